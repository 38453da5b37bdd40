"""CUDABench tasks and the prompt builder: the SFT data (data/build_sft.py) and the evaluation
(04_eval_kernels.py) must word prompts identically."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import json_kind
from .cli import UserError
from .files import read_jsonl
from .paths import LEVELS, MODES, SYSTEM_PROMPT, TASKS_FILE

TASK_REQUIRED = (
    "id",
    "task_name",
    "inputs",
    "outputs",
    "bench.cu",
    "gen.py",
    "compare.py",
    "level1_prompt",
    "level2_prompt",
    "level3_prompt",
)
# The fields read as text (the prompt's words, the scripts written to files); the optional ones where present.
TASK_TEXT = ("task_name", "bench.cu", "gen.py", "compare.py", *(f"level{lv}_prompt" for lv in LEVELS))
TASK_OPTIONAL_TEXT = ("task_description", "split", "category")
BUFFER_TEXT = ("name", "dtype", "shape")
KERNEL_MODE_TEXT = ("harness.cu", "marker", "launch", "reference_kernels")  # and signatures: a list of text
# The largest buffer a task may declare. A candidate may write 1.5x the largest (harness/programs.py:
# output_limit_mb), set as a file-size rlimit, which Python's setrlimit takes as a signed 64-bit count of
# bytes: 1.5 x 2^62 < 2^63.
MAX_BUFFER_BYTES = 1 << 62
# Linux's NAME_MAX: a buffer is the file <name>.bin, one path component.
NAME_MAX = 255


def load_tasks(path: Path = TASKS_FILE) -> list[dict]:
    """Read a CUDABench-format task file (ours or the real one), checking each field we use for its type
    (task_problem) and that each id names one task (a result row names its task by id)."""
    tasks, first_line = [], {}
    for lineno, task in read_jsonl(path):
        missing = [k for k in TASK_REQUIRED if k not in task]
        if missing:
            raise UserError(
                f"{path}:{lineno}: task is missing {', '.join(missing)}; "
                f"a CUDABench task needs {', '.join(TASK_REQUIRED)}"
            )
        if problem := task_problem(task):
            raise UserError(f"{path}:{lineno}: {problem}; fix that field of the task")
        if str(task["id"]) in first_line:
            raise UserError(
                f"{path}:{lineno}: task id {task['id']!r} is already the id of line "
                f"{first_line[str(task['id'])]}; give each task its own id"
            )
        first_line[str(task["id"])] = lineno
        tasks.append(task)
    return tasks


def task_problem(task: dict) -> str | None:
    """What is wrong with one task's fields, in words (None: nothing): the id an integer or a one-line
    string; the text fields strings; inputs and outputs arrays of buffers (buffer_problem); kernel_mode,
    where present, an object of its text fields and a list of signatures, its marker inside its harness."""
    tid = task["id"]
    if not (type(tid) is int or (isinstance(tid, str) and tid and tid.isprintable())):
        return f"id must be an integer or a one-line string, not {json_kind(tid)}"
    problem = task_field_problem(task)
    return f"task {tid!r}: {problem}" if problem else None


def task_field_problem(task: dict) -> str | None:
    """task_problem's answer for the fields other than the id."""
    for key in (*TASK_TEXT, *(k for k in TASK_OPTIONAL_TEXT if k in task)):
        if not isinstance(task[key], str):
            return f"{key} must be a string, not {json_kind(task[key])}"
    for key in ("inputs", "outputs"):
        if not isinstance(task[key], list):
            return f"{key} must be an array of {{name, dtype, shape}} objects, not {json_kind(task[key])}"
        for i, buf in enumerate(task[key]):
            if problem := buffer_problem(buf):
                return f"{key}[{i}]: {problem}"
    km = task.get("kernel_mode")
    if km is None:  # no kernel-mode harness (--mode kernel refuses the task)
        return None
    if not isinstance(km, dict):
        return f"kernel_mode must be an object (or absent), not {json_kind(km)}"
    for key in KERNEL_MODE_TEXT:
        if not isinstance(km.get(key), str):
            return f"kernel_mode.{key} must be a string, not {json_kind(km.get(key))}"
    signatures = km.get("signatures")
    if not (isinstance(signatures, list) and all(isinstance(s, str) for s in signatures)):
        return f"kernel_mode.signatures must be an array of strings, not {json_kind(signatures)}"
    if not km["marker"] or km["marker"] not in km["harness.cu"]:
        return "kernel_mode.marker must occur in kernel_mode.harness.cu (the kernels are put in its place)"
    return None


