"""Stage 01's batching and bookkeeping: `auto` batch sizes and chunk rows per device, the batch plan
(docs/performance.md), its progress lines, the check that some sample keeps a response token, line numbers
of token offsets, the printed summary."""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cuset_common.artifacts import path_text
from cuset_common.cli import UserError
from cuset_common.progress import Progress
from cuset_common.trackers import Trackers

AUTO = {"batch_size": {"cpu": 1, "gpu": 8}, "chunk_rows": {"cpu": 128, "gpu": 1024}}  # `auto` per device


def for_device(name: str, value: int | str, device: str) -> int:
    """--batch-size or --chunk-rows (name: batch_size, chunk_rows) with auto resolved for the device.

    On a CPU, one sample per batch: right padding and the masked attention it needs cost more than the
    larger matrix products gain; and 128 rows per output-layer chunk: the passes over a [rows, vocab]
    block (log-softmax, exp, sums) then run from cache, where larger and smaller chunks were slower. Both
    keep stage 01 at or above the per-sample loop a user writes first (research/bench/profiling.py; the
    figures: docs/performance.md, "Stage 01 against the per-sample loop"). On a GPU, larger batches and
    chunks, to fill the device (docs/notebook.md says what is measured there)."""
    return value if value != "auto" else AUTO[name]["cpu" if device == "cpu" else "gpu"]


def make_batches(encs: list[dict], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Sample indices grouped longest first (little padding; an out-of-memory shows at once)."""
    order = sorted((i for i, e in enumerate(encs) if e["spans"]), key=lambda i: -len(encs[i]["input_ids"]))
    batches, pos = [], 0
    while pos < len(order):
        size = max(1, min(batch_size, batch_tokens // len(encs[order[pos]]["input_ids"])))
        batches.append(order[pos : pos + size])
        pos += size
    return batches


def batch_progress(
    batch_tokens: list[int], start: int, log_every: float, trackers: Trackers
) -> Callable[[int], None]:
    """Stage 01's progress on the one display (cuset_common/progress.py; a line every log_every seconds off
    a terminal, and after the last batch): tokens done (padding excluded), batch k/K, this run's rate, ETA.
    batch_tokens: tokens per batch of the plan; start: the first batch this run scores, which a resumed
    run says first. Returns what to call once batch k is scored; it also logs the tokens done and the rate
    to the trackers (--report-to), at step k + 1.

    On stdout, with the stage's other lines: its stderr holds only an error, in one line."""
    total, before = sum(batch_tokens), sum(batch_tokens[:start])
    if start:
        print(
            f"[profile] resuming at batch {start + 1}/{len(batch_tokens)}: {before}/{total} tokens done",
            flush=True,
        )
    progress = Progress("profile", total, before, every_s=log_every, stream=sys.stdout)
    resumed, t0 = f" (resumed at batch {start + 1})" if start else "", time.monotonic()

    def batch_done(k: int) -> None:
        done = progress.done + batch_tokens[k]
        rate = (done - before) / max(time.monotonic() - t0, 1e-9)  # tokens per second of this run
        progress(
            batch_tokens[k],
            detail=f" tokens | batch {k + 1}/{len(batch_tokens)} | {rate:,.0f} tok/s{resumed}",
        )
        trackers.log({"tokens_done": done, "tokens_per_s": rate}, step=k + 1)

    return batch_done


def check_response_tokens(encs: list[dict], args: argparse.Namespace) -> None:
    """Refuse data none of whose samples keeps a response token: its profile would hold nothing."""
    if not any(e["spans"] for e in encs):
        raise UserError(
            f"{args.data}: none of its {len(encs)} samples keeps a response token within "
            f"--max-length {args.max_length} (the prompts fill it); raise --max-length"
        )


def line_indices(text: str, starts: list[int]) -> list[int]:
    """0-based line number of each character offset in text."""
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    return [bisect.bisect_left(newlines, s) for s in starts]


def profile_figures(tensors: dict[str, np.ndarray], counts: dict, categories: dict[int, str]) -> dict:
    """Stage 01's findings in figures: the counts, mean confidence, entropy and accuracy over the response
    tokens, the CUDA-sensitive share, and the mean confidence of each category that occurs."""
    p0, c = tensors["p0"], tensors["c"]  # [T] each
    figures = {k: counts[k] for k in ("samples", "response_tokens", "truncated", "no_response")}
    if len(p0):
        figures |= {
            "mean_confidence": float(p0.mean()),
            "mean_entropy": float(tensors["entropy"].astype(np.float32).mean()),
            "token_accuracy": float(tensors["argmax_correct"].mean()),
            "cuda_sensitive_share": float((c > 0).mean()),
        }
    figures["categories"] = {
        name: {"tokens": int((c == code).sum()), "mean_confidence": float(p0[c == code].mean())}
        for code, name in categories.items()
        if (c == code).any()
    }
    return figures


def print_profile_summary(figures: dict, categories: dict[int, str], out: Path) -> None:
    """Stage 01's closing lines: profile_figures as a person reads them."""
    f = figures
    print(
        f"[profile] {f['samples']} samples, {f['response_tokens']} response tokens, "
        f"{f['truncated']} truncated, {f['no_response']} without response tokens"
    )
    if "mean_confidence" in f:
        print(
            f"[profile] mean confidence {f['mean_confidence']:.3f}, mean entropy {f['mean_entropy']:.3f} "
            f"nats, token accuracy (argmax = gold) {f['token_accuracy']:.1%}, "
            f"CUDA-sensitive {f['cuda_sensitive_share']:.1%} of tokens"
        )
    for code, name in categories.items():
        if cat := f["categories"].get(name):
            print(
                f"  {code} {name:<16} {cat['tokens']:>7} tokens  mean confidence {cat['mean_confidence']:.3f}"
            )
    print(f"[profile] wrote {path_text(out)}")
