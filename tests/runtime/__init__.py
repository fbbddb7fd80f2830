"""Tests of the runtime settings (``torch2ms.runtime``: threads, memory, graph-kernel flags); a
package, so that its modules' names do not shadow the other tests'."""
