"""bench/gpu_check.py on the CPU: without a GPU it refuses in one line; its verdicts (the speedup window, the
memory plan against the peak), its command runner (time limit, the kill at a line) and its unpacking of a
bubblewrap .deb, with dpkg-deb and without, checked on real files and processes. The check's steps
themselves need a GPU: docs/tests.md, "The GPU check"."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, load_script

from cuset_common.cli import UserError

gc = load_script("bench/gpu_check.py")
MIB = 2**20


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
def test_without_a_gpu_the_check_exits_2_with_one_line(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: no CUDA GPU: "), r.stderr
    assert not out.exists()  # refused before any work


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_speedup_window_passes_only_rows_that_pass_with_a_speedup_near_1(tmp_path):
    good = [
        {"task_id": "sin", "level": 1, "outcome": "pass", "speedup": 1.02},
        {"task_id": "elu", "level": 1, "outcome": "pass", "speedup": 0.8},  # the window's ends belong to it
        {"task_id": "mish", "level": 1, "outcome": "pass", "speedup": 1.25},
    ]
    assert gc.speedup_problems(gc.read_rows(write_rows(tmp_path / "good.jsonl", good))) == []

    bad = [
        {"task_id": "sin", "level": 1, "outcome": "pass", "speedup": 1.3},
        {"task_id": "elu", "level": 1, "outcome": "pass", "speedup": 0.79},
        {"task_id": "mish", "level": 1, "outcome": "pass", "timing_void": "2 CUSET_TIMING line(s)"},
        {"task_id": "gelu_tanh", "level": 1, "outcome": "pass", "speedup": None},
        {"task_id": "cube_poly", "level": 1, "outcome": "runtime_error"},
    ]
    assert gc.speedup_problems(gc.read_rows(write_rows(tmp_path / "bad.jsonl", bad))) == [
        "sin level 1: speedup 1.300 outside [0.8, 1.25]",
        "elu level 1: speedup 0.790 outside [0.8, 1.25]",
        "mish level 1: no speedup (2 CUSET_TIMING line(s))",
        "gelu_tanh level 1: no speedup (no timing line)",
        "cube_poly level 1: outcome runtime_error, not pass",
    ]
    assert gc.speedup_problems([]) == ["results.jsonl has no rows"]


def test_peak_may_exceed_the_plan_by_the_stated_margin_and_no_more():
    plan = 100 * MIB
    allowed = plan * (1 + gc.PLAN_MARGIN) + gc.PLAN_SLACK_BYTES
    assert gc.plan_exceeded({"plan_bytes": plan, "peak_allocated_bytes": 40 * MIB}) is None
    assert gc.plan_exceeded({"plan_bytes": plan, "peak_allocated_bytes": allowed}) is None
    over = gc.plan_exceeded({"plan_bytes": plan, "peak_allocated_bytes": allowed + MIB})
    assert over == (
        "peak allocated 239.0 MiB exceeds the plan's 100.0 MiB by more than 10% + 128 MiB (allowed 238.0 MiB)"
    )
    figures = gc.plan_figures({"plan_bytes": plan, "peak_allocated_bytes": 150 * MIB})
    assert figures == {"plan_mib": 100.0, "peak_allocated_mib": 150.0, "peak_over_plan": 1.5}


def test_a_command_is_killed_at_its_line_or_at_its_time_limit(tmp_path):
    log = tmp_path / "step.log"
    steps = "import time\nfor i in range(1, 100):\n    print(f'step {i:>5}/99', flush=True); time.sleep(1)"
    done = gc.run_command([sys.executable, "-c", steps], log, 60, {}, gc.SECOND_STEP_LINE)
    assert done.kill_line == "step     2/99" and done.code == -9
    assert "step     3/99" not in done.output  # the kill lands at the line, within the step after it

    t0 = time.monotonic()
    done = gc.run_command(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], log, 1, {}, None
    )
    assert done.code is None and done.output == "up\n" and time.monotonic() - t0 < 30
    text = log.read_text()
    assert text.count("$ ") == 2 and "killed after the time limit of 1 s" in text


def test_a_step_is_skipped_without_its_inputs_or_time_and_a_crash_is_its_fail(tmp_path):
    (tmp_path / "logs").mkdir()
    check = gc.Check(tmp_path, {}, {"capability": "9.0"}, None, time.monotonic() + 600)
    check.results["train"] = {"status": "FAIL"}

    def crash(_check):
        raise KeyError("final_loss")

    needs = gc.run_step(check, gc.Step("memory-plan", crash, ("train",)))
    assert (needs["status"], needs["reason"]) == ("SKIP", "needs train, which did not pass")
    crashed = gc.run_step(check, gc.Step("memory-plan", crash))
    assert (crashed["status"], crashed["reason"]) == (
        "FAIL",
        "the check itself raised KeyError: 'final_loss'",
    )
    check.deadline = time.monotonic() + gc.MIN_STEP_S - 1
    late = gc.run_step(check, gc.Step("memory-plan", crash))
    assert (late["status"], late["reason"]) == ("SKIP", "the 8-minute budget is spent")


def build_deb(tmp_path: Path, compression: str, with_bwrap: bool = True) -> Path:
    """A tiny Debian package built by dpkg-deb: a control file and, if asked, a usr/bin/bwrap script."""
    tree = tmp_path / f"tree-{compression}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: bubblewrap\nVersion: 0.0-test\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    (tree / "usr" / "bin").mkdir(parents=True)
    if with_bwrap:
        (tree / "usr" / "bin" / "bwrap").write_text("#!/bin/sh\necho bubblewrap 0.0-test\n")
        (tree / "usr" / "bin" / "bwrap").chmod(0o755)
    deb = tmp_path / f"bubblewrap-{compression}.deb"
    subprocess.run(
        ["dpkg-deb", f"-Z{compression}", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb


needs_dpkg_deb = pytest.mark.skipif(
    shutil.which("dpkg-deb") is None, reason="dpkg-deb builds the test package"
)


@needs_dpkg_deb
@pytest.mark.parametrize("compression", ["xz", "gzip", "none"])
@pytest.mark.parametrize("with_dpkg_deb", [True, False], ids=["dpkg-deb", "python"])
def test_bwrap_comes_from_the_deb_with_or_without_dpkg_deb(tmp_path, monkeypatch, compression, with_dpkg_deb):
    deb = build_deb(tmp_path, compression)
    if not with_dpkg_deb:
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dpkg-deb: the package is read in Python
    folder = gc.bwrap_folder(deb, tmp_path / "unpacked")
    assert folder == tmp_path / "unpacked" / "usr" / "bin"
    r = subprocess.run([str(folder / "bwrap")], capture_output=True, text=True)
    assert r.stdout == "bubblewrap 0.0-test\n"


@needs_dpkg_deb
def test_a_deb_without_bwrap_or_not_a_deb_is_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(
        UserError, match=re.escape("the package has no usr/bin/bwrap; name the bubblewrap .deb")
    ):
        gc.bwrap_folder(build_deb(tmp_path, "xz", with_bwrap=False), tmp_path / "a")
    not_deb = tmp_path / "bubblewrap.deb"
    not_deb.write_text("hello")
    with pytest.raises(UserError, match="dpkg-deb cannot unpack it"):
        gc.bwrap_folder(not_deb, tmp_path / "b")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError, match=re.escape("not a Debian package (no ar header); name a .deb file")):
        gc.bwrap_folder(not_deb, tmp_path / "c")
    with pytest.raises(UserError, match="no such file"):
        gc.bwrap_folder(tmp_path / "missing.deb", tmp_path / "d")


def test_a_failure_is_told_by_its_cause_not_by_torchrun_s_closing_banner():
    torchrun = "\n".join(
        [
            '[rank0]:   File "03_train_cuset.py", line 669, in place_model',
            "[rank0]: TypeError: memory_plan() missing 1 required positional argument: 'precision'",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================",
        ]
    )
    assert gc.Finished(1, torchrun).cause() == (
        "[rank0]: TypeError: memory_plan() missing 1 required positional argument: 'precision'"
    )
    stage = "objective cuset | 40 samples\nerror: --batch-size 8 must be a multiple of processes x 3\n"
    assert gc.Finished(2, stage).cause() == "error: --batch-size 8 must be a multiple of processes x 3"
    assert gc.Finished(-9, "step     1/8\n\n").cause() == "step     1/8"
    assert gc.Finished(None, "").cause() == "(no output)"


def test_the_summary_says_when_stage_04_ran_without_the_sandbox():
    steps = {"profile": {"status": "PASS"}, "train": {"status": "FAIL"}}
    sandboxed = gc.summary_line({"sandbox": {"status": "PASS"}} | steps, 301.4)
    assert sandboxed == "gpu check: 2 passed, 1 failed, 0 skipped in 301 s (budget 480 s)"
    unsandboxed = gc.summary_line({"sandbox": {"status": "SKIP"}} | steps, 301.4)
    assert unsandboxed == (
        "gpu check: 1 passed, 1 failed, 1 skipped in 301 s (budget 480 s); the sandbox step was SKIPPED: "
        "stage 04 ran with --no-sandbox"
    )
