"""Tests of the generated code (``torch2ms.codegen``); a package, so that its modules' names do not
shadow the other tests'."""
