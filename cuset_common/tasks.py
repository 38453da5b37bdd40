"""CUDABench tasks and the prompt builder: the SFT data (data/build_sft.py) and the evaluation
(04_eval_kernels.py) must word prompts identically."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .cli import UserError
from .files import read_jsonl
from .paths import LEVELS, MODES, SYSTEM_PROMPT, TASKS_FILE

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
        parts += ["Inputs (raw little-endian binary files, row-major):",
                  *_buffer_lines(task["inputs"], "read from"),
                  "Outputs:", *_buffer_lines(task["outputs"], "write to"), "",
                  "Write a complete CUDA C++ program with a main function that reads the inputs, computes "
                  "the outputs on the GPU and writes them. Reply with the whole "
                  "program in one ```cpp code block."]
    else:
        km = task.get("kernel_mode")
        if not km:
            raise UserError(f"task {task['id']} has no kernel_mode harness; use --mode standalone")
        parts += ["Inputs:", *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}" for b in task["inputs"]],
                  "Outputs:", *[f"- {b['name']}: {b['dtype']}, shape {b['shape']}"
                                for b in task["outputs"]], "",
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
