"""Stage 03's samples: each record tokenized as stages 01 and 02 tokenized it (cuset_common.data), aligned
with stage 02's regions artifact (its r_it and w_i; with --mask-source profile also the stage-01 profile's
p0_it), and batched (collate). The TRL port (research/trl_sft.py) and the worked trace (trace.py) read them
here too.

A sample is {input_ids, start (its first response token), r [n_i] bool, w, p0 [n_i] or None}. The artifacts
are checked against this run's tokenizer and data before any work; --force accepts other inputs, except
tokens that would not line up (another --max-length, another profile).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cuset_common.artifacts import check_meta_matches, read_artifact, tokenizer_fingerprint
from cuset_common.cli import UserError
from cuset_common.data import encode_sample, right_pad
from cuset_common.data_sources import data_checks
from cuset_common.files import sha256_file
from cuset_common.models import load_tokenizer

REGIONS_HINT = "python 02_label_regions.py (after python 01_profile.py) with this --model and --data"


@dataclass
class Inputs:
    """The run's tokenizer and samples, and what the checkpoint's meta.json records of them."""

    tokenizer: object
    tok_fp: str  # tokenizer_fingerprint
    data_id: dict  # load_data's identity of the data
    regions: dict | None  # load_regions, None where the objective reads no regions
    max_length: int
    samples: list[dict]
    skipped: int  # samples whose prompt fills max_length: no response token


def regions_needed(args, objectives: dict) -> bool:
    """Whether the run reads stage 02's artifact: its objective uses r_it or w_i (objectives: stage 03's
    OBJECTIVES), or its mask reads the profile's p0 (--mask-source profile)."""
    return objectives[args.objective].uses_regions or args.mask_source == "profile"


def load_samples(args, records: list[dict], data_id: dict, with_regions: bool) -> Inputs:
    """The tokenizer, the regions (with_regions: regions_needed) and the samples of these records, each
    checked before any work: artifacts of other inputs, a --max-length other than the regions', fewer
    samples than a batch."""
    tokenizer = padding_tokenizer(args.model)
    tok_fp = tokenizer_fingerprint(tokenizer)
    regions = load_regions(args, tok_fp, data_id) if with_regions else None
    max_length = resolve_max_length(args, regions)
    samples, skipped = tokenize_dataset(records, tokenizer, max_length, regions)
    check_enough_samples(args, len(samples), skipped)
    return Inputs(tokenizer, tok_fp, data_id, regions, max_length, samples, skipped)


def padding_tokenizer(model: str):
    """The model's tokenizer, padding with its end-of-sequence token where it names no pad token."""
    tokenizer = load_tokenizer(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_regions(args, tok_fp: str, data_id: dict, trace: bool = False) -> dict:
    """Stage 02's artifact, checked against this run's tokenizer and data: {meta, offsets, r (r_it [T]),
    w (w_i [S]), tensors (all of them)}, and with --mask-source profile (or for the trace) {profile (its
    tensors), p0 (p0_it [T])}. The trace needs tau_i and m_i as well, and the profile's c_it."""
    if not (args.regions / "meta.json").exists():
        who = "--trace" if trace else f"--objective {args.objective}"
        raise UserError(
            f"{who} needs the regions artifact of stage 02, not found at {args.regions}; run {REGIONS_HINT}, "
            "or pass --regions"
        )
    per_sample = {"w": np.float32, **({"tau": np.float32, "m": np.float32} if trace else {})}
    tensors, meta = read_artifact(
        args.regions,
        "02_label_regions",
        REGIONS_HINT,
        token_tensors={"region_id": np.int32},
        sample_tensors=per_sample,
    )
    expected = {"tokenizer_fingerprint": tok_fp, **data_checks(data_id)}
    found = {"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"), **data_checks(meta.get("data"))}
    check_meta_matches(found, expected, args.regions, REGIONS_HINT, args.force)
    offsets = tensors["sample_offsets"]
    out = {
        "meta": meta,
        "offsets": offsets,
        "r": tensors["region_id"] >= 0,
        "w": tensors["w"],
        "tensors": tensors,
    }
    if args.mask_source == "profile" or trace:
        wanted = {"p0": np.float32, **({"c": np.uint8} if trace else {})}
        out["profile"] = load_profile(args, meta, offsets, expected, wanted)
        out["p0"] = out["profile"]["p0"]
    return out


