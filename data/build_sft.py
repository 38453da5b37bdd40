"""Build the bundled SFT data from the `train` split of data/tasks/tasks.jsonl, and the held-out
SFT data from its `eval` split.

    python data/build_sft.py                # writes data/sft/{train,train_kernel,eval,eval_kernel}.jsonl
    python data/build_sft.py --variants 0   # kernel-mode file without renamed copies (the 102 answers only)

train_kernel_originals.jsonl: the kernel-mode records of the train tasks themselves, without renamed
copies (the first 102 records of train_kernel.jsonl): the training data of a real model, which reads
names from its prompt without them (research/compare_objectives.py --preset cpu-real).
    python data/build_sft.py --check        # exit 1 if the committed files are stale

train.jsonl: one record per (train task, prompt level 1-3), standalone mode: the user turn is
built by cuset_common.tasks.build_prompt (the same builder stage 04 uses), the assistant turn is
the task's reference program in one ```cpp block.

train_kernel.jsonl: the kernel-mode data, one record per train task, the level cycling
1, 2, 3 over tasks so that a small set still covers every level; the assistant turn is only
the reference kernels (what kernel mode asks a model to write). Then --variants K renamed
copies of every train task (data/taskgen/variants.py: kernel, helper, constant and parameter
names drawn afresh, consistently in prompt, signatures and answer; ids `<task id>~v<j>`), each
rendered as a task of its own, so that the names an answer must use can only be read from its
prompt: without them a tiny model memorises the 102 answers and writes training kernels' names
for held-out tasks. Copies are made of train tasks only; each is checked to be of a train op and
to name no held-out op. Standalone data gets no copies: its answers are whole programs, three
times longer, and the tiny model's demo is kernel mode.

eval.jsonl and eval_kernel.jsonl: the same two forms, built by the same record() from the `eval`
split (held-out ops, as stage 04 evaluates them by default), without renamed copies: held-out data
for stage 01 to score trained checkpoints on (research/compare_objectives.py). Never trained on.

Records are chat `messages` plus `id`, `task_id`, `level`, `mode` (extra keys are ignored by
the stages). Output is deterministic: rerunning reproduces the files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common (taskgen.variants uses it too)
from taskgen import FAMILIES  # noqa: E402
from taskgen.core import OpSpec, render_task  # noqa: E402
from taskgen.variants import held_out_words, variant  # noqa: E402

from cuset_common.cli import UserError, run_main
from cuset_common.files import write_jsonl_atomic
from cuset_common.paths import (
    EVAL_SFT_FILE,
    EVAL_SFT_KERNEL_FILE,
    LEVELS,
    SFT_FILE,
    SFT_KERNEL_FILE,
    SFT_KERNEL_ORIGINALS_FILE,
    TASKS_FILE,
)
from cuset_common.tasks import build_messages, fence, load_tasks

# Renamed copies per train task in the bundled kernel-mode file. With the originals that is
# 102 x (1 + 9) = 1,020 records, few enough for a stage-03 epoch on the tiny model on a CPU
# (docs/performance.md, "Building the models", times it).
DEFAULT_VARIANTS = 9


def record(task: dict, level: int, mode: str) -> dict:
    code = task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"]
    messages = build_messages(task, level, mode) + [{"role": "assistant", "content": fence(code)}]
    return {
        "id": f"{task['id']}/{mode}/L{level}",
        "task_id": task["id"],
        "level": level,
        "mode": mode,
        "messages": messages,
    }


def train_specs(train: list[dict]) -> list[OpSpec]:
    """The specs the train tasks were rendered from; refuses a task file that they no longer render."""
    specs = {s.task_id: s for family in FAMILIES for s in family.specs()}
    out = []
    for t in train:
        spec = specs.get(t["id"])
        if spec is None or render_task(spec) != t:
            raise UserError(
                f"task {t['id']} is not what data/taskgen renders: renamed copies are made from the "
                f"bundled tasks; rebuild them with python data/build_tasks.py, or pass --variants 0"
            )
        out.append(spec)
    return out


def variant_tasks(train: list[dict], k: int) -> list[list[dict]]:
    """k renamed copies of each train task, as rendered tasks: result[j - 1][i] is copy j of task i."""
    if k == 0:
        return []
    specs = [s for family in FAMILIES for s in family.specs()]
    forbidden = held_out_words(specs)
    base = train_specs(train)
    copies = [[render_task(variant(s, j, forbidden)) for s in base] for j in range(1, k + 1)]
    for c in (c for row in copies for c in row):
        if (
            c["split"] != "train" or c["op"] in forbidden
        ):  # variant() refuses both; kept as the data's own guard
            raise UserError(f"copy {c['id']} is not of a train op")
    return copies


def build_split(tasks: list[dict], split: str, k: int) -> tuple[list[dict], list[dict]]:
    """(standalone records, kernel-mode records) of one split's tasks, the latter with k renamed copies."""
    chosen = [t for t in tasks if t.get("split") == split]
    standalone = [record(t, level, "standalone") for t in chosen for level in LEVELS]
    kernel = [record(t, LEVELS[i % len(LEVELS)], "kernel") for i, t in enumerate(chosen)]
    # Copy j starts the level cycle j places later, so each task's copies cover every level.
    for j, row in enumerate(variant_tasks(chosen, k), start=1):
        kernel += [
            dict(record(t, LEVELS[(i + j) % len(LEVELS)], "kernel"), variant_of=chosen[i]["id"])
            for i, t in enumerate(row)
        ]
    return standalone, kernel


