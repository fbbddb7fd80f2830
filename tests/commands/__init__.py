"""Tests of the CLI commands (``torch2ms.commands``); a package, so that its modules' names do not
shadow the other tests'."""
