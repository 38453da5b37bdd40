"""Which tasks' gen.py scripts stage 04 can re-seed (docs/evaluation.md, "Input sets"): each gen.py run twice
through harness/reseed_gen.py, under two secrets, in folders of its own; a task whose two runs write the
same files cannot be re-seeded (stage 04 then judges it on its own input set alone), one whose runs fail
is counted apart with its error.

The scripts run as plain subprocesses here (they are the task authors' code, which stage 04 also runs
unsandboxed as trusted scripts), one at a time, each within --timeout seconds; install what they import
first (the real CUDABench set: torch, scipy, pillow). Data are removed as soon as they are compared.

    python research/reseed_check.py --tasks CUDABench-Set.jsonl --out reseed.jsonl
    python research/reseed_check.py --tasks CUDABench-Set.jsonl --sample 100 --out reseed.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuset_common.tasks import load_tasks
from harness.input_sets import same_files, write_generator


def seeding(gen: str) -> str:
    """How a gen.py seeds, by the first call it makes that reseed_gen replaces (none: unseeded)."""
    calls = [
        ("torch.manual_seed", r"\btorch\.manual_seed\("),
        ("np.random.seed", r"\b(np|numpy)\.random\.seed\("),
        ("default_rng", r"\bdefault_rng\("),
        ("RandomState", r"\bRandomState\("),
        ("random.seed", r"(?<![.\w])random\.seed\("),
    ]
    found = [name for name, pattern in calls if re.search(pattern, gen)]
    return "+".join(found) or "none"


def run_twice(task: dict, root: Path, timeout: float) -> dict:
    """gen.py under two secrets in folders of `root`: the task's verdict (same, differ, or failed)."""
    folders = []
    for secret in ("1" * 64, "2" * 64):
        folder = root / secret[0]
        (folder / "data").mkdir(parents=True)
        script = write_generator(task, folder, secret)
        try:
            r = subprocess.run(
                [sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {"verdict": "failed", "why": f"timeout after {timeout:g} s"}
        if r.returncode != 0:
            return {"verdict": "failed", "why": (r.stderr.strip().splitlines() or ["?"])[-1][:300]}
        folders.append(folder)
    return {"verdict": "same" if same_files(folders[0] / "data", folders[1] / "data") else "differ"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, required=True, help="a CUDABench-format task file")
    ap.add_argument("--sample", type=int, default=0, help="that many tasks drawn at random (seed 0); 0 all")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per gen.py run")
    ap.add_argument(
        "--out", type=Path, required=True, help="JSONL: one line per task, appended as it is done"
    )
    args = ap.parse_args(argv)
    tasks = load_tasks(args.tasks)
    if args.sample:
        tasks = sorted(
            random.Random(0).sample(tasks, min(args.sample, len(tasks))), key=lambda t: str(t["id"])
        )
    done = {json.loads(line)["task_id"] for line in args.out.open()} if args.out.exists() else set()
    started = time.monotonic()
    for task in tasks:
        if str(task["id"]) in done:
            continue
        root, t0 = Path(tempfile.mkdtemp(prefix="reseed-")), time.monotonic()
        try:
            row = {"task_id": str(task["id"]), "seeding": seeding(task["gen.py"])} | run_twice(
                task, root, args.timeout
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        row["seconds"] = round(time.monotonic() - t0, 1)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in args.out.open()]
    print(
        f"{len(rows)} tasks in {time.monotonic() - started:,.0f} s:",
        dict(Counter(r["verdict"] for r in rows)),
    )
    for kind in ("same", "failed"):
        print(kind, [(r["task_id"], r["seeding"], r.get("why", "")) for r in rows if r["verdict"] == kind])
    return 0


if __name__ == "__main__":
    sys.exit(main())
