"""The ``torch2ms`` command line: loads every command module, maps errors to exit codes.

Exit codes: 0 every stage passed; 1 a stage failed its check (or crashed); 2 bad input
(recipe, model, checkpoint, ONNX, unsupported ops, a busy output folder); 3 a stage is not
checkable at these inputs (``errors.NotCheckable``); 130 interrupted.
"""

from __future__ import annotations

import importlib
import pkgutil
import signal
import sys
import threading

import typer

from torch2ms.cli_app import app, console, state
from torch2ms.errors import EXIT_INTERRUPTED, EXIT_USAGE, Torch2msError
from torch2ms.runtime.lifetime import interrupt


def _load_commands() -> None:
    import torch2ms.commands as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        importlib.import_module(f"torch2ms.commands.{mod}")


def main(argv: list[str] | None = None) -> None:
    _load_commands()
    if threading.current_thread() is threading.main_thread():
        # MindSpore replaces Python's SIGINT handler on every cell call with one that sends the
        # process SIGTERM: Ctrl-C during a MindSpore stage killed torch2ms with no message, its
        # partial folder and lock left behind. SIGTERM becomes KeyboardInterrupt here, so both
        # end like Ctrl-C elsewhere: partial discarded, lock released, exit 130.
        signal.signal(signal.SIGTERM, interrupt)
    try:
        # standalone_mode=False makes click *return* the code of typer.Exit(code) instead of
        # exiting with it: pass it on, or `raise typer.Exit(130)` would end with status 0.
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code != 0:
            sys.exit(code)
    except Torch2msError as err:
        console.print(f"[bold red]error:[/bold red] {err}", highlight=False)
        if state["debug"]:
            console.print_exception()
            if getattr(err, "child_traceback", None):  # raised in a stage's own process
                console.print(err.child_traceback, highlight=False, markup=False)
        sys.exit(err.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]; completed stages are kept: run the same command again to resume")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        import click

        # typer >= 0.2x vendors click (typer._click): its usage errors are not click's classes
        if isinstance(err, (click.exceptions.ClickException, typer.TyperException)) and hasattr(err, "show"):
            err.show()
            sys.exit(EXIT_USAGE)
        if isinstance(err, (click.exceptions.Abort, typer.Abort)):
            sys.exit(EXIT_INTERRUPTED)
        raise


if __name__ == "__main__":
    main()
