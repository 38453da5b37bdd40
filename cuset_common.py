"""Plumbing shared by the stages and the data builders: paths, errors, atomic writes,
JSONL reading with file:line errors, and the task prompt builder.

The method itself lives in the stage files; nothing here knows about confidences, regions
or losses. The prompt builder is here because the SFT data (data/build_sft.py) and the
evaluation (04_eval_kernels.py) must word prompts identically.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
TASKS_FILE = DATA / "tasks" / "tasks.jsonl"
SFT_FILE = DATA / "sft" / "train.jsonl"  # standalone mode: whole programs
# Kernel mode, with renamed copies of each train task (data/build_sft.py). The default data of
# stages 01-03: on the bundled tiny model, the only SFT data after which answers compile (README).
SFT_KERNEL_FILE = DATA / "sft" / "train_kernel.jsonl"
# The same without the copies: the training data of a real model, which needs none (--preset cpu-real).
SFT_KERNEL_ORIGINALS_FILE = DATA / "sft" / "train_kernel_originals.jsonl"
# Held-out SFT data: the same records from the `eval` split (held-out ops; no renamed copies), so that
# stage 01 can score a trained checkpoint on tasks it never saw (experiments/compare.py).
EVAL_SFT_FILE = DATA / "sft" / "eval.jsonl"
EVAL_SFT_KERNEL_FILE = DATA / "sft" / "eval_kernel.jsonl"
TINY_MODEL = DATA / "models" / "tiny-cuda-lm"
SMOLLM2_MODEL = DATA / "models" / "smollm2-135m-instruct"  # built by data/build_smollm2.py

# nvcc: fixed flags for every compile (reference programs, harnesses, candidates). Without a
# GPU nvcc only decides compile_error, which does not depend on the architecture, so we compile
# for one (Ampere, sm_80: every feature our tasks use exists there); on a GPU, for the GPU present.
NVCC_FLAGS = ["-O2", "-std=c++17", "-lineinfo"]
NVCC_DEFAULT_ARCH = ["-gencode", "arch=compute_80,code=sm_80"]
NVCC_NATIVE_ARCH = ["-arch=native"]

SYSTEM_PROMPT = "You are an expert CUDA programmer. You write correct, efficient CUDA C++."
LEVELS = (1, 2, 3)
MODES = ("standalone", "kernel")


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit status 2."""


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: Path, records: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append records and fsync, so that a kill loses at most the line being written (a torn last
    line, which read_appended_jsonl drops)."""
    with open(path, "a", encoding="utf-8", newline="\n") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def read_appended_jsonl(path: Path) -> list[dict]:
    """The records of a file written by append_jsonl ([] if there is none). A last line without its
    newline was cut by a kill: it is removed from the file, so that the next append starts clean."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        os.truncate(path, len(whole))
    return [obj for _, obj in read_jsonl(path)]


def replace_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move a completely written folder into place; the previous one is removed only after."""
    final_dir = Path(final_dir)
    old = final_dir.with_name(f".{final_dir.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a bad line raises UserError with file:line.

    Bad means: not UTF-8 (a UTF-16 or binary file), not JSON, or not an object. A UTF-8 byte-order mark
    on the first line is accepted (editors on Windows write one)."""
    path = Path(path)
    with open_input(path) as f:
        for lineno, raw in enumerate(f, start=1):
            obj = parse_json_line(raw, path, lineno)
            if obj is not None:
                yield lineno, obj


def parse_json_line(raw: bytes, path: Path, lineno: int) -> dict | None:
    """One line of a JSONL file as an object (None for a blank line); UserError with file:line otherwise."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                        f"{e.start + 1}); save the file as UTF-8 JSONL, one JSON object per line") from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                        f"each line must be one JSON object") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def open_input(path: Path):
    """An input file opened for reading in binary; a folder, a missing or unreadable file is a UserError."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not a file; name the JSONL file inside it")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror})") from None


# ---------------------------------------------------------------------------------------
# Tasks and prompts
# ---------------------------------------------------------------------------------------

TASK_REQUIRED = ("id", "task_name", "inputs", "outputs", "bench.cu", "gen.py", "compare.py",
                 "level1_prompt", "level2_prompt", "level3_prompt")


