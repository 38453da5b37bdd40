"""Benchmark stage 03 (03_train_cuset.py): each objective against sft, and the chunked head against
the model's own `model(labels=...)` cross-entropy.

Part 1, objectives. One optimizer step of stage 03's loop as one process runs it (its collate,
GoldLogProbs, objective_loss; backward, grad clip, AdamW step) on the bundled tiny model, with its
defaults (--chunk-rows 1024), for every --objective, on the same batch in one micro-batch: the
first 4 bundled samples cut at --length tokens. Region masks and sample weights are synthetic (a seeded
18% of response tokens in regions, weights uniform in [1, 3], about what stage 02 gives on the
bundled data): the cost does not depend on their values, and the bench then needs no stage 01/02 run.

Part 2, output layer. Forward + backward of the sft loss on one 2k-token sample (the longest
bundled one, prompt masked), on the tiny model's body with a random output layer of 32k and 150k
rows (tied, seeded): stage 03's chunked head (GoldLogProbs: response positions only, [chunk, V]
logits at a time, recomputed in backward) against `model(input_ids, labels=...).loss`, which
materialises float32 [L, V] logits, their log-softmax and their gradients. Both give the same loss
(checked).

Part 3, precision. Stage 03 itself (its main, with --objective sft) for --precision-steps optimizer steps
on --precision-model (default SmolLM2-135M-Instruct when data/build_smollm2.py has built it, else the tiny
model) in fp32 and under bf16 autocast, from the same weights and batches: CPU seconds per step (timed at
each step's log line, the first step left out as warm-up), tokens per CPU second, and each step's loss in
both with their difference against the bound cuset_common/cli.py derives (BF16_LOSS_RTOL).

Method: torch.set_num_threads(--threads); variants run back to back in rounds whose order flips
each round; ratios are medians over rounds of the within-round ratio. Time is the process's CPU
time on a CPU (research/bench/common.py, clock: wall time on a shared machine measures the scheduler; use
--threads 1 there), wall time on a GPU. Peak extra memory: once per variant in a forked child, on top
of the loaded model, data and (part 1) AdamW state (research/bench/common.py says how).

    python research/bench/train.py                   # full: every part at the default sizes
    python research/bench/train.py --quick         # CI smoke: tiny sizes, one round, checks only that it runs
    python research/bench/train.py --device cuda     # on a GPU (stage 03 runs under bf16 autocast there)
    python research/bench/train.py --parts precision --threads 1   # fp32 against bf16 on SmolLM2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports

import numpy as np
import torch
from transformers import AutoConfig

from cuset_common.data import load_sft
from cuset_common.device import BF16_LOSS_RTOL, bf16_supported, pick_device
from cuset_common.models import load_causal_lm, load_tokenizer, model_parameters
from cuset_common.paths import SFT_FILE, SFT_KERNEL_ORIGINALS_FILE, SMOLLM2_MODEL, TINY_MODEL
from cuset_common.training.samples import collate, tokenize_dataset
from cuset_common.training.step_log import StepLog
from research.bench.common import (
    MIB,
    add_run_args,
    clock,
    interleaved_times,
    limits_line,
    machine,
    machine_limits,
    median_ratio,
    peak_extra_memory,
    print_table,
    resolve_run_args,
    warm_up,
    wide_model,
)
from research.stage_modules import stage_module

REGION_SHARE, WEIGHT_RANGE = 0.18, (1.0, 3.0)  # synthetic regions and weights (module docstring)
PART1_SAMPLES = 4  # part 1's batch: one micro-batch (docs/performance.md records it so)
PRECISION_LENGTH = 512  # part 3's --max-length: the kernel-mode records fit it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="CI smoke: short samples, small vocabularies, one round"
    )
    ap.add_argument(
        "--parts",
        nargs="+",
        choices=("objectives", "head", "precision"),
        default=["objectives", "head", "precision"],
    )
    ap.add_argument(
        "--vocabs",
        nargs="+",
        type=int,
        default=[32000, 150000],
        help="output-layer rows for part 2 (default %(default)s; --quick: 8192)",
    )
    ap.add_argument(
        "--length", type=int, default=512, help="--max-length of the part-1 samples (--quick: 200)"
    )
    ap.add_argument("--seq", type=int, default=2048, help="tokens of the part-2 sample (--quick: 256)")
    ap.add_argument(
        "--precision-model",
        default=None,
        help="model of part 3 (default: SmolLM2 if built, else the tiny model; --quick: tiny)",
    )
    ap.add_argument("--precision-steps", type=int, default=12, help="steps of part 3 (--quick: 2)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.vocabs, args.length, args.seq, args.precision_steps = [8192], 200, 256, 3
    if args.precision_model is None:
        built = (SMOLLM2_MODEL / "config.json").is_file() and not args.quick
        args.precision_model = str(SMOLLM2_MODEL if built else TINY_MODEL)
    resolve_run_args(args)
    return args


def synthetic_samples(stage, tok, n: int, max_length: int) -> list[dict]:
    """stage 03's tokenized samples (tokenize_dataset, no regions artifact) + seeded regions and weights."""
    samples, _ = tokenize_dataset(load_sft(SFT_FILE)[:n], tok, max_length, None)
    rng = np.random.default_rng(0)
    for s in samples:
        s["r"] = rng.random(len(s["r"])) < REGION_SHARE
        s["w"] = float(rng.uniform(*WEIGHT_RANGE))
    return samples


