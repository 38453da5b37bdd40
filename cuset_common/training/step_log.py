"""Stage 03's log line per optimizer step: the progress line on stdout and the row of log.jsonl (the TRL port,
research/trl_sft.py, writes the same). Besides loss and nll per response token, the CuSeT diagnostics of
docs/method.md "Objectives": the share of response tokens the mask drops, the share in regions and the mean
weight per token."""

from __future__ import annotations

import time

from cuset_common.progress import duration
from cuset_common.training.divergence import json_row


def log_step(
    step: int, total: int, stats: dict, optimizer, tokens_seen: float, t_start: float, steps_run: int
) -> str:
    """Print the step's progress line; return its log.jsonl row. stats: the step's sums (objective_loss's
    over its micro-batches and processes); masked_share = 1 - sum k / n, region_share = sum r / n,
    weight_mean = sum w / n over its n response tokens."""
    elapsed = time.time() - t_start
    n = max(stats["tokens"], 1)
    row = {
        "step": step,
        "loss": round(stats["loss"], 6),
        "nll": round(stats["nll_sum"] / n, 6),
        "masked_share": round(1 - stats["kept"] / n, 4),
        "region_share": round(stats["region"] / n, 4),
        "weight_mean": round(stats["weight_sum"] / n, 4),
        "lr": optimizer.param_groups[0]["lr"],
        "tokens": int(stats["tokens"]),
    }
    print(
        f"step {step:>5}/{total} | loss {row['loss']:.4f} | nll {row['nll']:.4f} | "
        f"masked {row['masked_share']:.1%} | region {row['region_share']:.1%} | "
        f"w {row['weight_mean']:.3f} | lr {row['lr']:.2e} | {tokens_seen / elapsed:,.0f} tok/s | "
        f"ETA {duration(elapsed / steps_run * (total - step))}",
        flush=True,
    )
    return json_row(row)  # a diverged step's NaN as null: log.jsonl stays JSON
