"""Shared test setup: the repo root on sys.path, and the `gpu` marker that skips without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuset_common.cli import load_script  # noqa: E402,F401  (tests import it from here)


@lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True when nvidia-smi lists at least one GPU (torch here may be a CPU build)."""
    if shutil.which("nvidia-smi") is None:
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def pytest_collection_modifyitems(config, items):
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi -L lists none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def program_runner(ev, work: Path, backend: str):
    """Build and run programs the way stage 04's main() does: gen.py once per task, then per program
    its own folder, nvcc and (emulated backend) the g++ build for the emulator, then execute().
    `ev` is the loaded 04_eval_kernels.py; run.gen_dir(task) is the folder of a task's data."""
    work.mkdir(mode=0o711)
    runner = ev.Runner(True, backend)
    emulator = ev.prepare_emulator(work, checks=False) if backend == "emulated" else None

    def gen_dir(task: dict) -> Path:
        folder = work / task["id"]
        if not folder.exists():
            folder.mkdir(mode=0o711)
            failed = ev.prepare_task_data(task, folder / "gen", 120, runner)
            assert failed is None, failed
        return folder / "gen"

    def run(source: str, task: dict, timeout: float, timed: bool = False):
        data = gen_dir(task)
        workdir = Path(tempfile.mkdtemp(dir=data.parent))
        os.chmod(workdir, 0o711)
        outcome, exe, log = ev.build(source, workdir / "build", ev.NVCC_DEFAULT_ARCH, 120, emulator, runner)
        assert outcome is None, log
        assert (exe.name == "prog_emu") == (backend == "emulated")
        return ev.execute(task, exe, data, workdir, timeout, runner, timed=timed)

    run.gen_dir = gen_dir
    return run
