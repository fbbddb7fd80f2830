"""Errors torch2ms reports to users, with the exit code each one maps to.

Every error names what is wrong (a recipe field path, a file, an ONNX node) and says what
to do. The CLI prints the message and exits with ``exit_code``; no traceback for these.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_CHECKABLE = 3
EXIT_INTERRUPTED = 130


class Torch2msError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class RecipeError(Torch2msError):
    """The recipe file is missing, unreadable or invalid."""


class ModelError(Torch2msError):
    """The model factory, the checkpoint or the ONNX export failed."""


class OnnxError(Torch2msError):
    """An ONNX file cannot be read or is outside what we support."""


class UnsupportedOpsError(OnnxError):
    """One or more ONNX nodes have no converter; the message lists them all."""

    def __init__(self, message: str, problems: list | None = None):
        super().__init__(message, hint="see `torch2ms ops` for the supported operators")
        self.problems = problems or []


class PluginError(Torch2msError):
    """A converter plugin (a recipe's ``converters``, an entry point) cannot be used; names the plugin and the op."""


class LockedError(Torch2msError):
    """Another torch2ms process is using the same output folder."""


class CheckFailed(Torch2msError):
    """A stage's outputs left the tolerance against the PyTorch reference."""

    exit_code = EXIT_CHECK_FAILED


class NotCheckable(Torch2msError):
    """A stage passed only on a bound past ``check.ceiling`` without evidence that every node is right."""

    exit_code = EXIT_NOT_CHECKABLE


class StageFailed(Torch2msError):
    """A stage raised; wraps the cause with the stage name and what ran before it."""

    exit_code = EXIT_CHECK_FAILED
