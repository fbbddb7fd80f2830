"""Tests of end-to-end conversions: shipped recipes, trained fixtures, random networks,
determinism; a package, so that its modules' names do not shadow the other tests'."""
