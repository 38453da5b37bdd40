"""Stage 04: generate CUDA for each task, compile with nvcc, run sandboxed (GPU or CPU emulation), score.

Inputs:  a model (--model: hub id, local folder or stage-03 checkpoint) or completions made
         elsewhere (--solutions), or the tasks' own references (--reference); a
         CUDABench-format task file (--tasks; the real CUDABench JSONL works unchanged).
Outputs: --out/results.jsonl (one row per task x level x sample), summary.json, summary.md,
         completions.jsonl (what the model wrote), task_checks.jsonl (each task's reference, run
         here), fingerprint.json (what defines the run).
         Rows and completions are appended as they finish; rerunning the same run resumes it
         (harness/run_folder.py).

    python 04_eval_kernels.py                                   # tiny model, bundled eval split
    python 04_eval_kernels.py --model data/artifacts/ckpt-cuset --num-samples 5 --temperature 0.8
    python 04_eval_kernels.py --mode kernel --levels 1          # kernels into the fixed harness, timed
    python 04_eval_kernels.py --reference --split eval          # the references themselves (100% pass)
    python 04_eval_kernels.py --backend emulate --emulate-checks # CPU emulation with AddressSanitizer
    python 04_eval_kernels.py --tasks CUDABench-Set.jsonl --solutions my_api_outputs.jsonl

Protocol (README, "Evaluation protocol and sandbox"): extract the code block -> nvcc (fixed flags,
parallel, timeout) -> gen.py once per task in its own folder -> the binary in a fresh sandbox folder
that holds only the inputs -> compare.py on the files it wrote under data/. Outcomes: missing,
no_code, compile_error, runtime_error, timeout, wrong_output, pass; `unsupported` (the emulator
cannot run it) and `task_error` are counted apart, outside pass@k.

Task check: the task's scripts are known to accept one program, the task's own reference. Before
a task's candidates are judged, its reference goes through the same path (one extra compile and
run per task that has a candidate to judge; the verdict is kept in --out/task_checks.jsonl, so a
resumed run does not pay it again). `task_error`: gen.py failed, or the reference ran and
compare.py judged it F. A reference that cannot run here (unsupported, timeout, ...) leaves its
task unchecked: its rows are judged and counted apart as `unchecked`. --no-task-check skips it.

Backends (--backend, default auto = the GPU when nvidia-smi lists one, else emulate):
gpu runs nvcc's binary on the GPU, one program at a time, and times kernel mode. emulate
keeps nvcc's verdict on compiling, then translates the program (harness/emulate.py) and
builds it with g++ against our CPU runtime header (harness/emu/), sandboxed like nvcc, and
runs it in parallel through the same sandbox, gen.py and compare.py: functional verdicts
only, rows labelled `backend: emulated`, no timings. See README, "CPU emulation".

Sandbox (generated code is untrusted; harness/sandbox.py): nvcc and the program see a
whitelist of the file system (system libraries and tools, the CUDA toolkit, GPU device nodes,
their own /proc, a private /tmp, their own folder), no network, an unprivileged uid, resource
limits and a wall-clock timeout that kills everything they started. Where that isolation is
impossible, stage 04 says why and refuses unless --no-sandbox. What the program wrote is read
without following links (harness/program_files.py). Kernel-mode timings carry a per-run nonce.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuset_common import (DATA, LEVELS, NVCC_DEFAULT_ARCH, NVCC_FLAGS, NVCC_NATIVE_ARCH, TASKS_FILE, TINY_MODEL,
                          ArgumentParser, UserError, append_jsonl, build_messages, check_model_source,
                          check_ranges, end_of_turn_ids, fence, finishes_out, load_causal_lm, load_tasks,
                          load_tokenizer, pick_device, render_prompt_and_response, run_main,
                          write_jsonl_atomic, write_text_atomic)
from harness.program_files import copy_written_files
from harness.programs import (Emulator, Runner, build_emulated, built_file, choose_runner, clip, gpu_name,
                              make_work_dir, output_limit_mb, parse_timing, prepare_emulator)
from harness.run_folder import load_solutions, open_run, run_fingerprint

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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--model", default=str(TINY_MODEL), help="hub id, local folder or stage-03 checkpoint")
    a("--tasks", type=Path, default=TASKS_FILE, help="CUDABench-format JSONL (default: %(default)s)")
    a("--split", default="eval", help="task split to use; 'all' for every task (default: %(default)s)")
    a("--levels", default="1,2,3", help="prompt levels, comma separated (default: %(default)s)")
    a("--mode", choices=("standalone", "kernel"), default="standalone")
    a("--num-samples", type=int, default=1, help="samples per task and level (k of pass@k)")
    a("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    a("--top-p", type=float, default=0.95)
    a("--max-new-tokens", type=int, default=1024)
    a("--gen-batch-size", type=int, default=8, help="prompts per generate call (default %(default)s)")
    a("--threads", type=int, default=None,
      help="torch threads for generation (default: the CPUs this process may use; 1 is faster beside other jobs)")
    a("--limit", type=int, default=None, help="only the first N tasks (quick looks)")
    a("--jobs", type=int, default=os.cpu_count() or 2, help="parallel nvcc compiles")
    a("--compile-timeout", type=float, default=120.0, help="seconds per nvcc compile")
    a("--run-timeout", type=float, default=30.0,
      help=f"seconds per program run, at least (default %(default)s): a candidate may also take "
           f"{CANDIDATE_ALLOWANCE}x what its task's reference took here, and a reference "
           f"{REFERENCE_ALLOWANCE}x this (emulated runs of heavy tasks take minutes)")
    a("--task-timeout", type=float, default=900.0,
      help="seconds for a task's own gen.py or compare.py (the author's code: generous; default %(default)s)")
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/eval-<source>)")
    a("--force", action="store_true", help="start over in --out when it holds another run")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--solutions", type=Path, help="JSONL of completions made elsewhere: task_id, level, "
                                                     "sample, completion")
    src.add_argument("--reference", action="store_true", help="score the tasks' own reference programs")
    a("--device", default="auto", help="device for generation: auto | cpu | cuda")
    a("--backend", choices=("auto", "gpu", "emulate"), default="auto",
      help="where programs run: the GPU, or CPU emulation (functional only); auto = GPU if present")
    a("--emulate-checks", action="store_true",
      help="emulated builds with AddressSanitizer: out-of-bounds device accesses become runtime_error")
    a("--no-task-check", action="store_true",
      help="do not run each task's own reference program before judging its candidates (saves one compile "
           "and run per task; a task whose compare.py rejects everything then reads as wrong_output)")
    a("--no-sandbox", action="store_true",
      help="run generated code WITHOUT isolation where none is possible (only for code you trust)")
    args = ap.parse_args(argv)
    try:
        args.levels = sorted({int(x) for x in args.levels.split(",")})
    except ValueError:
        ap.error(f"--levels must be comma-separated integers, got {args.levels!r}")
    if not set(args.levels) <= set(LEVELS):
        ap.error(f"--levels must be within {LEVELS}")
    check_ranges(ap, args, {"num_samples": "[1, inf)", "max_new_tokens": "[1, inf)",
                            "gen_batch_size": "[1, inf)", "jobs": "[1, inf)", "limit": "[1, inf)",
                            "threads": "[1, inf)", "compile_timeout": "(0, inf)", "run_timeout": "(0, inf)",
                            "task_timeout": "(0, inf)", "temperature": "[0, inf)", "top_p": "(0, 1]"})
    if args.out is None:
        name = "reference" if args.reference else (args.solutions.stem if args.solutions else Path(args.model).name)
        args.out = DATA / "artifacts" / f"eval-{name}-{args.mode}"
    return args


# ---------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ---------------------------------------------------------------------------------------
# Code extraction
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


def program_source(task: dict, code: str, mode: str) -> str:
    if mode == "standalone":
        return code
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], code)


# ---------------------------------------------------------------------------------------
# Compile, generate data, run, compare
# ---------------------------------------------------------------------------------------


def compile_program(source: str, workdir: Path, arch: list[str], timeout: float,
                    runner: Runner) -> tuple[Path | None, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prog.cu").write_text(source)
    code, log = runner.untrusted(["nvcc", *NVCC_FLAGS, *arch, "prog.cu", "-o", "prog"], workdir, timeout, nproc=512)
    ok = code == 0 and built_file(workdir, "prog")
    return (workdir / "prog" if ok else None), ("compile timeout" if code is None else log)


def build(source: str, workdir: Path, arch: list[str], timeout: float, emulator: Emulator | None,
          runner: Runner) -> tuple[str | None, Path | None, str]:
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


def execute(task: dict, exe: Path, gen_dir: Path, workdir: Path, timeout: float, runner: Runner,
            env: dict[str, str] | None = None, timed: bool = False, compare_timeout: float = 900.0
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
    code, log = runner.untrusted(["./prog"], run_dir, timeout, file_mb=limit_mb, nproc=64, env=env,
                                 stdin=f"{nonce}\n".encode())
    took = {"run_s": round(time.monotonic() - started, 2)}
    if code is None:
        return "timeout", f"no exit within {timeout:g} s\n{log}", took
    if code != 0:
        return "runtime_error", f"exit status {code}\n{log}", took
    # The reference outputs (links: ours and compare's only), never replaced by the program's files; the
    # inputs come from the program's folder, so what it wrote under an input's name (in place) is its output.
    given = {f"{buf['name']}.bin" for buf in task["inputs"]}
    shutil.copytree(gen_dir / "data", cmp_dir / "data", copy_function=os.link, ignore=lambda _, names: given)
    notes = copy_written_files(workdir, ["run", "data"], cmp_dir / "data", skip=set(os.listdir(cmp_dir / "data")),
                               max_bytes=limit_mb << 20)
    (cmp_dir / "compare.py").write_text(task["compare.py"])
    ccode, verdict = runner.task_script("compare.py", cmp_dir, compare_timeout)
    timing = took | (parse_timing(log, nonce) if timed else {})
    lines = verdict.strip().splitlines()
    passed = ccode == 0 and bool(lines) and lines[-1].strip() == "T"
    log += "".join(f"\n[harness] {n}" for n in notes) + "\n[compare] " + verdict
    return ("pass" if passed else "wrong_output"), log, timing


# ---------------------------------------------------------------------------------------
# Completions: from a model or the references (from a file: harness/run_folder.py)
# ---------------------------------------------------------------------------------------


def reference_completion(task: dict, mode: str) -> str:
    return fence(task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"])


def stop_after_code_block(tok, prompt_len: int, mode: str):
    """A generate() stopping criterion, per sequence: stop once the reply holds a closed code block
    that the mode asks for (what comes after it is never used). Decodes the whole reply only when a
    fence has just been written."""
    import torch
    from transformers import StoppingCriteria

    class StopAfterCodeBlock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = []
            for row in input_ids:
                if "```" not in tok.decode(row[-4:], skip_special_tokens=True):
                    done.append(False)
                    continue
                reply = tok.decode(row[prompt_len:], skip_special_tokens=True).replace("\r\n", "\n")
                done.append(any(wanted_block(m.group(1), mode) for m in CLOSED_FENCE.finditer(reply)))
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopAfterCodeBlock()


def report_tokens(progress, prompt_len: int, batch: str):
    """A generate() stopping criterion that never stops: it shows the batch's tokens so far and their
    rate on the progress line, at most once a second (a batch of long answers takes minutes on a CPU)."""
    import torch
    from transformers import StoppingCriteria

    class ReportTokens(StoppingCriteria):
        t0 = shown = time.time()

        def __call__(self, input_ids, scores, **kwargs):
            now = time.time()
            if now - self.shown >= 1.0:
                self.shown, new = now, input_ids.shape[1] - prompt_len
                progress(0, f" (batch {batch}: {new} tokens each, {new * len(input_ids) / (now - self.t0):.1f} tok/s)")
            return torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)

    return ReportTokens()


def generate(args, tasks_by_id: dict, jobs: list[tuple], progress, on_batch) -> None:
    """Batched HF generate with the chat template; prompts from cuset_common (same wording as the SFT
    data). on_batch({job: reply}) is called as each batch finishes, so a kill loses one batch."""
    import torch

    device = pick_device(args.device)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    tok = load_tokenizer(args.model, need_offsets=False, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = load_causal_lm(args.model, dtype).to(device).eval()
    wanted = set(jobs)
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    batches = math.ceil(len(prompts) / args.gen_batch_size)
    for i in range(0, len(prompts), args.gen_batch_size):
        chunk = prompts[i:i + args.gen_batch_size]
        texts = [render_prompt_and_response(tok, {"prompt_messages": build_messages(tasks_by_id[t], lv, args.mode),
                                                  "response": ""})[0] for t, lv in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        prompt_len = enc["input_ids"].shape[1]
        sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.temperature > 0 \
            else dict(do_sample=False)
        # stop at the end of the turn or after the code block the mode asks for, not at max_new_tokens
        stops = [stop_after_code_block(tok, prompt_len, args.mode),
                 report_tokens(progress, prompt_len, f"{i // args.gen_batch_size + 1}/{batches}")]
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=args.max_new_tokens, num_return_sequences=args.num_samples,
                                 pad_token_id=tok.pad_token_id, eos_token_id=end_of_turn_ids(tok),
                                 stopping_criteria=stops, **sampling)
        replies = tok.batch_decode(gen[:, prompt_len:], skip_special_tokens=True)
        batch = {(tid, level, s): replies[j * args.num_samples + s]
                 for j, (tid, level) in enumerate(chunk) for s in range(args.num_samples)}
        on_batch({job: text for job, text in batch.items() if job in wanted})
        progress(len(chunk))


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------


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
                out[f"fast_{p:g}"] = sum(r["outcome"] == "pass" and (r.get("speedup") or 0) > p
                                         for r in judged) / max(len(judged), 1)
        return out

    return {"backend": backend, "num_samples": k,
            "overall": stats(rows),
            "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in (*OUTCOMES, *APART)},
            "by_level": {f"L{lv}": stats(v) for lv, v in sorted(group(lambda r: r["level"]).items())},
            "by_category": {c: stats(v) for c, v in sorted(group(lambda r: r["category"]).items())}}


def summary_markdown(summary: dict, header: str) -> str:
    cols = [c for c in summary["overall"] if c != "rows"]
    lines = [header, "", "| group | rows | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    def row(name, s):
        vals = [f"{s[c]:.3f}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in cols]
        return f"| {name} | {s['rows']} | " + " | ".join(vals) + " |"
    lines.append(row("**all**", summary["overall"]))
    lines += [row(k, v) for k, v in summary["by_level"].items()]
    lines += [row(k, v) for k, v in summary["by_category"].items()]
    lines += ["", "Outcomes: " + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())]
    if summary["outcomes"][TASK_ERROR]:
        lines += ["", f"{summary['outcomes'][TASK_ERROR]} rows are `task_error`: the task's own gen.py or compare.py "
                      "failed here, or compare.py judged the task's own reference F (their cause and log are in "
                      "results.jsonl); they are outside pass@k and the compile rate."]
    if summary["overall"]["unchecked"]:
        lines += ["", f"{summary['overall']['unchecked']} rows with a verdict are `unchecked`: their task's own "
                      "reference could not run here (task_checks.jsonl says why), so nothing showed that its "
                      "scripts accept a right program; they are inside pass@k."]
    if summary["backend"] == "emulated":
        lines += ["", "**backend: emulated.** Programs ran under CPU emulation: verdicts on functional correctness "
                      "of well-synchronised code; no timings. `unsupported` rows are outside pass@k."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


class Progress:
    """One line per update with done/total, rate and ETA (stderr)."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done, self.t0 = what, total, 0, time.time()

    def __call__(self, n: int = 1, detail: str = "") -> None:
        self.done += n
        el = time.time() - self.t0
        eta = f"{el / self.done * (self.total - self.done):,.0f}s" if self.done else "?"
        print(f"\r{self.what}: {self.done}/{self.total}{detail} | {el:,.0f}s | ETA {eta}   ", end="",
              file=sys.stderr, flush=True)
        if self.done >= self.total:
            print(file=sys.stderr)


