"""Tests of the export stage's exporters and verdicts (``torch2ms.export``); a package, so that its
modules' names do not shadow the other tests'."""
