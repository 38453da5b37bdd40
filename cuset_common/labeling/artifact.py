"""Stage 02's artifact (02_label_regions.py): its tensors, its meta.json (the profile it came from, which
stage 03 checks; the counts; the finding) and the room it needs on disk, asked for before any work."""

from __future__ import annotations

import argparse

import numpy as np

from cuset_common.artifacts import args_to_json
from cuset_common.files import json_safe
from cuset_common.labeling.labels import RegionLabels

STAGE = "02_label_regions"
# regions.html's bytes per token shown: its <span> with style and tooltip (about 130) and the line's markup
HTML_BYTES_PER_TOKEN = 256


def room_needed(t: dict, samples: list[dict], html_samples: int) -> int:
    """Bytes of the regions artifact, over-estimated before the work: region_id (4 a token); at most one
    region per sensitive token (each holds a seed), 17 bytes each; tau, m, w and sample_offsets (20 a
    sample); regions.html, the html_samples largest samples at HTML_BYTES_PER_TOKEN a token and 6 a
    character (`&` escaped is `&amp;`); 64 kB for report.md and meta.json."""
    n = np.diff(t["sample_offsets"])  # [S]
    page = HTML_BYTES_PER_TOKEN * n + 6 * np.array([len(s["response_text"].encode()) for s in samples])
    shown = np.sort(page)[::-1][:html_samples]  # [<= html_samples] the largest pages
    return 4 * len(t["p0"]) + 17 * int(np.count_nonzero(t["c"])) + 20 * len(n) + int(shown.sum()) + 65536


def regions_tensors(labels: RegionLabels) -> dict[str, np.ndarray]:
    """The regions artifact's tensors: regions per token and per region, and tau_i, m_i, w_i per sample."""
    return {
        "region_id": labels.region_id,
        "region_category": labels.region_category,
        "region_start": labels.region_start,
        "region_end": labels.region_end,
        "tau": labels.tau.astype(np.float32),
        "m": labels.m.astype(np.float32),
        "w": labels.w.astype(np.float32),
        "sample_offsets": labels.sample_offsets.astype(np.int64),
    }


def regions_meta(
    args: argparse.Namespace,
    profile_meta: dict,
    profile_sha: dict,
    labels: RegionLabels,
    finding: dict,
    seeds: int,
) -> dict:
    """meta.json: the run's arguments, the profile's identity (stage 03 checks it; profile_sha: the sha256
    of the bytes read of each of its files), counts (seeds: how many tokens seeded regions) and the
    finding."""
    inherited = ("model", "tokenizer_fingerprint", "data", "max_length", "categories")
    return {
        "stage": STAGE,
        "args": args_to_json(args),
        **{k: profile_meta.get(k) for k in inherited},
        "profile": {
            "path": str(args.profile.resolve()),
            "meta_sha256": profile_sha["meta.json"],
            "tensors_sha256": profile_sha["tensors.safetensors"],
        },
        "counts": {
            "samples": len(labels.n),
            "response_tokens": len(labels.p0),
            "regions": len(labels.region_start),
            "region_tokens": int((labels.region_id >= 0).sum()),
            "seeds": seeds,
        },
        "finding": json_safe(finding),
    }
