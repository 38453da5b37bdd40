"""Stage 04's run folder (--out), apart from the protocol in 04_eval_kernels.py: what defines a
run (its tasks, its fingerprint), resuming the same run or refusing another's folder, and reading
answers made elsewhere (--solutions). Rows, completions and task checks are appended as they
finish (Run), so a killed run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

from cuset_common.artifacts import json_kind
from cuset_common.cli import UserError
from cuset_common.device import resolve_precision
from cuset_common.files import (
    append_jsonl,
    read_appended_jsonl,
    read_jsonl,
    sha256_file,
    write_jsonl_atomic,
    write_text_atomic,
)
from cuset_common.out_dir import EVAL_RUN_FILES, check_out_dir, open_out
from cuset_common.paths import LEVELS
from cuset_common.tasks import load_tasks
from harness.input_sets import run_secret
from harness.vllm_generation import choose_engine, engine_device

# Room a job takes in --out: its row (logs clipped to harness.programs.LOG_KEEP characters, twice at most)
# and its completion (up to --max-new-tokens tokens of a few bytes each), written twice (appended, then in
# job order); rough on purpose.
ROOM_PER_JOB = 64 << 10
FINGERPRINTED = (
    "tasks",
    "split",
    "limit",
    "mode",
    "levels",
    "num_samples",
    "temperature",
    "top_p",
    "max_new_tokens",
    "loop_stop",
    "backend",
    "emulate_checks",
    "compile_timeout",
    "run_timeout",
    "timing_timeout",  # which passing rows carry timings
    "no_task_check",
    "input_sets",  # how many; the secret behind the fresh ones is kept apart (Run.secret)
)


def model_fingerprint(name: str) -> dict:
    """What identifies a --model: a hub id as given; for a local folder, its config, tokenizer and
    the size, head and tail (1 MiB each) of every weight file: cheap for GBs, changed by training."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return {"model": name}
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(1 << 20)
            fh.seek(max(size - (1 << 20), 0))
            h.update(f"{f.name}:{size}:".encode() + head + fh.read())
    return {"model": str(path.resolve()), "model_files": h.hexdigest()}


def run_fingerprint(args, backend: str) -> dict:
    """What defines a run's rows: a rerun into the same --out resumes only when all of it is equal."""
    source = (
        {"source": "reference"}
        if args.reference
        else {"source": "solutions", "solutions_sha256": sha256_file(args.solutions)}
        if args.solutions
        else {"source": "model"} | model_fingerprint(args.model) | generation_settings(args)
    )
    values = vars(args) | {
        "tasks": sha256_file(args.tasks),
        "backend": backend,
        "emulate_checks": backend == "emulated" and args.emulate_checks,
    }
    return source | {k: values[k] for k in FINGERPRINTED}


def run_engine(args) -> tuple[str, str]:
    """(engine, why) of the run's generation (choose_engine), decided on all the run's replies, not on those
    still to do: a resumed run keeps the engine it started with, --engine auto included."""
    tasks, _ = select_tasks(args)
    return choose_engine(args, len(tasks) * len(args.levels) * args.num_samples)


def generation_settings(args) -> dict:
    """What defines a run's replies besides the sampling arguments (part of its fingerprint): the engine
    (--engine auto as it resolves, run_engine), the kind of device and the dtype that compute them, and,
    when sampling, the seed: each engine draws its samples its own way, and CPU and GPU kernels, like bf16
    and fp32, round differently enough to part greedy replies where two tokens nearly tie. Not which GPU of
    a machine, nor --gen-batch-size or --vllm-gpu-memory: a resumed run may take another free GPU or batch
    otherwise, at the cost of rounding in the last bits. The openai engine's replies are the server's: its
    base URL and the model's name there (never the key), and the seed when sampling."""
    engine = run_engine(args)[0]
    sampling = {"seed": args.seed} if args.temperature > 0 else {}
    if engine == "openai":
        return {"engine": engine, "server": args.base_url.rstrip("/"), "api_model": args.api_model} | sampling
    device = engine_device(engine, args.device)
    return {
        "engine": engine,
        "device": device.split(":")[0],
        "precision": resolve_precision(args.precision, device),
    } | sampling


# The fields a resumed run reads of each row of its files, and their JSON types (bool is not int here).
RUN_ROWS = {
    "results.jsonl": {
        "task_id": (str,),
        "level": (int,),
        "sample": (int,),
        "outcome": (str,),
        "category": (str,),
    },
    "completions.jsonl": {
        "task_id": (str,),
        "level": (int,),
        "sample": (int,),
        "completion": (str, type(None)),
    },  # None: --solutions had no answer
    "task_checks.jsonl": {"task_id": (str,), "outcome": (str,)},
}


