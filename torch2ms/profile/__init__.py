"""Op-level profile of a converted model: PyTorch eager under ``torch.profiler`` and MindSpore
PyNative / GRAPH_MODE / GRAPH_MODE + graph kernels under ``mindspore.profiler.Profiler``, compared
per op type and per PyTorch module path. ``core`` runs and summarises, ``mindspore_ops`` and
``torch_ops`` read each profiler, ``report`` writes ``<run>/profile/``."""

from torch2ms.profile.core import ProfileOptions, run_profile
from torch2ms.profile.report import write_all

__all__ = ["ProfileOptions", "run_profile", "write_all"]
