"""Stage 03's log of its optimizer steps (the TRL port, research/trl_sft.py, keeps the same): per step a row
of log.jsonl, the same row to the run's trackers (--report-to), and the progress display's line; at the end,
the run's curves as a PNG.

A row: loss and nll per response token; the CuSeT diagnostics of docs/method.md "Objectives" (the share of
response tokens the mask drops, the share in regions, the mean weight per token); lr and the gradient norm;
the response tokens (n) and all the tokens the model read (prompt and response, no padding); then the step's
clock: its seconds, the tokens read per second, its model FLOPs and MFU (cuset_common/training/mfu.py; null
without a peak)."""

from __future__ import annotations

import sys
import time

import torch

from cuset_common.figures import pyplot, save_figure
from cuset_common.progress import QUIET_EVERY_S, Progress
from cuset_common.trackers import Trackers
from cuset_common.training.divergence import json_row
from cuset_common.training.mfu import ModelFlops, mfu

CURVES_FILE = "curves.png"


def synchronize(device: str) -> None:
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class StepLog:
    """The log of one run's steps, from `step` (a resumed run's) to `total`: start() as a step begins (on
    every process), the log itself with the step's sums once it ended (on rank 0). peak: one device's peak
    FLOP/s (None: no MFU); world: the processes, each on a device of its own; every_s: seconds between
    progress lines off a terminal."""

    def __init__(
        self,
        model,
        total: int,
        step: int,
        device: str,
        peak: float | None,
        world: int,
        trackers: Trackers | None = None,
        every_s: float = QUIET_EVERY_S,
    ):
        self.flops, self.device, self.peak, self.world = ModelFlops(model), device, peak, world
        self.trackers = trackers or Trackers([])
        self.progress = Progress("train (steps)", total, done=step, every_s=every_s, stream=sys.stdout)
        self.t0 = time.perf_counter()

    def start(self) -> None:
        synchronize(self.device)
        self.t0 = time.perf_counter()

    def __call__(self, step: int, stats: dict, lr: float, lengths: list[tuple[int, int]]) -> str:
        """The step's row as a log.jsonl line; printed and tracked. stats: the step's sums over its
        micro-batches and processes (objective_loss's, the loss, grad_norm); lengths: (T, R) of each sample
        of the global batch, its tokens and its response tokens."""
        synchronize(self.device)
        seconds = time.perf_counter() - self.t0
        n, flops, read = max(stats["tokens"], 1), self.flops(lengths), sum(t for t, _ in lengths)
        row = {
            "step": step,
            "loss": round(stats["loss"], 6),
            "nll": round(stats["nll_sum"] / n, 6),
            "masked_share": round(1 - stats["kept"] / n, 4),
            "region_share": round(stats["region"] / n, 4),
            "weight_mean": round(stats["weight_sum"] / n, 4),
            "lr": lr,
            "grad_norm": round(stats["grad_norm"], 6),
            "tokens": int(stats["tokens"]),
            "sequence_tokens": read,
            "seconds": round(seconds, 4),
            "tokens_per_s": round(read / seconds, 1),
            "flops": flops,
            "mfu": None if (m := mfu(flops, seconds, self.peak, self.world)) is None else round(m, 5),
        }
        self.trackers.log(row, step)
        self.progress(1, detail=progress_detail(row))
        return json_row(row)  # a diverged step's NaN as null: log.jsonl stays JSON


def progress_detail(row: dict) -> str:
    """A step's figures on the progress line."""
    mfu_text = "" if row["mfu"] is None else f" | MFU {row['mfu']:.1%}"
    return (
        f" | loss {row['loss']:.4f} | nll {row['nll']:.4f} | masked {row['masked_share']:.1%} | "
        f"region {row['region_share']:.1%} | w {row['weight_mean']:.3f} | lr {row['lr']:.2e} | "
        f"{row['tokens_per_s']:,.0f} tok/s{mfu_text}"
    )


def write_curves(out, rows: list[dict]) -> bool:
    """<out>/curves.png: the loss and the masked share per step (one panel each); False without matplotlib
    (cuset_common/figures.py) or rows."""
    plt = pyplot()
    if plt is None or not rows:
        return False
    steps = [r["step"] for r in rows]
    fig, (loss_ax, masked_ax) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    loss_ax.plot(steps, [r["loss"] for r in rows], label="loss (the objective's)")
    loss_ax.plot(steps, [r["nll"] for r in rows], label="nll per response token", alpha=0.7)
    loss_ax.set_ylabel("nats per token")
    loss_ax.legend(fontsize=8)
    masked_ax.plot(steps, [r["masked_share"] for r in rows], label="masked share (1 - sum k / n)")
    masked_ax.plot(steps, [r["region_share"] for r in rows], label="region share (sum r / n)", alpha=0.7)
    masked_ax.set_xlabel("optimizer step")
    masked_ax.set_ylabel("share of response tokens")
    masked_ax.legend(fontsize=8)
    save_figure(fig, out / CURVES_FILE)
    return True
