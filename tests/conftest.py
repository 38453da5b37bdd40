"""Shared test setup: the repo root on sys.path, and the `gpu` marker that skips without a GPU."""
from __future__ import annotations

import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuset_common import load_script  # noqa: E402,F401  (tests import it from here)


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
