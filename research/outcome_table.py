"""The outcome table of one stage-04 run, with the reason behind every row that did not pass.

Stage 04's summary counts outcomes; this groups what lies behind them, read from the run's rows:
`unsupported` by what the emulator does not model, `task_error` by cause (gen.py failed, and why;
compare.py rejected the task's own reference), and the task ids of every other row that did not
pass. It is how the table of the real CUDABench references in docs/evaluation.md was made:

    python 04_eval_kernels.py --tasks CUDABench-Set.jsonl --reference --levels 1 --backend emulate \\
        --out data/artifacts/cudabench-references
    python research/outcome_table.py data/artifacts/cudabench-references
    python research/outcome_table.py --help

The table is printed (markdown) and written to <run>/outcomes.md. results.jsonl is only read: a run may be
appending to it meanwhile, and a last line without its newline (being written, or cut by a kill) is left
out of the table and left in the file, for stage 04 to finish or repair.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cuset_common lives at the repo root
from cuset_common.cli import ArgumentParser, UserError, run_main  # noqa: E402
from cuset_common.files import is_file, read_whole_lines_jsonl, write_text_atomic  # noqa: E402
from harness.outcomes import APART, OUTCOMES, TASK_ERROR, UNSUPPORTED  # noqa: E402

# pass first, then the other verdicts from the last step of the protocol back to the first, then the rows
# counted apart (OUTCOMES runs from the first step to pass)
ORDER = (*reversed(OUTCOMES), *APART)
SHOWN_IDS = 12  # task ids listed per reason before "..."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a stage-04 --out folder (holds results.jsonl)")
    return ap.parse_args(argv)


def reason(row: dict) -> str:
    """Why a row did not pass, in a few words that rows with the same cause share."""
    log, outcome = row.get("log", ""), row["outcome"]
    if outcome == UNSUPPORTED:
        found = re.search(r"emulator: (?:line \d+: )?([^(\n]+)", log)
        return found.group(1).strip() if found else "emulator: " + first_line(log)
    if outcome == TASK_ERROR and row.get("cause") == "reference judged F":
        return "compare.py judged the task's own reference F"
    if outcome == TASK_ERROR and row.get("cause", "").endswith("on the GPU"):
        return f"the task's own {row['cause']}"
    if outcome == TASK_ERROR:
        module = re.search(r"No module named '([\w.]+)'", log)
        if module:
            return f"gen.py imports {module.group(1).split('.')[0]}, not installed"
        if "not compiled with CUDA" in log or "CUDA driver" in log or "no NVIDIA driver" in log:
            return "gen.py needs a GPU (torch on CUDA)"
        return "gen.py failed: " + last_line(log)
    if outcome == "runtime_error":
        return first_line(log)
    return ""


def first_line(log: str) -> str:
    return next((x.strip() for x in log.splitlines() if x.strip()), "")[:100]


def last_line(log: str) -> str:
    return next((x.strip() for x in reversed(log.splitlines()) if x.strip()), "")[:100]


def ids(task_ids: list[str]) -> str:
    shown = ", ".join(sorted(task_ids, key=lambda t: (len(t), t))[:SHOWN_IDS])
    return shown + (", ..." if len(task_ids) > SHOWN_IDS else "")


def outcome_table(rows: list[dict]) -> str:
    counts = Counter(r["outcome"] for r in rows)
    by_reason: dict[tuple, list[str]] = defaultdict(list)
    for r in rows:
        if r["outcome"] != "pass":
            by_reason[(r["outcome"], reason(r))].append(str(r["task_id"]))
    lines = ["| outcome | rows | share | reason | task ids |", "|---|---:|---:|---|---|"]
    for outcome in [o for o in ORDER if counts[o]] + sorted(set(counts) - set(ORDER)):
        lines.append(f"| **{outcome}** | {counts[outcome]} | {counts[outcome] / len(rows):.1%} | | |")
        for (o, why), tids in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            if o == outcome:
                lines.append(f"| | {len(tids)} | | {why.replace('|', '/')} | {ids(tids)} |")
    return "\n".join(lines) + f"\n\n{len(rows)} rows.\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = args.run / "results.jsonl"
    if not is_file(results):
        raise UserError(f"{args.run}: no results.jsonl here; name the --out folder of a stage-04 run")
    rows = read_whole_lines_jsonl(results)  # never read_appended_jsonl: it cuts a torn line, a writer's job
    if not rows:
        raise UserError(f"{results}: no rows yet")
    table = outcome_table(rows)
    write_text_atomic(args.run / "outcomes.md", table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
