"""Tests of the structure the whole package promises: imports, function lengths, the wheel; a
package, so that its modules' names do not shadow the other tests'."""
