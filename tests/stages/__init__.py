"""Tests of the stages (``torch2ms.stages``) and what a recipe's inputs make them do; a package, so
that its modules' names do not shadow the other tests'."""
