"""Benchmark stage 01 (01_profile.py) against the loop a user writes first.

The anchor ("naive") is, per sample, `model(input_ids).logits.float().log_softmax(-1)` and a gather
of the gold response tokens: full-vocabulary float32 log-probs at every position. Stage 01 is timed
through its own `profile()` (batch plan, head check, chunked head on response positions, entropy),
with its default arguments and with explicit --batch-size values. Equal work: the same samples,
encoded by the stage's own encode_sample, the same response tokens scored (checked: the two agree
on every confidence). Stage 01 also computes each token's entropy, which the anchor does not.

Two shapes:
  tiny  the bundled tiny model (Llama, 8k vocabulary), the first --tiny-samples bundled SFT samples
        (~1.2k tokens each)
  wide  the tiny model's body with a random 32k-vocabulary output layer (seeded; built here), the
        --wide-samples longest bundled samples (~2k tokens each): the head's share of the work as in
        real models

Method: torch.set_num_threads(--threads); the variants run back to back in rounds whose order
flips each round, and the ratio is the median over rounds of the within-round ratio. Time is the
process's CPU time on a CPU (on a shared machine wall time measures the scheduler; use --threads 1
there, as OpenMP threads spin while they wait and bill it as CPU time), wall time on a GPU. Peak
extra memory is measured once per variant in a forked child (research/bench/common.py says how).

    python research/bench/profiling.py                 # full: both shapes at the default sizes
    python research/bench/profiling.py --quick     # CI smoke: tiny sizes, one round, checks only that it runs
    python research/bench/profiling.py --device cuda   # on a GPU (bf16 autocast, the stage's default)
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports

import numpy as np
import torch

from cuset_common.data import encode_sample, load_sft
from cuset_common.device import pick_device
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.paths import SFT_FILE, TINY_MODEL
from cuset_common.trackers import Trackers
from research.bench.common import (
    MIB,
    add_run_args,
    clock,
    interleaved_times,
    machine,
    median_ratio,
    peak_extra_memory,
    print_table,
    resolve_run_args,
    warm_up,
    wide_model,
)
from research.stage_modules import stage_file_module

WIDE_VOCAB = 32000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke: two short samples per shape, one round")
    ap.add_argument("--shapes", nargs="+", choices=("tiny", "wide"), default=["tiny", "wide"])
    ap.add_argument(
        "--tiny-samples", type=int, default=16, help="first bundled samples, tiny shape (%(default)s)"
    )
    ap.add_argument(
        "--wide-samples", type=int, default=4, help="longest bundled samples, wide shape (%(default)s)"
    )
    ap.add_argument(
        "--stage",
        type=str,
        default="01_profile.py",
        help="stage-01 script to time, relative to the repo root or absolute (another version: "
        "git show HEAD:01_profile.py > /tmp/old.py; --stage /tmp/old.py)",
    )
    ap.add_argument(
        "--batch-sizes",
        nargs="*",
        type=int,
        default=[8],
        help="stage 01 --batch-size values timed besides its default (%(default)s; --quick: none)",
    )
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.tiny_samples, args.wide_samples = [], 2, 2
    resolve_run_args(args)
    return args


def load_shape(shape: str, args: argparse.Namespace) -> tuple[object, object, list[dict]]:
    """(model, tokenizer, encoded samples) of a shape (module docstring)."""
    tok = load_tokenizer(str(TINY_MODEL))
    records = load_sft(SFT_FILE)
    encs = [encode_sample(tok, r, 256 if args.quick else 2048) for r in records]
    if shape == "tiny":
        model, encs = load_causal_lm(str(TINY_MODEL), torch.float32), encs[: args.tiny_samples]
    else:
        model, encs = (
            wide_model(WIDE_VOCAB),
            sorted(encs, key=lambda e: -len(e["input_ids"]))[: args.wide_samples],
        )
    return model.to(args.device).eval(), tok, encs


@torch.no_grad()
def naive_loop(model, encs: list[dict], device: str, use_bf16: bool) -> list[np.ndarray]:
    """What a user writes first: the model's full logits per sample, float32 log-softmax, gather."""
    out = []
    for e in encs:
        ids = torch.tensor([e["input_ids"]], device=device)  # [1, L]
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logp = model(input_ids=ids).logits.float().log_softmax(-1)[0]  # [L, V] float32
        s = e["response_start"]
        out.append(logp[s - 1 : -1].gather(1, ids[0, s:, None])[:, 0].exp().cpu().numpy())  # [n]
    return out