def read_run_rows(out: Path, name: str) -> list[dict]:
    """The rows of one of a run's files (read_appended_jsonl), each holding RUN_ROWS' fields; a row that
    lacks one (edited by hand, or not this stage's file) is a UserError before any work."""
    rows = read_appended_jsonl(out / name)
    for i, row in enumerate(rows, start=1):
        if wrong := [k for k, kinds in RUN_ROWS[name].items() if type(row.get(k)) not in kinds]:
            raise UserError(
                f"{out / name}: row {i} lacks {', '.join(wrong)} or holds another type there "
                f"(not as stage 04 wrote it); pass --force to start the run over, or name another"
                f" --out"
            )
    return rows


class Run:
    """The rows, completions and task checks of the run in --out, appended to their files as each is made
    and then kept in memory (under one lock: compiles and runs finish on several threads), so that a kill
    loses only what was in flight and what a file lacks is never taken as done; and the secret behind the
    run's fresh input sets (harness/input_sets.py: run_secret), kept in --out so that a resumed run judges
    its remaining rows on the same sets as the rows it keeps."""

    def __init__(self, out: Path):
        self.out, self.lock = out, threading.Lock()
        key = lambda r: (r["task_id"], r["level"], r["sample"])  # noqa: E731
        self.rows = {key(r): r for r in read_run_rows(out, "results.jsonl")}
        self.completions = {key(r): r["completion"] for r in read_run_rows(out, "completions.jsonl")}
        self.checks = {r.pop("task_id"): r for r in read_run_rows(out, "task_checks.jsonl")}
        self.secret = run_secret(out)

    def record(self, job: tuple, row: dict) -> None:
        with self.lock:
            append_jsonl(self.out / "results.jsonl", [row])
            self.rows[job] = row

    def record_check(self, task_id: str, check: dict) -> None:
        with self.lock:
            append_jsonl(self.out / "task_checks.jsonl", [{"task_id": task_id} | check])
            self.checks[task_id] = check

    def keep_completions(self, batch: dict) -> None:
        with self.lock:
            rows = [
                {"task_id": j[0], "level": j[1], "sample": j[2], "completion": c}
                for j, c in sorted(batch.items())
            ]
            append_jsonl(self.out / "completions.jsonl", rows)
            self.completions.update(batch)

    def finish(self, jobs: list[tuple]) -> list[dict]:
        """The rows in job order, one per job, rewritten so (results.jsonl was appended as rows came)."""
        final = [self.rows[j] for j in jobs]
        write_jsonl_atomic(self.out / "results.jsonl", final)
        return final


def open_run(args, fingerprint: dict, n_jobs: int) -> Run:
    """Resume the run in args.out if it is the same run (rows, completions and task checks so far), start it
    if the folder is new or --force; refuse another run's folder, and what no stage may write into
    (cuset_common.check_out_dir, which first takes the lock of --out: rows are appended to it for the
    whole run, so a second run into it must not start). With --force the previous run is set aside: put
    back if this one fails, deleted when it finishes (cuset_common.open_out)."""
    out, fp_path = args.out, args.out / "fingerprint.json"
    inputs = {
        "--tasks": args.tasks,
        "--solutions": args.solutions,
        "--model": None if args.reference or args.solutions else Path(args.model),
    }
    check_out_dir(out, "04_eval_kernels", inputs, args.force, n_jobs * ROOM_PER_JOB)
    saved = saved_fingerprint(out)
    if saved is not None and saved != fingerprint and not args.force:
        differ = [k for k in sorted(set(saved) | set(fingerprint)) if saved.get(k) != fingerprint.get(k)]
        raise UserError(
            f"--out {out} holds another run (it differs in: {', '.join(differ)}); pass --force "
            f"to start over there, or name another --out"
        )
    open_out(out, start_over=args.force)
    if args.force or saved is None:
        write_text_atomic(fp_path, json.dumps(fingerprint, indent=2) + "\n")
    return Run(out)


def select_tasks(args) -> tuple[list[dict], set[str]]:
    """The tasks of this run (--tasks, --split, --mode, --limit), and the ids of all tasks in --tasks
    (those --solutions may name)."""
    tasks = load_tasks(args.tasks)
    ids = {str(t["id"]) for t in tasks}
    if args.split != "all" and any("split" in t for t in tasks):  # a file without splits (CUDABench): whole
        tasks = [t for t in tasks if t.get("split") == args.split]
    if args.mode == "kernel":
        missing = [str(t["id"]) for t in tasks if not t.get("kernel_mode")]  # absent or null
        if missing:
            raise UserError(
                f"--mode kernel needs tasks with a kernel_mode harness; {len(missing)} have none "
                f"(e.g. {missing[0]}); use --mode standalone"
            )
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise UserError(f"{args.tasks}: no tasks in split {args.split!r}")
    return tasks, ids


