"""When a step is finished, and how an interrupted one continues. A step is finished when its artifact
exists, matches what would be run now (the arguments its stage records, stage 04's fingerprint.json, the
data's sha256) and is newer than the artifacts it reads; an interrupted one continues with its stage's own
--resume where the state it left is the same run's, else starts over. A run whose training diverged (stage
03 stopped on a loss, gradient or weight that is not finite) is done too: its record says so, and the
report shows it as diverged, not as numbers of a model that was never made."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from cuset_common.artifacts import args_to_json
from cuset_common.files import sha256_file, write_text_atomic
from cuset_common.profiler.shards import partial_dir
from cuset_common.training.checkpoint import resume_dir
from cuset_common.training.divergence import DIVERGED
from harness.eval_options import parse_args as eval_args
from harness.programs import gpu_name, resolve_backend
from harness.run_folder import run_fingerprint
from research.comparison.stages import RESUME_MAY_CHANGE, stage_args


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when it is absent, unreadable or not an object (its step runs again)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def summary_problem(summary: dict | None) -> str | None:
    """What keeps the table from reading a stage-04 summary.json (read_json's value: None when it is
    absent or no JSON object), in words; None when it holds all the table reads."""
    if summary is None:
        return "absent, or not a JSON object"
    k, over = summary.get("num_samples"), summary.get("overall")
    if type(k) is not int or k < 1:
        return "num_samples must be an integer >= 1"
    if not isinstance(summary.get("backend"), str):
        return "backend must be a string"
    if not isinstance(over, dict):
        return "overall must be an object"
    rates = ("compile_rate", "pass@1", *([f"pass@{k}"] if k > 1 else []))  # pass@k: pass@1 when k is 1
    if isinstance(over, dict) and over.get("pass@1", 0) is None:
        return (
            "overall.pass@1 is null: no row was judged (each was task_error, generation_error or unsupported)"
        )
    if bad := [r for r in rates if type(over.get(r)) not in (int, float) or not 0 <= over[r] <= 1]:
        return f"overall.{bad[0]} must be a number in [0, 1]"
    return None


def same_args(saved: dict, now, ignore: set[str]) -> bool:
    """The arguments a stage recorded equal those it would be given now, but for `ignore`."""
    if not isinstance(saved, dict):  # an edited or damaged record: the step runs again
        return False
    now = args_to_json(now)
    return all(saved.get(k) == now.get(k) for k in set(saved) | set(now) if k not in ignore)


@functools.cache
def data_sha256(path: str, mtime_ns: int) -> str:
    """sha256 of a data file, once per version of it (finished() asks for every step)."""
    return sha256_file(Path(path))


def fingerprint(step: dict) -> dict:
    """What stage 04 would record in fingerprint.json for this step (its own function, on its own
    parsing: harness/run_folder.py, harness/eval_options.py)."""
    now = eval_args(step["argv"])
    return run_fingerprint(now, resolve_backend(now.backend, gpu_name()))


def stamp_file(step: dict) -> Path:
    """The file a step writes last, which says it finished: stage 04's summary.json, else meta.json."""
    return step["out"] / ("summary.json" if step["stage"] == "04" else "meta.json")


def finished(step: dict) -> bool:
    """The step's artifact exists, matches what would be run now, and is newer than what it reads."""
    out, stage = step["out"], step["stage"]
    stamp = stamp_file(step)
    if not stamp.exists() or any(
        not p.exists() or p.stat().st_mtime > stamp.stat().st_mtime for p in step["inputs"]
    ):
        return False
    if stage == "04":  # a summary.json the table cannot read (damaged, edited by hand) is made again
        return summary_problem(read_json(stamp)) is None and read_json(
            out / "fingerprint.json"
        ) == fingerprint(step)
    meta, now = read_json(stamp) or {}, stage_args(stage, step["argv"])
    if not same_args(meta.get("args", {}), now, {"force"} if stage == "02" else RESUME_MAY_CHANGE[stage]):
        return False
    weights = ("model.safetensors", "model.safetensors.index.json")  # one file, or shards and their index
    if stage == "03" and not (meta.get("final_step") and any((out / w).exists() for w in weights)):
        return False
    data = meta.get("data")
    return stage == "02" or (
        isinstance(data, dict)
        and data.get("sha256") == data_sha256(str(now.data), now.data.stat().st_mtime_ns)
    )


def continuation(step: dict, log) -> tuple[str, ...]:
    """Arguments that continue an interrupted step, or start it over where it cannot continue: another run's
    state, or one older than what the step reads (a checkpoint or regions made again since), is not
    resumed."""
    out, stage = step["out"], step["stage"]

    def resumable(state: Path) -> bool:
        saved = read_json(state)
        return (
            saved is not None
            and not any(p.exists() and p.stat().st_mtime > state.stat().st_mtime for p in step["inputs"])
            and same_args(saved.get("args", saved), stage_args(stage, step["argv"]), RESUME_MAY_CHANGE[stage])
        )

    if stage == "01" and (partial_dir(out) / "state.json").exists():
        if resumable(partial_dir(out) / "state.json"):
            return ("--resume",)
        log(f"removing {partial_dir(out)}: partial results of another run")
        shutil.rmtree(partial_dir(out))
    if stage == "03":
        if resumable(resume_dir(out) / "args.json"):
            return ("--resume",)
        return ("--force",) if out.exists() and any(out.iterdir()) else ()
    if stage == "04" and read_json(out / "fingerprint.json") not in (None, fingerprint(step)):
        return ("--force",)
    return ()


def diverged_file(step: dict) -> Path:
    """Where the comparison records that a run's training diverged: beside its checkpoint folder, which
    stage 03 leaves as it was (or empty, or with its last resume state)."""
    return step["out"].parent / "diverged.json"


def stage_diverged(log_tail: str) -> str | None:
    """The error line of a stage-03 call that stopped because the run diverged (its output's last line,
    cuset_common/training/divergence.py's DIVERGED), without `error: `; None for any other failure."""
    last = (log_tail.strip().splitlines() or [""])[-1]
    return last.removeprefix("error: ") if last.startswith(f"error: {DIVERGED}") else None


def record_diverged(step: dict, message: str) -> None:
    """Record that this training step diverged, with the arguments it ran with: a later call with the same
    arguments reports the run as diverged instead of training it again (it would diverge again)."""
    record = {"argv": step["argv"], "message": message}
    write_text_atomic(diverged_file(step), json.dumps(record, indent=2) + "\n")


def diverged(step: dict, fresh: bool = True) -> str | None:
    """Stage 03's message when this training step diverged, else None. fresh: the record must be of the
    arguments the step would run with now, and newer than what it reads (regions made again since are
    another training); --report-only reads a record as it is (its paths are another folder's, and checkout
    times are no mtimes)."""
    if step["stage"] != "03":
        return None
    path = diverged_file(step)
    record = read_json(path)
    if record is None or not isinstance(record.get("message"), str):
        return None
    if fresh and (
        record.get("argv") != step["argv"]
        or any(p.exists() and p.stat().st_mtime > path.stat().st_mtime for p in step["inputs"])
    ):
        return None
    return record["message"]


def training_diverged(steps: list[dict], fresh: bool = True) -> str | None:
    """diverged() of a run's training step (None for the base group, which trains nothing)."""
    return next((m for s in steps if (m := diverged(s, fresh))), None)


def group_done(steps: list[dict]) -> bool:
    """A group needs no more stage calls: every step finished, or its training diverged (the steps after
    it have no model to read)."""
    return training_diverged(steps) is not None or all(finished(s) for s in steps)
