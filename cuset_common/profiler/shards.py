"""Stage 01's partial results: shards of finished batches in <out>.partial/, what --resume continues from.

state.json holds what the result depends on (arguments, data, tokenizer, device); each shard
batches-B0-B1.safetensors the results of batches [B0, B1) of the run's deterministic batch plan, written
to a temp name and renamed, so a kill never leaves half a shard. --resume refuses another run's state
(check_partial) and a shard that does not continue the plan (load_shards)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from cuset_common.artifacts import check_resume_args, disk_full, path_text
from cuset_common.cli import UserError
from cuset_common.files import read_json_object, write_text_atomic

# A sample's results, in the order stage 01's score_batch returns them, with the dtype a shard keeps each in
# (all [n], over the shard's tokens).
SHARD_RESULTS = {"p0": np.float32, "entropy": np.float32, "argmax_correct": np.uint8}


def partial_dir(out: Path) -> Path:
    """Where a run keeps its finished batches until the artifact is written: `<out>.partial/` beside
    --out."""
    return out.with_name(out.name + ".partial")


def check_partial(partial: Path, run: dict, resume: bool, may_change: set[str]) -> None:
    """--resume continues the same run (arguments, data, tokenizer, device); without it, a killed run's
    partial results are neither reused nor deleted. may_change: the arguments that do not change the
    result."""
    state = partial / "state.json"
    if not resume:
        if state.exists():
            raise UserError(
                f"{partial}: a stopped run left partial results here; pass --resume (with the "
                f"same arguments) to continue it, or delete that folder to start over"
            )
        return
    if not state.exists():
        raise UserError(f"--resume: no partial run in {partial}; run without --resume")
    saved = read_json_object(state, f"delete {partial} to start over (its resume state is damaged)")
    if not isinstance(saved.get("args"), dict):
        raise UserError(f"{state}: records no arguments of the run; delete {partial} to start over")
    check_resume_args(saved["args"], run["args"], may_change, partial, restart=f"delete {partial}")
    wrong = [
        f"{k}: the run has {saved.get(k)!r}, now {v!r}"
        for k, v in run.items()
        if k != "args" and saved.get(k) != v
    ]
    if wrong:
        raise UserError(
            f"{partial}: --resume on other inputs than the run's own ({'; '.join(wrong)}); "
            f"resume with the same inputs, or delete {partial} to start over"
        )


def save_shard(partial: Path, run: dict, batches: list[list[int]], b0: int, b1: int, results: list) -> None:
    """Results of batches [b0, b1) as one shard, written to a temp name and renamed (never half a shard).
    A full disk or quota stops the run (UserError): the shards saved before stay, for --resume."""
    order = [i for b in batches[b0:b1] for i in b]
    tmp = partial / ".shard.tmp"
    columns = {
        name: np.concatenate([results[i][k] for i in order]).astype(dtype)
        for k, (name, dtype) in enumerate(SHARD_RESULTS.items())
    }
    samples = np.asarray(order, dtype=np.int64)  # [m] sample indices, batch order
    try:
        if not (partial / "state.json").exists():
            write_text_atomic(partial / "state.json", json.dumps(run, indent=2) + "\n")
        save_file({"samples": samples, **columns}, str(tmp))
        os.replace(tmp, partial / f"batches-{b0:06d}-{b1:06d}.safetensors")
    except Exception as e:
        tmp.unlink(missing_ok=True)
        if why := disk_full(e):
            raise UserError(
                f"{path_text(partial)}: {why} while finished batches were being saved there; the shards "
                "saved before are kept: free some space and rerun the same command with --resume"
            ) from None
        raise


def load_shards(partial: Path, batches: list[list[int]], encs: list[dict], results: list) -> int:
    """Put the shards' results in place; returns the first batch still to do."""
    done = 0
    for f in sorted(partial.glob("batches-*.safetensors")):  # zero-padded names sort in batch order
        b0, b1 = map(int, f.stem.split("-")[1:])
        t, order = read_shard(f, partial), [i for b in batches[b0:b1] for i in b]
        cuts = np.cumsum([0] + [len(encs[i]["spans"]) for i in order])
        if b0 != done or t["samples"].tolist() != order or any(len(t[n]) != cuts[-1] for n in SHARD_RESULTS):
            raise UserError(
                f"{f}: does not continue batch {done} of this run's plan; delete {partial} to start over"
            )
        for k, i in enumerate(order):
            results[i] = tuple(t[name][cuts[k] : cuts[k + 1]] for name in SHARD_RESULTS)
        done = b1
    return done


def read_shard(f: Path, partial: Path) -> dict[str, np.ndarray]:
    """One shard's tensors; UserError for one that cannot be read (cut short: by a crash before the file
    system had written it out, or a copy), that an older version wrote (a result missing), or that holds
    a non-finite score (no run of this version saves one: cuset_common/profiler/inputs.py, check_scores)."""
    try:
        t = load_file(str(f))
    except Exception as e:  # safetensors' SafetensorError, or OSError
        raise UserError(
            f"{path_text(f)}: cannot be read ({type(e).__name__}: {e}); delete it and the shards after it "
            f"to redo their batches with --resume, or delete {path_text(partial)} to start over"
        ) from None
    missing = [name for name in ("samples", *SHARD_RESULTS) if name not in t]
    if missing:
        raise UserError(
            f"{path_text(f)}: written by an older version of this stage (no {missing[0]}); delete "
            f"{path_text(partial)} to start over"
        )
    if not all(np.isfinite(t[name]).all() for name in ("p0", "entropy")):
        raise UserError(
            f"{path_text(f)}: holds non-finite scores (NaN or inf) of a model whose weights hold NaN or "
            f"inf; delete {path_text(partial)} and rerun with a model that gives finite log-probabilities"
        )
    return t
