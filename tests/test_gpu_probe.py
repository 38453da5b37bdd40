"""The GPU backend's logic, tested on the CPU (harness/gpu_probe.py, the GPU part of harness/sandbox.py,
the task check's rule in 04_eval_kernels.py): nvcc's flags from a compute capability, the probe built
by the candidates' own compile and run in their sandbox (here, without a GPU, it must say what CUDA
reported), the backend decided from --backend, the GPU listed and the probe, the sandbox's device
whitelist from a folder of stand-in nodes, the driver's library folders from an `ldconfig -p`
listing, the GPU listed by the driver without nvidia-smi, and which failures of a task's own reference
make its task a task_error."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import load_script

from cuset_common.cli import UserError
from harness.gpu_probe import cuda_arch, decide_backend, gencode_flags, probe_gpu, run_failure
from harness.programs import Runner, driver_gpu_name
from harness.sandbox import (
    driver_binds,
    driver_library_folders,
    gpu_access_problem,
    gpu_node_binds,
    probe_isolation,
)

ev = load_script("04_eval_kernels.py")
root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="as root the sandbox uid is a stranger to every node"
)
H200 = "NVIDIA H200"


# ---------------------------------------------------------------------------------------
# nvcc's flags, and the probe itself
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capability,flags,arch",
    [
        ("9.0", ["-gencode", "arch=compute_90,code=sm_90"], 900),
        ("8.6", ["-gencode", "arch=compute_86,code=sm_86"], 860),
        ("12.0", ["-gencode", "arch=compute_120,code=sm_120"], 1200),
    ],
)
def test_a_capability_gives_an_explicit_gencode_and_its_cuda_arch(capability, flags, arch):
    assert gencode_flags(capability) == flags
    assert cuda_arch(capability) == arch


@pytest.mark.parametrize("capability", ["", "9", "sm_90", "9.0.1", "native"])
def test_what_is_not_a_capability_is_refused(capability):
    with pytest.raises(ValueError, match="not a compute capability"):
        gencode_flags(capability)


def test_the_probe_is_built_by_the_candidates_compile_and_without_a_gpu_says_what_cuda_reported():
    builds = []

    def compile_program(source, folder, arch, timeout, runner):  # the real one, its flags kept
        builds.append(arch)
        return ev.compile_program(source, folder, arch, timeout, runner)

    probe = probe_gpu(Runner(probe_isolation().available, "gpu"), "8.0", compile_program)
    assert builds == [probe.arch] == [["-gencode", "arch=compute_80,code=sm_80"]]
    assert probe.failure.startswith("it exited with status 1: cuda driver 0 runtime "), probe.failure
    assert "cudaGetDeviceProperties: " in probe.failure
    assert "\n" not in probe.failure


def test_without_a_capability_nothing_is_built():
    probe = probe_gpu(Runner(False, "gpu"), None, build=None)
    assert probe.arch == [] and probe.failure.startswith("cannot tell the GPU's compute capability")


@pytest.mark.parametrize(
    "code,log,failure",
    [
        (0, "__CUDA_ARCH__ 900\n", None),
        (0, "__CUDA_ARCH__ 0\n", "its kernel did not report __CUDA_ARCH__ 900: __CUDA_ARCH__ 0"),
        (
            0,
            "__CUDA_ARCH__ 9000\n",
            "its kernel did not report __CUDA_ARCH__ 900: __CUDA_ARCH__ 9000",
        ),
        (
            1,
            "kernel launch: no kernel image is\navailable for this device\n",
            "it exited with status 1: kernel launch: no kernel image is available for this device",
        ),
        (None, "", "it did not finish within 60 s"),
    ],
)
def test_the_probe_ran_only_when_its_kernel_reported_the_architecture_it_was_built_for(code, log, failure):
    assert run_failure(code, log, "9.0") == failure


# ---------------------------------------------------------------------------------------
# The backend: --backend, the GPU listed, the probe
# ---------------------------------------------------------------------------------------

FAILED = "it exited with status 1: cudaMalloc: no CUDA-capable device is detected"


@pytest.mark.parametrize(
    "choice,gpu,probe_failure,expected",
    [
        ("emulate", None, None, "emulated"),
        ("emulate", H200, None, "emulated"),
        ("auto", None, None, "emulated"),
        ("auto", H200, None, "gpu"),
        (
            "auto",
            H200,
            FAILED,
            f"the GPU probe failed on {H200}: {FAILED}. Fix that, or pass --backend emulate",
        ),
        ("gpu", None, None, "--backend gpu: no GPU found"),
        ("gpu", H200, None, "gpu"),
        ("gpu", H200, FAILED, f"--backend gpu: the GPU probe failed on {H200}: {FAILED}. Fix that"),
    ],
)
def test_the_gpu_is_used_only_where_the_probe_ran_and_a_listed_gpu_it_failed_on_is_refused(
    choice, gpu, probe_failure, expected
):
    if expected in ("gpu", "emulated"):
        assert decide_backend(choice, gpu, probe_failure) == expected
        return
    with pytest.raises(UserError) as refused:
        decide_backend(choice, gpu, probe_failure)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_a_gpu_listed_by_the_driver_alone_is_found(tmp_path):
    # A container without nvidia-smi still has the driver's list: /proc/driver/nvidia/gpus/<bus>/information.
    assert driver_gpu_name(tmp_path) is None
    (tmp_path / "0000:18:00.0").mkdir()
    (tmp_path / "0000:18:00.0" / "information").write_text(f"Model: \t\t {H200}\nIRQ:   \t\t 16\n")
    assert driver_gpu_name(tmp_path) == H200


# ---------------------------------------------------------------------------------------
# The sandbox's device whitelist and the driver's libraries
# ---------------------------------------------------------------------------------------


def stand_in_dev(folder: Path, modes: dict[str, int]) -> Path:
    """A dev folder of stand-in nodes: character devices with /dev/null's numbers as root, else files."""
    (folder / "nvidia-caps").mkdir(parents=True)
    for name, mode in modes.items():
        if os.geteuid() == 0:
            os.mknod(folder / name, stat.S_IFCHR | mode, os.stat("/dev/null").st_rdev)
        else:
            (folder / name).touch()
        os.chmod(folder / name, mode)
    return folder


