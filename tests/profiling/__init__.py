"""Tests of the per-op profile (``torch2ms.profile``); not named ``profile``, which would shadow
the standard library's module; a package, so that its modules' names do not shadow the other
tests'."""
