"""Fresh input sets (docs/evaluation.md, "Input sets"), apart from the protocol in 04_eval_kernels.py: every
program is judged on the task's own input set and on --input-sets - 1 more, made by the task's own gen.py
under seeds drawn for this run, which no candidate can know.

A task's gen.py seeds its generators with a fixed number, so its inputs and reference outputs are the same
in every run and for every model: a program that writes the memorized outputs, or special-cases the inputs'
values, passes them. A fresh set is the same gen.py run through harness/reseed_gen.py, which mixes each
seed the script asks for with a secret: sha256 of the run's secret (drawn with `secrets` when the run
starts, kept in --out/SECRET_FILE so that a resumed run makes the same sets), the task and the set's name.
No task file is edited.

A fresh set is not used (the task is then judged on fewer sets, which the rows and the summary say) when
gen.py fails under it, when it writes the same files as for the task's own set (it draws nothing at
random, or seeds in a way reseed_gen does not replace), or when the task's own reference program does not
pass on it (the task check, or the row itself with --reference): the task's scripts then cannot judge a
right program on that set.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cuset_common.cli import UserError
from cuset_common.files import write_text_atomic
from harness import reseed_gen

TASK_SET = "task"  # the set the task's gen.py makes as it is written
SECRET_FILE = "input_sets.json"  # in --out: the run's secret
RESEED_SCRIPT = Path(reseed_gen.__file__)


def set_names(count: int) -> list[str]:
    """The names of a run's input sets, in the order programs run on them: the task's own, then fresh-1..."""
    return [TASK_SET, *(f"fresh-{i}" for i in range(1, count))]


def run_secret(out: Path) -> str:
    """The run's secret: read from --out/SECRET_FILE, or drawn now and written there (a new run, or --force,
    which starts from an empty folder). Not part of the fingerprint, which is computed before the folder
    is opened and must be equal on resume; --input-sets is."""
    path = out / SECRET_FILE
    if not path.exists():
        secret = secrets.token_hex(32)
        note = (
            "the secret behind this run's fresh input sets (harness/input_sets.py); never shown to a program"
        )
        write_text_atomic(path, json.dumps({"secret": secret, "note": note}, indent=2) + "\n")
        return secret
    try:
        secret = json.loads(path.read_text())["secret"]
    except (ValueError, KeyError, TypeError):
        secret = None
    if not (isinstance(secret, str) and secret):
        raise UserError(
            f"{path} is not as stage 04 wrote it; pass --force to start the run over, or name another --out"
        )
    return secret


def set_secret(run_secret_: str, task_id: str, name: str) -> str | None:
    """The secret reseed_gen mixes into one fresh set's seeds; None for the task's own set."""
    if name == TASK_SET:
        return None
    return hashlib.sha256(f"{run_secret_}:{task_id}:{name}".encode()).hexdigest()


def write_generator(task: dict, folder: Path, secret: str | None) -> str:
    """gen.py in `folder` and, for a fresh set (`secret` given), reseed_gen and its secret beside it.
    Returns the script to run there."""
    (folder / reseed_gen.GEN_SCRIPT).write_text(task["gen.py"])
    if secret is None:
        return reseed_gen.GEN_SCRIPT
    shutil.copy(RESEED_SCRIPT, folder / RESEED_SCRIPT.name)
    (folder / reseed_gen.SECRET_FILE).write_text(json.dumps({"secret": secret}))
    return RESEED_SCRIPT.name


@dataclass
class InputSet:
    """One input set of a task: its name (TASK_SET, fresh-1, ...), the folder gen.py wrote it in (data/
    there holds inputs and reference outputs), and why it is not used (None: it is)."""

    name: str
    folder: Path
    dropped: str | None = None


def make_input_sets(
    generate: Callable[[Path, str | None], str | None], folder: Path, names: list[str], secrets_: list
) -> tuple[list[InputSet], str | None]:
    """Each set's data in `folder`, the task's own set in gen/, fresh-i in gen-fresh-i/: generate(its
    folder, its secret) runs gen.py there and returns None or why it failed. Returns the sets and, when
    the task's own gen.py failed, why (a task_error; the fresh sets are then not made)."""
    sets = []
    for name, secret in zip(names, secrets_, strict=True):
        path = folder / ("gen" if name == TASK_SET else f"gen-{name}")
        failed = generate(path, secret)
        if failed and name == TASK_SET:
            return [], failed
        dropped = f"gen.py failed under a fresh seed: {failed.splitlines()[0]}" if failed else None
        if not failed and name != TASK_SET and same_files(sets[0].folder / "data", path / "data"):
            dropped = "gen.py wrote the same files as for the task's own set (it cannot be re-seeded here)"
        sets.append(InputSet(name, path, dropped))
    return sets, None


