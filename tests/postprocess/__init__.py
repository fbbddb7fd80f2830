"""Tests of the shipped postprocessing (``torch2ms.postprocess``); a package, so that its modules'
names do not shadow the other tests'."""
