"""Test setup: choose the fast MindSpore CPU setting before anything imports MindSpore, so the
suite never pays the ~80x AVX-512 slowdown; quiet MindSpore's C++ log."""

from __future__ import annotations

import os

from torch2ms.runtime import configure_cpu

configure_cpu()
os.environ.setdefault("GLOG_v", "3")