def load_tasks(path: Path = TASKS_FILE) -> list[dict]:
    """Read a CUDABench-format task file (ours or the real one), checking the fields we use and that each
    id names one task (a result row names its task by id)."""
    tasks, first_line = [], {}
    for lineno, task in read_jsonl(path):
        missing = [k for k in TASK_REQUIRED if k not in task]
        if missing:
            raise UserError(f"{path}:{lineno}: task is missing {', '.join(missing)}; "
                            f"a CUDABench task needs {', '.join(TASK_REQUIRED)}")
        if str(task["id"]) in first_line:
            raise UserError(f"{path}:{lineno}: task id {task['id']!r} is already the id of line "
                            f"{first_line[str(task['id'])]}; give each task its own id")
        first_line[str(task["id"])] = lineno
        tasks.append(task)
    return tasks


def _buffer_lines(buffers: list[dict], verb: str) -> list[str]:
    return [f"- {b['name']}: {b['dtype']}, shape {b['shape']}, {verb} data/{b['name']}.bin" for b in buffers]


def build_prompt(task: dict, level: int, mode: str) -> str:
    """The user turn for one task: the level's prompt, the I/O contract and what to return.

    Used verbatim by data/build_sft.py (training) and 04_eval_kernels.py (evaluation), so a
    model is evaluated on exactly the wording it was trained on.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode}")
    parts = [f"Task: {task['task_name']}", task[f"level{level}_prompt"].strip(), ""]
    if mode == "standalone":
        parts += ["Inputs (raw little-endian binary files, row-major):", *_buffer_lines(task["inputs"], "read from"),
                  "Outputs:", *_buffer_lines(task["outputs"], "write to"), "",
                  "Write a complete CUDA C++ program with a main function that reads the inputs, computes the "
                  "outputs on the GPU and writes them. Reply with the whole program in one ```cpp code block."]
    else:
        km = task.get("kernel_mode")
        if not km:
            raise UserError(f"task {task['id']} has no kernel_mode harness; use --mode standalone")
        parts += ["Inputs:", *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}" for b in task["inputs"]],
                  "Outputs:", *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}" for b in task["outputs"]], "",
                  "Write only the CUDA kernel(s) with exactly these signatures, plus any __device__ helpers "
                  "and constants they need:", *[f"  {s}" for s in km["signatures"]],
                  f"The host code is fixed: {km['launch']}",
                  "Do not write main or any host code. Reply with the code in one ```cpp code block."]
    return "\n".join(parts)


def build_messages(task: dict, level: int, mode: str) -> list[dict[str, Any]]:
    """System and user turns, ready for tokenizer.apply_chat_template."""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": build_prompt(task, level, mode)}]


KERNEL_SIGNATURE = re.compile(r"__global__\s+void\s+(\w+)\s*\(([^)]*)\)")


def signature_parts(signature: str) -> tuple[str, list[str], list[str]]:
    """The first `__global__ void k(const float* __restrict__ x, int n)` in the text -> ("k",
    ["const float* __restrict__", "int"], ["x", "n"]): the kernel's name, its parameters' types (spacing
    normalised) and names ("" for a parameter without one, as in `(int, float* a)`)."""
    m = KERNEL_SIGNATURE.search(signature)
    if not m:
        raise UserError(f"not a `__global__ void name(params)` signature: {signature!r}")
    types, names = [], []
    for param in filter(None, (p.strip() for p in m.group(2).split(","))):
        named = re.fullmatch(r"(.*?\W)\s*(\w+)", param)  # a type, then the name
        types.append(" ".join((named.group(1) if named else param).split()))
        names.append(named.group(2) if named else "")
    return m.group(1), types, names


def fence(code: str) -> str:
    """The assistant turn's form: one ```cpp block."""
    return f"```cpp\n{code.strip()}\n```"


# ---------------------------------------------------------------------------------------
# Stage entry points
# ---------------------------------------------------------------------------------------


def run_main(main_fn, argv: list[str] | None = None) -> int:
    """Run a stage's main; a UserError prints `error: ...` to stderr and exits with status 2 (as do
    the argument parser's refusals, which exit through SystemExit)."""
    import sys

    try:
        return main_fn(argv) or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusals are one line in our form (`error: ...`, exit status 2): the usage block
    argparse prints first would bury the line that says what is wrong."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see --help\n")


