"""What a zoo model leaves in its run folder next to the stage folders, and how it is read.

``zoo-job.json``     the job: merged recipe, output root, timeout (written by the launcher)
``zoo-status.json``  progress, rewritten atomically at every stage event: ``state`` is
                     starting -> running -> finished; ``stages`` maps stage -> status
``zoo-worker.log``   the worker's stdout and stderr
``zoo-result.json``  the model's summary row, written by the launcher when the worker is gone
"""

from __future__ import annotations

import json
from pathlib import Path

from torch2ms.pipeline.workspace import write_json

JOB, STATUS, LOG, RESULT = "zoo-job.json", "zoo-status.json", "zoo-worker.log", "zoo-result.json"


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_status(run_dir: Path, status: dict) -> None:
    write_json(Path(run_dir) / STATUS, status)
