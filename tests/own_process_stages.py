"""Stages for tests/pipeline/test_own_process.py: light (no torch), importable by the stage's own process."""

from __future__ import annotations

import os
import signal
import time

from torch2ms.errors import RecipeError
from torch2ms.pipeline.stage import Stage, StageOutput


class Own(Stage):
    own_process = True

    def config(self, recipe) -> dict:
        return {}


class Reports(Own):
    """Logs a line, writes a file and counts its pid."""

    name = "reports"
    writes = ("pid.txt",)

    def run(self, ctx, out):
        ctx.log(f"{self.name}: hello from pid {os.getpid()}")
        (out / "pid.txt").write_text(str(os.getpid()))
        return StageOutput(None, counts={"pid": os.getpid()})


class Raises(Own):
    """A user error, with its hint, from inside the stage."""

    name = "raises"

    def run(self, ctx, out):
        (out / "half.txt").write_text("half written")
        raise RecipeError("inputs[0].shape: 3 dimensions, the model takes 4", hint="give [1, 3, 32, 32]")


class Killed(Own):
    """Killed from outside (the kernel's OOM killer does this) in the middle of its work."""

    name = "killed"

    def run(self, ctx, out):
        (out / "half.txt").write_text("half written")
        os.kill(os.getpid(), signal.SIGKILL)


class Sleeps(Own):
    """Writes into its folder, says so, and waits to be interrupted (which it records)."""

    name = "sleeps"

    def run(self, ctx, out):
        (out / "half.txt").write_text("half written")
        try:
            ctx.log(f"{self.name}: sleeping in pid {os.getpid()}")
            time.sleep(120)
        except KeyboardInterrupt:  # interrupted, not killed: say so outside the partial folder
            (ctx.run.root.parent / "sleeps-interrupted").write_text(str(os.getpid()))
            raise
        return StageOutput(None)