def buffer_problem(buf) -> str | None:
    """What is wrong with one buffer of inputs or outputs (None: nothing): name, dtype and shape strings,
    the name one file name, the size it declares at most MAX_BUFFER_BYTES."""
    if not isinstance(buf, dict):
        return f"must be an object {{name, dtype, shape}}, not {json_kind(buf)}"
    for key in BUFFER_TEXT:
        if not isinstance(buf.get(key), str):
            return f"{key} must be a string, not {json_kind(buf.get(key))}"
    name = buf["name"]
    if not name or not name.isprintable() or "/" in name or len(f"{name}.bin".encode()) > NAME_MAX:
        return (
            f"name {name!r} must name one file (<name>.bin, at most {NAME_MAX} bytes): printable, without '/'"
        )
    if any(len(d) > 19 for d in re.findall(r"\d+", buf["shape"])) or buffer_bytes(buf) > MAX_BUFFER_BYTES:
        return f"shape {buf['shape']!r} of {buf['dtype']!r} declares over 2^62 bytes"
    return None


def buffer_bytes(buf: dict) -> int:
    """The bytes a buffer declares: the product of the numbers in its shape ("(128, 128, 4)"; none: 0)
    times its dtype's item size, numpy's for a type name (float32, i4), else 8, the widest usual element
    (bfloat16, a typo; numpy would parse a dtype such as "(2,3)f4, i8" as Python source)."""
    dims = [int(d) for d in re.findall(r"\d+", buf["shape"])]
    return math.prod(dims) * item_size(buf["dtype"]) if dims else 0


def item_size(dtype: str) -> int:
    """buffer_bytes' item size of a dtype."""
    if re.fullmatch(r"[A-Za-z]\w*", dtype):
        try:
            with warnings.catch_warnings():  # numpy warns of deprecated aliases ("a" for "S")
                warnings.simplefilter("ignore")
                return np.dtype(dtype).itemsize
        except (TypeError, ValueError):
            pass
    return 8


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
        parts += [
            "Inputs (raw little-endian binary files, row-major):",
            *_buffer_lines(task["inputs"], "read from"),
            "Outputs:",
            *_buffer_lines(task["outputs"], "write to"),
            "",
            "Write a complete CUDA C++ program with a main function that reads the inputs, computes "
            "the outputs on the GPU and writes them. Reply with the whole "
            "program in one ```cpp code block.",
        ]
    else:
        km = task.get("kernel_mode")
        if not km:
            raise UserError(f"task {task['id']} has no kernel_mode harness; use --mode standalone")
        parts += [
            "Inputs:",
            *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}" for b in task["inputs"]],
            "Outputs:",
            *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}" for b in task["outputs"]],
            "",
            "Write only the CUDA kernel(s) with exactly these signatures, plus any __device__ helpers "
            "and constants they need:",
            *[f"  {s}" for s in km["signatures"]],
            f"The host code is fixed: {km['launch']}",
            "Do not write main or any host code. Reply with the code in one ```cpp code block.",
        ]
    return "\n".join(parts)


def build_messages(task: dict, level: int, mode: str) -> list[dict[str, Any]]:
    """System and user turns, ready for tokenizer.apply_chat_template."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": build_prompt(task, level, mode)},
    ]


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
