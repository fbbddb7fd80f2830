"""``torch2ms zoo``: convert many models as a batch, each in its own worker process, and write
one summary (pass rate, per-stage status, errors, counts, latency, memory, failure reasons).

``spec`` reads zoo files, ``launch`` runs one model in a worker process and classifies the
outcome, ``worker`` is that process (forked by ``forkserver``, which imported torch and MindSpore once),
``executors`` runs workers locally or on Ray, ``batch``
ties them together and ``summary`` writes the tables.
"""

from torch2ms.zoo.batch import ZooOptions, run_batch
from torch2ms.zoo.spec import ZooModel, load_zoo, parse_zoo, select

__all__ = ["ZooModel", "ZooOptions", "load_zoo", "parse_zoo", "run_batch", "select"]
