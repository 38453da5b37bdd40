"""The one rule for every stage's --out folder: what may be replaced (only an empty folder or the stage's own
artifact or run), the room and the rights it needs, the previous artifact kept aside until the new one is
complete, and stage 03's and 04's run files that make a folder theirs."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

from .cli import UserError
from .files import exists, real_path
from .out_lock import lock_out, release_out_locks

# ---------------------------------------------------------------------------------------
# Output folders (--out): one rule for every stage, checked before any work.
# ---------------------------------------------------------------------------------------
STAGES = ("01_profile", "02_label_regions", "03_train_cuset", "04_eval_kernels")
# What a stage-04 run folder holds (harness/run_folder.py), and what marks a stage-03 folder that has no
# meta.json yet (a run that is training, stopped or killed: its resume state, or one being written).
EVAL_RUN_FILES = (
    "results.jsonl",
    "completions.jsonl",
    "task_checks.jsonl",
    "summary.json",
    "summary.md",
    "fingerprint.json",
    "input_sets.json",
)
TRAIN_RUN_FILES = ("resume", ".resume.old", ".resume.tmp", ".final.tmp")
# The --out folders this process writes into in place (open_out), each with whether it started over there.
_OPENED: list[tuple[Path, bool]] = []


def artifact_stage(folder: Path) -> str | None:
    """The stage whose artifact (or run) the folder holds, or None: the stage its meta.json names, else
    stage 04 or 03 by the files their runs write."""
    try:
        stage = json.loads((folder / "meta.json").read_bytes()).get("stage")
    except (OSError, ValueError, AttributeError, RecursionError):
        stage = None
    if stage in STAGES:
        return stage
    for name, files in (("04_eval_kernels", EVAL_RUN_FILES), ("03_train_cuset", TRAIN_RUN_FILES)):
        if any((folder / f).exists() for f in files):
            return name
    return None


def check_out_dir(
    out: Path, stage: str, inputs: dict[str, Path | None], force: bool | None, need_bytes: int = 0
) -> None:
    """Refuse an --out this stage must not replace, before any work (UserError, one line).

    A stage replaces --out only if it is absent, empty, or an artifact of its own stage (of another stage
    with --force); a file, a folder of anything else, or the folder of an input (inputs: {flag: path}) is
    refused whatever --force says. force: None for a stage without --force. Before it looks into the
    folder it checks the room (check_room(need_bytes)) and takes the lock of --out (lock_out: one run per
    folder, held until the stage's main returns, finishes_out), so that what it finds there is no other
    run's half-written state; check_writable comes last.

    An --out that is a symbolic link is followed: these checks, and every later step (write_artifact,
    open_out, finishes_out), act on the folder it points to (real_path); the link itself is never moved.
    """
    out, real = Path(out), real_path(out, "--out")
    if real.exists() and not real.is_dir():
        raise UserError(f"--out {out} is a file; name a folder (the stage writes its files inside)")
    for flag, path in inputs.items():
        holder = Path(path).resolve() if path is not None and exists(path) else None
        if holder is not None and not holder.is_dir():
            holder = holder.parent
        if holder is not None and (holder == real or real in holder.parents):
            raise UserError(
                f"--out {out} holds {flag} {path}: writing there would replace the input; name another --out"
            )
    check_room(out, need_bytes)
    lock_out(out)
    try:
        entries = sorted(p.name for p in real.iterdir()) if real.is_dir() else []
    except OSError as e:
        raise UserError(
            f"--out {out}: cannot be read ({e.strerror}); name a folder you can read and write"
        ) from None
    owner = artifact_stage(real) if entries else None
    if entries and owner is None:
        raise UserError(
            f"--out {out} holds files that are not an artifact of this project (e.g. "
            f"{entries[0]}); name another --out (an absent or empty folder, or an artifact to "
            "replace)"
        )
    if owner not in (None, stage) and not force:
        hint = "name another --out" if force is None else "pass --force to replace it, or name another --out"
        raise UserError(f"--out {out} holds a {owner} artifact, not a {stage} one; {hint}")
    check_writable(out, real)


def check_writable(out: Path, real: Path) -> None:
    """Refuse an existing --out that the stage could not replace or add to, before any work: a folder in it
    that cannot be read and written (its files could not be renamed or removed), or a file that cannot be
    (stage 04 appends to its own). os.access sees the mode, an immutable flag and a read-only mount."""
    effective = os.access in os.supports_effective_ids  # the user the stage runs as, under setuid too
    for folder, _, files in os.walk(real):
        for path in [Path(folder), *(Path(folder) / f for f in files)]:
            need = os.R_OK | os.W_OK | (os.X_OK if path.is_dir() else 0)
            if not path.is_symlink() and not os.access(path, need, effective_ids=effective):
                raise UserError(
                    f"--out {out}: {path} is read-only here (its mode, an immutable flag or a "
                    f"read-only mount); make it writable (chmod -R u+w), or name another --out"
                )


def size_text(n: float) -> str:
    """Bytes with the unit that shows them (decimal, as disks are sold): 512 B, 20.5 KB, 146.6 MB, 1.2 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def check_room(out: Path, need_bytes: int) -> None:
    """Refuse an --out that cannot be written, or whose file system has less than need_bytes free, before the
    work (the stage would fail only at its end). Found out by writing a temp file where --out is made or
    replaced: in its parent (the nearest that exists), never in --out itself, which another process of the
    same run (DDP) may be checking at the same time."""
    real = real_path(out, "--out")
    base = next((p for p in real.parents if p.exists()), Path("/"))
    if not base.is_dir():
        raise UserError(f"--out {out}: {base} is a file, not a folder; name another --out")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".cuset-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(
            f"--out {out}: cannot write in {base} ({e.strerror}); name a folder you can write to"
        ) from None
    free = shutil.disk_usage(real if real.is_dir() else base).free
    if free < need_bytes:
        raise UserError(
            f"--out {out}: needs about {size_text(need_bytes)}, but {base} has {size_text(free)} free; free "
            f"some space or name another --out"
        )