def check_ranges(ap: argparse.ArgumentParser, args: argparse.Namespace, ranges: dict[str, str]) -> None:
    """Refuse each numeric argument outside its interval, before any work (ap.error: one line, exit 2).

    ranges: {dest: interval as written in mathematics}, e.g. "[1, inf)", "(0, 1]". An unset argument
    (None) passes. NaN lies in no interval, and no interval here holds infinity (it is open there).
    """
    for dest, interval in ranges.items():
        value = getattr(args, dest)
        if value is not None and not within(value, interval):
            kind = "an integer" if isinstance(value, int) else "a finite number"
            unset = ", or unset" if ap.get_default(dest) is None else ""
            ap.error(f"--{dest.replace('_', '-')} {value:g}: must be {kind} {describe(interval)}{unset}")


def within(value: float, interval: str) -> bool:
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    above = value > lo if interval[0] == "(" else value >= lo
    return above and (value < hi if interval[-1] == ")" else value <= hi)


def describe(interval: str) -> str:
    """An interval in words: [1, inf) is ">= 1", (0, inf) is "> 0", [0, 1] is "in [0, 1]"."""
    lo, hi = (x.strip() for x in interval[1:-1].split(","))
    if hi == "inf":
        return f"{'>' if interval[0] == '(' else '>='} {lo}"
    return f"in {interval}"


