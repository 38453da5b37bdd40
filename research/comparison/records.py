"""Records: the finished results of --out without checkpoint weights (small enough to commit; their sizes:
docs/comparison.md), to make the table from as they are (--report-only) on a machine that has no runs/."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cuset_common.cli import UserError
from cuset_common.files import write_text_atomic
from research.comparison.plan import plan, step_groups
from research.comparison.steps import diverged_file, group_done, read_json, stamp_file, training_diverged

CKPT_KEPT = ("meta.json", "log.jsonl")  # of a checkpoint folder: its arguments and its training log


def without_weights(folder: str, names: list[str]) -> list[str]:
    """copytree's ignore: a checkpoint keeps CKPT_KEPT only (its weights and resume state stay behind)."""
    return [n for n in names if n not in CKPT_KEPT] if Path(folder).name == "ckpt" else []


def check_record_folder(record: Path, out: Path, groups: list[tuple[str, list[dict], Path]]) -> None:
    """--save-record must be a folder (or one to make) apart from --out: neither inside the other, so that
    a copy never lands in what it copies; and no folder it copies into may be a file."""
    holder = next((p for p in [record, *record.absolute().parents] if p.exists()), None)
    if holder is not None and not holder.is_dir():
        raise UserError(f"--save-record {record}: {holder} is a file; name a folder")
    targets = [record / name / step["out"].name for name, steps, _ in groups for step in steps]
    if file := next((t for p in targets for t in (p.parent, p) if t.is_file()), None):
        raise UserError(
            f"--save-record {record}: {file} is a file where the record keeps a folder; move it "
            f"away, or name another folder"
        )
    real_record, real_out = record.resolve(), out.resolve()
    if real_record == real_out or real_out in real_record.parents or real_record in real_out.parents:
        raise UserError(
            f"--save-record {record} and --out {out} overlap (one is the other or inside it); "
            f"the record is a copy of --out: name a folder outside it"
        )


def save_record(args) -> int:
    """Copy each finished group of --out into --save-record, step folder by step folder: a step's earlier
    copy is replaced, the others stay (a base model evaluated in another session keeps its results). Of a
    run whose training diverged, the record that says so (it has no other results)."""
    base_steps, runs = plan(args)
    saved = []
    for name, steps, folder in step_groups(args, base_steps, runs):
        if not group_done(steps):
            continue
        dest = args.save_record / name
        copy_results(steps, dest)
        timings = (read_json(dest / "timings.json") or {}) | (read_json(folder / "timings.json") or {})
        write_text_atomic(dest / "timings.json", json.dumps(timings, indent=2) + "\n")
        if (folder / "log.txt").exists():
            shutil.copyfile(folder / "log.txt", dest / "log.txt")
        saved.append(name)
    print(
        f"[compare] saved {len(saved)} finished group(s) into {args.save_record}: "
        f"{', '.join(saved) or 'none'}; the table: --report-only --out {args.save_record}"
    )
    return 0


def copy_results(steps: list[dict], dest: Path) -> None:
    """A done group's results into dest: each step's folder (a checkpoint without its weights), or of a run
    whose training diverged its record alone (it has no other results)."""
    if training_diverged(steps):
        record = next(diverged_file(s) for s in steps if s["stage"] == "03")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, dest / record.name)
        return
    for src in [s["out"] for s in steps]:
        tmp = dest / f".{src.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=without_weights)
        shutil.rmtree(dest / src.name, ignore_errors=True)
        os.replace(tmp, dest / src.name)


def missing_results(args, base_steps: list[dict], runs: list[dict]) -> list[str]:
    """`group (folder, ...)` for each group of --out that lacks artifacts the table reads: every step's but
    stage 03's and the base profile of the training data (the regions stand for it)."""
    missing = []
    for name, steps, _ in step_groups(args, base_steps, runs):
        if training_diverged(steps, fresh=False):  # no results: the record says it diverged
            continue
        read = [s for s in steps if s["stage"] != "03" and (s["stage"], s["out"].name) != ("01", "profile")]
        lacks = [s["out"].name for s in read if not stamp_file(s).exists()]
        missing += [f"{name} ({', '.join(lacks)})"] if lacks else []
    return missing
