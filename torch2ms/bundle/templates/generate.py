#!/usr/bin/env python3
"""Greedy text generation with this bundle's two graphs, exactly as manifest.json describes.

Needs numpy and either MindSpore Lite (``mindspore_lite``, used when importable: on the board) or
MindSpore (``mindspore``: loads the MindIRs with ``nn.GraphCell``); ``--tokenizer`` needs the
``tokenizers`` package. It does not need torch2ms or torch.

    python3 infer.py --prompt-ids "1 2 3" --max-new-tokens 20   # prints the generated token ids
    python3 infer.py --prompt "Hello" --tokenizer tokenizer.json # encodes the text, decodes the output
    python3 infer.py --self-check        # samples/generation.npz: the recorded prompts vs transformers' tokens

The loop (manifest "generation"): the graphs take a batch of ``batch`` rows, so a prompt fills every
row. A batch is left-padded (ids ``pad_id``, mask 0) to the smallest prompt gear that holds its
longest prompt; the prefill graph gives the first token's logits and the cache [layers, batch,
kv_heads, cache_length, head_dim], prompt in slots 0 .. gear-1. Decode step ``s`` (from 1) feeds
the last token at each row's position ``real tokens + s - 1``, writes cache slot ``gear + s - 1``,
attends to the mask's 1s (the row's prompt and what was generated) and returns the cache, fed back.
Tokens are the argmax of each step's logits, ``max_new_tokens`` of them per row (no stop token);
at most ``cache_length - gear + 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _cap_onednn_isa() -> None:
    """As the one-model bundle's infer.py: oneDNN above AVX2 falls back to reference code on
    AVX-512/AMX CPUs, so the ISA is capped there, before mindspore is imported (a user's value stays)."""
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        return
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        return
    if "avx2" in flags and any(f in flags for f in ("avx512f", "amx_tile", "amx_bf16")):
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"


class Model:
    """One graph: MindSpore Lite when importable, else MindSpore's GraphCell (CPU unless --device says)."""

    def __init__(self, path: Path, device: str):
        try:
            import mindspore_lite as mslite
        except ImportError:
            mslite = None
        if mslite is not None:
            context = mslite.Context()
            context.target = [device]
            if device == "ascend":
                context.ascend.device_id = int(os.environ.get("DEVICE_ID", "0"))
            self.lite = mslite.Model()
            self.lite.build_from_file(str(path), mslite.ModelType.MINDIR, context)
            self.runtime = f"mindspore_lite ({device})"
        else:
            _cap_onednn_isa()
            os.environ.setdefault("GLOG_v", "3")
            import mindspore as ms

            ms.set_context(mode=ms.GRAPH_MODE, device_target={"cpu": "CPU", "ascend": "Ascend", "gpu": "GPU"}[device])
            self.ms = ms
            self.cell = ms.nn.GraphCell(ms.load(str(path.resolve())))
            self.lite = None
            self.runtime = f"mindspore {ms.__version__} GraphCell ({device})"

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if self.lite is not None:
            inputs = self.lite.get_inputs()
            shapes = [list(a.shape) for a in arrays]
            if [list(t.shape) for t in inputs] != shapes:  # the prefill at another prompt gear
                self.lite.resize(inputs, shapes)
            for t, a in zip(inputs, arrays):
                t.set_data_from_numpy(np.ascontiguousarray(a))
            return [o.get_data_to_numpy() for o in self.lite.predict(inputs)]
        out = self.cell(*[self.ms.Tensor(np.ascontiguousarray(a)) for a in arrays])
        return [o.asnumpy() for o in out]


def gear_for(gears: list[int], prompts: list[list[int]]) -> int:
    longest = max(len(p) for p in prompts)
    fits = [g for g in gears if g >= longest]
    if not fits:
        raise ValueError(f"a {longest}-token prompt is longer than the largest prompt gear ({max(gears)})")
    return min(fits)


def greedy(prefill: Model, decode: Model, prompts: list[list[int]], max_new_tokens: int, gen: dict) -> np.ndarray:
    """Token ids [len(prompts), max_new_tokens] of one batch (``len(prompts)`` is the graphs' batch)."""
    gear, cache_length = gear_for(gen["prompt_gears"], prompts), gen["cache"]["cache_length"]
    if gear + max_new_tokens - 1 > cache_length:
        raise ValueError(
            f"{max_new_tokens} new tokens after a prompt at gear {gear} do not fit cache_length {cache_length}: "
            f"ask for at most {cache_length - gear + 1}"
        )
    ids = np.full((len(prompts), gear), gen["pad_id"], dtype=np.int32)
    mask = np.zeros((len(prompts), gear), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, gear - len(prompt) :], mask[row, gear - len(prompt) :] = prompt, 1
    logits, keys, values = prefill(ids, mask)
    tokens = [logits[:, -1].argmax(axis=-1)]
    cache_mask = np.zeros((len(prompts), cache_length), dtype=np.int32)
    cache_mask[:, :gear] = mask
    real = mask.sum(axis=1)
    for step in range(1, max_new_tokens):
        slot = gear + step - 1
        cache_mask[:, slot] = 1
        logits, keys, values = decode(
            tokens[-1][:, None].astype(np.int32),
            (real + step - 1).astype(np.int32),
            np.array([slot], dtype=np.int32),
            cache_mask.copy(),
            keys,
            values,
        )
        tokens.append(logits[:, -1].argmax(axis=-1))
    return np.stack(tokens, axis=1).astype(np.int64)


def generate(models: tuple[Model, Model], prompts: list[list[int]], max_new_tokens: int, gen: dict) -> np.ndarray:
    """``greedy`` over ``prompts`` in batches of the graphs' batch, the last batch filled up with
    copies of its last prompt (their tokens dropped)."""
    batch = gen["batch"]
    out = []
    for start in range(0, len(prompts), batch):
        part = prompts[start : start + batch]
        rows = len(part)
        out.append(greedy(*models, part + [part[-1]] * (batch - rows), max_new_tokens, gen)[:rows])
    return np.concatenate(out)


def recorded() -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """The recorded prompts, transformers' tokens for them and the top-2 logit gaps (samples/generation.npz)."""
    with np.load(HERE / "samples" / "generation.npz", allow_pickle=False) as z:
        ids, lengths, tokens, gaps = z["prompt_ids"], z["prompt_lengths"], z["tokens"], z["gaps"]
    return [ids[row, :n].tolist() for row, n in enumerate(lengths)], tokens, gaps


def first_difference(expected: np.ndarray, got: np.ndarray, gaps: np.ndarray) -> str | None:
    """The earliest step (then row) whose token differs, described, or None."""
    differ = np.argwhere((expected != got).T)
    if not len(differ):
        return None
    step, row = (int(i) for i in differ[0])
    return (
        f"step {step}, row {row}: token {int(got[row, step])} instead of transformers' {int(expected[row, step])} "
        f"(its top-2 logit gap there {float(gaps[row, step]):.3g}); {int((expected != got).sum())} of "
        f"{expected.size} tokens differ"
    )


def self_check(models: tuple[Model, Model], manifest: dict) -> str | None:
    """The bundle's loop on the recorded prompts against transformers' tokens: None when every token
    is the same, else the first difference."""
    prompts, tokens, gaps = recorded()
    return first_difference(tokens, generate(models, prompts, tokens.shape[1], manifest["generation"]), gaps)


def load_models(manifest: dict, device: str, paths: tuple[str | None, str | None] = (None, None)):
    """The prefill and decode graphs: the manifest's MindIRs, or ``paths`` (converter_lite's output)."""
    graphs = manifest["generation"]["graphs"]
    chosen = [Path(p) if p else HERE / graphs[g]["mindir"] for g, p in zip(("prefill", "decode"), paths)]
    for path in chosen:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such model file")
    return Model(chosen[0], device), Model(chosen[1], device)


def _tokenizer(path: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("error: --tokenizer needs the tokenizers package: pip install tokenizers") from None
    if not Path(path).is_file():
        raise SystemExit(f"error: --tokenizer {path}: no such file")
    return Tokenizer.from_file(path)


def _prompt(args, tokenizer) -> list[int]:
    if args.prompt is not None:
        if tokenizer is None:
            raise SystemExit("error: --prompt is text: give --tokenizer tokenizer.json too, or --prompt-ids")
        return tokenizer.encode(args.prompt).ids
    try:
        ids = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    except ValueError:
        raise SystemExit(f'error: --prompt-ids {args.prompt_ids!r}: give whole numbers, e.g. "1 2 3"') from None
    return ids


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.self_check and args.prompt_ids is None and args.prompt is None:
        _parser().error("give --prompt-ids, --prompt (with --tokenizer) or --self-check")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        _parser().error(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    manifest = json.loads((HERE / "manifest.json").read_text())
    gen = manifest["generation"]
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    prompt = None if args.self_check else _prompt(args, tokenizer)
    bad = [t for t in prompt or () if not 0 <= t < gen["vocab"]]
    if prompt is not None and (not prompt or bad):
        print(f"error: the prompt needs token ids in [0, {gen['vocab']}), got {bad or 'none'}", file=sys.stderr)
        return 2
    try:
        models = load_models(manifest, args.device or _default_device(), (args.prefill_model, args.decode_model))
        print(f"{manifest['model']['name']} {manifest['model']['version']} on {models[0].runtime}", file=sys.stderr)
        if args.self_check:
            problem = self_check(models, manifest)
            print(problem and f"FAIL {problem}" or "ok   every token is transformers' (samples/generation.npz)")
            return 1 if problem else 0
        tokens = generate(models, [prompt], args.max_new_tokens or gen["max_new_tokens"], gen)[0].tolist()
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(" ".join(map(str, tokens)))
    if tokenizer is not None:
        print(tokenizer.decode(tokens))
    return 0


def _default_device() -> str:
    try:
        import mindspore_lite  # noqa: F401

        return "ascend"
    except ImportError:
        return "cpu"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-ids", default=None, help='the prompt as token ids, e.g. "1 2 3"')
    p.add_argument("--prompt", default=None, help="the prompt as text (needs --tokenizer)")
    p.add_argument(
        "--tokenizer", default=None, help="a tokenizers tokenizer.json: encodes --prompt, decodes the output"
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens to generate (default: the manifest's)")
    p.add_argument("--self-check", action="store_true", help="the recorded prompts against transformers' tokens")
    p.add_argument(
        "--device", default=None, choices=["cpu", "ascend", "gpu"], help="default: ascend with MindSpore Lite, else cpu"
    )
    p.add_argument("--prefill-model", default=None, help="another prefill MindIR (e.g. converter_lite's output)")
    p.add_argument("--decode-model", default=None, help="another decode MindIR (e.g. converter_lite's output)")
    return p


if __name__ == "__main__":
    sys.exit(main())
