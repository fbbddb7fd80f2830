"""A user's C++ kernel as a MindSpore ``ops.Custom(func_type="aot")``: declared, built, cached, carried.

A plugin declares ``AotKernel(source=..., function=..., inputs=(...), out_shape=..., out_dtype=...)``
beside its converter, which returns ``em.custom(kernel, ...)`` (``torch2ms.converters.api``). The
kernel is MindSpore's AOT CPU signature (https://www.mindspore.cn/docs/en/r2.10.0/api_python/ops/
mindspore.ops.Custom.html, ``func_type="aot"``)::

    extern "C" int Function(int nparam, void **params, int *ndims, int64_t **shapes,
                            const char **dtypes, void *stream, void *extra)

``params`` holds the inputs then the output; a non-zero return fails the op. MindSpore allocates the
output from ``out_shape``/``out_dtype``, Python expressions of the inputs' shapes and dtypes by the
names in ``inputs``: the generated ``network.py`` declares the ``ops.Custom`` with them in the
``__init__`` of one cell per kernel, as a hand-written MindSpore primitive does.

Built with the machine's ``g++ -shared -fPIC`` and the kernel's flags, cached under
``$TORCH2MS_KERNEL_CACHE`` (default ``~/.cache/torch2ms/kernels``) by the sha256 of the source, the
compiler's version line, the flags and the function: a rebuilt run folder compiles nothing. Each
stage that writes a ``network.py`` copies the ``.so`` to ``kernels/`` beside it and records the
source hash, compiler and flags (``conversion.json`` ``custom_kernels``). A MindIR keeps of a Custom
op only its ``func_name`` (the ``.so`` path and function), ``func_type`` and the output shape, not
the library nor the inference: ``carry_into_mindir`` copies ``kernels/`` next to ``network.mindir``
and writes the path relative to it (``kernels/x.so``), which MindSpore resolves against the working
directory, so the MindIR runs from its own folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from torch2ms.errors import PluginError

KERNEL_DIR = "kernels"
ASCEND_DIR = "ascend"  # kernels/ascend/<function>/: the op's Ascend implementation and op-info, for the board
COMPILER = "g++"


class KernelError(PluginError):
    """A user kernel that does not build, or whose output is not what its inference declares."""


@dataclass(frozen=True)
class AscendKernel:
    """The op's Ascend implementation for the board: a TBE (.py) or Ascend C (.cpp) source and its
    op-info registration (the JSON/INI a CANN custom-op package installs), carried into the bundle
    under ``kernels/ascend/<function>/``; built and installed on the board as MindSpore's Ascend AOT
    custom ops are (https://www.mindspore.cn/tutorials/en/r2.10.0/custom_program/operation/
    op_custom_ascendc.html). torch2ms does not build it: no CANN here."""

    source: Path
    op_info: Path
    kind: str = "ascendc"  # or "tbe"


@dataclass(frozen=True)
class AotKernel:
    source: Path  # the .cc, e.g. Path(__file__).parent / "silu_mul.cc"
    function: str  # its extern "C" function
    inputs: tuple[str, ...]  # the kernel's inputs, named as out_shape / out_dtype use them
    out_shape: str  # the output shape from the inputs' shapes, e.g. "x"
    out_dtype: str  # the output dtype from the inputs' dtypes, e.g. "x"
    flags: tuple[str, ...] = ("-O2",)
    ascend: AscendKernel | None = None
    plugin: str | None = field(default=None, compare=False)

    def __post_init__(self):
        from torch2ms.custom.loading import LOADING_PLUGIN

        object.__setattr__(self, "source", Path(self.source).resolve())
        object.__setattr__(self, "plugin", LOADING_PLUGIN[-1] if LOADING_PLUGIN else None)
        if not self.function.isidentifier():
            raise PluginError(f"converter plugin {self.plugin!r}: AotKernel function {self.function!r} is not a C name")
        known = KERNELS.setdefault(self.function, self)
        if known.source != self.source:
            raise PluginError(
                f"converter plugin {self.plugin!r}: two AOT kernels named {self.function!r} "
                f"({known.source} and {self.source})",
                hint="give each kernel function its own name",
            )

    @property
    def path(self) -> Path:
        return self.source

    @property
    def cell(self) -> str:
        """The generated cell's class name."""
        return f"{self.function[:1].upper()}{self.function[1:]}Kernel"

    @property
    def library(self) -> str:
        return f"{self.function}.so"

    def cell_source(self) -> str:
        """The module-level cell ``network.py`` holds for this kernel (``Emitter.custom``)."""
        args = ", ".join(self.inputs)
        sha = source_sha256(self)[:16]
        return f'''class {self.cell}(nn.Cell):
    """ops.Custom AOT kernel {self.function} ({self.source.name}, sha256 {sha}), built by torch2ms."""

    def __init__(self):
        super().__init__()
        library = os.path.join(os.path.dirname(os.path.abspath(__file__)), "{KERNEL_DIR}", "{self.library}")
        self.op = ops.Custom(
            library + ":{self.function}",
            out_shape=lambda {args}: {self.out_shape},
            out_dtype=lambda {args}: {self.out_dtype},
            func_type="aot",
        )

    def construct(self, {args}):
        return self.op({args})
'''