def objective_steps(
    stage, model, samples: list[dict], pad_id: int, device: str
) -> dict[str, Callable[[], float]]:
    """objective -> one optimizer step of stage 03's loop on `samples` (returns the loss)."""
    defaults = stage.parse_args([])
    knobs = dict(rho=defaults.rho, tau_max=defaults.tau_max, profit_threshold=defaults.profit_threshold)
    net = stage.GoldLogProbs(model, defaults.chunk_rows)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-6
    )  # tiny: the weights barely move between variants
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))
    mb = collate(samples, pad_id, device)  # one micro-batch of them all
    N = float(sum(len(s["input_ids"]) - s["start"] for s in samples))  # before masking

    def step(objective: str) -> float:
        with autocast:
            log_q = net(mb["ids"], mb["attn"], mb["valid"])  # [b, L-1]
        loss, _ = stage.objective_loss(log_q, mb["valid"], mb["r"], mb["w"], N, objective, **knobs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), defaults.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    step("sft")  # AdamW state exists from here on: part of what is loaded, for every objective alike
    return {obj: (lambda obj=obj: step(obj)) for obj in stage.OBJECTIVES}


def head_variants(stage, model, sample: dict, pad_id: int, device: str) -> dict[str, Callable[[], float]]:
    """'plain model(labels=...)' and 'stage 03 chunked head' -> forward + backward of the sft loss."""
    mb = collate([sample], pad_id, device)
    labels = mb["ids"].masked_fill(torch.arange(mb["ids"].shape[1], device=device) < sample["start"], -100)
    net = stage.GoldLogProbs(model, stage.parse_args([]).chunk_rows)
    N = float(mb["valid"].sum())
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))

    def plain() -> float:
        with autocast:
            loss = model(
                input_ids=mb["ids"], attention_mask=mb["attn"], labels=labels
            ).loss  # mean over labels
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    def chunked() -> float:
        with autocast:
            log_q = net(mb["ids"], mb["attn"], mb["valid"])
        loss, _ = stage.objective_loss(log_q, mb["valid"], mb["r"], mb["w"], N, "sft")
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    return {"plain model(labels=...)": plain, "stage 03 chunked head": chunked}


def measure(found: dict[str, Callable[[], float]], model, args) -> tuple[dict, dict, dict]:
    """(losses, seconds per round, peak extra bytes) per variant; the first run doubles as a warm-up."""
    losses = {name: run() for name, run in found.items()}
    times = interleaved_times(found, args.repeats, args.device)
    memory = {
        name: peak_extra_memory(run, args.device, lambda: warm_up(model, args.device))
        for name, run in found.items()
    }
    return losses, times, memory


