"""Stage 01's batching: `auto` batch sizes and chunk rows per device, and the batch plan (docs/performance.md)."""
from __future__ import annotations

import argparse

AUTO = {"batch_size": {"cpu": 1, "gpu": 8}, "chunk_rows": {"cpu": 128, "gpu": 1024}}  # `auto` per device


def positive_or_auto(text: str) -> int | str:
    """--batch-size, --chunk-rows: `auto` or an integer >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1 (or auto)")
    return value


def for_device(name: str, value: int | str, device: str) -> int:
    """--batch-size or --chunk-rows (name: batch_size, chunk_rows) with auto resolved for the device.

    On a CPU, one sample per batch: right padding and the masked attention it needs cost more than the
    larger matrix products gain; and 128 rows per output-layer chunk: the passes over a [rows, vocab]
    block (log-softmax, exp, sums) then run from cache (on one thread with a 32k vocabulary, the output
    layer took 1.6x as long in 1024-row chunks, 1.4x in 32-row ones). Both keep stage 01 at or above the
    per-sample loop a user writes first (bench/profile.py; docs/performance.md). On a GPU, batches and
    large chunks fill the device (not measured yet)."""
    return value if value != "auto" else AUTO[name]["cpu" if device == "cpu" else "gpu"]


def make_batches(encs: list[dict], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Sample indices grouped longest first (little padding; an out-of-memory shows at once)."""
    order = sorted((i for i, e in enumerate(encs) if e["spans"]), key=lambda i: -len(encs[i]["input_ids"]))
    batches, pos = [], 0
    while pos < len(order):
        size = max(1, min(batch_size, batch_tokens // len(encs[order[pos]]["input_ids"])))
        batches.append(order[pos:pos + size])
        pos += size
    return batches
