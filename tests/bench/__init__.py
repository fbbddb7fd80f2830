"""Tests of the benchmark (``torch2ms.bench``, benchmarks/convert_cost.py); a package, so that its
modules' names do not shadow the other tests'."""
