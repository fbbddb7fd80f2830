"""Benchmark a converted model every way it can run: PyTorch eager, onnxruntime, MindSpore
PyNative / GRAPH_MODE (plain, Conv2dBnAct, BN folded, graph-kernel fusion) and the reloaded
MindIR. See ``core`` for the method, ``variants`` for how each runs, ``fusion`` for the kernel
counts, ``report`` for the outputs."""

from torch2ms.bench.core import BenchOptions, run_bench
from torch2ms.bench.report import print_table, write_all

__all__ = ["BenchOptions", "run_bench", "print_table", "write_all"]