def as_text(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=TASKS_FILE, help="task JSONL (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=SFT_FILE, help="standalone SFT JSONL (default: %(default)s)")
    ap.add_argument(
        "--out-kernel",
        type=Path,
        default=SFT_KERNEL_FILE,
        help="kernel-mode SFT JSONL (default: %(default)s)",
    )
    ap.add_argument(
        "--out-kernel-originals",
        type=Path,
        default=SFT_KERNEL_ORIGINALS_FILE,
        help="kernel-mode SFT JSONL without renamed copies (default: %(default)s)",
    )
    ap.add_argument(
        "--out-eval",
        type=Path,
        default=EVAL_SFT_FILE,
        help="held-out standalone SFT JSONL, eval split (default: %(default)s)",
    )
    ap.add_argument(
        "--out-eval-kernel",
        type=Path,
        default=EVAL_SFT_KERNEL_FILE,
        help="held-out kernel-mode SFT JSONL, eval split (default: %(default)s)",
    )
    ap.add_argument(
        "--variants",
        type=int,
        default=DEFAULT_VARIANTS,
        help="renamed copies of each train task in the kernel-mode file (default: %(default)s)",
    )
    ap.add_argument("--check", action="store_true", help="compare with the outputs instead of writing")
    args = ap.parse_args(argv)
    if args.variants < 0:
        print(f"--variants must be >= 0, got {args.variants}", file=sys.stderr)
        return 2

    tasks = load_tasks(args.tasks)
    standalone, kernel = build_split(tasks, "train", args.variants)
    eval_standalone, eval_kernel = build_split(tasks, "eval", 0)  # held out: never renamed copies
    for split, recs in (("train", standalone), ("eval", eval_standalone)):
        if not recs:
            print(f"{args.tasks}: no task has split {split!r}", file=sys.stderr)
            return 2
    originals = [r for r in kernel if "~" not in r["id"]]  # build_split puts each task before its copies
    outputs = [
        (args.out, standalone),
        (args.out_kernel, kernel),
        (args.out_kernel_originals, originals),
        (args.out_eval, eval_standalone),
        (args.out_eval_kernel, eval_kernel),
    ]
    if args.check:
        stale = [
            str(p) for p, recs in outputs if not p.exists() or p.read_text(encoding="utf-8") != as_text(recs)
        ]
        print("STALE, run python data/build_sft.py: " + ", ".join(stale) if stale else "SFT data up to date")
        return 1 if stale else 0
    for path, recs in outputs:
        write_jsonl_atomic(path, recs)
        print(f"wrote {path}: {len(recs)} records")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
