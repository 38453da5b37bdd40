"""Stage 04 on the GPU machines users have, with stand-ins on PATH for what this CPU machine lacks
(harness/gpu_probe.py, harness/programs.py, cuset_common/device.py): an `nvidia-smi` that never answers (a
hung driver) is one line and exit 2, never a hang; the GPU the programs run on is the one --device and
CUDA_VISIBLE_DEVICES select, not nvidia-smi's first; the probe builds again for the GPU its program reports;
a driver older than nvcc's CUDA is named as the cause; an exclusive-process GPU is refused before
generating on it; after a program fails on the GPU the probe runs again, and a GPU that does not recover
stops the run before that program's row is recorded."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eval_stage, refused

import cuset_common.device as device
from cuset_common.cli import UserError
from cuset_common.paths import ROOT
from harness import gpu_probe
from harness.gpu_probe import (
    GpuWatch,
    Probe,
    compute_capability,
    exclusive_gpu_problem,
    probe_gpu,
    run_failure,
)
from harness.programs import ListedGpu, Runner, gpu_name, program_gpu

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
TWO_GPUS = (
    f"0, {UUID_A}, NVIDIA A100-SXM4-80GB, 8.0, Default\n1, {UUID_B}, NVIDIA H100 80GB HBM3, 9.0, Default\n"
)


def stand_in_nvidia_smi(folder: Path, monkeypatch, body: str) -> Path:
    """An `nvidia-smi` script first on PATH that runs `body` (sh)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin")
    return bin_dir


def listing(folder, monkeypatch, rows: str) -> None:
    """nvidia-smi that answers --query-gpu with `rows` (as csv,noheader) and -L with a line per GPU."""
    body = f'case "$1" in -L) echo "GPU 0: stand-in";; *) printf "%s" "{rows}";; esac'
    stand_in_nvidia_smi(folder, monkeypatch, body)


# ---------------------------------------------------------------------------------------
# A hung driver
# ---------------------------------------------------------------------------------------


def test_a_hung_nvidia_smi_is_one_line_within_its_limit(tmp_path, monkeypatch):
    # sh waits on a child that holds the pipe: subprocess.run(timeout=) would wait for it after the kill
    stand_in_nvidia_smi(tmp_path, monkeypatch, "sleep 600; true")
    monkeypatch.setattr(device, "NVIDIA_SMI_TIMEOUT_S", 1)
    started = time.monotonic()
    with pytest.raises(
        UserError, match=r"nvidia-smi -L did not answer within 1 s: the GPU driver seems hung"
    ):
        device.nvidia_smi("-L")
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_stage_04_beside_a_hung_nvidia_smi_exits_2_with_one_line_within_a_minute(tmp_path, monkeypatch):
    bin_dir = stand_in_nvidia_smi(tmp_path, monkeypatch, "exec sleep 600")
    argv = ["--reference", "--levels", "1", "--limit", "1", "--out", str(tmp_path / "out")]
    env = {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "04_eval_kernels.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: nvidia-smi") and "seems hung" in lines[0]
    assert took < 60, took


# ---------------------------------------------------------------------------------------
# Which GPU: --device, CUDA_VISIBLE_DEVICES, nvidia-smi's order, the probe's report
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "visible,device_arg,expected",
    [
        (None, "auto", "0"),
        (None, "cuda:1", "1"),
        ("1", "cuda", "1"),
        ("2,3", "cuda:1", "3"),
        (f"{UUID_A},{UUID_B}", "cuda:1", UUID_B),
        ("3", "cpu", "3"),  # generation on the CPU: the programs take the first visible GPU
    ],
)
def test_the_programs_gpu_is_the_one_device_and_cuda_visible_devices_select(
    visible, device_arg, expected, monkeypatch
):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert program_gpu(device_arg) == expected


def test_a_device_beyond_the_visible_gpus_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(
        UserError, match=r"--device cuda:1: CUDA_VISIBLE_DEVICES='1' makes 1 GPU\(s\) visible"
    ):
        program_gpu("cuda:1")


