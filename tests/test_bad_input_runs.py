"""Runs that meet in one --out, and artifacts whose files are not their own: a second run into an --out
that a live run holds exits 2 with one line naming that run's process, before any work (--resume too, and
research/compare_objectives.py on its folder); a run killed (SIGKILL) while it holds the lock does not block
the next; an artifact whose tensor file was replaced by another run's (same names, dtypes and shapes) is
refused by the stage that reads it, in one line naming the stage to rerun, with nothing changed; and so is
one written before artifacts recorded their files.

The first run of each pair is a real stage, started as the command line starts it and paused (SIGSTOP) as
soon as it holds the lock, so that the second meets it on any machine, fast or slow; the second runs in
this process. The artifacts come from the `world` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ARGS, MADE, SCRIPTS, load_script, refused, snapshot
from safetensors.numpy import load_file

from cuset_common.cli import run_main
from cuset_common.out_lock import lock_file
from cuset_common.paths import ROOT

STAGE = {stage: load_script(script) for stage, script in SCRIPTS.items()}
COMPARE = ROOT / "research" / "compare_objectives.py"
# The lock file names its holder "pid <pid> on <host>, since <time>" (cuset_common/out_lock.py)
HOLDER = "pid {} on "


def command(stage: str, argv: list) -> list[str]:
    script = COMPARE if stage == "compare" else ROOT / SCRIPTS[stage]
    return [sys.executable, str(script), *map(str, argv)]


@contextlib.contextmanager
def holding_the_lock(stage: str, argv: list, out: Path):
    """A run of `stage` (01 .. 04, or compare) started as a subprocess and paused (SIGSTOP) once it holds
    the lock of `out`; killed on the way out unless the test let it finish."""
    run = subprocess.Popen(command(stage, argv), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while HOLDER.format(run.pid) not in (lock_file(out).read_text() if lock_file(out).exists() else ""):
            assert run.poll() is None, f"the first run ended without holding the lock: {run.stderr.read()}"
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.01)
        run.send_signal(signal.SIGSTOP)
        yield run
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()
        run.stderr.close()


# ---------------------------------------------------------------------------------------
# One run per --out
# ---------------------------------------------------------------------------------------


# Work that keeps a first run holding its lock long enough to be caught there on a loaded machine: stage
# 02 on the world's 8 samples is otherwise done within milliseconds of taking it.
LONGER = {"02": ["--permutations", "50000"]}


@pytest.mark.parametrize(
    "stage, second",
    [("01", []), ("01", ["--resume"]), ("02", []), ("03", []), ("04", [])],
    ids=["01", "01-resume", "02", "03", "04"],
)
def test_a_second_run_into_a_held_out_exits_2_and_the_first_finishes(world, stage, second, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*ARGS[stage](world), *LONGER.get(stage, []), "--out", out]
    with holding_the_lock(stage, argv, out) as first:
        before = snapshot(tmp_path)
        line, _ = refused(STAGE[stage].main, [*argv, *second], capsys)
        assert "another run is writing there" in line and HOLDER.format(first.pid) in line, line
        assert snapshot(tmp_path) == before  # the second run touched nothing, not even the lock file
        first.send_signal(signal.SIGCONT)
        assert first.wait() == 0, first.stderr.read()
    assert (out / ("summary.json" if stage == "04" else "meta.json")).is_file()
    assert not lock_file(out).exists()  # released, and its file removed, when the first run ended


def test_a_second_compare_into_a_held_folder_exits_2(tmp_path, capsys):
    record = tmp_path / "cpu-real"
    shutil.copytree(ROOT / "docs" / "records" / "cpu-real", record)
    argv = ["--preset", "cpu-real", "--report-only", "--out", record]
    with holding_the_lock("compare", argv, record) as first:
        line, _ = refused(load_script("research/compare_objectives.py").main, argv, capsys)
        assert "another run is writing there" in line and HOLDER.format(first.pid) in line, line


def test_the_lock_of_a_killed_run_does_not_block_the_next(world, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*ARGS["01"](world), "--out", out]
    with holding_the_lock("01", argv, out) as killed:
        killed.kill()  # SIGKILL: no handler runs, the lock file stays behind naming the process
        killed.wait()
    assert HOLDER.format(killed.pid) in lock_file(out).read_text()
    capsys.readouterr()
    assert run_main(STAGE["01"].main, list(map(str, argv))) == 0
    assert f"taking over the lock left by a run that is gone (pid {killed.pid} " in capsys.readouterr().err
    assert (out / "meta.json").is_file() and not lock_file(out).exists()


# ---------------------------------------------------------------------------------------
# Artifacts that vouch for their own files
# ---------------------------------------------------------------------------------------


def other_precision(world: dict) -> list[str]:
    """Stage 01's arguments for the precision the world's profile was not made in (auto picks per machine)."""
    made_in = json.loads((world["profile"] / "meta.json").read_text())["precision"]
    return ["--precision", "fp32" if made_in == "bf16-autocast" else "bf16"]


def twin_artifact(world: dict, stage: str, extra: list, file: str, tmp_path: Path) -> Path:
    """A copy of the world's artifact of `stage` whose `file` is that of another run of the stage on the
    same inputs with `extra` arguments: the same tensors by name, dtype and shape, other values."""
    other = tmp_path / "other"
    assert STAGE[stage].main([*map(str, ARGS[stage](world)), *extra, "--out", str(other)]) == 0
    mixed = shutil.copytree(world[MADE[stage]], tmp_path / "mixed")
    shutil.copy(other / file, mixed / file)
    ours, theirs = load_file(str(world[MADE[stage]] / file)), load_file(str(other / file))
    assert {k: (v.dtype, v.shape) for k, v in ours.items()} == {
        k: (v.dtype, v.shape) for k, v in theirs.items()
    }
    assert any(not np.array_equal(ours[k], theirs[k]) for k in ours)
    return mixed


@pytest.mark.parametrize(
    "stage, other_run, file, reader, reading, rerun",
    [
        ("01", other_precision, "tensors.safetensors", "02", lambda art: ["--profile", art], "01_profile.py"),
        (
            "02",
            lambda w: ["--rho", "0.5"],
            "tensors.safetensors",
            "03",
            lambda art: ["--objective", "cuset", "--regions", art],
            "02_label",
        ),
        (
            "03",
            lambda w: ["--seed", "1"],
            "model.safetensors",
            "01",
            lambda art: ["--model", art],
            "03_train",
        ),
    ],
    ids=["profile-of-another-precision", "regions-of-another-rho", "checkpoint-of-another-seed"],
)
def test_an_artifact_holding_another_runs_tensors_is_refused(
    world, stage, other_run, file, reader, reading, rerun, tmp_path, capsys
):
    mixed = twin_artifact(world, stage, other_run(world), file, tmp_path)
    before = snapshot(tmp_path)
    line, _ = refused(
        STAGE[reader].main, [*ARGS[reader](world), *reading(mixed), "--out", tmp_path / "next"], capsys
    )
    assert f"{mixed / file}: not the file this artifact wrote" in line and rerun in line, line
    assert snapshot(tmp_path) == before


def test_an_artifact_that_records_no_files_is_refused(world, tmp_path, capsys):
    """What an artifact written before artifacts recorded their files holds: a meta.json without `files`."""
    profile = shutil.copytree(world["profile"], tmp_path / "profile")
    meta = json.loads((profile / "meta.json").read_text())
    del meta["files"]
    (profile / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    line, _ = refused(
        STAGE["02"].main, [*ARGS["02"](world), "--profile", profile, "--out", tmp_path / "r"], capsys
    )
    assert "records no sha256 of tensors.safetensors" in line and "01_profile.py" in line, line
    assert not (tmp_path / "r").exists()