def bench_objectives(stage, tok, args) -> None:
    model = load_causal_lm(str(TINY_MODEL), torch.float32).to(args.device).train()
    samples = synthetic_samples(stage, tok, 2 if args.quick else PART1_SAMPLES, args.length)
    found = objective_steps(stage, model, samples, tok.pad_token_id, args.device)
    _, times, memory = measure(found, model, args)
    tokens = sum(len(s["input_ids"]) for s in samples)
    print(
        f"\n### objectives: one optimizer step, {len(samples)} samples, {tokens:,} tokens, tiny model "
        f"(vocabulary {model.config.vocab_size:,})\n"
    )
    rows = [
        [
            name,
            f"{statistics.median(t):.3f}",
            f"{1 / median_ratio(times, name, 'sft'):.2f}x",
            f"{memory[name] / MIB:,.0f}",
            f"{memory[name] / memory['sft']:.2f}x",
        ]
        for name, t in times.items()
    ]
    print_table(
        [
            "objective",
            f"step ({clock(args.device)[1]})",
            "time vs sft",
            "peak extra memory (MiB)",
            "memory vs sft",
        ],
        rows,
    )


def bench_head(stage, tok, args) -> None:
    sample = max(
        tokenize_dataset(load_sft(SFT_FILE), tok, args.seq, None)[0], key=lambda s: len(s["input_ids"])
    )
    hidden = AutoConfig.from_pretrained(TINY_MODEL).hidden_size
    print(
        f"\n### output layer: forward + backward of the sft loss, one sample of {len(sample['input_ids']):,} "
        f"tokens ({len(sample['input_ids']) - sample['start']:,} scored), "
        f"the tiny model's body (hidden {hidden})\n"
    )
    rows = []
    for vocab in args.vocabs:
        model = wide_model(vocab).to(args.device).train()
        found = head_variants(stage, model, sample, tok.pad_token_id, args.device)
        losses, times, memory = measure(found, model, args)
        plain, chunked = losses.values()
        if abs(plain - chunked) > 1e-3 * abs(plain):
            raise RuntimeError(
                f"vocabulary {vocab}: the chunked loss {chunked} differs from the plain {plain}"
            )
        for name, t in times.items():
            anchor = "plain model(labels=...)"
            rows.append(
                [
                    f"{vocab:,}",
                    name,
                    f"{statistics.median(t):.2f}",
                    f"{median_ratio(times, name, anchor):.2f}x",
                    f"{memory[name] / MIB:,.0f}",
                    f"{memory[name] / memory[anchor]:.2f}x",
                ]
            )
        del model, found  # before the next vocabulary's model exists, not after
    print_table(
        [
            "vocabulary",
            "variant",
            f"step ({clock(args.device)[1]})",
            "speed vs plain",
            "peak extra memory (MiB)",
            "memory vs plain",
        ],
        rows,
    )


def train_timed(stage, argv: list[str]) -> tuple[list[float], list[float], list[int]]:
    """Stage 03's main on argv: (loss, CPU seconds, response tokens) per step, the seconds between two
    calls of its step log (cuset_common/training/step_log.py)."""
    marks, rows = [time.process_time()], []
    logged = StepLog.__call__

    def timed(self, *a, **k):
        marks.append(time.process_time())
        line = logged(self, *a, **k)
        rows.append(json.loads(line))
        return line

    StepLog.__call__ = timed
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if stage.main(argv) != 0:
                raise RuntimeError(f"stage 03 failed: {argv}")
    finally:
        StepLog.__call__ = logged
    return [r["loss"] for r in rows], list(np.diff(marks)), [r["tokens"] for r in rows]


