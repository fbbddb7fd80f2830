"""Tests of converter plugins and AOT kernels (``torch2ms.custom``); a package, so that its
modules' names do not shadow the other tests'."""