def same_files(a: Path, b: Path) -> bool:
    """The two folders hold the same file names with the same bytes (top level; read until a difference)."""
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    for name in names:
        pa, pb = a / name, b / name
        if pa.stat().st_size != pb.stat().st_size:
            return False
        with open(pa, "rb") as fa, open(pb, "rb") as fb:
            while chunk := fa.read(1 << 20):
                if chunk != fb.read(1 << 20):
                    return False
    return True


def mark_dropped_by_check(sets: list[InputSet], check: dict | None) -> None:
    """Leave out of the runs the fresh sets on which the task check saw the task's own reference fail. A
    set the check did not run (no check, or the reference failed on the task's own set, as under
    emulation where it may not run) stays."""
    seen = {r["seed"]: r["outcome"] for r in (check or {}).get("input_sets", [])}
    for s in sets:
        outcome = seen.get(s.name, "pass")
        if s.dropped is None and s.name != TASK_SET and outcome != "pass":
            s.dropped = f"the task's own reference ends {outcome} on it"


def judge_on_sets(
    run_one: Callable[[InputSet], tuple[str, str, dict]], sets: list[InputSet], reference: bool
) -> tuple[str, str, dict]:
    """A program run on each set in turn (run_one: execute()'s outcome, log and fields), as judged:
    a candidate passes only when it passes on every set, and the sets after the first it fails are not
    run; the task's own `reference` (the task check, or a --reference row) is judged on its task set and
    runs on the fresh sets only to show which the task can judge (mark_dropped_by_check). Returns the deciding
    run's outcome and log, its fields with run_s the longest run's, and input_sets: each set run, its
    name (seed) and outcome, in order; input_sets_dropped: the sets not used and why."""
    runs = []
    for s in [s for s in sets if s.dropped is None]:
        runs.append((s, *run_one(s)))
        if runs[-1][1] != "pass" and (not reference or s.name == TASK_SET):
            break
    failed = next((r for r in runs if r[1] != "pass"), None)
    decided, outcome, log, fields = runs[0] if reference or failed is None else failed
    if decided is not runs[0][0]:
        log = f"[harness] input set {decided.name}, drawn for this run (the task's own passed):\n{log}"
    records = [{"seed": s.name, "outcome": o, "run_s": f.get("run_s")} for s, o, _, f in runs]
    if reference:
        for s, o, _, _ in runs[1:]:
            if o != "pass":
                s.dropped = f"the task's own reference ends {o} on it"
    extra = {"run_s": max(f.get("run_s", 0) for *_, f in runs), "input_sets": records}
    dropped = [{"seed": s.name, "why": s.dropped} for s in sets if s.dropped]
    return outcome, log, fields | extra | ({"input_sets_dropped": dropped} if dropped else {})


def input_set_summary(rows: list[dict], requested: int) -> dict:
    """The summary's words on input sets: how many were asked for, the tasks judged on fewer (and which),
    and the rows a fresh set caught (they passed the task's own set and failed on a fresh one)."""
    fewer = sorted({r["task_id"] for r in rows if r.get("input_sets_dropped")})
    ran = [r["input_sets"] for r in rows if r["outcome"] != "pass" and len(r.get("input_sets", [])) > 1]
    caught = sum(sets[0]["outcome"] == "pass" for sets in ran)
    return {"requested": requested, "tasks_on_fewer_sets": len(fewer), "tasks": fewer, "caught": caught}