def aside_dir(out: Path) -> Path:
    """Where a stage keeps the previous artifact of `out` while it writes the new one: a hidden sibling of
    the real folder (real_path), wherever a link named it from."""
    real = real_path(out, "--out")
    return real.with_name(f".{real.name}.previous")


def open_out(out: Path, start_over: bool) -> None:
    """Make `out` ready for a stage that writes its artifact in place (03, 04): continue what is there, or
    start over (--force) with the previous artifact moved to aside_dir(out), to be put back if the stage
    fails and deleted only once it succeeds (finishes_out). A kill leaves it aside, and `out` holds the
    killed run: a later success there deletes the aside; a later start-over discards the killed run.
    A link as `out` is followed: all of this happens to the real folder, the link stays."""
    out = real_path(out, "--out")
    aside = aside_dir(out)
    if start_over and aside.exists():
        shutil.rmtree(out, ignore_errors=True)  # the killed run's partial state; aside holds the artifact
    elif start_over and out.is_dir() and any(out.iterdir()):
        os.replace(out, aside)
    out.mkdir(parents=True, exist_ok=True)
    _OPENED.append((out, start_over))


def finishes_out(main_fn):
    """A stage's main that settles its --out when it ends: releases the lock (lock_out), however main ends,
    and settles what open_out set aside: put back over the new, incomplete artifact if main fails (an
    exception), deleted once main returns. An interrupt (Ctrl-C) keeps both: the new run can be resumed,
    the previous artifact waits aside."""

    @functools.wraps(main_fn)
    def main(argv: list[str] | None = None) -> int:
        try:
            code = main_fn(argv)
        except Exception:
            for out, started_over in _OPENED:
                if started_over and aside_dir(out).exists():
                    shutil.rmtree(out, ignore_errors=True)
                    os.replace(aside_dir(out), out)
            raise
        else:
            for out, _ in _OPENED:
                shutil.rmtree(aside_dir(out), ignore_errors=True)
            return code
        finally:
            _OPENED.clear()
            release_out_locks()

    return main


def check_train_out(args, regions: Path | None, resumable: bool = True) -> None:
    """Stage 03's --out (and research/trl_sft.py's, which cannot resume: resumable False), before any work:
    the rule of every stage (check_out_dir), and a folder with a run in it is continued with --resume or
    started over with --force, never silently."""
    inputs = {"--data": args.data, "--model": Path(args.model), "--regions": regions}
    check_out_dir(args.out, "03_train_cuset", inputs, args.force)
    resuming = resumable and args.resume
    if args.out.is_dir() and any(args.out.iterdir()) and not (resuming or args.force):
        how = "pass --resume to continue that run, --force" if resumable else "pass --force"
        raise UserError(
            f"{args.out} exists and is not empty; {how} to start over (the previous one is kept until "
            "the new one finishes), or another --out"
        )
