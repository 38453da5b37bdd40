"""The command: run what is not finished (or copy a record, or read one), then aggregate and report."""

from __future__ import annotations

import json
import shlex
import sys

from cuset_common.artifacts import args_to_json
from cuset_common.cli import UserError
from cuset_common.out_dir import finishes_out
from cuset_common.out_lock import lock_out
from cuset_common.trackers import open_trackers
from research.comparison.metrics import aggregate
from research.comparison.options import parse_args
from research.comparison.plan import plan
from research.comparison.records import missing_results, save_record
from research.comparison.report import COLUMNS, write_report
from research.comparison.runner import execute
from research.comparison.stages import command, shown


@finishes_out  # releases the lock on the folder this run writes
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lock_out(args.save_record or args.out)  # one run per folder (cuset_common/out_lock.py)
    if args.save_record:
        return save_record(args)
    trackers = open_trackers(args, "compare", args.out, {"args": args_to_json(args)})  # --report-to
    if args.report_only:
        (base_steps, runs), calls = plan(args), 0
        if missing := missing_results(args, base_steps, runs):
            raise UserError(
                f"--report-only: {args.out} lacks results of {'; '.join(missing)}; run what "
                f"makes them (--runs), then --save-record again"
            )
    else:
        base_steps, runs, calls, stopped = execute(args)
        if stopped:
            return 0
        if args.runs:
            print("[compare] no table: --runs ran part of the comparison", flush=True)
            return 0
    res = aggregate(args, runs) | {
        "preset": args.preset,
        "objectives": args.objectives,
        "seeds": args.seeds,
        "seeds_for": args.seeds_for,
        "model": args.model,
        "data": str(args.data),
        "eval_data": str(args.eval_data),
        "columns": COLUMNS,
        "stage_calls": calls,
        "command": shlex.join(["python", *sys.argv]),
        "commands": [shown(command(s)) for s in base_steps + [s for r in runs for s in r["steps"]]],
        "timings": {
            r["name"]: json.loads((r["dir"] / "timings.json").read_text())
            for r in [{"name": "base", "dir": args.out / "base"}, *runs]
            if (r["dir"] / "timings.json").exists()
        },
    }
    write_report(args, res)
    trackers.log({"table": res["table"], "paired": res["paired"]})  # per objective: mean, std; differences
    return 0
