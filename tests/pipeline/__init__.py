"""Tests of the stage machinery (``torch2ms.pipeline``): runner, checks, diff, interruption,
errors; a package, so that its modules' names do not shadow the other tests'."""