def load_profile(args, regions_meta: dict, offsets: np.ndarray, expected: dict, wanted: dict) -> dict:
    """The tensors of the stage-01 profile that stage 02 read (--mask-source profile: its p0), refused if it
    changed since.

    The regions artifact records the profile's absolute path and the sha256 of its meta.json: a profile
    rewritten since (stage 01 rerun on other data into the same folder) would otherwise silently mask other
    tokens than the regions were labelled on.
    """
    recorded = regions_meta["profile"]  # {path, meta_sha256}: read_artifact checked both are there
    prof_dir = Path(recorded["path"])
    hint = (
        f"python 01_profile.py --out {prof_dir}, then python 02_label_regions.py --profile {prof_dir} "
        f"--out {args.regions}, with this --model and --data"
    )
    prof, meta = read_artifact(prof_dir, "01_profile", hint, token_tensors=wanted)
    if sha256_file(prof_dir / "meta.json") != recorded["meta_sha256"] and not args.force:
        raise UserError(
            f"{prof_dir} is not the profile {args.regions} was labelled on (its meta.json "
            f"sha256 differs from the one stage 02 recorded); rerun {hint}, or pass --force"
        )
    found = {"tokenizer_fingerprint": meta.get("tokenizer_fingerprint"), **data_checks(meta.get("data"))}
    check_meta_matches(found, expected, prof_dir, hint, args.force)
    # Not overridable by --force: with other offsets, p0 would be read for the wrong tokens.
    if not np.array_equal(prof["sample_offsets"], offsets):
        raise UserError(
            f"{prof_dir}: its samples and response tokens ({len(prof['sample_offsets']) - 1}, "
            f"{int(prof['sample_offsets'][-1])}) do not line up with {args.regions} "
            f"({len(offsets) - 1}, {int(offsets[-1])}); rerun {hint}"
        )
    return prof


def resolve_max_length(args, regions: dict | None) -> int:
    """--max-length, else the regions artifact's (the masks line up only with the same), else 1024."""
    max_length = args.max_length or (regions["meta"]["max_length"] if regions else 1024)
    if regions and max_length != regions["meta"]["max_length"]:
        raise UserError(
            f"--max-length {max_length} differs from the regions artifact's "
            f"{regions['meta']['max_length']}; region masks would not line up"
        )
    return max_length


def tokenize_dataset(
    records: list[dict], tokenizer, max_length: int, regions: dict | None
) -> tuple[list[dict], int]:
    """encode_sample for every record (the same tokenization as stage 01), plus its region slice.

    Returns (samples, skipped): a sample whose prompt fills max_length has no response token and is
    skipped (counted), after its alignment with the regions artifact's offsets is checked.
    """
    samples = [aligned_sample(tokenizer, rec, i, max_length, regions) for i, rec in enumerate(records)]
    kept = [s for s in samples if len(s["input_ids"]) > s["start"]]
    return kept, len(samples) - len(kept)


def aligned_sample(tokenizer, record: dict, i: int, max_length: int, regions: dict | None) -> dict:
    """Record i (the i-th sample of the artifacts too) tokenized, with its slice of the regions artifact."""
    enc = encode_sample(tokenizer, record, max_length)
    n_resp = len(enc["input_ids"]) - enc["response_start"]
    s = {
        "input_ids": enc["input_ids"],
        "start": enc["response_start"],
        "w": 1.0,
        "r": np.zeros(n_resp, dtype=bool),
    }
    s["p0"] = None
    if regions is not None:
        lo, hi = int(regions["offsets"][i]), int(regions["offsets"][i + 1])
        if hi - lo != n_resp:
            raise UserError(
                f"{record.get('id')}: {n_resp} response tokens here but {hi - lo} in the regions "
                "artifact; rerun stages 01 and 02 with the same --max-length and data"
            )
        s.update(
            r=regions["r"][lo:hi],
            w=float(regions["w"][i]),
            p0=regions["p0"][lo:hi] if "p0" in regions else None,
        )
    return s


def check_enough_samples(args, n_samples: int, skipped: int) -> None:
    if n_samples < args.batch_size:
        raise UserError(
            f"{args.data}: {n_samples} samples with response tokens ({skipped} skipped: prompt fills "
            f"--max-length), fewer than --batch-size {args.batch_size}; "
            + ("raise --max-length" if skipped else "lower --batch-size")
        )


def collate(samples: list[dict], pad_id: int, device: str) -> dict:
    """Right-padded batch. Position t predicts token t+1, so targets are input_ids shifted."""
    ids, attn = right_pad([s["input_ids"] for s in samples], pad_id)  # [B, L] each
    b, length = ids.shape
    valid = torch.zeros((b, length - 1), dtype=torch.bool)  # over target positions
    r = torch.zeros((b, length - 1), dtype=torch.bool)
    p0 = torch.ones((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        n, start = len(s["input_ids"]), s["start"]
        # response token j sits at position start + j and is predicted from position start + j - 1
        lo, hi = start - 1, n - 1
        valid[i, lo:hi] = True
        r[i, lo:hi] = torch.from_numpy(np.asarray(s["r"], dtype=bool))
        if s["p0"] is not None:
            p0[i, lo:hi] = torch.from_numpy(np.asarray(s["p0"], dtype=np.float32))
    w = torch.tensor([s["w"] for s in samples], dtype=torch.float32)  # [B]
    batch = dict(ids=ids, attn=attn, valid=valid, r=r, p0=p0, w=w)
    return {k: v.to(device) for k, v in batch.items()}
