"""Build the bundled task suite data/tasks/tasks.jsonl from the family modules in data/taskgen/.

Each line is one task in the CUDABench schema (id, task_name, task_description, inputs,
outputs, bench.cu, gen.py, compare.py, level1/2/3_prompt) plus our fields: split
(train / eval / pretrain, disjoint by operation), category, op, and kernel_mode (the fixed
host harness with a marked insertion point, the exact kernel signatures, the launch
configuration in words, and the reference kernels).

The output is deterministic: running this again reproduces the file byte for byte.

    python data/build_tasks.py                      # writes data/tasks/tasks.jsonl
    python data/build_tasks.py --out /tmp/t.jsonl   # somewhere else
    python data/build_tasks.py --check              # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from taskgen import FAMILIES
from taskgen.core import OpSpec, render_task, to_jsonl_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common.files import write_text_atomic  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "tasks" / "tasks.jsonl"


def collect_specs() -> list[OpSpec]:
    specs = [spec for family in FAMILIES for spec in family.specs()]
    ids = Counter(s.task_id for s in specs)
    dup = [i for i, c in ids.items() if c > 1]
    if dup:
        raise SystemExit(f"duplicate task ids: {dup}")
    split_of_op: dict[str, str] = {}
    for s in specs:
        if split_of_op.setdefault(s.op, s.split) != s.split:
            raise SystemExit(f"op {s.op!r} appears in splits {split_of_op[s.op]!r} and {s.split!r}")
    return specs


def render_all(specs: list[OpSpec]) -> str:
    return "".join(to_jsonl_line(render_task(s)) for s in specs)


def summary(specs: list[OpSpec]) -> str:
    by_split = Counter(s.split for s in specs)
    by_cat = Counter((s.category, s.split) for s in specs)
    cats = sorted({s.category for s in specs})
    lines = [
        f"{len(specs)} tasks, {len({s.op for s in specs})} ops, {len(cats)} categories: "
        + ", ".join(f"{k}={by_split[k]}" for k in ("train", "eval", "pretrain"))
    ]
    for c in cats:
        lines.append(
            f"  {c:<16} " + "  ".join(f"{k}={by_cat[(c, k)]:>2}" for k in ("train", "eval", "pretrain"))
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output JSONL (default: %(default)s)")
    ap.add_argument(
        "--check", action="store_true", help="compare with --out instead of writing; exit 1 if different"
    )
    args = ap.parse_args(argv)

    specs = collect_specs()
    text = render_all(specs)
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'STALE, run python data/build_tasks.py'}")
        return 0 if same else 1
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}")
    print(summary(specs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
