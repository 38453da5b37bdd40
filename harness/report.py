"""What stage 04 shows its user, apart from the protocol in 04_eval_kernels.py: the progress line
(done/total, elapsed, ETA) of generation, compiles and runs, and summary.json and summary.md from
the summary that 04_eval_kernels.summarize computes.
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuset_common import write_text_atomic


class Progress:
    """One line, redrawn on each update: done/total, an optional detail, elapsed seconds and ETA (stderr)."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done, self.t0 = what, total, 0, time.time()

    def __call__(self, n: int = 1, detail: str = "") -> None:
        self.done += n
        el = time.time() - self.t0
        eta = f"{el / self.done * (self.total - self.done):,.0f}s" if self.done else "?"
        print(f"\r{self.what}: {self.done}/{self.total}{detail} | {el:,.0f}s | ETA {eta}   ", end="",
              file=sys.stderr, flush=True)
        if self.done >= self.total:
            print(file=sys.stderr)


def mapped(what: str, fn, items: list, jobs: int) -> list:
    """[fn(x) for x in items], `jobs` at a time, with a progress line."""
    progress = Progress(what, len(items))

    def one(x):
        out = fn(x)
        progress()
        return out
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, items))


NOTES = {  # what summary.md says when a run has rows of a kind
    "task_error": "{n} rows are `task_error`: the task's own gen.py failed here, or compare.py judged the "
                  "task's own reference F (their cause and log are in results.jsonl); they are outside "
                  "pass@k and the compile rate.",
    "unchecked": "{n} rows with a verdict are `unchecked`: their task's own reference could not run here "
                 "(task_checks.jsonl says why), so nothing showed that its scripts accept a right program; "
                 "they are inside pass@k.",
    "emulated": "**backend: emulated.** Programs ran under CPU emulation: verdicts on functional correctness "
                "of well-synchronised code; no timings. `unsupported` rows are outside pass@k.",
}


def summary_markdown(summary: dict, header: str) -> str:
    """summary.md: one table row per group (all, each level, each category), the outcome counts, notes."""
    cols = [c for c in summary["overall"] if c != "rows"]
    lines = [header, "", "| group | rows | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]

    def row(name, s):
        vals = [f"{s[c]:.3f}" if isinstance(s.get(c), float) else str(s.get(c, "")) for c in cols]
        return f"| {name} | {s['rows']} | " + " | ".join(vals) + " |"
    lines.append(row("**all**", summary["overall"]))
    lines += [row(k, v) for k, v in summary["by_level"].items()]
    lines += [row(k, v) for k, v in summary["by_category"].items()]
    lines += ["", "Outcomes: " + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())]
    counts = {"task_error": summary["outcomes"]["task_error"], "unchecked": summary["overall"]["unchecked"],
              "emulated": summary["backend"] == "emulated"}
    lines += [line for kind, n in counts.items() if n for line in ("", NOTES[kind].format(n=n))]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: dict, header: str) -> str:
    """summary.json and summary.md in `out`, each written atomically; returns the markdown."""
    md = summary_markdown(summary, header)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "summary.md", md)
    return md
