"""Stage 04: generate CUDA for each task, compile with nvcc, run sandboxed (GPU or CPU emulation), score.

Inputs:  a model (--model: hub id, local folder or stage-03 checkpoint) or completions made
         elsewhere (--solutions), or the tasks' own references (--reference); a
         CUDABench-format task file (--tasks; the real CUDABench JSONL works unchanged).
Outputs: --out/results.jsonl (one row per task x level x sample), summary.json, summary.md,
         completions.jsonl (what the model wrote), task_checks.jsonl (each task's reference, run
         here), fingerprint.json (what defines the run).
         Rows and completions are appended as they finish; rerunning the same run resumes it.

    python 04_eval_kernels.py                                   # tiny model, bundled eval split
    python 04_eval_kernels.py --model data/artifacts/ckpt-cuset --num-samples 5 --temperature 0.8
    python 04_eval_kernels.py --mode kernel --levels 1          # kernels into the fixed harness, timed
    python 04_eval_kernels.py --reference --split eval          # the references themselves (100% pass)
    python 04_eval_kernels.py --backend emulate --emulate-checks # CPU emulation with AddressSanitizer
    python 04_eval_kernels.py --tasks CUDABench-Set.jsonl --solutions my_api_outputs.jsonl
    python 04_eval_kernels.py --model M --generate-only --out gen  # completions only (e.g. on a GPU machine);
    python 04_eval_kernels.py --model M --solutions gen/completions.jsonl     # ... scored elsewhere
    python 04_eval_kernels.py --engine openai --base-url http://127.0.0.1:8000/v1 --api-model M  # served

Generation (docs/evaluation.md, "Generation"; harness/completions.py): --engine hf is our own decoding
loop (harness/generation.py), vllm vLLM's offline engine (harness/vllm_generation.py), openai an
OpenAI-compatible server (harness/openai_generation.py): the same prompts, replies cut by the same rules;
auto (default) takes vLLM only where its start-up pays. A prompt the server gives no reply is a
`generation_error` row, asked again when the run is rerun. --precision auto: bf16 where the hardware has it
natively, else fp32; summary.json's "generation" says what ran, its tokens and their seconds.

Protocol (docs/evaluation.md, "Protocol"), in the order of this file: extract the code block -> nvcc
(fixed flags, parallel, timeout) -> gen.py once per task and input set in its own folder (the task's
own set, and --input-sets - 1 fresh ones under seeds drawn for the run: harness/input_sets.py) -> per
set, the binary in a fresh sandbox folder that holds only the inputs -> compare.py on the files it
wrote under data/ -> an outcome (harness/outcomes.py): missing, no_code, compile_error,
runtime_error, timeout, wrong_output, no_kernel (right, but no kernel launched:
harness/launch_count.py), pass (on every set); `unsupported` (the emulator cannot run it),
`task_error` and `generation_error` are counted apart, outside pass@k. Then the task check, pass@k and
the summary; main is the recipe. When each build and run happens, on how many threads and for how
long: harness/schedule.py.

Task check: a task's scripts are known to accept one program, its own reference; before its
candidates are judged, that reference goes the same path (one extra compile and a run per input set
for each task with a candidate to judge, kept in --out/task_checks.jsonl); a fresh set it fails on is
left out. `task_error`: gen.py failed, or compare.py judged the reference F, or (on the GPU) the
reference did not pass. Emulated, a reference that cannot
run leaves its task `unchecked` (judged, counted apart). --no-task-check skips it.

Backends (--backend, default auto = the GPU when the driver lists one, else emulate): gpu runs
nvcc's binary on the GPU, one program at a time, and times kernel mode, once a probe built for the
GPU's compute capability ran on it in the sandbox (harness/gpu_probe.py; else the run stops); emulate
keeps nvcc's verdict on compiling, rebuilds the program for our CPU runtime (harness/emulate.py,
harness/emu/) and runs it through the same sandbox, gen.py and compare.py: functional verdicts only,
no timings. Generated code is untrusted: every compile and run is sandboxed (harness/sandbox.py: a
whitelist of the file system, no network, an unprivileged uid, limits, a timeout), or refused where no
isolation is possible unless --no-sandbox. The protocol in full: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from cuset_common.artifacts import args_to_json
from cuset_common.cli import run_main, sigterm_exits
from cuset_common.out_dir import finishes_out
from cuset_common.paths import NVCC_FLAGS
from cuset_common.trackers import open_trackers
from harness.backend_choice import choose_backend, start_runner
from harness.completions import gather_completions, reference_completion
from harness.eval_options import check_generation, parse_args
from harness.fresh_run import run_fresh, time_kernels
from harness.input_sets import (
    judge_on_sets,
    make_input_sets,
    mark_dropped_by_check,
    set_names,
    set_secret,
    write_generator,
)
from harness.job_rows import job_row, record_generation_errors
from harness.launch_count import LaunchCounter, launch_counter, no_kernel_reason
from harness.outcomes import (
    APART,
    GENERATION_ERROR,
    NO_KERNEL,
    NOT_COMPILED,
    OUTCOMES,
    TASK_ERROR,
    UNSUPPORTED,
)
from harness.program_files import copy_written_files
from harness.programs import (
    Emulator,
    Runner,
    build_emulated,
    built_file,
    clip,
    make_work_dir,
    output_limit_mb,
    prepare_emulator,
    require_tools,
)
from harness.report import generation_summary, write_generation_summary, write_run_summary
from harness.run_folder import Run, load_solutions, open_run, run_fingerprint, select_tasks
from harness.schedule import Schedule, run_budget
from harness.timing import speed_stats

# ---------------------------------------------------------------------------------------
# 1. Extract the code block
# ---------------------------------------------------------------------------------------


FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)
CLOSED_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)\n[ \t]*```", re.S)


def wanted_block(block: str, mode: str) -> bool:
    """A block the mode asks for: a kernel, and in standalone mode also a main()."""
    return "__global__" in block and (mode == "kernel" or re.search(r"\bmain\s*\(", block) is not None)


def extract_code(reply: str, mode: str) -> str | None:
    """The code block to compile, or None when the reply holds no usable code.

    Prefers a fenced block containing `__global__` (and `main(` in standalone mode), then any
    block with `__global__`; an unclosed final fence counts as a block. Without fences, the
    whole reply is used only if it looks like CUDA (has `__global__`).
    """
    reply = reply.replace("\r\n", "\n")  # replies written with CRLF line ends (Windows, some APIs)
    blocks = [m.group(2) for m in FENCE.finditer(reply)]
    for pick in (lambda b: wanted_block(b, mode), lambda b: "__global__" in b):
        found = [b for b in blocks if pick(b)]
        if found:
            return max(found, key=len).strip() + "\n"
    if not blocks and "__global__" in reply:
        return reply.strip() + "\n"
    return None


def reply_complete(reply: str, mode: str) -> bool:
    """The reply holds a closed code block the mode asks for: generation stops there (what comes after
    it is never used)."""
    return any(wanted_block(m.group(1), mode) for m in CLOSED_FENCE.finditer(reply.replace("\r\n", "\n")))


# ---------------------------------------------------------------------------------------
# 2. Compile with nvcc (emulated: then rebuild for the CPU)
# ---------------------------------------------------------------------------------------


def program_source(task: dict, code: str, mode: str) -> str:
    """The program to compile: the code itself (standalone), or the task's kernel-mode harness with the
    code in its marker's place."""
    if mode == "standalone":
        return code
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], code)


