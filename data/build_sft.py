"""Build the bundled SFT data from the `train` split of data/tasks/tasks.jsonl.

    python data/build_sft.py           # writes data/sft/train.jsonl and data/sft/train_kernel.jsonl
    python data/build_sft.py --check   # exit 1 if the committed files are stale

train.jsonl: one record per (train task, prompt level 1-3), standalone mode: the user turn is
built by cuset_common.build_prompt (the same builder stage 04 uses), the assistant turn is
the task's reference program in one ```cpp block.

train_kernel.jsonl: the kernel-mode variant, one record per train task, the level cycling
1, 2, 3 over tasks so that a small set still covers every level; the assistant turn is only
the reference kernels (what kernel mode asks a model to write).

Records are chat `messages` plus `id`, `task_id`, `level`, `mode` (extra keys are ignored by
the stages). Output is deterministic: rerunning reproduces the files byte for byte.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common import (LEVELS, SFT_FILE, SFT_KERNEL_FILE, TASKS_FILE, build_messages,  # noqa: E402
                          fence, load_tasks, write_jsonl_atomic)


def record(task: dict, level: int, mode: str) -> dict:
    code = task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"]
    messages = build_messages(task, level, mode) + [{"role": "assistant", "content": fence(code)}]
    return {"id": f"{task['id']}/{mode}/L{level}", "task_id": task["id"], "level": level, "mode": mode,
            "messages": messages}


def build(tasks: list[dict]) -> tuple[list[dict], list[dict]]:
    train = [t for t in tasks if t.get("split") == "train"]
    standalone = [record(t, level, "standalone") for t in train for level in LEVELS]
    kernel = [record(t, LEVELS[i % len(LEVELS)], "kernel") for i, t in enumerate(train)]
    return standalone, kernel


def as_text(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=TASKS_FILE, help="task JSONL (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=SFT_FILE, help="standalone SFT JSONL (default: %(default)s)")
    ap.add_argument("--out-kernel", type=Path, default=SFT_KERNEL_FILE,
                    help="kernel-mode SFT JSONL (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the outputs instead of writing")
    args = ap.parse_args(argv)

    standalone, kernel = build(load_tasks(args.tasks))
    if not standalone:
        print(f"{args.tasks}: no task has split 'train'", file=sys.stderr)
        return 2
    outputs = [(args.out, standalone), (args.out_kernel, kernel)]
    if args.check:
        stale = [str(p) for p, recs in outputs if not p.exists() or p.read_text(encoding="utf-8") != as_text(recs)]
        print("STALE, run python data/build_sft.py: " + ", ".join(stale) if stale else "SFT data up to date")
        return 1 if stale else 0
    for path, recs in outputs:
        write_jsonl_atomic(path, recs)
        print(f"wrote {path}: {len(recs)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
