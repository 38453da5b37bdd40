"""Stage 03's schedule: how many optimizer steps, the learning rate of each (lr_at) and the samples of each
global batch (batch_order). The TRL port (research/trl_sft.py) follows it to train the same model, and the
tiny model was trained on lr_at (data/build_tiny_model.py)."""

from __future__ import annotations

import math

import torch


def lr_at(step: int, total: int, warmup: int, peak: float, min_ratio: float) -> float:
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def batch_order(n: int, batch: int, epoch: int, seed: int) -> list[list[int]]:
    """This epoch's global batches: a seeded shuffle, the last partial batch dropped."""
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i : i + batch] for i in range(0, n - batch + 1, batch)]


def schedule(args, n_samples: int) -> tuple[int, int, int]:
    """(steps per epoch, total steps, warmup steps): --max-steps, else --epochs; warmup 5% by default."""
    steps_per_epoch = n_samples // args.batch_size
    total = args.max_steps or max(1, int(args.epochs * steps_per_epoch))
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, total // 20)
    return steps_per_epoch, total, warmup
