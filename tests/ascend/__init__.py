"""Tests of the Ascend placement (``torch2ms.ascend``); a package, so that its modules' names do
not shadow the other tests'."""