def test_the_whitelist_binds_the_nodes_cuda_opens_at_their_names(tmp_path):
    names = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "null"]
    dev = stand_in_dev(tmp_path, dict.fromkeys([*names, "nvidia-caps/nvidia-cap1"], 0o666))
    bound = ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl", "nvidia-caps/nvidia-cap1"]
    assert gpu_node_binds(dev) == [arg for n in bound for arg in ("--dev-bind", str(dev / n), f"/dev/{n}")]


@root_only
def test_a_node_closed_to_the_sandbox_uid_is_named_with_what_to_change(tmp_path):
    dev = stand_in_dev(tmp_path, {"nvidiactl": 0o666, "nvidia0": 0o666, "nvidia-caps/nvidia-cap1": 0o400})
    assert (
        gpu_access_problem(dev) is None
    )  # a root-only MIG capability node is none of the program's business
    os.chmod(dev / "nvidia0", 0o660)  # e.g. NVreg_DeviceFileMode=0660 with the group video
    problem = gpu_access_problem(dev)
    assert problem.startswith(f"{dev}/nvidia0 is crw-rw---- (gid 0): the sandboxed program cannot open it")
    assert problem.endswith(f"(chmod 666 {dev}/nvidia*, or the driver's option NVreg_DeviceFileMode=0666)")


def test_the_driver_library_folders_come_from_ldconfig_with_links_resolved(tmp_path):
    # A driver container's layout: the loader's cache lists a link whose target lies outside the system.
    (tmp_path / "lib").mkdir()
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "libcuda.so.550.54").touch()
    (tmp_path / "lib" / "libcuda.so.1").symlink_to(tmp_path / "driver" / "libcuda.so.550.54")
    listing = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {tmp_path}/lib/libcuda.so.1\n"
        "\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/lib/nvidia/libnvidia-ptxjitcompiler.so.1\n"
        "\tlibz.so.1 (libc6,x86-64) => /opt/zlib/libz.so.1\n"
    )
    folders = driver_library_folders(listing)
    assert folders == {tmp_path / "lib", tmp_path / "driver", Path("/usr/lib/nvidia")}
    outside = [str(tmp_path / "driver"), str(tmp_path / "lib")]  # /usr is bound anyway
    assert driver_binds(folders) == [arg for f in outside for arg in ("--ro-bind", f, f)]


# ---------------------------------------------------------------------------------------
# The task check on the GPU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome,backend,cause",
    [
        ("pass", "gpu", None),
        ("skipped", "gpu", None),
        ("wrong_output", "gpu", "reference judged F"),
        ("runtime_error", "gpu", "reference runtime_error on the GPU"),
        ("timeout", "gpu", "reference timeout on the GPU"),
        ("compile_error", "gpu", "reference compile_error on the GPU"),
        ("pass", "emulated", None),
        ("wrong_output", "emulated", "reference judged F"),
        ("runtime_error", "emulated", None),  # unchecked: the emulator may be what fails
        ("timeout", "emulated", None),
        ("unsupported", "emulated", None),
    ],
)
def test_on_the_gpu_a_reference_that_does_not_pass_makes_its_task_a_task_error(outcome, backend, cause):
    found = ev.reference_failure(outcome, backend)
    assert (found and found[0]) == cause
