"""What stage 04 reports, apart from the protocol in 04_eval_kernels.py: summary.json and summary.md from
the summary that 04_eval_kernels.summarize computes, with what ran the rows and the generation record
(harness/generation.py: generation_record); a --generate-only run's summary holds that record and no
verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

from cuset_common.files import write_text_atomic
from harness.input_sets import input_set_summary
from harness.outcomes import NO_KERNEL
from harness.programs import Runner

NOTES = {  # what summary.md says when a run has rows of a kind
    "task_error": "{n} rows are `task_error`: the task's own gen.py failed here, compare.py judged the "
    "task's own reference F, or that reference did not pass on the GPU (their cause and log are in "
    "results.jsonl); they are outside "
    "pass@k and the compile rate.",
    "unchecked": "{n} rows with a verdict are `unchecked`: their task's own reference could not run here "
    "(task_checks.jsonl says why), so nothing showed that its scripts accept a right program; "
    "they are inside pass@k.",
    "emulated": "**backend: emulated.** Programs ran under CPU emulation: verdicts on functional correctness "
    "of well-synchronised code; no timings. `unsupported` rows are outside pass@k.",
}


def checks_summary(rows: list[dict], requested_sets: int) -> dict:
    """What the judge's checks did in a run (docs/evaluation.md, "Protocol"): the input sets asked for and
    the tasks judged on fewer (harness/input_sets.py), and the rows each check caught: a fresh input set
    (passed the task's own, failed a fresh one), no_kernel (the right outputs, no kernel launched), the
    output check after the timed launches (a pass whose timing is void for it), and the speedups flagged
    as suspect (harness/timing.py: SUSPECT_SPEEDUP)."""
    sets = input_set_summary(rows, requested_sets)
    return {
        "input_sets": sets["requested"],
        "tasks_on_fewer_sets": sets["tasks_on_fewer_sets"],
        "fewer_sets_tasks": sets["tasks"],
        "caught_by_fresh_inputs": sets["caught"],
        "caught_no_kernel": sum(r["outcome"] == NO_KERNEL for r in rows),
        "caught_timing_output_check": sum("timing_check" in r for r in rows),
        "speedup_suspect": sum(bool(r.get("speedup_suspect")) for r in rows),
    }


def checks_line(checks: dict) -> str:
    """summary.md's sentence on the checks (checks_summary)."""
    fewer = checks["fewer_sets_tasks"]
    named = f" ({', '.join(fewer[:8])}{', ...' if len(fewer) > 8 else ''})" if fewer else ""
    return (
        f"Checks: {checks['input_sets']} input set(s) per program (the task's own and fresh ones, "
        f"docs/evaluation.md); {checks['tasks_on_fewer_sets']} task(s) judged on fewer{named}, results.jsonl "
        f"says why. Caught: {checks['caught_by_fresh_inputs']} row(s) by a fresh input set, "
        f"{checks['caught_no_kernel']} `no_kernel`, {checks['caught_timing_output_check']} timing(s) void by "
        f"the output check after the timed launches; {checks['speedup_suspect']} speedup(s) over 10x flagged "
        f"`speedup_suspect`."
    )


def rate_text(stats: dict, column: str) -> str:
    """A cell of the summary table: a rate to 3 decimals, "n/a" where no row could give it (null), a count."""
    value = stats.get(column, "")
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_markdown(summary: dict, header: str) -> str:
    """summary.md: one table row per group (all, each level, each category), the outcome counts, notes."""
    cols = [c for c in summary["overall"] if c != "rows"]
    lines = [header, "", "| group | rows | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]

    def row(name, s):
        vals = [rate_text(s, c) for c in cols]
        return f"| {name} | {s['rows']} | " + " | ".join(vals) + " |"

    lines.append(row("**all**", summary["overall"]))
    lines += [row(k, v) for k, v in summary["by_level"].items()]
    lines += [row(k, v) for k, v in summary["by_category"].items()]
    lines += ["", "Outcomes: " + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())]
    counts = {
        "task_error": summary["outcomes"]["task_error"],
        "unchecked": summary["overall"]["unchecked"],
        "emulated": summary["backend"] == "emulated",
    }
    lines += [line for kind, n in counts.items() if n for line in ("", NOTES[kind].format(n=n))]
    if summary.get("checks"):
        lines += ["", checks_line(summary["checks"])]
    if summary.get("generation"):
        lines += ["", generation_line(summary["generation"])]
    return "\n".join(lines) + "\n"


def generation_line(record: dict) -> str:
    """One sentence of what generating took (the generation record)."""
    return (
        f"Generation: {record['engine']} ({record['version']}, {record['dtype']}, {record['device']}; "
        f"{record['chosen']}), loaded in {record['load_s']:,.1f} s; {record['tokens']:,} tokens in "
        f"{record['seconds']:,.1f} s, {record['tokens_per_s']} tokens/s with loading excluded."
    )


def generation_summary(args, jobs: list[tuple], run, generation: dict | None) -> dict:
    """summary.json of a --generate-only run: what was generated and how, and no verdicts."""
    return {
        "generate_only": True,
        "model": str(args.model),
        "mode": args.mode,
        "levels": args.levels,
        "rows": len(jobs),
        "completions": sum(j in run.completions for j in jobs),
        "completions_file": str(args.out / "completions.jsonl"),
        "generation": generation,
    }


def write_generation_summary(out: Path, summary: dict) -> str:
    """summary.json and summary.md of a --generate-only run (generation_summary), each
    written atomically; returns the markdown, which says that nothing was judged."""
    record, file = summary["generation"], summary["completions_file"]
    md = "\n".join(
        [
            f"# Generation only: {summary['model']}, mode {summary['mode']}, levels {summary['levels']}",
            "",
            f"**No verdicts**: nothing was compiled, run or judged. {summary['completions']} of "
            f"{summary['rows']} completions are in {file}; score them with `04_eval_kernels.py --solutions "
            f"{file}` (same --tasks, --mode, --levels), or rerun this command without --generate-only in the "
            f"same --out.",
            "",
            generation_line(record)
            if record
            else "Nothing was generated: every completion was there already.",
        ]
    )
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "summary.md", md + "\n")
    return md


def write_run_summary(
    args, rows: list[dict], summary: dict, gpu: str | None, runner: Runner, generation
) -> str:
    """summary.json and summary.md of the run's rows, from their `summary` (04_eval_kernels.py: summarize)
    with what ran them; returns the markdown."""
    backend = summary["backend"]
    summary = summary | {
        "gpu": gpu,
        "model": "reference" if args.reference else str(args.solutions or args.model),
        "emulate_checks": backend == "emulated" and args.emulate_checks,
        "sandbox": runner.sandbox,
        "generation": generation,
        "generation_errors": sum("generation_error" in r for r in rows),
        "checks": checks_summary(rows, args.input_sets),
    }
    header = (
        f"# Evaluation: {summary['model']} on {args.tasks.name} ({args.split}), mode {args.mode}, "
        f"backend: {backend}" + ("" if runner.sandbox else ", NOT sandboxed (--no-sandbox)")
    )
    if summary["generation_errors"]:
        header += (
            f"\n\n**{summary['generation_errors']} rows got no reply from the server** (outcome "
            f"`generation_error`, outside pass@k; results.jsonl says why): rerun the same command to ask "
            f"again."
        )
    return write_summary(args.out, summary, header)


def write_summary(out: Path, summary: dict, header: str) -> str:
    """summary.json and summary.md in `out`, each written atomically; returns the markdown."""
    md = summary_markdown(summary, header)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "summary.md", md)
    return md
