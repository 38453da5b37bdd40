"""How long the CPU emulator takes on every reference program, to hold it to its speed budget for the
170-task x 2-mode reference run (docs/performance.md, "Stage 04: sandboxed compiles against plain nvcc").

For each task and mode: translate the reference (harness/emulate.py), build it with g++ against
the runtime header (precompiled once, as stage 04 does), run gen.py once per task, time the
program, and check it with compare.py.
nvcc and the sandbox are left out (stage 04 adds them; here only emulation is measured) and so is
generated code: the references are our own.

    python research/bench/emulator.py                      # every task, both modes, 2 parallel jobs
    python research/bench/emulator.py --mode kernel --limit 20 --jobs 4
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports
from cuset_common.paths import TASKS_FILE  # noqa: E402
from cuset_common.tasks import load_tasks  # noqa: E402
from harness.emulate import EMU_INCLUDE, gxx_command, pch_command, translate  # noqa: E402


def source_of(task: dict, mode: str) -> str:
    if mode == "standalone":
        return task["bench.cu"]
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], km["reference_kernels"])


def run(cmd: list[str], cwd: Path, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t0, r


def bench_task(task: dict, modes: list[str], root: Path, include: Path, timeout: float) -> list[tuple]:
    """(task, mode, build s, run s, verdict) per mode; gen.py runs once."""
    folder = root / task["id"]
    (folder / "data").mkdir(parents=True)
    (folder / "gen.py").write_text(task["gen.py"])
    (folder / "compare.py").write_text(task["compare.py"])
    _, r = run([sys.executable, "gen.py"], folder, timeout)
    if r.returncode:
        return [(task["id"], m, 0.0, 0.0, f"gen.py failed: {r.stderr[-300:]}") for m in modes]
    out = []
    for mode in modes:
        (folder / "prog.cpp").write_text(translate(source_of(task, mode)))
        build_s, r = run(gxx_command("prog.cpp", "prog", str(include), False), folder, timeout)
        if r.returncode:
            out.append((task["id"], mode, build_s, 0.0, f"g++ failed: {r.stderr[-300:]}"))
            continue
        run_s, r = run(["./prog"], folder, timeout)
        if r.returncode:
            out.append((task["id"], mode, build_s, run_s, f"exit {r.returncode}: {r.stderr[-300:]}"))
            continue
        _, v = run([sys.executable, "compare.py"], folder, timeout)
        out.append(
            (task["id"], mode, build_s, run_s, "pass" if v.stdout.strip().endswith("T") else "wrong_output")
        )
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=TASKS_FILE)
    ap.add_argument("--mode", choices=("both", "standalone", "kernel"), default="both")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per build or run")
    args = ap.parse_args()
    tasks = load_tasks(args.tasks)[: args.limit]
    modes = ["standalone", "kernel"] if args.mode == "both" else [args.mode]
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix="cuset-bench-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        include = Path(tmp) / "emu"
        shutil.copytree(EMU_INCLUDE, include)
        subprocess.run(pch_command(str(include), False), check=True)
        rows = [
            row
            for rows in pool.map(lambda t: bench_task(t, modes, Path(tmp), include, args.timeout), tasks)
            for row in rows
        ]
    wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    print(f"{'task':40s} {'mode':10s} {'build s':>8s} {'run s':>8s}  verdict")
    for tid, mode, build_s, run_s, verdict in rows:
        print(f"{tid:40s} {mode:10s} {build_s:8.2f} {run_s:8.2f}  {verdict}")
    passed = sum(r[4] == "pass" for r in rows)
    slowest = max(rows, key=lambda r: r[3])
    # CPU seconds do not depend on what else the machine runs; wall seconds do
    print(
        f"\n{passed}/{len(rows)} pass; wall {wall:.0f} s with {args.jobs} jobs, {cpu:.0f} CPU s "
        f"(g++, programs, gen.py, compare.py); builds {sum(r[2] for r in rows):.0f} s, "
        f"runs {sum(r[3] for r in rows):.0f} s "
        f"in all (wall); slowest run {slowest[3]:.1f} s ({slowest[0]}, {slowest[1]})"
    )
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
