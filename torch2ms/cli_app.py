"""The ``torch2ms`` Typer app, its console and shared options. Commands live one per module in
``torch2ms/commands/`` and register themselves on ``app``."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="PyTorch -> MindSpore for Atlas boards, checked against PyTorch at every stage.",
)
# Off a terminal (CI logs, zoo worker logs, pipes) messages are not wrapped at 80 columns: a path or
# an error line broken mid-word cannot be searched for or copied.
console = Console(stderr=True, soft_wrap=not Console(stderr=True).is_terminal)
out_console = Console(width=None if Console().is_terminal else 160)
state = {"debug": False}

CpuIsa = typer.Option(
    None,
    "--cpu-isa",
    help=(
        "oneDNN ISA cap for MindSpore (e.g. AVX2, default); env TORCH2MS_CPU_ISA. Auto: on AVX-512/AMX CPUs, the "
        "faster of AVX2 and the default, measured once and cached."
    ),
)


def setup_cpu(isa: str | None) -> None:
    """Choose the CPU setting before anything imports MindSpore, and say what was chosen."""
    from torch2ms.runtime.cpu import configure_cpu

    choice = configure_cpu(isa)
    console.print(f"[dim]CPU: ONEDNN_MAX_CPU_ISA={choice.isa} ({choice.source}: {choice.reason})[/dim]")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    state["debug"] = debug