# kernel function -> its declaration
KERNELS: dict[str, AotKernel] = {}


def source_sha256(kernel: AotKernel) -> str:
    try:
        return hashlib.sha256(kernel.source.read_bytes()).hexdigest()
    except OSError as err:
        raise KernelError(
            f"converter plugin {kernel.plugin!r}: AOT kernel {kernel.function}: cannot read {kernel.source}: "
            f"{err.strerror}",
            hint="AotKernel(source=...) names the .cc beside the plugin, e.g. Path(__file__).parent / 'op.cc'",
        ) from None


def compiler_version() -> str:
    """The first line of ``g++ --version``; part of the cache key and the record."""
    try:
        done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise KernelError(
            f"{COMPILER} is not installed: AOT kernels are built with it", hint="apt-get install g++"
        ) from None
    return done.stdout.splitlines()[0].strip()


def cache_root() -> Path:
    return Path(os.environ.get("TORCH2MS_KERNEL_CACHE") or Path.home() / ".cache" / "torch2ms" / "kernels")


def build(kernel: AotKernel, op: str) -> tuple[Path, dict]:
    """The kernel's shared library (compiled unless cached) and its record; ``op`` names the ONNX op
    in an error: a compile error is the compiler's first error line."""
    compiler = compiler_version()
    flags = [*kernel.flags, "-shared", "-fPIC"]
    sha = source_sha256(kernel)
    key = hashlib.sha256("\n".join([sha, compiler, *flags, kernel.function]).encode()).hexdigest()[:24]
    target = cache_root() / key / kernel.library
    record = {
        "op": op,
        "source": str(kernel.source),
        "source_sha256": sha,
        "compiler": compiler,
        "flags": flags,
        "cache": str(target),
    }
    if target.is_file():
        return target, record
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{kernel.library}.{os.getpid()}")
    command = [COMPILER, *flags, "-fdiagnostics-color=never", "-o", str(partial), str(kernel.source)]
    # LC_ALL=C: plain quotes in the compiler's messages, not the locale's
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        errors = [line for line in done.stderr.splitlines() if "error:" in line] or done.stderr.splitlines() or ["?"]
        raise KernelError(
            f"custom op {op}: AOT kernel {kernel.function} ({kernel.source.name}) does not compile: "
            f"{errors[0].strip()}",
            hint=f"{COMPILER} {' '.join(flags)} -o {kernel.library} {kernel.source}",
        )
    os.replace(partial, target)
    return target, record


def used_by(source: str) -> list[AotKernel]:
    """The declared kernels a generated ``network.py`` holds a cell for."""
    return [k for k in KERNELS.values() if f"class {k.cell}(nn.Cell):" in source]


def install(source: str, out: Path, ops: dict[str, str]) -> dict[str, dict]:
    """Build every kernel ``source`` uses and copy it to ``out``/kernels; function -> its record.
    ``ops``: function -> the ONNX op that uses it (for errors)."""
    records = {}
    for kernel in used_by(source):
        library, record = build(kernel, ops.get(kernel.function, kernel.function))
        (out / KERNEL_DIR).mkdir(exist_ok=True)
        shutil.copy2(library, out / KERNEL_DIR / kernel.library)
        records[kernel.function] = {**record, "library": f"{KERNEL_DIR}/{kernel.library}"}
    return records


