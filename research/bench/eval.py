"""Stage 04's speed against honest anchors: its parallel, sandboxed nvcc compiles against
nvcc run one program at a time without a sandbox, what the sandbox costs per compile, and the time
per row of a whole `--reference` run under the CPU emulator (nvcc, g++ build, gen.py, run, compare).

Each variant compiles the same reference programs (the bundled tasks' bench.cu, standalone mode) for
the architecture stage 04 uses here (sm_80 only without a GPU, the GPU's own with one). Figures are
wall seconds on this machine, measured back to back in one run; the ratios are what to read.

    python research/bench/eval.py                 # 24 programs, --jobs = the CPUs available
    python research/bench/eval.py --programs 60 --jobs 4
    python research/bench/eval.py --quick         # 2 programs, CI smoke: runs, prints the table, means little
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, whose packages it imports
from cuset_common.paths import NVCC_DEFAULT_ARCH, NVCC_FLAGS, TASKS_FILE  # noqa: E402
from cuset_common.tasks import load_tasks  # noqa: E402
from harness.gpu_probe import compute_capability, gencode_flags  # noqa: E402
from harness.programs import choose_runner, gpu_name, resolve_backend  # noqa: E402
from research.bench.common import cpus_available, print_table  # noqa: E402
from research.stage_modules import stage_module  # noqa: E402

ev = stage_module("04")


def plain_nvcc(source: str, folder: Path, arch: list[str]) -> bool:
    """The anchor: what a user runs by hand, no sandbox."""
    folder.mkdir(parents=True)
    (folder / "prog.cu").write_text(source)
    r = subprocess.run(["nvcc", *NVCC_FLAGS, *arch, "prog.cu", "-o", "prog"], cwd=folder, capture_output=True)
    return r.returncode == 0


def stage04_compile(source: str, folder: Path, arch: list[str], runner) -> bool:
    """Stage 04's compile: the same nvcc command inside the whitelist sandbox."""
    folder.mkdir(parents=True, mode=0o711)
    exe, _ = ev.compile_program(source, folder / "build", arch, 300, runner)
    return exe is not None


def timed(compile_one, sources: list[str], root: Path, jobs: int) -> tuple[float, int]:
    """(wall seconds, programs built) for compiling every source with `jobs` in parallel."""
    root.mkdir(mode=0o711)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        built = sum(pool.map(lambda i: compile_one(sources[i], root / str(i)), range(len(sources))))
    return time.perf_counter() - t0, built


def reference_run_seconds(n: int, out: Path) -> float:
    """Wall seconds per row of `04_eval_kernels.py --reference` on n tasks (emulated without a GPU)."""
    t0 = time.perf_counter()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # its own summary is not ours
        ev.main(["--reference", "--split", "all", "--levels", "1", "--limit", str(n), "--out", str(out)])
    return (time.perf_counter() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--programs", type=int, default=24, help="reference programs to compile (default %(default)s)"
    )
    ap.add_argument(
        "--jobs", type=int, default=cpus_available(), help="parallel compiles (default: CPUs available)"
    )
    ap.add_argument("--quick", action="store_true", help="2 programs: CI smoke, the figures mean little")
    args = ap.parse_args(argv)
    n = 2 if args.quick else args.programs
    gpu = gpu_name()
    arch = gencode_flags(compute_capability()) if gpu else NVCC_DEFAULT_ARCH  # as stage 04's probe builds
    sources = [t["bench.cu"] for t in load_tasks(TASKS_FILE)[:n]]
    print(
        f"# research/bench/eval.py{' --quick' if args.quick else ''}: {n} reference programs, "
        f"nvcc {' '.join(arch)}"
    )
    print(
        f"machine: {cpus_available()} CPUs available, GPU: {gpu or 'none'}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC')}"
    )
    runner = choose_runner(False, resolve_backend("auto", gpu))
    with tempfile.TemporaryDirectory(prefix="cuset-bench-eval-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o711)
        plain_nvcc(
            sources[0], tmp_path / "warm-up", arch
        )  # the first nvcc reads the toolkit from disk: untimed
        seq, ok_seq = timed(lambda s, d: plain_nvcc(s, d, arch), sources, tmp_path / "plain", 1)
        box, ok_box = timed(lambda s, d: stage04_compile(s, d, arch, runner), sources, tmp_path / "box1", 1)
        par, ok_par = timed(
            lambda s, d: stage04_compile(s, d, arch, runner), sources, tmp_path / "par", args.jobs
        )
        per_row = reference_run_seconds(min(n, 8), tmp_path / "ref")
    if not ok_seq == ok_box == ok_par == n:
        print(f"error: not every reference compiled ({ok_seq}, {ok_box}, {ok_par} of {n})", file=sys.stderr)
        return 1
    rows = [
        ["plain nvcc, one at a time (anchor)", f"{seq:.1f}", f"{60 * n / seq:.1f}", "1.00x", "1.00x"],
        [
            "stage 04, sandboxed, one at a time",
            f"{box:.1f}",
            f"{60 * n / box:.1f}",
            f"{seq / box:.2f}x",
            "1.00x",
        ],
        [
            f"stage 04, sandboxed, --jobs {args.jobs}",
            f"{par:.1f}",
            f"{60 * n / par:.1f}",
            f"{seq / par:.2f}x",
            f"{min(args.jobs, cpus_available()):.2f}x",
        ],
    ]
    print_table(["variant", "wall s", "programs per minute", "speed vs anchor", "ideal"], rows)
    print(
        f"\nsandbox cost per compile: {(box - seq) / n:+.2f} s ({box / seq:.2f}x the plain compile); "
        f"parallel efficiency {seq / par / min(args.jobs, cpus_available()):.0%} of ideal"
    )
    print(
        f"stage 04 --reference end to end ({'GPU' if gpu else 'emulated'}): {per_row:.1f} s per row "
        f"(compile, {'run' if gpu else 'g++ build, emulated run'}, gen.py, compare; {min(n, 8)} rows)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
