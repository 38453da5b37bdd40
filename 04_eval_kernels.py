"""Stage 04: generate CUDA for each task, compile with nvcc, run sandboxed (GPU or CPU emulation), score.

Inputs:  a model (--model: hub id, local folder or stage-03 checkpoint) or completions made
         elsewhere (--solutions), or the tasks' own references (--reference); a
         CUDABench-format task file (--tasks; the real CUDABench JSONL works unchanged).
Outputs: --out/results.jsonl (one row per task x level x sample), summary.json, summary.md,
         completions.jsonl (what the model wrote). Rerunning with the same --out resumes.

    python 04_eval_kernels.py                                   # tiny model, bundled eval split
    python 04_eval_kernels.py --model data/artifacts/ckpt-cuset --num-samples 5 --temperature 0.8
    python 04_eval_kernels.py --mode kernel --levels 1          # kernels into the fixed harness, timed
    python 04_eval_kernels.py --reference --split eval          # the references themselves (100% pass)
    python 04_eval_kernels.py --backend emulate --emulate-checks # CPU emulation with AddressSanitizer
    python 04_eval_kernels.py --tasks CUDABench-Set.jsonl --solutions my_api_outputs.jsonl

Protocol (DESIGN.md, Evaluation): extract the code block -> nvcc (fixed flags, parallel,
timeout) -> gen.py in its own folder -> the binary in a fresh sandbox folder that holds only
the inputs -> compare.py on its outputs. Outcomes: no_code, compile_error, runtime_error,
timeout, wrong_output, pass; `unsupported` (counted apart, outside pass@k) when the emulator
cannot run a program.

Backends (--backend, default auto = the GPU when nvidia-smi lists one, else emulate):
gpu runs nvcc's binary on the GPU, one program at a time, and times kernel mode. emulate
keeps nvcc's verdict on compiling, then translates the program (harness/emulate.py) and
builds it with g++ against our CPU runtime header (harness/emu/), sandboxed like nvcc, and
runs it in parallel through the same sandbox, gen.py and compare.py: functional verdicts
only, rows labelled `backend: emulated`, no timings. See README, "CPU emulation".

Sandbox (generated code is untrusted): every compile and run gets its own folder, a
wall-clock timeout that kills everything it started, resource limits (CPU time, file size,
processes, core dumps), a scrubbed environment and, when started as root, private network,
PID and mount namespaces (private /tmp, /var/tmp, /dev/shm) and an unprivileged uid.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cuset_common import (DATA, LEVELS, NVCC_DEFAULT_ARCH, NVCC_FLAGS, NVCC_NATIVE_ARCH, TASKS_FILE, TINY_MODEL,
                          UserError, build_messages, fence, load_causal_lm, load_tasks, load_tokenizer,
                          pick_device, read_jsonl, render_prompt_and_response, run_main, write_jsonl_atomic,
                          write_text_atomic)
from harness.emulate import EMU_INCLUDE, Unsupported, gxx_command, pch_command, translate

OUTCOMES = ("no_code", "compile_error", "runtime_error", "timeout", "wrong_output", "pass")
UNSUPPORTED = "unsupported"  # the emulator cannot run it: no verdict, kept out of pass@k
FAST_P = (0.0, 1.0, 1.5)
SANDBOX_UID = 61234  # unprivileged uid for untrusted programs when we run as root (no passwd entry needed)
LOG_KEEP = 4000  # characters of each log kept in results (head and tail)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    a("--gen-batch-size", type=int, default=8, help="prompts per generate call")
    a("--limit", type=int, default=None, help="only the first N tasks (quick looks)")
    a("--jobs", type=int, default=os.cpu_count() or 2, help="parallel nvcc compiles")
    a("--compile-timeout", type=float, default=120.0, help="seconds per nvcc compile")
    a("--run-timeout", type=float, default=30.0, help="seconds per program run")
    a("--out", type=Path, default=None, help="output folder (default: data/artifacts/eval-<source>)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--solutions", type=Path, help="JSONL of completions made elsewhere: task_id, level, "
                                                     "sample, completion")
    src.add_argument("--reference", action="store_true", help="score the tasks' own reference programs")
    a("--device", default="auto", help="device for generation: auto | cpu | cuda")
    a("--backend", choices=("auto", "gpu", "emulate"), default="auto",
      help="where programs run: the GPU, or CPU emulation (functional only); auto = GPU if present")
    a("--emulate-checks", action="store_true",
      help="emulated builds with AddressSanitizer: out-of-bounds device accesses become runtime_error")
    args = ap.parse_args(argv)
    try:
        args.levels = sorted({int(x) for x in args.levels.split(",")})
    except ValueError:
        ap.error(f"--levels must be comma-separated integers, got {args.levels!r}")
    if not set(args.levels) <= set(LEVELS):
        ap.error(f"--levels must be within {LEVELS}")
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


def extract_code(reply: str, mode: str) -> str | None:
    """The code block to compile, or None when the reply holds no usable code.

    Prefers a fenced block containing `__global__` (and `main(` in standalone mode), then any
    block with `__global__`; an unclosed final fence counts as a block. Without fences, the
    whole reply is used only if it looks like CUDA (has `__global__`).
    """
    blocks = [m.group(2) for m in FENCE.finditer(reply)]
    def wanted(b: str) -> bool:
        return "__global__" in b and (mode == "kernel" or re.search(r"\bmain\s*\(", b) is not None)
    for pick in (wanted, lambda b: "__global__" in b):
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
# Sandbox
# ---------------------------------------------------------------------------------------


def gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def is_root() -> bool:
    return os.geteuid() == 0


def _limits(cpu_s: int, file_mb: int, nproc: int):
    def apply():
        os.setsid()  # own process group: the timeout kills everything it started
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _scrubbed_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "LANG")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    return env


def _isolated(cmd: list[str], untrusted: bool) -> list[str]:
    """As root: private network and PID namespaces (no network; when the program dies the kernel
    kills all it spawned). Untrusted code also gets a private mount namespace whose /tmp,
    /var/tmp and /dev/shm are fresh and empty but for the sandbox folder itself (bound back at
    its own path), and runs as the unprivileged SANDBOX_UID. Elsewhere the command runs as it
    is; the resource limits and the timeout still apply.
    """
    if not is_root():
        return cmd
    namespaces = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
    if not untrusted:  # task scripts: their interpreter may live under /tmp (a venv), so no masking
        return [*namespaces, "--", *cmd]
    script = ('P="$(pwd)" && mount -t tmpfs -o size=256m tmpfs /tmp && mount -t tmpfs -o size=64m tmpfs /var/tmp'
              ' && mount -t tmpfs -o size=64m tmpfs /dev/shm && mkdir -p "$P"'
              # mount's own cwd is still the real folder: bind it (uncanonicalized) over the new, empty path
              ' && mount --no-canonicalize --bind /proc/self/cwd "$P" && cd "$P" && exec '
              f"setpriv --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups --no-new-privs -- ")
    return [*namespaces, "--mount", "--", "sh", "-c", script + '"$@"', "sh", *cmd]


def _kill_everything(proc: subprocess.Popen) -> None:
    """Kill the program and all it spawned, and return only once they are gone.

    As root the program is the init of its own PID namespace: killing it makes the kernel kill
    every process in the namespace, and unshare exits only after that. Elsewhere the process
    group is killed (a process that left the group escapes; the resource limits still hold).
    """
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except FileNotFoundError:
        children = []
    for child in children:
        try:
            os.kill(int(child), signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)  # unshare reaps the namespace init after the kernel emptied the namespace
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _drain(stream, keep: list, limit: int) -> None:
    """Read a pipe to the end, keeping the first and last `limit` bytes: megabytes of output are cut."""
    head, tail, total = b"", b"", 0
    for chunk in iter(lambda: stream.read(65536), b""):
        total += len(chunk)
        if len(head) < limit:
            head += chunk[: limit - len(head)]
        tail = (tail + chunk)[-limit:]
    text = head.decode(errors="replace")
    if total > limit:
        text += f"\n[... {total - limit} bytes cut ...]\n" + tail[-(limit // 2):].decode(errors="replace")
    keep.append(text)


def run_sandboxed(cmd: list[str], cwd: Path, timeout: float, *, as_sandbox_user: bool, cpu_s: int = 120,
                  file_mb: int = 512, nproc: int = 256, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run cmd in cwd under the sandbox; returns (exit status, or None on timeout; head+tail of output).

    as_sandbox_user: generated code and its compiler run as SANDBOX_UID with a masked /tmp (when
    root). Task scripts (gen.py, compare.py) keep our uid and file system view, since the
    interpreter may live where that uid cannot read or under /tmp, but get no network, the
    limits, the timeout and the scrubbed environment (plus `env`).
    """
    if as_sandbox_user and is_root():
        for p in [cwd, *cwd.rglob("*")]:
            os.chown(p, SANDBOX_UID, SANDBOX_UID)
    proc = subprocess.Popen(_isolated(cmd, untrusted=as_sandbox_user), cwd=cwd, env=_scrubbed_env(cwd) | (env or {}),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_limits(cpu_s, file_mb, nproc))
    out: list[str] = []
    reader = threading.Thread(target=_drain, args=(proc.stdout, out, LOG_KEEP // 2), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    _kill_everything(proc)
    reader.join(timeout=5)
    return code, out[0] if out else ""


# ---------------------------------------------------------------------------------------
# Compile, generate data, run, compare
# ---------------------------------------------------------------------------------------


def compile_program(source: str, workdir: Path, arch: list[str], timeout: float) -> tuple[Path | None, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prog.cu").write_text(source)
    code, log = run_sandboxed(["nvcc", *NVCC_FLAGS, *arch, "prog.cu", "-o", "prog"], workdir, timeout,
                              as_sandbox_user=True, cpu_s=int(timeout) + 5, nproc=512)
    ok = code == 0 and (workdir / "prog").exists()
    return (workdir / "prog" if ok else None), ("compile timeout" if code is None else log)


@dataclass(frozen=True)
class Emulator:
    """The emulation backend of one run: a copy of harness/emu with the header precompiled for the
    run's g++ flags (plain or AddressSanitizer)."""
    include: Path
    checks: bool


def prepare_emulator(work: Path, checks: bool) -> Emulator:
    include = work / "emu"
    shutil.copytree(EMU_INCLUDE, include)
    r = subprocess.run(pch_command(str(include), checks), capture_output=True, text=True)
    if r.returncode != 0:  # our own header: a failure here is a bug or a broken g++, not the candidate's
        raise UserError(f"g++ cannot build the emulator's runtime header:\n{r.stderr[-2000:]}")
    return Emulator(include, checks)


def build_emulated(source: str, workdir: Path, timeout: float, emulator: Emulator) -> tuple[Path | None, str]:
    """Rebuild a program nvcc accepted for the CPU emulator: translate, then g++ against the runtime
    header, linked into the build folder (the sandbox user sees nothing else). Returns
    (executable, "") or (None, why the emulator cannot run it)."""
    try:
        translated = translate(source)
    except Unsupported as e:
        return None, f"emulator: {e}"
    shutil.copytree(emulator.include, workdir / "emu", copy_function=os.link)
    (workdir / "prog_emu.cpp").write_text(translated)
    code, log = run_sandboxed(gxx_command("prog_emu.cpp", "prog_emu", "emu", emulator.checks), workdir, timeout,
                              as_sandbox_user=True, cpu_s=int(timeout) + 5, nproc=512)
    if code == 0 and (workdir / "prog_emu").exists():
        return workdir / "prog_emu", ""
    why = "timeout" if code is None else log
    return None, f"emulator: g++ cannot build the translated program (nvcc could):\n{why}"


def build(source: str, workdir: Path, arch: list[str], timeout: float,
          emulator: Emulator | None) -> tuple[str | None, Path | None, str]:
    """nvcc decides compile_error on every backend; an emulator (None on the GPU) then rebuilds for
    the CPU. Returns (outcome if it ends here, else None; executable; log)."""
    exe, log = compile_program(source, workdir, arch, timeout)
    if exe is None:
        return "compile_error", None, log
    if emulator is not None:
        exe, log = build_emulated(source, workdir, timeout, emulator)
        if exe is None:
            return UNSUPPORTED, None, log
    return None, exe, ""


def prepare_task_data(task: dict, folder: Path, timeout: float) -> None:
    """Run gen.py once per task: inputs and reference outputs in `folder`/data (never shown to candidates)."""
    folder.mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "gen.py").write_text(task["gen.py"])
    code, log = run_sandboxed([sys.executable, "gen.py"], folder, timeout, as_sandbox_user=False,
                              cpu_s=int(timeout) + 5)
    if code != 0:
        raise UserError(f"task {task['id']}: gen.py failed ({'timeout' if code is None else f'exit {code}'}):\n{log}")
    os.chmod(folder, 0o700)  # the candidate's uid must not reach the reference outputs


def execute(task: dict, exe: Path, gen_dir: Path, workdir: Path, timeout: float, backend: str = "gpu",
            env: dict[str, str] | None = None) -> tuple[str, str, dict]:
    """Run a compiled candidate (with `env` added) on the task's inputs, then compare. Returns
    (outcome, log, timing); timings only on the GPU (emulated ones mean nothing)."""
    run_dir, cmp_dir = workdir / "run", workdir / "compare"
    (run_dir / "data").mkdir(parents=True)
    shutil.copy(exe, run_dir / "prog")
    for buf in task["inputs"]:  # only the inputs: the program cannot read reference outputs
        shutil.copy(gen_dir / "data" / f"{buf['name']}.bin", run_dir / "data")
    code, log = run_sandboxed(["./prog"], run_dir, timeout, as_sandbox_user=True, cpu_s=int(timeout) + 5,
                              nproc=64, env=env)
    if code is None:
        return "timeout", log, {}
    if code != 0:
        return "runtime_error", f"exit status {code}\n{log}", {}
    shutil.copytree(gen_dir / "data", cmp_dir / "data")
    for buf in task["outputs"]:
        produced = run_dir / "data" / f"{buf['name']}.bin"
        if produced.is_file() and not produced.is_symlink():
            shutil.copy(produced, cmp_dir / "data" / produced.name)
    (cmp_dir / "compare.py").write_text(task["compare.py"])
    ccode, verdict = run_sandboxed([sys.executable, "compare.py"], cmp_dir, timeout, as_sandbox_user=False,
                                   cpu_s=int(timeout) + 5)
    timing = parse_timing(log) if backend == "gpu" else {}
    lines = verdict.strip().splitlines()
    passed = ccode == 0 and bool(lines) and lines[-1].strip() == "T"
    return ("pass" if passed else "wrong_output"), log + "\n[compare] " + verdict, timing


def parse_timing(log: str) -> dict:
    m = re.search(r"CUSET_TIMING candidate_ms=([\d.eE+-]+) reference_ms=([\d.eE+-]+)", log)
    if not m:
        return {}
    cand, ref = float(m.group(1)), float(m.group(2))
    return {"candidate_ms": cand, "reference_ms": ref, "speedup": ref / cand if cand > 0 else None}


def clip(text: str) -> str:
    return text if len(text) <= LOG_KEEP else text[: LOG_KEEP // 2] + "\n[...]\n" + text[-LOG_KEEP // 2:]


# ---------------------------------------------------------------------------------------
# Completions: from a model, from a file, or the references
# ---------------------------------------------------------------------------------------


def reference_completion(task: dict, mode: str) -> str:
    return fence(task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"])


def load_solutions(path: Path, wanted: set[tuple]) -> dict[tuple, str]:
    """--solutions JSONL: {task_id, level, sample, completion} per line; keys must name known jobs."""
    found = {}
    for lineno, obj in read_jsonl(path):
        try:
            key = (str(obj["task_id"]), int(obj["level"]), int(obj.get("sample", 0)))
            text = obj["completion"]
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}:{lineno}: each line needs task_id, level, sample (int) and completion") from None
        if not isinstance(text, str):
            raise UserError(f"{path}:{lineno}: completion must be a string")
        if key in wanted:
            found[key] = text
    return found


def generate(args, tasks_by_id: dict, jobs: list[tuple], progress) -> dict[tuple, str]:
    """Batched HF generate with the chat template; prompts from cuset_common (same wording as the SFT data)."""
    import torch

    device = pick_device(args.device)
    tok = load_tokenizer(args.model, need_offsets=False, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = load_causal_lm(args.model, dtype).to(device).eval()
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    out: dict[tuple, str] = {}
    for i in range(0, len(prompts), args.gen_batch_size):
        chunk = prompts[i:i + args.gen_batch_size]
        texts = [render_prompt_and_response(tok, {"prompt_messages": build_messages(tasks_by_id[t], lv, args.mode),
                                                  "response": ""})[0] for t, lv in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.temperature > 0 \
            else dict(do_sample=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=args.max_new_tokens, num_return_sequences=args.num_samples,
                                 pad_token_id=tok.pad_token_id, **sampling)
        replies = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for j, (tid, level) in enumerate(chunk):
            for s in range(args.num_samples):
                out[(tid, level, s)] = replies[j * args.num_samples + s]
        progress(len(chunk))
    return out


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------


def summarize(rows: list[dict], k: int, backend: str) -> dict:
    """Per level and per category: compile rate, pass@1, pass@k (over rows with a verdict:
    `unsupported` ones are counted apart), speedups and fast_p (GPU rows only carry timings)."""
    def group(key):
        g = defaultdict(list)
        for r in rows:
            g[key(r)].append(r)
        return g

    def stats(rs: list[dict]) -> dict:
        judged = [r for r in rs if r["outcome"] != UNSUPPORTED]
        per_prompt = defaultdict(list)
        for r in judged:
            per_prompt[(r["task_id"], r["level"])].append(r)
        n_ok = [(len(v), sum(r["outcome"] == "pass" for r in v)) for v in per_prompt.values()]
        out = {"rows": len(rs), "compile_rate": sum(r["outcome"] not in ("no_code", "compile_error") for r in rs)
               / max(len(rs), 1), UNSUPPORTED: len(rs) - len(judged)}
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
            "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in (*OUTCOMES, UNSUPPORTED)},
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

    def __call__(self, n: int = 1) -> None:
        self.done += n
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0
        print(f"\r{self.what}: {self.done}/{self.total} | {el:,.0f}s | ETA {eta:,.0f}s", end="", file=sys.stderr,
              flush=True)
        if self.done >= self.total:
            print(file=sys.stderr)


def select_tasks(args) -> list[dict]:
    tasks = load_tasks(args.tasks)
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
    return tasks


def resolve_backend(choice: str, gpu: str | None) -> str:
    """The backend label of this run's rows: "gpu" or "emulated"."""
    if choice == "gpu" and gpu is None:
        raise UserError("--backend gpu: no GPU found (nvidia-smi lists none); use --backend emulate")
    return "gpu" if choice == "gpu" or (choice == "auto" and gpu) else "emulated"


def compile_job(task: dict, job: tuple, completion: str, args, arch: list[str], backend: str,
                emulator: Emulator | None, work: Path):
    """Extract and build one completion. Returns (row, executable or None, its folder or None)."""
    tid, level, sample = job
    row = {"task_id": tid, "level": level, "sample": sample, "mode": args.mode,
           "category": task.get("category", "uncategorized"), "backend": backend,
           "emulate_checks": backend == "emulated" and args.emulate_checks}
    code = extract_code(completion, args.mode)
    if code is None:
        return row | {"outcome": "no_code", "log": clip(completion)}, None, None
    workdir = Path(tempfile.mkdtemp(dir=work, prefix=f"{level}_{sample}_"))
    outcome, exe, log = build(program_source(task, code, args.mode), workdir / "build", arch, args.compile_timeout,
                              emulator)
    if outcome is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        return row | {"outcome": outcome, "log": clip(log)}, None, None
    return row, exe, workdir


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = select_tasks(args)
    by_id = {str(t["id"]): t for t in tasks}
    jobs = [(str(t["id"]), lv, s) for t in tasks for lv in args.levels for s in range(args.num_samples)]
    gpu = gpu_name()
    backend = resolve_backend(args.backend, gpu)
    if args.emulate_checks and backend == "gpu":
        raise UserError("--emulate-checks applies to emulated runs; add --backend emulate")
    arch = NVCC_NATIVE_ARCH if gpu else NVCC_DEFAULT_ARCH
    print(f"{len(tasks)} tasks x levels {args.levels} x {args.num_samples} samples = {len(jobs)} rows, "
          f"mode {args.mode}")
    print(f"GPU: {gpu} (compile for it, run, compare, time)" if backend == "gpu" else
          f"backend: emulated (nvcc {' '.join(arch)} decides compile errors; programs run under CPU emulation"
          f"{' with AddressSanitizer' if args.emulate_checks else ''}: functional verdicts only, no timings)")
    for tool in ("nvcc", *(["g++"] if backend == "emulated" else [])):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found on PATH; install " + ("the CUDA toolkit" if tool == "nvcc" else "g++"))

    # Resume: keep finished rows made by the same backend and mode.
    results_path, comp_path = args.out / "results.jsonl", args.out / "completions.jsonl"
    done = {}
    if results_path.exists():
        done = {(r["task_id"], r["level"], r["sample"]): r for _, r in read_jsonl(results_path)
                if r.get("backend") == backend and r.get("mode") == args.mode
                and r.get("emulate_checks") == (backend == "emulated" and args.emulate_checks)}
    completions = {(r["task_id"], r["level"], r["sample"]): r["completion"]
                   for _, r in (read_jsonl(comp_path) if comp_path.exists() else [])}
    todo = [j for j in jobs if j not in done]
    print(f"{len(jobs) - len(todo)} rows already done in {args.out}; {len(todo)} to do")

    need = [j for j in todo if j not in completions]
    if args.reference:
        completions.update({j: reference_completion(by_id[j[0]], args.mode) for j in need})
    elif args.solutions:
        completions.update(load_solutions(args.solutions, set(need)))
        completions.update({j: "" for j in need if j not in completions})  # missing answer = no code
    elif need:
        completions.update(generate(args, by_id, need, Progress("generate (prompts)", len({j[:2] for j in need}))))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(comp_path, [{"task_id": j[0], "level": j[1], "sample": j[2], "completion": c}
                                   for j, c in sorted(completions.items())])

    # The same completion for the same task is the same program (--reference at every level, repeated
    # samples): it is built and run once and its row copied to the other jobs.
    first: dict[tuple, tuple] = {}
    unique = [j for j in todo if first.setdefault((j[0], completions[j]), j) == j]
    rows = dict(done)
    lock = threading.Lock()
    work = Path(tempfile.mkdtemp(prefix="cuset-eval-"))  # 0700: sandboxed programs cannot look around
    try:
        emulator = prepare_emulator(work, args.emulate_checks) if backend == "emulated" and unique else None
        task_dirs = {tid: work / f"task-{i}" for i, tid in enumerate(sorted({j[0] for j in unique}))}
        for d in task_dirs.values():
            d.mkdir()
        compiling = Progress("compile", len(unique))

        def build_one(job):
            out = compile_job(by_id[job[0]], job, completions[job], args, arch, backend, emulator,
                              task_dirs[job[0]])
            compiling()
            return job, out

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            built = list(pool.map(build_one, unique))
        by_task = defaultdict(list)
        for job, out in built:
            by_task[job[0]].append((job, out))
        running = Progress("run", sum(exe is not None for _, (_, exe, _) in built))
        # Emulated programs run --jobs at a time and share the cores out (this also keeps the sandbox
        # uid's threads under its process limit).
        run_env = {"CUSET_EMU_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, args.jobs)))}

        def run_task(tid: str) -> None:
            """gen.py once, then the task's programs; its data is removed when they are done."""
            gen_dir = task_dirs[tid] / "gen"
            for job, (row, exe, workdir) in by_task[tid]:
                if exe is not None:
                    if not gen_dir.exists():
                        prepare_task_data(by_id[tid], gen_dir, args.run_timeout * 4)
                    outcome, log, timing = execute(by_id[tid], exe, gen_dir, workdir, args.run_timeout, backend,
                                                   run_env)
                    row = row | {"outcome": outcome, "log": clip(log)} | timing
                    shutil.rmtree(workdir, ignore_errors=True)
                    running()
                with lock:
                    rows[job] = row
                    if len(rows) % 20 == 0:  # partial results survive a kill
                        write_jsonl_atomic(results_path, [rows[j] for j in jobs if j in rows])
            shutil.rmtree(task_dirs[tid], ignore_errors=True)

        # One program at a time on the GPU, so that timings stay meaningful; emulated ones in parallel.
        with ThreadPoolExecutor(1 if backend == "gpu" else max(1, args.jobs)) as pool:
            list(pool.map(run_task, sorted(by_task)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for j in todo:
        rows[j] = rows[first[(j[0], completions[j])]] | {"level": j[1], "sample": j[2]}

    final = [rows[j] for j in jobs]
    write_jsonl_atomic(results_path, final)
    summary = summarize(final, args.num_samples, backend)
    summary["gpu"], summary["model"] = gpu, ("reference" if args.reference else str(args.solutions or args.model))
    summary["emulate_checks"] = backend == "emulated" and args.emulate_checks
    header = (f"# Evaluation: {summary['model']} on {args.tasks.name} ({args.split}), mode {args.mode}, "
              f"backend: {backend}")
    md = summary_markdown(summary, header)
    write_text_atomic(args.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(args.out / "summary.md", md)
    print(md)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
