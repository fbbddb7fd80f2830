"""Tests of the task checks (``torch2ms.tasks``); a package, so that its modules' names do not
shadow the other tests'."""