def load_script(relpath: str):
    """Import a stage script by path, for tests and benchmarks (a stage's file name starts with a digit,
    so `import` cannot name it; the stages themselves never import each other)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(Path(relpath).stem.replace("-", "_"), ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def pick_device(name: str = "auto") -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available; use --device cpu")
    return name


# ---------------------------------------------------------------------------------------
# Artifacts: a folder with tensors.safetensors + meta.json (+ extra files), written atomically.
# ---------------------------------------------------------------------------------------

SCHEMA_VERSION = 1


def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open_input(Path(path)) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's full definition (vocab, merges, specials) and chat template."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    spec += "\n" + str(getattr(tokenizer, "chat_template", None))
    return hashlib.sha256(spec.encode()).hexdigest()


def library_versions() -> dict[str, str]:
    import platform

    import numpy
    import safetensors
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": safetensors.__version__,
            "numpy": numpy.__version__}


def write_artifact(out_dir: Path, tensors: dict, meta: dict, extra_files: dict[str, str] | None = None) -> None:
    """Write tensors (numpy arrays) + meta.json (+ text files) to a temp folder, then swap it in."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp"))
    try:
        save_file({k: v for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
        full_meta = {"schema_version": SCHEMA_VERSION, **meta, "versions": library_versions()}
        (tmp / "meta.json").write_text(json.dumps(full_meta, indent=2, sort_keys=False) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        replace_dir_atomic(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_artifact(art_dir: Path, expected_stage: str, rerun_hint: str, token_tensors: dict | None = None,
                  sample_tensors: dict | None = None) -> tuple[dict, dict]:
    """Load (tensors, meta) of an artifact folder; a missing, foreign or damaged one is a UserError.

    token_tensors / sample_tensors: {name: numpy dtype} that must be present, 1-D, of that dtype, and as
    long as the response tokens (sample_offsets[-1]) / the samples (len(sample_offsets) - 1).
    """
    from safetensors.numpy import load_file

    art_dir = Path(art_dir)
    meta_path, tensor_path = art_dir / "meta.json", art_dir / "tensors.safetensors"
    if not meta_path.exists() or not tensor_path.exists():
        raise UserError(f"{art_dir}: no {expected_stage} artifact here (meta.json + tensors.safetensors); "
                        f"run {rerun_hint} first")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{meta_path}: not valid JSON ({e}); rerun {rerun_hint}") from None
    if not isinstance(meta, dict) or meta.get("stage") != expected_stage:
        stage = meta.get("stage") if isinstance(meta, dict) else None
        raise UserError(f"{art_dir}: is a {stage!r} artifact, expected {expected_stage!r}")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise UserError(f"{art_dir}: schema version {meta.get('schema_version')} but this code reads "
                        f"{SCHEMA_VERSION}; rerun {rerun_hint}")
    try:
        tensors = load_file(str(tensor_path))
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError, on a damaged file
        raise UserError(f"{tensor_path}: cannot be read ({type(e).__name__}: {e}); it may be truncated; "
                        f"rerun {rerun_hint}") from None
    if token_tensors is not None or sample_tensors is not None:
        check_flat_tensors(tensors, token_tensors or {}, sample_tensors or {}, meta, f"{art_dir}: ", rerun_hint)
    return tensors, meta


def check_flat_tensors(t: dict, token_tensors: dict, sample_tensors: dict, meta: dict, where: str,
                       rerun_hint: str) -> None:
    """The artifact contract for flat per-token data: names, dtypes, lengths and sample_offsets."""
    import numpy as np

    def bad(msg: str) -> UserError:
        return UserError(f"{where}{msg}; rerun {rerun_hint}")

    for name, dtype in {**token_tensors, **sample_tensors, "sample_offsets": np.int64}.items():
        if name not in t or t[name].dtype != dtype or t[name].ndim != 1:
            raise bad(f"tensor {name} missing or not 1-D {np.dtype(dtype).name}")
    off = t["sample_offsets"]
    if len(off) == 0 or off[0] != 0 or np.any(np.diff(off) < 0):
        raise bad("sample_offsets must start at 0 and never decrease")
    n_tok, n_samples = int(off[-1]), len(off) - 1
    for name in token_tensors:
        if len(t[name]) != n_tok:
            raise bad(f"tensor {name} has {len(t[name])} entries but sample_offsets cover {n_tok} tokens")
    for name in sample_tensors:
        if len(t[name]) != n_samples:
            raise bad(f"tensor {name} has {len(t[name])} entries but there are {n_samples} samples")
    counts = meta.get("counts") or {}
    if counts.get("samples", n_samples) != n_samples or counts.get("response_tokens", n_tok) != n_tok:
        raise bad(f"meta.json counts ({counts.get('samples')} samples, {counts.get('response_tokens')} tokens) "
                  f"disagree with the tensors ({n_samples}, {n_tok})")


def args_to_json(args) -> dict:
    """argparse values as JSON-friendly values (paths as strings), for meta.json and resume checks."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def check_resume_args(saved: dict, now: dict, may_change: set[str], where: Path,
                      restart: str = "another --out, or --force") -> None:
    """--resume continues one run: refuse other arguments than the ones it started with (issue 9, item 5).

    may_change: arguments that do not change the result (logging, --stop-after, --resume itself);
    restart: how this stage starts a run afresh instead.
    """
    diff = [f"--{k.replace('_', '-')}: the run has {saved.get(k)!r}, now {now.get(k)!r}"
            for k in sorted(set(saved) | set(now)) if k not in may_change and saved.get(k) != now.get(k)]
    if diff:
        raise UserError(f"{where}: --resume with arguments other than the run's own ({'; '.join(diff)}); "
                        f"resume with the same arguments, or start a new run ({restart})")


def check_meta_matches(meta: dict, expected: dict[str, str], art_dir: Path, rerun_hint: str, force: bool) -> None:
    """Refuse an artifact made from another model, tokenizer or data (unless --force)."""
    wrong = [f"{k}: artifact has {meta.get(k)!r}, now {v!r}" for k, v in expected.items() if meta.get(k) != v]
    if wrong and not force:
        raise UserError(f"{art_dir} was made from different inputs ({'; '.join(wrong)}); "
                        f"rerun {rerun_hint}, or pass --force to use it anyway")


# ---------------------------------------------------------------------------------------
# Output folders (--out): one rule for every stage, checked before any work.
# ---------------------------------------------------------------------------------------

STAGES = ("01_profile", "02_label_regions", "03_train_cuset", "04_eval_kernels")
# What a stage-04 run folder holds (harness/run_folder.py), and what marks a stage-03 folder that has no
# meta.json yet (a run that is training, stopped or killed: its resume state, or one being written).
EVAL_RUN_FILES = ("results.jsonl", "completions.jsonl", "task_checks.jsonl", "summary.json", "summary.md",
                  "fingerprint.json")
TRAIN_RUN_FILES = ("resume", ".resume.old", ".resume.tmp", ".final.tmp")
# The --out folders this process writes into in place (open_out), each with whether it started over there.
_OPENED: list[tuple[Path, bool]] = []


def artifact_stage(folder: Path) -> str | None:
    """The stage whose artifact (or run) the folder holds, or None: the stage its meta.json names, else
    stage 04 or 03 by the files their runs write."""
    try:
        stage = json.loads((folder / "meta.json").read_text()).get("stage")
    except (OSError, ValueError, AttributeError):
        stage = None
    if stage in STAGES:
        return stage
    for name, files in (("04_eval_kernels", EVAL_RUN_FILES), ("03_train_cuset", TRAIN_RUN_FILES)):
        if any((folder / f).exists() for f in files):
            return name
    return None


def check_out_dir(out: Path, stage: str, inputs: dict[str, Path | None], force: bool | None,
                  need_bytes: int = 0) -> None:
    """Refuse an --out this stage must not replace, before any work (UserError, one line).

    A stage replaces --out only if it is absent, empty, or an artifact of its own stage (of another stage
    with --force); a file, a folder of anything else, or the folder of an input (inputs: {flag: path}) is
    refused whatever --force says. force: None for a stage without --force. Then check_room(need_bytes).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; name a folder (the stage writes its files inside)")
    for flag, path in inputs.items():
        holder = Path(path).resolve() if path is not None and Path(path).exists() else None
        if holder is not None and not holder.is_dir():
            holder = holder.parent
        if holder is not None and (holder == out.resolve() or out.resolve() in holder.parents):
            raise UserError(f"--out {out} holds {flag} {path}: writing there would replace the input; "
                            f"name another --out")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    owner = artifact_stage(out) if entries else None
    if entries and owner is None:
        raise UserError(f"--out {out} holds files that are not an artifact of this project (e.g. "
                        f"{entries[0]}); name another --out (an absent or empty folder, or an artifact to "
                        f"replace)")
    if owner not in (None, stage) and not force:
        hint = "name another --out" if force is None else "pass --force to replace it, or name another --out"
        raise UserError(f"--out {out} holds a {owner} artifact, not a {stage} one; {hint}")
    check_room(out, need_bytes)


def check_room(out: Path, need_bytes: int) -> None:
    """Refuse an --out that cannot be written, or whose file system has less than need_bytes free, before the
    work (the stage would fail only at its end). Found out by writing a temp file where --out is made or
    replaced: in its parent (the nearest that exists), never in --out itself, which another process of the
    same run (DDP) may be checking at the same time."""
    out = Path(out)
    base = next((p for p in out.absolute().parents if p.exists()), Path("/"))
    if not base.is_dir():
        raise UserError(f"--out {out}: {base} is a file, not a folder; name another --out")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".cuset-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"--out {out}: cannot write in {base} ({e.strerror}); name a folder you can write to"
                        ) from None
    free = shutil.disk_usage(out if out.is_dir() else base).free
    if free < need_bytes:
        raise UserError(f"--out {out}: needs about {need_bytes / 1e6:,.1f} MB, but {base} has "
                        f"{free / 1e6:,.1f} MB free; free some space or name another --out")


def aside_dir(out: Path) -> Path:
    """Where a stage keeps the previous artifact of `out` while it writes the new one: a hidden sibling."""
    out = Path(out).resolve()
    return out.with_name(f".{out.name}.previous")


def open_out(out: Path, start_over: bool) -> None:
    """Make `out` ready for a stage that writes its artifact in place (03, 04): continue what is there, or
    start over (--force) with the previous artifact moved to aside_dir(out), to be put back if the stage
    fails and deleted only once it succeeds (finishes_out). A kill leaves it aside, and `out` holds the
    killed run: a later success there deletes the aside; a later start-over discards the killed run."""
    out, aside = Path(out), aside_dir(out)
    if start_over and aside.exists():
        shutil.rmtree(out, ignore_errors=True)  # the killed run's partial state; aside holds the artifact
    elif start_over and out.is_dir() and any(out.iterdir()):
        os.replace(out, aside)
    out.mkdir(parents=True, exist_ok=True)
    _OPENED.append((out, start_over))


def finishes_out(main_fn):
    """A stage's main that settles what open_out set aside: put back over the new, incomplete artifact if
    main fails (an exception), deleted once main returns. An interrupt (Ctrl-C) keeps both: the new run can
    be resumed, the previous artifact waits aside."""
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
    return main


# ---------------------------------------------------------------------------------------
# SFT data: read any supported JSONL form, and tokenize a sample the same way in every stage.
# ---------------------------------------------------------------------------------------

# Used when the tokenizer has no chat template (documented in README).
PLAIN_PROMPT_TEMPLATE = "### System:\n{system}\n\n### Instruction:\n{user}\n\n### Response:\n"


def normalize_record(obj: dict, where: str) -> dict:
    """One SFT record -> {"id", "prompt_messages": [...], "response": str}.

    Accepted forms: chat `messages` (last turn is the assistant's), `prompt`/`completion`,
    `instruction`/`input`/`output`, or `text` (no prompt: every token is a response token).
    """
    rid = str(obj.get("id", where))
    if "messages" in obj:
        msgs = obj["messages"]
        ok = (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                     and m.get("role") in ("system", "user", "assistant")
                                                     for m in msgs))
        if not ok or msgs[-1]["role"] != "assistant":
            raise UserError(f"{where}: 'messages' must be a list of {{role, content}} turns ending with an "
                            f"assistant turn")
        prompt, response = msgs[:-1], msgs[-1]["content"]  # contents checked above
    elif "prompt" in obj and "completion" in obj:
        user, response = strings(where, obj["prompt"], obj["completion"])
        prompt = [{"role": "user", "content": user}]
    elif "instruction" in obj and "output" in obj:
        instruction, extra, response = strings(where, obj["instruction"], obj.get("input", ""), obj["output"])
        prompt = [{"role": "user", "content": instruction + (f"\n\n{extra}" if extra else "")}]
    elif "text" in obj:
        prompt, (response,) = [], strings(where, obj["text"])
    else:
        raise UserError(f"{where}: unknown record form (keys: {', '.join(sorted(obj)) or 'none'}); expected "
                        f"'messages', 'prompt'+'completion', 'instruction'+'input'+'output', or 'text'")
    if not response.strip():  # its tokens would be the end-of-turn token alone: nothing to profile or learn
        raise UserError(f"{where}: the response (the answer to learn) is empty; write it, or remove the "
                        f"record")
    return {"id": rid, "prompt_messages": prompt, "response": response}


def strings(where: str, *fields) -> tuple[str, ...]:
    """The fields of a record, refused unless all are strings."""
    if not all(isinstance(f, str) for f in fields):
        raise UserError(f"{where}: fields must be strings")
    return fields


def load_sft(path: Path) -> list[dict]:
    records = [normalize_record(obj, f"{path}:{lineno}") | {"line": lineno} for lineno, obj in read_jsonl(path)]
    if not records:
        raise UserError(f"{path}: no records")
    return records


def render_prompt_and_response(tokenizer, record: dict) -> tuple[str, str]:
    """Text of the prompt (ending where the model starts answering) and of the response.

    With a chat template the response is the assistant content plus whatever the template
    appends to close the turn (the end-of-turn token: the model must learn to stop).
    """
    msgs = record["prompt_messages"]
    if getattr(tokenizer, "chat_template", None) and msgs:
        prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": record["response"]}],
                                             tokenize=False)
        if not full.startswith(prompt):
            raise UserError("the chat template does not render the prompt as a prefix of the conversation; "
                            "pass a tokenizer whose template does")
        return prompt, close_turn(tokenizer, full[len(prompt):], record["response"])
    eos = tokenizer.eos_token or ""
    if not msgs:
        return "", record["response"] + eos
    system = "\n".join(m["content"] for m in msgs if m["role"] == "system")
    user = "\n\n".join(m["content"] for m in msgs if m["role"] != "system")
    return PLAIN_PROMPT_TEMPLATE.format(system=system, user=user), record["response"] + eos


def special_token_strings(tokenizer) -> list[str]:
    """Text of every special token: the named ones and the added tokens marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted({*tokenizer.all_special_tokens, *(t.content for t in added.values() if t.special)} - {""})


def close_turn(tokenizer, response: str, content: str) -> str:
    """The response as the model must produce it: the assistant content and the template's text up to and
    including its end-of-turn token, nothing after it.

    ChatML writes `<|im_end|>\n` after a turn; generation stops at `<|im_end|>`, so the `\n` is never
    predicted and must not be trained or profiled either (issue 9, item 6). A template that closes the turn
    without any special token keeps its closing text minus trailing whitespace.
    """
    body = response.find(content) + len(content) if content and content in response else 0
    tail = response[body:]
    ends = [tail.find(s) + len(s) for s in special_token_strings(tokenizer) if s in tail]
    return response[:body] + (tail[:min(ends)] if ends else tail.rstrip())


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end an assistant turn: eos, and the special token the chat template closes a turn
    with (ChatML's `<|im_end|>` in a tokenizer whose eos is another token). Generation stops at any."""
    _, response = render_prompt_and_response(tokenizer, {"prompt_messages": [{"role": "user", "content": "?"}],
                                                         "response": "x"})
    ids = {tokenizer.eos_token_id} - {None}
    ids |= {tokenizer.convert_tokens_to_ids(s) for s in special_token_strings(tokenizer) if response.endswith(s)}
    return sorted(i for i in ids if i is not None and i != tokenizer.unk_token_id)


def encode_sample(tokenizer, record: dict, max_length: int) -> dict:
    """Token ids of prompt + response, with the response tokens' character spans.

    Prompt and response are tokenized separately so that the boundary is a token boundary
    and the spans index into the response text. Returns input_ids (list), response_start
    (index of the first response token, i.e. of the first predicted one), spans [(start, end)]
    per response token from response_start on,
    response_text, truncated (the response lost its tail to max_length).
    """
    prompt_text, response_text = render_prompt_and_response(tokenizer, record)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"] if prompt_text else []
    enc = tokenizer(response_text, add_special_tokens=False, return_offsets_mapping=True)
    resp_ids, spans = enc["input_ids"], [tuple(s) for s in enc["offset_mapping"]]
    room = max(0, max_length - len(prompt_ids))
    truncated = len(resp_ids) > room
    start, spans = len(prompt_ids), spans[:room]
    if start == 0 and spans:  # `text` form: nothing predicts the first token, it is context only (assumption)
        start, spans = 1, spans[1:]
    # a prompt that alone fills max_length leaves no response token: nothing of it is worth a forward
    # pass, so it is cut to max_length too and the stages skip and count the sample (issue 9, item 4)
    return {"input_ids": (prompt_ids + resp_ids[:room])[:max_length], "response_start": min(start, max_length),
            "spans": spans, "response_text": response_text, "truncated": truncated}


# ---------------------------------------------------------------------------------------
# Models: loading with one-line errors, and the check that logits are a plain linear head.
# ---------------------------------------------------------------------------------------

# What a local model folder must hold, per part: at least one file matching one of the patterns.
MODEL_PARTS = {"tokenizer": ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"),
               "model config": ("config.json",), "model weights": ("*.safetensors", "*.bin")}


def check_model_source(name: str, parts: tuple[str, ...] = tuple(MODEL_PARTS)) -> None:
    """A local folder must exist and hold the files of each part (MODEL_PARTS); any other name must be a hub
    id that is in the local Hugging Face cache or can be reached (check_hub_id)."""
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if not looks_local:
        check_hub_id(name)
        return
    if not path.is_dir():
        raise UserError(f"--model {name}: {'is not a folder' if path.exists() else 'no such folder'}; pass a "
                        f"folder holding a Hugging Face model (config.json, weights, tokenizer) or a hub id")
    for part in parts:
        if not any(any(path.glob(pattern)) for pattern in MODEL_PARTS[part]):
            raise UserError(f"--model {name}: this folder holds no {part} (none of "
                            f"{', '.join(MODEL_PARTS[part])}); point --model at the folder that "
                            f"save_pretrained wrote")


@functools.lru_cache(maxsize=None)
def check_hub_id(name: str) -> None:
    """Refuse in about a second a name that is neither a local folder nor a hub id we can use: not in the
    local cache, and the hub unreachable (offline, no network) or without it. A reachable hub that has it
    passes: from_pretrained downloads it. Without this, from_pretrained retries for about 45 s first."""
    import huggingface_hub
    from huggingface_hub.errors import (GatedRepoError, HFValidationError, HfHubHTTPError,
                                        RepositoryNotFoundError)

    start = f"--model {name}: no local folder {name}, and hub id {name}"
    fix = "pass the folder that holds the model, or a hub id that exists (with network access to download it)"
    try:
        files = ("config.json", "tokenizer_config.json")
        cached = (huggingface_hub.try_to_load_from_cache(name, f) for f in files)
        if any(isinstance(path, str) for path in cached):  # a path; else None or a "known missing" marker
            return
        huggingface_hub.model_info(name, timeout=2)
    except HFValidationError as e:
        raise UserError(f"{start} is not a valid hub id ({e}); {fix}") from None
    except GatedRepoError:
        return  # it exists; from_pretrained says how to get access
    except RepositoryNotFoundError:
        raise UserError(f"{start} is not found on the hub (or it is private: log in with `hf auth login`); "
                        f"{fix}") from None
    except HfHubHTTPError:
        return  # the hub answered (an error of its own): leave the verdict to from_pretrained
    except Exception as e:  # the HTTP client's own errors (no network, DNS, timeout), and offline mode
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        raise UserError(f"{start} is not in the local cache and the hub cannot be reached ({why}); {fix}"
                        ) from None


def load_tokenizer(name: str, need_offsets: bool = True, **kwargs):
    """The model's tokenizer, fast when need_offsets (character spans). A failure is one line naming the path."""
    from transformers import AutoTokenizer

    check_model_source(name, ("tokenizer",))
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, ValueError, ImportError, KeyError) as e:
        raise UserError(f"--model {name}: cannot load its tokenizer ({str(e).splitlines()[0] if str(e) else e!r})"
                        ) from None
    if need_offsets and not tokenizer.is_fast:
        raise UserError(f"--model {name}: its tokenizer is not a fast tokenizer; character offsets are needed")
    return tokenizer


