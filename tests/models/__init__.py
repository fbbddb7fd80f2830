"""Tests of the model factories (``torch2ms.models``); a package, so that its modules' names do not
shadow the other tests'."""