def carry_into_mindir(src: Path, out: Path, graph: Path) -> list[str]:
    """Copy ``src``/kernels to ``out``/kernels and make ``graph``'s Custom ops name their library as
    ``kernels/<file>.so`` (resolved from the working directory: the MindIR's folder); returns the
    libraries."""
    if not (src / KERNEL_DIR).is_dir():
        return []
    shutil.copytree(src / KERNEL_DIR, out / KERNEL_DIR, dirs_exist_ok=True)
    for kernel in KERNELS.values():  # the board's implementation, where the plugin gives one
        if kernel.ascend is not None and (out / KERNEL_DIR / kernel.library).is_file():
            target = out / KERNEL_DIR / ASCEND_DIR / kernel.function
            target.mkdir(parents=True, exist_ok=True)
            for path in (kernel.ascend.source, kernel.ascend.op_info):
                shutil.copy2(path, target / Path(path).name)
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(graph.read_bytes())
    prefix = (str((src / KERNEL_DIR).resolve()) + "/").encode()
    for prim in model.primitives:
        for attr in prim.attribute:
            if attr.name in ("func_name", "uniq_name") and prefix in attr.s:
                attr.s = attr.s.replace(prefix, f"{KERNEL_DIR}/".encode())
    graph.chmod(0o600)
    graph.write_bytes(model.SerializeToString())
    return sorted(p.relative_to(out / KERNEL_DIR).as_posix() for p in (out / KERNEL_DIR).rglob("*") if p.is_file())


# kernel function -> the ONNX op a converter called it for ("domain.Op"), for records and errors
OPS: dict[str, str] = {}


def check_inference(kernel: AotKernel, em, shapes: list[list[int]]) -> None:
    """The kernel's ``out_shape`` on its inputs' ``shapes`` must be the node's ONNX output shape,
    else MindSpore would allocate an output the kernel does not fill as PyTorch computes it."""
    node = em.node
    op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
    OPS[kernel.function] = op
    where = f"custom op {op} (node {node.name!r}): AOT kernel {kernel.function}"
    if len(kernel.inputs) != len(shapes):
        raise KernelError(
            f"{where} takes {len(kernel.inputs)} inputs {kernel.inputs}, the converter gives {len(shapes)}"
        )
    try:
        shape = eval(f"lambda {', '.join(kernel.inputs)}: {kernel.out_shape}")(*shapes)  # noqa: S307 - the plugin's code
    except Exception as err:  # noqa: BLE001 - any error of the plugin's expression
        raise KernelError(f"{where}: out_shape {kernel.out_shape!r} raised {type(err).__name__}: {err}") from None
    if tuple(int(d) for d in shape) != em.out_shape(0):
        raise KernelError(
            f"{where}: its out_shape {kernel.out_shape!r} gives {tuple(shape)}, the op's output is "
            f"{em.out_shape(0)} (ONNX, as PyTorch computes it)",
            hint="fix AotKernel(out_shape=...) so that it gives the op's output shape",
        )


@contextlib.contextmanager
def running_in(folder: Path | None):
    """The block with ``folder`` as the working directory (None: unchanged)."""
    if folder is None:
        yield
        return
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def mindir_kernels(model) -> dict[str, str]:
    """The AOT kernels a MindIR's Custom ops load (a ``mind_ir_pb2.ModelProto``): function -> library path."""
    out = {}
    for prim in model.primitives:
        for attr in prim.attribute:
            if attr.name == "func_name" and b":" in attr.s:
                library, _, function = attr.s.decode().rpartition(":")
                out[function] = library
    return out


def board_finding(function: str, folder: Path) -> tuple[str, str]:
    """(level, why) of a Custom op on the Ascend board: its implementation is in the bundle
    (``kernels/ascend/<function>/``) or the user must supply it."""
    given = folder / KERNEL_DIR / ASCEND_DIR / function
    if given.is_dir() and any(given.iterdir()):
        files = ", ".join(sorted(p.name for p in given.iterdir()))
        return "check", (
            f"custom op {function}: AI Core, the user's Ascend kernel ({KERNEL_DIR}/{ASCEND_DIR}/{function}/: "
            f"{files}); build and install it as a CANN custom-op package on the board before converting"
        )
    return "error", (
        f"custom op {function}: unsupported on the board, its kernel is a host CPU library; supply its Ascend "
        "implementation (a TBE or Ascend C source and its op-info registration) as AotKernel(ascend=AscendKernel(...))"
    )