def select_tasks(args) -> tuple[list[dict], set[str]]:
    """The tasks of this run, and the ids of all tasks in --tasks (those --solutions may name)."""
    tasks = load_tasks(args.tasks)
    ids = {str(t["id"]) for t in tasks}
    if args.split != "all":
        if any("split" in t for t in tasks):
            tasks = [t for t in tasks if t.get("split") == args.split]
        # a file without splits (the real CUDABench) is used whole
    if args.mode == "kernel":
        missing = [str(t["id"]) for t in tasks if "kernel_mode" not in t]
        if missing:
            raise UserError(f"--mode kernel needs tasks with a kernel_mode harness; {len(missing)} have none "
                            f"(e.g. {missing[0]}); use --mode standalone")
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise UserError(f"{args.tasks}: no tasks in split {args.split!r}")
    return tasks, ids


def resolve_backend(choice: str, gpu: str | None) -> str:
    """The backend label of this run's rows: "gpu" or "emulated"."""
    if choice == "gpu" and gpu is None:
        raise UserError("--backend gpu: no GPU found (nvidia-smi lists none); use --backend emulate")
    return "gpu" if choice == "gpu" or (choice == "auto" and gpu) else "emulated"


def compile_job(task: dict, job: tuple, completion: str | None, args, arch: list[str], runner: Runner,
                emulator: Emulator | None, work: Path):
    """Extract and build one completion (None: the solutions file has no answer for it). Returns
    (row, executable or None, its folder or None)."""
    tid, level, sample = job
    row = {"task_id": tid, "level": level, "sample": sample, "mode": args.mode,
           "category": task.get("category", "uncategorized"), "backend": runner.backend,
           "emulate_checks": runner.backend == "emulated" and args.emulate_checks}
    if completion is None:
        return row | {"outcome": "missing", "log": f"{args.solutions} has no answer for this job"}, None, None
    code = extract_code(completion, args.mode)
    if code is None:
        return row | {"outcome": "no_code", "log": clip(completion)}, None, None
    workdir = Path(tempfile.mkdtemp(dir=work, prefix=f"{level}_{sample}_"))
    os.chmod(workdir, 0o711)  # the sandbox uid passes through to its own folders, lists nothing
    outcome, exe, log = build(program_source(task, code, args.mode), workdir / "build", arch, args.compile_timeout,
                              emulator, runner)
    if outcome is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        return row | {"outcome": outcome, "log": clip(log)}, None, None
    return row, exe, workdir