def saved_fingerprint(out: Path) -> dict | None:
    """The fingerprint of the run in `out` (None: no run there)."""
    fp_path = out / "fingerprint.json"
    if fp_path.exists():
        try:
            return json.loads(fp_path.read_text())
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deeply to read
            return {"fingerprint.json": "unreadable"}
    if any((out / f).exists() for f in EVAL_RUN_FILES):
        return {"fingerprint.json": "absent (written by an older version)"}
    return None


def load_solutions(path: Path, wanted: set[tuple], task_ids: set[str]) -> dict[tuple, str | None]:
    """--solutions JSONL: {task_id, level, sample (default 0), completion} per line; a null completion is no
    answer (outcome `missing`), as stage 04's own completions.jsonl writes one. A line naming a task
    that is not in --tasks, a level other than 1-3 or a negative sample is refused (a typo would otherwise
    score that job as missing), and so is the same job twice (which answer counts?). Answers for jobs this
    run did not select (another split, level or sample) are ignored with a warning that counts them."""
    found: dict[tuple, str | None] = {}
    first_line: dict[tuple, int] = {}
    outside = []
    for lineno, obj in read_jsonl(path):
        key, text = solution_row(obj, f"{path}:{lineno}", task_ids)
        if key in first_line:
            raise UserError(
                f"{path}:{lineno}: task {key[0]} level {key[1]} sample {key[2]} was already "
                f"answered on line {first_line[key]}; keep one answer per task, level and sample"
            )
        first_line[key] = lineno
        if key in wanted:
            found[key] = text
        else:
            outside.append((lineno, key))
    if not first_line:  # every job would be scored `missing`
        raise UserError(
            f"{path}: holds no answers; write one JSON object per line: task_id, level, sample, completion"
        )
    if not found:  # as empty as no answers at all: every job would be scored `missing`
        lineno, key = outside[0]
        raise UserError(
            f"{path}: none of its {len(outside)} answer(s) names a job of this run (e.g. line {lineno}: "
            f"{key[0]} level {key[1]} sample {key[2]}); pass the --split, --levels and --num-samples "
            f"the answers were written for"
        )
    if outside:
        lineno, key = outside[0]
        print(
            f"warning: {path}: {len(outside)} answer(s) name no job of this run (split, level or sample "
            f"not selected), e.g. line {lineno}: {key[0]} level {key[1]} sample {key[2]}; ignored",
            file=sys.stderr,
        )
    return found


def solution_row(obj: dict, where: str, task_ids: set[str]) -> tuple[tuple, str | None]:
    """((task id, level, sample), completion) of one --solutions line, refused unless it names a job that
    can exist: level and sample JSON integers (1.7 is no level, nor true, nor "1"), the task id an integer
    or a string of --tasks."""
    if not all(k in obj for k in ("task_id", "level", "completion")):
        raise UserError(
            f"{where}: each line needs task_id, level, sample (an integer; 0 if absent) and completion"
        )
    tid, level, sample, text = obj["task_id"], obj["level"], obj.get("sample", 0), obj["completion"]
    wrong = [
        f"{name} is {json_kind(value)}"
        for name, value, kinds in (
            ("task_id", tid, (str, int)),
            ("level", level, (int,)),
            ("sample", sample, (int,)),
        )
        if type(value) not in kinds
    ]  # type(), not isinstance: true is an int to Python
    if wrong:
        raise UserError(
            f"{where}: {', '.join(wrong)}; task_id must be a string or an integer, level and "
            f'sample integers ("level": 1, not 1.0, true or "1")'
        )
    key = (str(tid), level, sample)
    if text is not None and not isinstance(text, str):  # null: no answer given, as stage 04 writes it
        raise UserError(f"{where}: completion must be a string or null (no answer), not {json_kind(text)}")
    if key[0] not in task_ids:
        raise UserError(
            f"{where}: task {key[0]!r} is not in --tasks; fix the task id (or pass the task file "
            f"it comes from)"
        )
    if key[1] not in LEVELS or key[2] < 0:
        raise UserError(
            f"{where}: level {key[1]} sample {key[2]}: levels are {', '.join(map(str, LEVELS))} "
            f"and samples count from 0"
        )
    return key, text