def load_causal_lm(name: str, dtype):
    """AutoModelForCausalLM in `dtype`; a failure is one line naming the path and what is missing."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    check_model_source(name, ("model config", "model weights"))
    try:
        return AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError, ImportError, KeyError, SafetensorError) as e:  # Safetensor: a damaged file
        raise UserError(f"--model {name}: cannot load the model ({str(e).splitlines()[0] if str(e) else e!r})"
                        ) from None


def output_head(model):
    """(weight [V, d], bias [V] or None) of the model's output layer: logits = h @ weight.T + bias."""
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def check_head_is_plain(model, input_ids, stage: str) -> None:
    """Refuse a model whose logits are not `last_hidden_state @ W.T + b` (issue 9, item 2).

    The stages apply the output layer themselves, in chunks over response positions only, so a model
    that scales (Granite's logits_scaling) or soft-caps (Gemma 2) its logits would be scored and trained
    on the wrong distribution. Checked on one forward pass in eval mode, on up to 64 tokens: a hook
    takes the base model's output on its way to the head. (Two passes need not agree to the last bit:
    on CPU the first forward pass of a process can take other kernels, 1e-3 apart in the logits here.)
    Tolerance: what rounding allows, not a guess. Each side's float32 dot product of length d (+ bias)
    is within gamma * (|h| @ |W|.T + |b|) of the exact value, gamma = (d+1)u / (1 - (d+1)u), u = 2^-24
    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1), plus the rounding
    of the model's logits to their own dtype.
    """
    import torch

    captured = {}

    def keep(_module, _inputs, out):
        captured["hidden"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    was_training = model.training
    model.eval()
    hook = model.base_model.register_forward_hook(keep)
    try:
        with torch.no_grad():
            theirs = model(input_ids=input_ids[:, :64], use_cache=False).logits  # [1, L, V]
    finally:
        hook.remove()
        model.train(was_training)
    with torch.no_grad():
        hidden = captured["hidden"].float()  # [1, L, d]
        weight, bias = output_head(model)
        w = weight.float()  # [V, d]
        b = bias.float() if bias is not None else torch.zeros(w.shape[0], device=w.device)  # [V]
        ours = hidden @ w.t() + b  # [1, L, V]
        d, u = hidden.shape[-1], 2.0 ** -24
        gamma = (d + 1) * u / (1 - (d + 1) * u)
        allowed = 2 * gamma * (hidden.abs() @ w.abs().t() + b.abs()) + torch.finfo(theirs.dtype).eps * theirs.abs()
        err = (ours - theirs.float()).abs().flatten()
        allowed = allowed.flatten()
        worst = torch.argmax(err - allowed)  # the logit furthest past what rounding allows
        diff, room = err[worst].item(), allowed[worst].item()
    if diff > room:
        raise UserError(f"model type {model.config.model_type!r} ({type(model).__name__}): its logits are not "
                        f"last_hidden_state @ lm_head.weight.T (+ bias): they differ by up to {diff:.2g}, where "
                        f"rounding allows {room:.2g} (logit scaling or soft-capping?); {stage} applies the output "
                        f"layer itself and does not support this model")
