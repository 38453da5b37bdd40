"""Plumbing shared by the stages and the data builders: paths, errors, atomic writes,
JSONL reading with file:line errors, and the task prompt builder.

The method itself lives in the stage files; nothing here knows about confidences, regions
or losses. The prompt builder is here because the SFT data (data/build_sft.py) and the
evaluation (04_eval_kernels.py) must word prompts identically.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
TASKS_FILE = DATA / "tasks" / "tasks.jsonl"
SFT_FILE = DATA / "sft" / "train.jsonl"
SFT_KERNEL_FILE = DATA / "sft" / "train_kernel.jsonl"
TINY_MODEL = DATA / "models" / "tiny-cuda-lm"

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
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: Path, records: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


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
    """Yield (line number, object) for each non-blank line; a bad line raises UserError with file:line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                                f"each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


# ---------------------------------------------------------------------------------------
# Tasks and prompts
# ---------------------------------------------------------------------------------------

TASK_REQUIRED = ("id", "task_name", "inputs", "outputs", "bench.cu", "gen.py", "compare.py",
                 "level1_prompt", "level2_prompt", "level3_prompt")


def load_tasks(path: Path = TASKS_FILE) -> list[dict]:
    """Read a CUDABench-format task file (ours or the real one), checking the fields we use."""
    tasks = []
    for lineno, task in read_jsonl(path):
        missing = [k for k in TASK_REQUIRED if k not in task]
        if missing:
            raise UserError(f"{path}:{lineno}: task is missing {', '.join(missing)}; "
                            f"a CUDABench task needs {', '.join(TASK_REQUIRED)}")
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


def fence(code: str) -> str:
    """The assistant turn's form: one ```cpp block."""
    return f"```cpp\n{code.strip()}\n```"
