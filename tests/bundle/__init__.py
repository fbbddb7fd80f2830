"""Tests of deployment bundles and precision plans (``torch2ms.bundle``); a package, so that its
modules' names do not shadow the other tests'."""
