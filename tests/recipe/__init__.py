"""Tests of the recipe's schema (``torch2ms.recipe``); a package, so that its modules' names do not
shadow the other tests'."""