def gather_completions(args, by_id: dict, need: list[tuple], completions: dict, comp_path: Path,
                       solutions: dict | None) -> None:
    """Completions for the jobs in `need` (from `solutions` when given), appended to completions.jsonl
    (and `completions`) as they come."""
    def keep(batch: dict) -> None:
        completions.update(batch)
        append_jsonl(comp_path, [{"task_id": j[0], "level": j[1], "sample": j[2], "completion": c}
                                 for j, c in sorted(batch.items(), key=lambda kv: kv[0])])

    if not need:
        return
    if args.reference:
        keep({j: reference_completion(by_id[j[0]], args.mode) for j in need})
    elif solutions is not None:
        keep({j: solutions.get(j) for j in need})  # None: no answer given (outcome `missing`)
    else:
        generate(args, by_id, need, Progress("generate (prompts)", len({j[:2] for j in need})), keep)


@finishes_out
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks, task_ids = select_tasks(args)
    by_id = {str(t["id"]): t for t in tasks}
    jobs = [(str(t["id"]), lv, s) for t in tasks for lv in args.levels for s in range(args.num_samples)]
    gpu = gpu_name()
    backend = resolve_backend(args.backend, gpu)
    if args.emulate_checks and backend == "gpu":
        raise UserError("--emulate-checks applies to emulated runs; add --backend emulate")
    arch = NVCC_NATIVE_ARCH if gpu else NVCC_DEFAULT_ARCH
    for tool in ("nvcc", *(["g++"] if backend == "emulated" else [])):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found on PATH; install " + ("the CUDA toolkit" if tool == "nvcc" else "g++"))
    if not (args.reference or args.solutions):
        check_model_source(args.model)
    print(f"{len(tasks)} tasks x levels {args.levels} x {args.num_samples} samples = {len(jobs)} rows, "
          f"mode {args.mode}")
    print(f"GPU: {gpu} (compile for it, run, compare, time)" if backend == "gpu" else
          f"backend: emulated (nvcc {' '.join(arch)} decides compile errors; programs run under CPU emulation"
          f"{' with AddressSanitizer' if args.emulate_checks else ''}: functional verdicts only, no timings)")
    runner = choose_runner(args.no_sandbox, backend)
    # bad lines are refused here, before any output
    solutions = load_solutions(args.solutions, set(jobs), task_ids) if args.solutions else None

    # Resume: rows and completions of the same run (fingerprint) are kept; they were appended as made.
    results_path, comp_path = args.out / "results.jsonl", args.out / "completions.jsonl"
    rows, completions, checks = open_run(args, run_fingerprint(args, backend), len(jobs))
    todo = [j for j in jobs if j not in rows]
    print(f"{len(jobs) - len(todo)} rows already done in {args.out}; {len(todo)} to do")
    gather_completions(args, by_id, [j for j in todo if j not in completions], completions, comp_path, solutions)

    # The same completion for the same task is the same program (--reference at every level,
    # repeated samples): it is built and run once and its row copied to the other jobs.
    first: dict[tuple, tuple] = {}
    unique = [j for j in todo if first.setdefault((j[0], completions[j]), j) == j]
    lock = threading.Lock()

    def record(job: tuple, row: dict) -> None:
        with lock:  # appended as it finishes: a kill loses only the rows in flight
            rows[job] = row
            append_jsonl(results_path, [row])

    def record_check(task_id: str, check: dict) -> None:
        with lock:
            checks[task_id] = check
            append_jsonl(args.out / "task_checks.jsonl", [{"task_id": task_id} | check])

    work = make_work_dir()
    try:
        evaluate(args, by_id, unique, completions, arch, runner, work, record, checks, record_check)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for j in todo:
        if j not in rows:
            record(j, rows[first[(j[0], completions[j])]] | {"level": j[1], "sample": j[2]})

    final = [rows[j] for j in jobs]
    write_jsonl_atomic(results_path, final)  # in job order, one row per job
    summary = summarize(final, args.num_samples, backend)
    summary["gpu"], summary["model"] = gpu, ("reference" if args.reference else str(args.solutions or args.model))
    summary["emulate_checks"] = backend == "emulated" and args.emulate_checks
    summary["sandbox"] = runner.sandbox
    header = (f"# Evaluation: {summary['model']} on {args.tasks.name} ({args.split}), mode {args.mode}, "
              f"backend: {backend}" + ("" if runner.sandbox else ", NOT sandboxed (--no-sandbox)"))
    md = summary_markdown(summary, header)
    write_text_atomic(args.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(args.out / "summary.md", md)
    print(md)
    print(f"results in {args.out}")
    return 0


def evaluate(args, by_id: dict, jobs: list[tuple], completions: dict, arch: list[str], runner: Runner, work: Path,
             record, checks: dict, record_check) -> None:
    """Build every job's program (--jobs in parallel) and the task check's references, then per task:
    gen.py once, the check, its programs, compare; record(job, row) as each row is final and
    record_check(task_id, check) as each check is (`checks`: those kept from before)."""
    emulator = prepare_emulator(work, args.emulate_checks) if runner.backend == "emulated" and jobs else None
    task_dirs = {tid: work / f"task-{i}" for i, tid in enumerate(sorted({j[0] for j in jobs}))}
    for d in task_dirs.values():
        d.mkdir(mode=0o711)

    def build_all(what: str, builds: list[tuple]) -> list[tuple]:
        """compile_job over (job, completion) pairs, --jobs at a time, with progress."""
        compiling = Progress(what, len(builds))

        def build_one(build):
            out = compile_job(by_id[build[0][0]], *build, args, arch, runner, emulator, task_dirs[build[0][0]])
            compiling()
            return out
        with ThreadPoolExecutor(args.jobs) as pool:
            return list(pool.map(build_one, builds))

    by_task = defaultdict(list)
    for job, (row, exe, workdir) in zip(jobs, build_all("compile", [(j, completions[j]) for j in jobs])):
        if exe is None:
            record(job, row)
        else:
            by_task[job[0]].append((job, row, exe, workdir))
    # The task check (docstring): the reference of each task that has a program to judge, built as one.
    to_check = [] if args.reference or args.no_task_check else [t for t in sorted(by_task) if t not in checks]
    references = {}
    built = build_all("compile (task check)", [((t, 0, "check"), reference_completion(by_id[t], args.mode))
                                               for t in to_check])
    for tid, (row, exe, workdir) in zip(to_check, built):
        if exe is None:
            record_check(tid, {"outcome": row["outcome"], "log": row["log"]})
        else:
            references[tid] = exe, workdir
    running = Progress("run", sum(len(v) for v in by_task.values()) + len(references))
    # Emulated programs run --jobs at a time and share the cores out (this also keeps the sandbox
    # uid's threads under its process limit).
    run_env = {"CUSET_EMU_THREADS": str(max(1, (os.cpu_count() or 1) // args.jobs))}
    timed = runner.backend == "gpu" and args.mode == "kernel"

    def run(tid: str, exe: Path, gen_dir: Path, workdir: Path, timeout: float) -> tuple[str, str, dict]:
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
        if tid not in checks:
            exe, workdir = references[tid]
            outcome, log, took = run(tid, exe, gen_dir, workdir, REFERENCE_ALLOWANCE * args.run_timeout)
            record_check(tid, {"outcome": outcome, "log": clip(log), "run_s": took["run_s"]})
        return checks[tid]

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
            failed = ("the task's own reference program ran here and compare.py judged it F, so its scripts "
                      "cannot judge a candidate:\n" + check["log"])
        for job, row, exe, workdir in by_task[tid]:
            if failed:
                cause = "gen.py failed" if check is None else "reference judged F"
                row = row | {"outcome": TASK_ERROR, "cause": cause, "log": clip(failed)}
                shutil.rmtree(workdir, ignore_errors=True)
                running()
            else:
                outcome, log, timing = run(tid, exe, gen_dir, workdir, run_budget(check))
                row = row | {"outcome": outcome, "log": clip(log)} | timing
                row |= {"task_check": check["outcome"]} if check else {}
            record(job, row)
        shutil.rmtree(task_dirs[tid], ignore_errors=True)

    # One program at a time on the GPU, so that timings stay meaningful; emulated ones in parallel.
    with ThreadPoolExecutor(1 if runner.backend == "gpu" else args.jobs) as pool:
        list(pool.map(run_task, sorted(by_task)))


if __name__ == "__main__":
    sys.exit(run_main(main))