def compile_program(
    source: str, workdir: Path, arch: list[str], timeout: float, runner: Runner
) -> tuple[Path | None, str]:
    """nvcc with the fixed flags on `source`, sandboxed in `workdir`: (the executable or None, nvcc's log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prog.cu").write_text(source)
    nvcc = ["nvcc", *NVCC_FLAGS, *arch, "prog.cu", "-o", "prog"]
    code, log = runner.untrusted(nvcc, workdir, timeout, nproc=512)
    ok = code == 0 and built_file(workdir, "prog")
    return (workdir / "prog" if ok else None), (f"compile timeout\n{log}" if code is None else log)


def build(
    source: str, workdir: Path, arch: list[str], timeout: float, emulator: Emulator | None, runner: Runner
) -> tuple[str | None, Path | None, str]:
    """nvcc decides compile_error on every backend; an emulator (None on the GPU) then rebuilds for
    the CPU. Returns (outcome if it ends here, else None; executable; log)."""
    exe, log = compile_program(source, workdir, arch, timeout, runner)
    if exe is None:
        return "compile_error", None, log
    if emulator is not None:
        exe, log = build_emulated(source, workdir, timeout, emulator, runner)
        if exe is None:
            return UNSUPPORTED, None, log
    return None, exe, ""


def compile_job(
    task: dict,
    job: tuple,
    completion: str | None,
    args,
    arch: list[str],
    runner: Runner,
    emulator: Emulator | None,
    work: Path,
):
    """Extract and build one completion (None: the solutions file has no answer for it). Returns
    (row, executable or None, its folder or None)."""
    row = job_row(task, job, args, runner)
    if completion is None:
        return row | {"outcome": "missing", "log": f"{args.solutions} has no answer for this job"}, None, None
    code = extract_code(completion, args.mode)
    if code is None:
        return row | {"outcome": "no_code", "log": clip(completion)}, None, None
    workdir = Path(tempfile.mkdtemp(dir=work, prefix=f"{job[1]}_{job[2]}_"))
    os.chmod(workdir, 0o711)  # the sandbox uid passes through to its own folders, lists nothing
    outcome, exe, log = build(
        program_source(task, code, args.mode), workdir / "build", arch, args.compile_timeout, emulator, runner
    )
    if outcome is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        return row | {"outcome": outcome, "log": clip(log)}, None, None
    return row, exe, workdir


# ---------------------------------------------------------------------------------------
# 3. The task's data: gen.py once per task
# ---------------------------------------------------------------------------------------


def prepare_task_data(
    task: dict, folder: Path, timeout: float, runner: Runner, secret: str | None = None
) -> str | None:
    """gen.py once per task and input set: inputs and reference outputs in `folder`/data (never shown to
    candidates), under whatever names its author chose; with a fresh set's `secret`, under seeds mixed with
    it (harness/input_sets.py). Returns None when it ran, else what failed (task_error)."""
    folder.mkdir(parents=True)
    (folder / "data").mkdir()
    code, log = runner.task_script(write_generator(task, folder, secret), folder, timeout)
    os.chmod(folder, 0o700)  # the candidate's uid must not reach the reference outputs
    if code == 0:
        return None
    missing = re.search(r"No module named '([\w.]+)'", log)
    hint = f" (it imports {missing.group(1)}: install it where stage 04 runs)" if missing else ""
    return f"gen.py failed{hint} ({'timeout' if code is None else f'exit status {code}'}):\n{log}"


# ---------------------------------------------------------------------------------------
# 4. Run in a fresh sandbox folder that holds only the inputs, compare, classify
# ---------------------------------------------------------------------------------------


def execute(
    task: dict,
    exe: Path,
    gen_dir: Path,
    workdir: Path,
    timeout: float,
    runner: Runner,
    env: dict[str, str] | None = None,
    timed: bool = False,
    compare_timeout: float = 900.0,
    timing_timeout: float = 120.0,
    counter: LaunchCounter | None = None,
) -> tuple[str, str, dict]:
    """Run a compiled candidate (with `env` added) in a fresh folder holding the task's inputs
    (harness/fresh_run.py), then compare what it wrote under data/ with the references (compare_outputs).
    Returns (outcome, log, timing); `timed` (kernel mode on the GPU): a program that passes is then timed
    in a run of its own (time_kernels), so that the outcome is decided before and apart from timing, and a
    slow but correct kernel still passes. `counter` (harness/launch_count.py): a program that writes the
    right outputs without launching a kernel is no_kernel."""
    started = time.monotonic()
    count = counter.start() if counter else None
    code, log = run_fresh(task, exe, gen_dir, workdir / "run", timeout, runner, env, count=count)
    launches, log = count.read(log) if count else (None, log)
    took = {"run_s": round(time.monotonic() - started, 2)} | ({"kernel_launches": launches} if count else {})
    if code is None:
        return "timeout", f"no exit within {timeout:g} s\n{log}", took
    if code != 0:
        return "runtime_error", f"exit status {code}\n{log}", took
    passed, judged = compare_outputs(task, gen_dir, workdir, runner, compare_timeout)
    if not passed:
        return "wrong_output", log + judged, took
    if count and (why := no_kernel_reason(launches)):
        return NO_KERNEL, f"{log}{judged}\n[harness] {why}", took
    if not timed:
        return "pass", log + judged, took
    timing = time_kernels(
        compare_outputs, task, exe, gen_dir, workdir, timing_timeout, runner, env, None, compare_timeout
    )
    return "pass", log + judged, took | timing


def compare_outputs(
    task: dict, gen_dir: Path, workdir: Path, runner: Runner, timeout: float, run: str = "run"
) -> tuple[bool, str]:
    """The task's compare.py on the reference outputs beside what the program left under `run`/data/.
    Returns (compare.py printed T last, the log: files left out, then compare.py's output)."""
    cmp_dir = workdir / ("compare" if run == "run" else f"compare-{run}")
    # The reference outputs (links: ours and compare's only), never replaced by the program's files;
    # the inputs come from the program's folder, so what it wrote under an input's name is its output.
    # Not so for the timing run (time_kernels): its data/ holds another set's inputs than those its
    # outputs are judged on, which come from gen_dir with the references (kernel mode writes no input).
    given = {f"{buf['name']}.bin" for buf in task["inputs"]} if run == "run" else set()
    shutil.copytree(gen_dir / "data", cmp_dir / "data", copy_function=os.link, ignore=lambda _, names: given)
    skip, max_bytes = set(os.listdir(cmp_dir / "data")), output_limit_mb(task) << 20
    notes = copy_written_files(workdir, [run, "data"], cmp_dir / "data", skip=skip, max_bytes=max_bytes)
    (cmp_dir / "compare.py").write_text(task["compare.py"])
    code, verdict = runner.task_script("compare.py", cmp_dir, timeout)
    lines = verdict.strip().splitlines()
    passed = code == 0 and bool(lines) and lines[-1].strip() == "T"
    return passed, "".join(f"\n[harness] {n}" for n in notes) + "\n[compare] " + verdict


# ---------------------------------------------------------------------------------------
# 5. The task check, and each task's programs judged (the schedule: harness/schedule.py)
# ---------------------------------------------------------------------------------------


def reference_failure(outcome: str, backend: str) -> tuple[str, str] | None:
    """(cause, why) of the task_error that the task check's `outcome` for the task's own reference makes
    on `backend`, or None when its candidates are judged (docs/evaluation.md, "Task check"). F from
    compare.py: its scripts reject a right program. On the GPU every outcome but pass: the reference is
    built for and run on the GPU it is meant for, so a crash, a timeout or a compile error there is the
    task's or the machine's, and would fail every candidate unseen. Emulated, a reference that does not
    run only leaves its task unchecked: the emulator or its sm_80 build may be what fails."""
    if outcome == "wrong_output":
        return "reference judged F", (
            "the task's own reference program ran here and compare.py judged it F, so its scripts cannot "
            "judge a candidate"
        )
    if backend == "gpu" and outcome not in ("pass", "skipped"):
        return f"reference {outcome} on the GPU", (
            f"the task's own reference program ended {outcome} on the GPU, so no candidate can be judged here"
        )
    return None


@dataclass
class Judge:
    """The protocol's last steps on one run's built programs, task by task (judge_task): gen.py once per
    input set, the task check, then each program run on each set and compared. Rows and checks are kept
    in `run` as each is final."""

    args: argparse.Namespace
    tasks: dict[str, dict]
    runner: Runner
    run: Run
    schedule: Schedule
    counter: LaunchCounter | None  # harness/launch_count.py; None: nothing counted (GPU kernel mode)

    def judge_task(self, task_id: str, programs: list[tuple], reference: tuple | None) -> None:
        """gen.py once per input set, the task check (`reference`: its build, None when there is none to
        run), then the task's programs, each (job, row, executable, folder). A task that cannot judge here
        (gen.py failed, or its own reference failed: reference_failure) gives its programs task_error rows;
        a fresh set that cannot judge (harness/input_sets.py) is left out of its programs' runs."""
        sets, failed = self.input_sets(task_id)
        check = None if failed else self.task_check(task_id, sets, reference)
        if failed and reference:
            self.schedule.finished(reference[1])  # the reference the check built is not run
        cause = "gen.py failed" if failed else None
        if check and (found := reference_failure(check["outcome"], self.runner.backend)):
            cause, why = found
            failed = f"{why}:\n{check['log']}"
        mark_dropped_by_check(sets, check)
        for job, row, exe, workdir in programs:
            if failed:
                row = row | {"outcome": TASK_ERROR, "cause": cause, "log": clip(failed)}
                self.schedule.finished(workdir)
            else:
                budget = run_budget(check, self.args.run_timeout)
                outcome, log, fields = self.run_program(
                    task_id, exe, sets, workdir, budget, self.timed, self.args.reference
                )
                row = row | {"outcome": outcome, "log": clip(log)} | fields
                row |= {"task_check": check["outcome"]} if check else {}
            self.run.record(job, row)

    def input_sets(self, task_id: str) -> tuple[list, str | None]:
        """The task's --input-sets sets, each made by its gen.py in the task's folder (make_input_sets):
        (the sets, or why the task's own gen.py failed)."""
        task, names = self.tasks[task_id], set_names(self.args.input_sets)
        secrets_ = [set_secret(self.run.secret, task_id, name) for name in names]

        def generate(folder: Path, secret: str | None) -> str | None:
            return prepare_task_data(task, folder, self.args.task_timeout, self.runner, secret)

        return make_input_sets(generate, self.schedule.folder(task_id), names, secrets_)

    def task_check(self, task_id: str, sets: list, reference: tuple | None) -> dict | None:
        """The task check's verdict (None with --reference: its rows are the check), run here unless the
        run already holds it: the reference's outcome on the task's own set, and on each set
        (input_sets), which shows the fresh sets its scripts can judge."""
        if self.args.reference:
            return None
        if self.args.no_task_check:
            return {"outcome": "skipped"}
        if task_id not in self.run.checks:
            exe, workdir = reference
            budget = run_budget(None, self.args.run_timeout)
            outcome, log, fields = self.run_program(task_id, exe, sets, workdir, budget, False, True)
            check = {"outcome": outcome, "log": clip(log), "run_s": fields["run_s"]}
            self.run.record_check(task_id, check | {"input_sets": fields["input_sets"]})
        return self.run.checks[task_id]

    @property
    def timed(self) -> bool:
        """Kernel mode on the GPU: a candidate that passes is timed against the reference kernels."""
        return self.runner.backend == "gpu" and self.args.mode == "kernel"

    def run_program(
        self, task_id: str, exe: Path, sets: list, workdir: Path, budget: float, timed: bool, reference: bool
    ) -> tuple:
        """execute() on each input set within `budget` seconds (judge_on_sets; `reference`: the task's own),
        then, when `timed` and it passed, its timing run within --timing-timeout, which times on one set
        and checks the launch after the timed ones on another (time_kernels); the program's folder is
        removed after."""
        task, env = self.tasks[task_id], self.schedule.run_env

        def run_on(input_set) -> tuple:
            limits = {"compare_timeout": self.args.task_timeout, "counter": self.counter}
            return execute(
                task, exe, input_set.folder, workdir / input_set.name, budget, self.runner, env, **limits
            )

        outcome, log, fields = judge_on_sets(run_on, sets, reference)
        if timed and outcome == "pass":
            used = [s.folder for s in sets if s.dropped is None]
            timeout, judge_s = self.args.timing_timeout, self.args.task_timeout
            fields |= time_kernels(
                compare_outputs, task, exe, used[-1], workdir, timeout, self.runner, env, used[0], judge_s
            )
        if self.runner.watch:  # a failure is the program's only while the GPU still works after it
            self.runner.watch.after(outcome, f"a program of task {task_id}")
        self.schedule.finished(workdir)
        return outcome, log, fields


def evaluate(args, by_id: dict, jobs: list[tuple], arch: list[str], runner: Runner, work: Path, run) -> None:
    """Build every job's program and the task check's references (--jobs at a time), then judge task by
    task (Judge.judge_task); each row and check is kept in `run` as it is final."""
    emulator = prepare_emulator(work, args.emulate_checks) if runner.backend == "emulated" and jobs else None
    schedule = Schedule(work, [j[0] for j in jobs], args.jobs, runner.backend)
    counter = launch_counter(runner.backend, args.mode, work) if jobs else None
    arch = arch + (counter.nvcc_flags if counter else [])  # the GPU's shared runtime, for the count

    def build_one(item: tuple) -> tuple:
        """(job, completion) -> compile_job's (row, executable or None, folder or None)."""
        job, completion = item
        task, folder = by_id[job[0]], schedule.folder(job[0])
        return compile_job(task, job, completion, args, arch, runner, emulator, folder)

    programs = defaultdict(list)  # task id -> [(job, row, executable, folder)]
    built = schedule.build("compile", build_one, [(j, run.completions[j]) for j in jobs])
    for job, (row, exe, workdir) in zip(jobs, built):
        if exe is None:
            run.record(job, row)
        else:
            programs[job[0]].append((job, row, exe, workdir))
    # The task check (docstring): the reference of each task that has a program to judge, built as one.
    checking = not (args.reference or args.no_task_check)
    to_check = [t for t in sorted(programs) if t not in run.checks] if checking else []
    check_builds = [((t, 0, "check"), reference_completion(by_id[t], args.mode)) for t in to_check]
    references, check_built = {}, schedule.build("compile (task check)", build_one, check_builds)
    for tid, (row, exe, workdir) in zip(to_check, check_built):
        if exe is None:
            run.record_check(tid, {"outcome": row["outcome"], "log": row["log"]})
        else:
            references[tid] = exe, workdir
    judge = Judge(args, by_id, runner, run, schedule, counter)
    runs = sum(map(len, programs.values())) + len(references)
    schedule.judge_tasks(
        lambda t: judge.judge_task(t, programs[t], references.get(t)), sorted(programs), runs
    )


def judge_jobs(args, by_id: dict, todo: list[tuple], arch: list[str], runner: Runner, run) -> None:
    """Rows for the jobs still to do, in a work folder of their own. The same code for the same task is the
    same program (--reference at every level, repeated samples, replies that differ only in their prose): it
    is built and run once and its row copied to the other jobs."""

    def program(job: tuple) -> tuple:
        completion = run.completions[job]
        code = extract_code(completion, args.mode) if completion is not None else None
        return job[0], code if code is not None else completion  # no code: the same reply, the same row

    programs = {j: program(j) for j in todo}
    first: dict[tuple, tuple] = {}
    unique = [j for j in todo if first.setdefault(programs[j], j) == j]
    work = make_work_dir()
    try:
        evaluate(args, by_id, unique, arch, runner, work, run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for j in todo:
        if first[programs[j]] != j:  # the first of each program has its row from evaluate
            run.record(j, run.rows[first[programs[j]]] | {"level": j[1], "sample": j[2]})


# ---------------------------------------------------------------------------------------
# 6. pass@k and the summary (rendered by harness/report.py)
# ---------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021). A prompt
    judged on fewer than k samples (the others `unsupported`) gets pass@n, the most its samples say."""
    k = min(k, n)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(rows: list[dict], k: int, backend: str) -> dict:
    """Per level and per category: compile rate (rows whose task could judge), pass@1, pass@k (over
    rows with a verdict: `unsupported` and `task_error` ones are counted apart), `unchecked` (rows
    with a verdict whose task's reference could not run here), speedups and fast_p (GPU rows only
    carry timings)."""
    return {
        "backend": backend,
        "num_samples": k,
        "overall": group_stats(rows, k),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in (*OUTCOMES, *APART)},
        "by_level": {f"L{lv}": group_stats(v, k) for lv, v in sorted(grouped(rows, "level").items())},
        "by_category": {c: group_stats(v, k) for c, v in sorted(grouped(rows, "category").items())},
    }


def grouped(rows: list[dict], key: str) -> dict:
    """{value: the rows holding it} of one field of the rows."""
    return {value: [r for r in rows if r[key] == value] for value in {r[key] for r in rows}}


def group_stats(rows: list[dict], k: int) -> dict:
    """summarize()'s figures for one group of rows."""
    judged = [r for r in rows if r["outcome"] not in APART]
    per_prompt = defaultdict(list)
    for r in judged:
        per_prompt[(r["task_id"], r["level"])].append(r)
    n_ok = [(len(v), sum(r["outcome"] == "pass" for r in v)) for v in per_prompt.values()]
    usable = [r for r in rows if r["outcome"] not in (TASK_ERROR, GENERATION_ERROR)]  # no program to build
    compiled = sum(r["outcome"] not in NOT_COMPILED for r in usable)
    out = {"rows": len(rows), "compile_rate": compiled / len(usable) if usable else None}  # None: no row
    out |= {o: sum(r["outcome"] == o for r in rows) for o in APART}
    out["unchecked"] = sum(r.get("task_check", "pass") != "pass" for r in judged)
    for kk in sorted({1, k}):  # over no judged prompt there is no rate: null, not 0
        out[f"pass@{kk}"] = sum(pass_at_k(n, c, kk) for n, c in n_ok) / len(n_ok) if n_ok else None
    return out | speed_stats(judged)


# ---------------------------------------------------------------------------------------
# The run: main is the recipe
# ---------------------------------------------------------------------------------------


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)  # harness/eval_options.py
    tasks, task_ids = select_tasks(args)
    by_id = {str(t["id"]): t for t in tasks}
    jobs = [(str(t["id"]), lv, s) for t in tasks for lv in args.levels for s in range(args.num_samples)]
    # a bad line of --solutions is refused here, as one of --tasks is: before any output
    solutions = load_solutions(args.solutions, set(jobs), task_ids) if args.solutions else None
    gpu, backend = choose_backend(args)
    check_generation(args)
    if not args.generate_only:
        require_tools(backend)
    shape = f"{len(tasks)} tasks x levels {args.levels} x {args.num_samples} samples"
    print(f"{shape} = {len(jobs)} rows, mode {args.mode}")
    runner, arch = (None, []) if args.generate_only else start_runner(args, gpu, backend, compile_program)

    # Resume: rows, completions and task checks of the same run (fingerprint) are kept as appended.
    fingerprint = run_fingerprint(args, backend)
    run = open_run(args, fingerprint, len(jobs))
    trackers = open_trackers(args, "04", args.out, {"args": args_to_json(args), "fingerprint": fingerprint})
    todo = [j for j in jobs if j not in run.rows or "generation_error" in run.rows[j]]
    print(f"{len(jobs) - len(todo)} rows already done in {args.out}; {len(todo)} to do")
    need = [j for j in todo if j not in run.completions]
    generation = gather_completions(args, by_id, need, run, solutions, reply_complete)
    if args.generate_only:
        print(write_generation_summary(args.out, generation_summary(args, jobs, run, generation)))
        return 0

    record_generation_errors(args, by_id, generation, runner, run)
    with sigterm_exits():  # as Ctrl-C: the programs that run end at once (harness/schedule.py)
        judge_jobs(args, by_id, [j for j in todo if j in run.completions], arch, runner, run)
    rows = run.finish(jobs)
    print(write_run_summary(args, rows, summarize(rows, args.num_samples, backend), gpu, runner, generation))
    trackers.log(json.loads((args.out / "summary.json").read_text()))  # pass@k, outcomes, speedups
    print(f"results in {args.out}")
    return 0


INTERRUPTED = (
    "the rows done so far are kept in --out; rerun the same command, without --force, to go on from them"
)

if __name__ == "__main__":
    sys.exit(run_main(main, interrupted=INTERRUPTED))
