"""Memorise-and-copy baseline for kernel mode: what a model would score that knew every train answer by
heart and copied the prompt's names without error, but could not write a kernel it has not seen.

For each task of --split with a kernel-mode harness, pick a train task whose kernel signatures have the
same shape (as many kernels, the same parameter types in the same order), one of the same category when
there is one; rename its kernels and parameters to the task's own, by position, and give its reference
kernels as the answer. A task no train signature fits gets no answer (stage 04: `missing`). Stage 04
evaluates the file like any other completions:

    python research/nearest_train.py          # writes data/artifacts/nearest_train.jsonl
    python 04_eval_kernels.py --solutions data/artifacts/nearest_train.jsonl --mode kernel --levels 1 \\
        --split eval --backend emulate
    python research/nearest_train.py --help

Two readings. Its compile rate is what copying names buys a model that only memorises: the
bundled tiny model has no such copy and compiles nothing. Its pass rate checks the split the other way
round: a train answer that computes an eval task's op would mean the op leaked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # the taskgen package lives in data/
from taskgen.variants import rename_code  # noqa: E402  (the SFT copies' renaming: members keep their names)

from cuset_common.cli import UserError, run_main
from cuset_common.files import write_jsonl_atomic
from cuset_common.paths import DATA, LEVELS, TASKS_FILE
from cuset_common.tasks import KERNEL_SIGNATURE, fence, load_tasks, signature_parts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tasks", type=Path, default=TASKS_FILE, help="task file with train tasks (default: %(default)s)"
    )
    ap.add_argument("--split", default="eval", help="split to answer (default: %(default)s)")
    ap.add_argument(
        "--out",
        type=Path,
        default=DATA / "artifacts" / "nearest_train.jsonl",
        help="solutions JSONL to write, for stage 04 --solutions (default: %(default)s)",
    )
    return ap.parse_args(argv)


def shape(task: dict) -> tuple:
    """What a harness needs of the candidate's kernels besides their names: parameter types per kernel."""
    return tuple(tuple(signature_parts(s)[1]) for s in task["kernel_mode"]["signatures"])


def pick_source(task: dict, train: list[dict]) -> dict | None:
    """The first train task of the same signature shape, one of the task's category first."""
    target = shape(task)
    fits = [t for t in train if shape(t) == target]
    same_category = [t for t in fits if t.get("category") == task.get("category")]
    return (same_category or fits or [None])[0]


def renamed_kernels(source: dict, task: dict) -> str:
    """The source task's reference kernels under the task's kernel and parameter names (by position)."""
    names = {}
    for theirs, ours in zip(source["kernel_mode"]["signatures"], task["kernel_mode"]["signatures"]):
        (k_src, _, p_src), (k_dst, _, p_dst) = signature_parts(theirs), signature_parts(ours)
        names[k_src] = k_dst
        names.update((a, b) for a, b in zip(p_src, p_dst) if a and b)  # "": a parameter without a name
    return rename_code(source["kernel_mode"]["reference_kernels"], names)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = [t for t in load_tasks(args.tasks) if t.get("kernel_mode")]
    train = [t for t in tasks if t.get("split") == "train"]
    wanted = [t for t in tasks if t.get("split") == args.split]
    for task in tasks:
        bad = [s for s in task["kernel_mode"]["signatures"] if not KERNEL_SIGNATURE.search(s)]
        if bad:
            raise UserError(
                f"--tasks {args.tasks}: task {task['id']}: kernel_mode signature {bad[0]!r} is not "
                f"`__global__ void name(params)`; fix the task file"
            )
    if not train or not wanted:
        raise UserError(
            f"--tasks {args.tasks}: {len(train)} train and {len(wanted)} {args.split!r} tasks with a "
            f"kernel-mode harness; the baseline needs both (pass --split, or our task file)"
        )
    rows, same_category = [], 0
    for task in wanted:
        source = pick_source(task, train)
        if source is None:
            continue
        same_category += source.get("category") == task.get("category")
        answer = fence(renamed_kernels(source, task))
        # One answer serves every level: kernel mode's harness and signatures do not depend on it.
        rows += [
            {"task_id": task["id"], "level": level, "sample": 0, "completion": answer, "source": source["id"]}
            for level in LEVELS
        ]
    write_jsonl_atomic(args.out, rows)
    print(
        f"{len(rows) // len(LEVELS)} of {len(wanted)} {args.split} tasks answered from a train task "
        f"of the same signature shape ({same_category} of the same category); wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
