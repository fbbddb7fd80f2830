"""Tests of the helper commands' code (``torch2ms.tools``: load-weights, the operator table); a
package, so that its modules' names do not shadow the other tests'."""
