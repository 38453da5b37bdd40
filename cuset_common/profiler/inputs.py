"""Stage 01's inputs as the profile records them: --data read once, so that the sha256 in the profile's
meta.json is that of the bytes profiled; and the check that the model's scores are finite."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import numpy as np

from cuset_common.artifacts import path_text
from cuset_common.cli import UserError
from cuset_common.data import load_sft
from cuset_common.data_sources import HUB_PREFIX, data_sha256, is_json_array, is_parquet, load_data
from cuset_common.files import open_input


def load_data_once(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(records, identity) as cuset_common.data_sources.load_data gives them, with a plain JSONL --data
    file read once: load_data hashes the file and then reads it again, so a file rewritten in between
    would be recorded under the sha256 of another than the one profiled. Every other source (a table, a
    folder, the hub, a mapping or filter; a pipe, which load_data reads once already) goes through
    load_data as it is, which stage 03 keeps for all."""
    path = Path(args.data)
    mapped = getattr(args, "data_fields", None) or getattr(args, "data_where", None)
    if mapped or str(path).startswith(HUB_PREFIX) or is_parquet(path) or not is_regular_file(path):
        return load_data(args)
    with open_input(path) as f:
        content = f.read()
    if is_json_array(path, content):  # a table of rows
        return load_data(args)
    return load_sft(path, content), {"path": str(path), "sha256": data_sha256(path, content)}


def check_scores(scored: list[tuple], batch: list[int], args: argparse.Namespace, use_bf16: bool) -> None:
    """Stop, before a shard or the artifact holds it, at a sample whose p0 or entropy is NaN or infinite
    (scored: score_batch's (p0, entropy, argmax_correct) per sample of the batch, `batch` their indices):
    a model whose weights hold NaN or inf gives such log-probabilities (so may bf16 that overflows), and
    no later stage can use them."""
    for i, (p0, entropy, _) in zip(batch, scored):
        if not (np.isfinite(p0).all() and np.isfinite(entropy).all()):
            bf16 = "; bf16 may overflow where fp32 does not: try --precision fp32" if use_bf16 else ""
            raise UserError(
                f"--model {path_text(args.model)}: gives non-finite log-probabilities (NaN or inf) on "
                f"sample {i} of --data (0-based, in data order), as a model whose weights hold NaN or inf "
                f"does; no profile was written. Rerun stage 01 with a model that gives finite "
                f"log-probabilities{bf16}"
            )


def is_regular_file(path: Path) -> bool:
    """A regular file (after links); False for anything else, and where the path cannot be asked about
    (load_data then says what is wrong with it)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return False