def training_ceiling(args) -> dict[str, float]:
    """Measure and print this machine's limits, and the training tokens per second they allow: a forward and
    backward pass is about 6 FLOP per parameter and token (2 forward, 4 backward; attention left out), so
    the GEMM rate over 6 N in each precision. Empty where the model's parameters cannot be counted."""
    limits = machine_limits(args.threads, args.device)
    print(limits_line(limits, args.threads, bf16_supported(args.device)))
    parameters = model_parameters(args.precision_model)
    if parameters is None:
        return {}
    ceiling = {p: limits[f"gemm_{p}"] / (6 * parameters) for p in ("fp32", "bf16")}
    print(
        f"ceiling: {parameters / 1e6:,.1f}M parameters, 6 FLOP each per trained token at the GEMM rate: "
        f"fp32 {ceiling['fp32']:,.0f} tokens/s, bf16 {ceiling['bf16']:,.0f} tokens/s\n"
    )
    return ceiling


def ceiling_share(rate: float, ceiling: dict[str, float], precision: str) -> str:
    """The measured rate as a share of its precision's ceiling."""
    return f"{rate / ceiling[precision]:.0%}" if precision in ceiling else "n/a"


def bench_precision(stage, args) -> None:
    steps, batch = args.precision_steps, 2 if args.quick else 8
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16"):
            argv = [
                "--model",
                args.precision_model,
                "--data",
                str(SFT_KERNEL_ORIGINALS_FILE),
                "--objective",
                "sft",
                "--max-steps",
                str(steps),
                "--batch-size",
                str(batch),
                "--lr",
                "1e-4",
                "--max-length",
                str(PRECISION_LENGTH),
                "--save-every",
                str(steps + 1),
                "--device",
                args.device,
                "--precision",
                precision,
                "--out",
                f"{tmp}/{precision}",
            ]
            found[precision] = train_timed(stage, argv)
    # the first step (warm-up: first allocations, lazy initialisation) is left out where there are more
    per_step = {p: statistics.median(t[1:] or t) for p, (_, t, _) in found.items()}
    rate = {p: sum(n[1:] or n) / sum(t[1:] or t) for p, (_, t, n) in found.items()}
    print(
        f"\n### precision: stage 03, {steps} steps of {batch} samples (max-length {PRECISION_LENGTH}) on "
        f"{Path(args.precision_model).name}, sft, lr 1e-4\n"
    )
    ceiling = training_ceiling(args)
    columns = ["precision", "step (CPU s, median after the 1st)", "tokens per CPU s", "vs fp32", "of ceiling"]
    print_table(
        columns,
        [
            [p, f"{per_step[p]:.2f}", f"{rate[p]:,.0f}", f"{rate[p] / rate['fp32']:.2f}x"]
            + [ceiling_share(rate[p], ceiling, p)]
            for p in found
        ],
    )
    rtol = BF16_LOSS_RTOL
    rows = [
        [str(k + 1), f"{a:.4f}", f"{b:.4f}", f"{(b - a) / a:+.2e}", "yes" if abs(b - a) <= rtol * a else "NO"]
        for k, (a, b) in enumerate(zip(found["fp32"][0], found["bf16"][0]))
    ]
    print()
    print_table(["step", "loss fp32", "loss bf16", "relative difference", f"within {rtol:.2e}"], rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.device = pick_device(args.device)
    stage = stage_module("03")
    tok = load_tokenizer(str(TINY_MODEL))
    if tok.pad_token_id is None:  # as stage 03 does
        tok.pad_token = tok.eos_token
    print(
        f"# research/bench/train.py{' --quick' if args.quick else ''}: "
        "stage 03's step per objective, and its chunked "
        f"head vs model(labels=...)\nmachine: {machine(args.device, args.threads)}; median of {args.repeats} "
        f"interleaved round(s)"
    )
    if "objectives" in args.parts:
        bench_objectives(stage, tok, args)
    if "head" in args.parts:
        bench_head(stage, tok, args)
    if "precision" in args.parts:
        bench_precision(stage, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
