"""Tests of the model zoos' runner (``torch2ms.zoo``); a package, so that its modules' names do not
shadow the other tests'."""