@pytest.mark.parametrize(
    "selection,name,capability",
    [
        ("1", "NVIDIA H100 80GB HBM3", "9.0"),
        (UUID_B[:12], "NVIDIA H100 80GB HBM3", "9.0"),
        ("0", "NVIDIA A100-SXM4-80GB", "8.0"),
    ],
)
def test_the_gpu_named_and_its_capability_are_the_selected_ones_not_nvidia_smis_first(
    selection, name, capability, tmp_path, monkeypatch
):
    listing(tmp_path, monkeypatch, TWO_GPUS)
    assert gpu_name(selection) == name
    assert compute_capability(selection) == capability


def test_the_programs_see_only_the_selected_gpu(run_program_env):
    assert run_program_env(Runner(True, "gpu", UUID_B)) == UUID_B


@pytest.fixture
def run_program_env(tmp_path):
    """The CUDA_VISIBLE_DEVICES a program sees when `runner` runs it (sandboxed, with the GPU's binds)."""

    def run(runner: Runner) -> str:
        code, log = runner.untrusted(["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], tmp_path, 30, nproc=8)
        assert code == 0, log
        return log.strip()

    return run


class ScriptedRunner:
    """A runner whose programs print what the GPU in front of them would: the device line of `ran_on`, then
    the architecture of the build when it is that GPU's."""

    sandbox = False

    def __init__(self, ran_on: str):
        self.ran_on, self.runs = ran_on, 0

    def untrusted(self, cmd, folder, timeout, **kw):
        self.runs += 1
        built_for = Path(folder).name.removeprefix("build-")
        arch = int(float(self.ran_on) * 100) if built_for == self.ran_on else 0
        return (
            0,
            f"cuda driver 13000 runtime 13000\ndevice {self.ran_on} {UUID_B} NVIDIA H100\n"
            f"__CUDA_ARCH__ {arch}\n",
        )


def fake_build(builds: list):
    def build(source, folder, arch, timeout, runner):
        builds.append(arch)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prog").touch()
        return folder / "prog", ""

    return build


def test_the_probe_builds_again_for_the_gpu_its_program_ran_on():
    builds = []
    probe = probe_gpu(ScriptedRunner("9.0"), "8.0", fake_build(builds))  # nvidia-smi's guess: the A100's 8.0
    assert builds == [["-gencode", "arch=compute_80,code=sm_80"], ["-gencode", "arch=compute_90,code=sm_90"]]
    assert probe.failure is None and probe.arch == builds[1]
    assert probe.gpu == "NVIDIA H100 (compute capability 9.0)"


def test_a_right_guess_is_built_once():
    builds = []
    assert probe_gpu(ScriptedRunner("9.0"), "9.0", fake_build(builds)).failure is None
    assert len(builds) == 1


# ---------------------------------------------------------------------------------------
# A driver older than nvcc's CUDA; exclusive-process mode
# ---------------------------------------------------------------------------------------


def test_a_driver_older_than_nvccs_cuda_is_named_with_what_to_do():
    log = "cuda driver 12040 runtime 13000\ncudaGetDeviceProperties: CUDA driver version is insufficient\n"
    failure = run_failure(1, log, "9.0")
    assert (
        "the driver supports CUDA 12.4, older than nvcc's CUDA 13.0: install a driver for CUDA 13.0"
        in failure
    )
    assert "\n" not in failure
    no_driver = "cuda driver 0 runtime 13000\ncudaGetDeviceProperties: CUDA driver version is insufficient\n"
    assert "older than" not in run_failure(1, no_driver, "9.0")  # no driver library at all: not an old one


@pytest.mark.parametrize(
    "mode,generating,refused_",
    [("Exclusive_Process", True, True), ("Exclusive_Process", False, False), ("Default", True, False)],
)
def test_an_exclusive_process_gpu_is_refused_only_where_this_process_would_hold_it(
    mode, generating, refused_
):
    gpu = ListedGpu("0", UUID_A, "NVIDIA H100", "9.0", mode)
    problem = exclusive_gpu_problem(gpu, generating)
    assert (problem is not None) == refused_
    if problem:
        assert "exclusive-process compute mode" in problem and "--generate-only" in problem


def test_stage_04_refuses_to_generate_on_an_exclusive_process_gpu_before_any_work(
    tmp_path, monkeypatch, capsys
):
    rows = f"0, {UUID_A}, NVIDIA H100 80GB HBM3, 9.0, Exclusive_Process\n"
    listing(tmp_path, monkeypatch, rows)
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: True)  # generation would take the GPU
    monkeypatch.setattr(device.torch.cuda, "device_count", lambda: 1)
    out = tmp_path / "out"
    argv = ["--backend", "gpu", "--engine", "hf", "--precision", "fp32", "--limit", "1", "--levels", "1"]
    line, _ = refused(eval_stage().main, [*argv, "--out", out], capsys)
    assert "exclusive-process compute mode" in line
    assert not (out / "results.jsonl").exists()


# ---------------------------------------------------------------------------------------
# The GPU after a failed program
# ---------------------------------------------------------------------------------------


class FailingProbeRunner:
    """Probe runs that fail `failures` times, then report the architecture of a 9.0 GPU."""

    sandbox = False

    def __init__(self, failures: int):
        self.failures, self.runs = failures, 0

    def untrusted(self, cmd, folder, timeout, **kw):
        self.runs += 1
        if self.runs <= self.failures:
            return 1, "cuda driver 13000 runtime 13000\ncudaGetDeviceProperties: unspecified launch failure\n"
        return 0, f"cuda driver 13000 runtime 13000\ndevice 9.0 {UUID_A} NVIDIA H100\n__CUDA_ARCH__ 900\n"


def watch(runner, tmp_path) -> GpuWatch:
    return GpuWatch(
        runner, Probe(["-gencode", "arch=compute_90,code=sm_90"], None, "H100", tmp_path / "prog")
    )


def test_a_passing_or_wrong_program_does_not_probe_again(tmp_path):
    runner = FailingProbeRunner(0)
    for outcome in ("pass", "wrong_output", "compile_error"):
        watch(runner, tmp_path).after(outcome, "a program")
    assert runner.runs == 0


def test_a_gpu_that_recovers_after_a_failed_program_lets_the_run_go_on(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_probe, "RECOVER_EVERY_S", 0.01)
    runner = FailingProbeRunner(2)
    watch(runner, tmp_path).after("runtime_error", "a program")
    assert runner.runs == 3


def test_a_gpu_that_does_not_recover_stops_the_run_naming_why(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_probe, "RECOVER_S", 0.05)
    monkeypatch.setattr(gpu_probe, "RECOVER_EVERY_S", 0.01)
    with pytest.raises(UserError) as stopped:
        watch(FailingProbeRunner(10**6), tmp_path).after("timeout", "a program of task t1")
    said = str(stopped.value)
    assert said.startswith("the GPU stopped working after a program of task t1 ended timeout")
    assert "unspecified launch failure" in said and "rerun the same command" in said and "\n" not in said


# ---------------------------------------------------------------------------------------
# The Python users have
# ---------------------------------------------------------------------------------------

# A real interpreter, not a pyenv shim (which runs only the versions pyenv is told to)
OLDER_PYTHON = next(
    iter(
        sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")))
        + glob.glob("/usr/bin/python3.10")
    ),
    None,
)


@pytest.mark.skipif(OLDER_PYTHON is None, reason="no Python 3.10 on this machine to try")
def test_a_python_older_than_3_11_is_refused_in_one_line():
    done = subprocess.run(
        [OLDER_PYTHON, "-c", "import cuset_common"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: Python 3.10") and done.stderr.count("\n") == 1