def variants(model, tok, encs: list[dict], args: argparse.Namespace) -> dict[str, Callable[[], list]]:
    """name -> a function running it once and returning the confidences per sample (data order)."""
    stage, device = stage_file_module(args.stage), args.device
    use_bf16 = device.startswith("cuda")  # stage 01's --precision auto
    unused = Path(tempfile.gettempdir()) / "bench-profile-unused"  # profile() only scores: nothing is saved

    def stage01(extra: list[str]) -> Callable[[], list]:
        stage_args = stage.parse_args(
            ["--device", device, "--out", str(unused), "--log-every", "1e9", "--save-every", "1e9", *extra]
        )

        # no trackers (--report-to); a stage version from before them takes none
        quiet = (
            {"trackers": Trackers([])} if "trackers" in inspect.signature(stage.profile).parameters else {}
        )

        def run() -> list:
            with contextlib.redirect_stdout(io.StringIO()):  # its one progress line
                results, _ = stage.profile(model, tok, encs, stage_args, device, use_bf16, run={}, **quiet)
            return [res[0] for res in results]  # confidences (the stage also returns entropy, argmax)

        return run

    default_bs = stage.parse_args([]).batch_size
    found = {
        "naive": lambda: naive_loop(model, encs, device, use_bf16),
        f"stage 01 default (--batch-size {default_bs})": stage01([]),
    }
    for bs in args.batch_sizes:
        found[f"stage 01 --batch-size {bs}"] = stage01(["--batch-size", str(bs)])
    return found


def bench_shape(shape: str, args: argparse.Namespace) -> None:
    model, tok, encs = load_shape(shape, args)
    found = variants(model, tok, encs, args)
    memory = {
        name: peak_extra_memory(run, args.device, lambda: warm_up(model, args.device))
        for name, run in found.items()
    }
    ref, tol = found["naive"](), 5e-2 if args.device.startswith("cuda") else 1e-4  # bf16 on a GPU
    for name, run in found.items():  # equal work: the same tokens scored, to the same values; a warm-up too
        got = run()
        diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got) if len(a))
        if any(len(a) != len(b) for a, b in zip(ref, got)) or diff > tol:
            raise RuntimeError(
                f"{name} disagrees with the naive loop (max |diff| {diff:.2g}): not equal work"
            )
    times = interleaved_times(found, args.repeats, args.device)
    tokens = sum(len(e["input_ids"]) for e in encs)
    vocab = model.get_output_embeddings().weight.shape[0]
    print(
        f"\n### {shape}: {len(encs)} samples, {tokens:,} tokens ({tokens / len(encs):,.0f} per sample, "
        f"{sum(len(e['spans']) for e in encs):,} scored), vocabulary {vocab:,}\n"
    )
    unit = clock(args.device)[1]
    rows = [
        [
            name,
            f"{tokens / statistics.median(t):,.0f}",
            f"{median_ratio(times, name, 'naive'):.2f}x",
            f"{memory[name] / MIB:,.0f}",
        ]
        for name, t in times.items()
    ]
    print_table(["variant", f"tokens per {unit}", "speed vs naive", "peak extra memory (MiB)"], rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.device = pick_device(args.device)
    print(
        f"# research/bench/profiling.py{' --quick' if args.quick else ''}: "
        "stage 01 vs the naive per-sample loop\n"
        f"machine: {machine(args.device, args.threads)}; median of {args.repeats} interleaved round(s)"
    )
    for shape in args.shapes:
        bench_shape(shape, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
