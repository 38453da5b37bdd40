"""Stage 02's input: the stage-01 profile (01_profile.py's artifact), read once and refused when foreign,
inconsistent or made from other inputs than --model and --data, before any work (docs/method.md
"Artifacts")."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cuset_common.artifacts import check_meta_matches, read_artifact_once, tokenizer_fingerprint
from cuset_common.cli import UserError
from cuset_common.data import jsonl_lines
from cuset_common.data_sources import data_checks, data_flags, load_data
from cuset_common.models import load_tokenizer

PROFILE_TENSORS = {
    "token_ids": np.int32,
    "p0": np.float32,
    "entropy": np.float16,
    "c": np.uint8,
    "char_start": np.int32,
    "char_end": np.int32,
    "line_index": np.int32,
}  # all [T]


def same_model(a: str, b: str) -> bool:
    """Model names match: equal strings, or two spellings of the same local folder."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def load_profile(args: argparse.Namespace) -> tuple[dict, dict, list[dict], dict[int, str], dict[str, str]]:
    """(tensors, meta, samples, category names, sha256 of each file) of the profile; refused when foreign,
    inconsistent or made from other inputs. Each file is read once, and its sha256 is that of the bytes
    parsed (read_artifact_once): what meta.json records as the source of the regions is what they came
    from, even if the profile is rewritten meanwhile."""
    hint = f"python 01_profile.py --model {args.model} {data_flags(args)} --out {args.profile}"
    read = read_artifact_once(
        args.profile, "01_profile", hint, token_tensors=PROFILE_TENSORS, also=("samples.jsonl",)
    )
    tensors, meta = read.tensors, read.meta
    fingerprint = tokenizer_fingerprint(load_tokenizer(args.model))
    seen = {
        "model": args.model if same_model(meta.get("model", ""), args.model) else meta.get("model"),
        **data_checks(meta.get("data")),
        "tokenizer_fingerprint": meta.get("tokenizer_fingerprint"),
    }
    expected = {"model": args.model, **data_checks(load_data(args)[1]), "tokenizer_fingerprint": fingerprint}
    check_meta_matches(seen, expected, args.profile, hint, args.force)
    try:
        samples = [s for _, s in jsonl_lines(args.profile / "samples.jsonl", read.files["samples.jsonl"])]
    except UserError as e:
        raise UserError(f"{e}; rerun {hint}") from None
    if not all(isinstance(s.get("response_text"), str) for s in samples):
        raise UserError(f"{args.profile}/samples.jsonl: a sample lacks its response_text; rerun {hint}")
    check_profile_tensors(tensors, len(samples), args.profile, hint)
    names = {int(k): v for k, v in sorted((meta.get("categories") or {}).items(), key=lambda kv: int(kv[0]))}
    if not set(np.unique(tensors["c"]).tolist()) <= {0, *names}:
        raise UserError(f"{args.profile}: meta.json 'categories' lacks a code used in 'c'; rerun {hint}")
    return tensors, meta, samples, names, read.sha256


def check_profile_tensors(t: dict, n_samples: int, where: Path, hint: str) -> None:
    """What read_artifact's generic check leaves: one offset per sample of samples.jsonl, lines in order."""

    def bad(msg: str) -> UserError:
        return UserError(f"{where}: {msg}; rerun {hint}")

    offsets, n_tokens = t["sample_offsets"], len(t["p0"])
    if len(offsets) != n_samples + 1:
        raise bad(f"sample_offsets cover {len(offsets) - 1} samples but samples.jsonl holds {n_samples}")
    if n_tokens == 0:
        raise bad("the profile holds no response tokens")
    p0 = t["p0"]
    outside = ~((p0 >= 0) & (p0 <= 1))  # [T]; NaN is in no interval
    if outside.any():
        first = int(np.argmax(outside))
        raise UserError(
            f"{where / 'tensors.safetensors'}: p0 holds {int(outside.sum())} of {n_tokens} values that are "
            f"not probabilities (NaN, infinite or outside [0, 1]; the first in sample "
            f"{int(np.searchsorted(offsets, first, side='right')) - 1}), as a model whose weights "
            f"diverged gives; rerun stage 01 with a model that gives finite probabilities: {hint}"
        )
    sample_of = np.repeat(np.arange(n_samples), np.diff(offsets))
    line_steps = np.diff(t["line_index"].astype(np.int64))[sample_of[1:] == sample_of[:-1]]
    if np.any(line_steps < 0):
        raise bad("line_index decreases within a sample")
