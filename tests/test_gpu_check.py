"""research/bench/gpu_check.py on the CPU: without a GPU it refuses in one line; its verdicts (the speedup
window, the memory plan against the peak on both sides, the driver's CUDA against nvcc's, PARTIAL for one GPU)
and the summary; the training shape that makes the plan's bounds hold; its command runner (time limit, the
kill at a line, process trees that leave the command's group: torchrun's workers, a setsid child, an escaped
one); nvidia-smi's time limit; and its unpacking of a bubblewrap .deb, with dpkg-deb and without, with
tarfile's filters and without (Python before 3.11.4), into a folder that outlives the check, on real files and
processes. The check's steps themselves need a GPU: docs/tests.md, "The GPU check"."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from conftest import load_script

from cuset_common import device
from cuset_common.cli import UserError
from cuset_common.data import encode_sample, load_sft
from cuset_common.models import load_causal_lm
from cuset_common.paths import ROOT, TINY_MODEL
from cuset_common.training.scale import memory_plan

gc = load_script("research/bench/gpu_check.py")
MIB = 2**20


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
def test_without_a_gpu_the_check_exits_2_with_one_line(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "research/bench/gpu_check.py", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
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


def test_the_peak_must_lie_near_the_plan_from_either_side():
    plan = 100 * MIB
    allowed = plan * (1 + gc.PLAN_MARGIN_ABOVE) + gc.PLAN_SLACK_BYTES
    least = plan * (1 - gc.PLAN_MARGIN_BELOW)
    for peak in (least, plan, allowed):  # the bounds belong to the window
        assert gc.plan_mismatch({"plan_bytes": plan, "peak_allocated_bytes": peak}) is None
    over = gc.plan_mismatch({"plan_bytes": plan, "peak_allocated_bytes": allowed + MIB})
    assert over == (
        "peak allocated 239.0 MiB exceeds the plan's 100.0 MiB by more than 10% + 128 MiB (allowed 238.0 MiB)"
    )
    under = gc.plan_mismatch({"plan_bytes": plan, "peak_allocated_bytes": least - MIB})
    assert under == (
        "peak allocated 83.0 MiB is under the plan's 100.0 MiB by more than 16% (at least 84.0 MiB): "
        "the plan counts more than the run holds"
    )
    figures = gc.plan_figures({"plan_bytes": plan, "peak_allocated_bytes": 150 * MIB})
    assert figures == {"plan_mib": 100.0, "peak_allocated_mib": 150.0, "peak_over_plan": 1.5}


def stage_03_args(tmp_path: Path):
    """Stage 03's arguments as the `train` step passes them."""
    check = gc.Check(tmp_path, {}, {}, None, time.monotonic())
    return load_script("03_train_cuset.py").parse_args(gc.train_argv(check, gc.TRAIN_STEPS, "train"))


def test_every_training_micro_batch_has_the_shape_the_plan_counts(tiny_tokenizer, tmp_path):
    """Every sample fills --max-length (no padding), enough have response tokens within it for the steps, and
    any micro-batch of them fills a whole --chunk-rows chunk of the output layer: the plan's shape."""
    args = stage_03_args(tmp_path)
    assert (args.max_length, args.micro_batch_size, args.chunk_rows) == (
        gc.TRAIN_MAX_LENGTH,
        gc.TRAIN_MICRO_BATCH,
        gc.TRAIN_CHUNK_ROWS,
    )
    samples = [encode_sample(tiny_tokenizer, r, args.max_length) for r in load_sft(gc.TRAIN_DATA)]
    assert {len(s["input_ids"]) for s in samples} == {args.max_length}
    responses = sorted(
        args.max_length - s["response_start"] for s in samples if s["response_start"] < args.max_length
    )
    assert len(responses) >= 2 * args.batch_size  # two steps an epoch at least: the resume crosses epochs
    assert sum(responses[: args.micro_batch_size]) >= args.chunk_rows


def test_the_margin_under_the_plan_is_what_the_plan_may_count_in_vain(tmp_path):
    """PLAN_MARGIN_BELOW against its derivation (the comment beside it), at `train`'s shape on a GPU: the
    smaller of the gradients and the activations with the head (counted twice at most), plus what only a
    padded micro-batch keeps (tests/test_fsdp.py: padding_only_bytes, here in bf16: 2 B)."""
    args = stage_03_args(tmp_path)
    model = load_causal_lm(str(TINY_MODEL), torch.float32)
    plan = {k: v[0] for k, v in memory_plan(model, args, 1, "cuda", args.max_length, "bf16").items()}
    cfg, tokens = model.config, args.micro_batch_size * args.max_length
    kv = cfg.num_key_value_heads * cfg.head_dim
    padding_only = cfg.num_hidden_layers * tokens * 2 * (args.max_length + 2 * (cfg.hidden_size - kv))
    in_vain = min(plan["gradients"], plan["activations"] + plan["output layer"]) + padding_only
    share = in_vain / plan["total"]
    assert share <= gc.PLAN_MARGIN_BELOW < share + 0.01, share  # the share, rounded up to a whole percent


def test_a_command_is_killed_at_its_line_or_at_its_time_limit(tmp_path):
    log = tmp_path / "step.log"
    line = "print(f'train (steps): {i}/99', flush=True); time.sleep(1)"
    steps = f"import time\nfor i in range(1, 100):\n    {line}"
    done = gc.run_command([sys.executable, "-c", steps], log, 60, {}, gc.SECOND_STEP_LINE)
    assert done.kill_line == "train (steps): 2/99" and done.code == -9
    assert "train (steps): 3/99" not in done.output  # the kill lands at the line, within the step after it

    t0 = time.monotonic()
    done = gc.run_command(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], log, 1, {}, None
    )
    assert done.code is None and done.output == "up\n" and time.monotonic() - t0 < 30
    text = log.read_text()
    assert text.count("$ ") == 2 and "killed after the time limit of 1 s" in text


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process `pid` ends within wait_s: no longer there, or a zombie (its parent, init here, may not
    reap). A process killed with SIGKILL closes its files (the command's output ends) before it becomes a
    zombie, and on a busy CPU the rest of its exit may wait for a core: it is given wait_s to finish."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def pids(output: str, word: str) -> list[int]:
    """The process ids a test command printed as `<word> <pid>`."""
    return [int(pid) for pid in re.findall(rf"^{word} (\d+)$", output, re.M)]


@pytest.mark.slow
def test_torchrun_s_workers_are_killed_at_the_time_limit(tmp_path):
    """torchrun starts its workers in sessions of their own, out of the command's process group: they die
    at the limit all the same, and the command returns then, not when a worker would have ended."""
    worker = tmp_path / "worker.py"
    worker.write_text("import os, time\nprint(f'worker {os.getpid()}', flush=True)\ntime.sleep(300)\n")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    limit = 8  # torchrun and its worker import torch first: seconds on a busy CPU
    t0 = time.monotonic()
    done = gc.run_command([*torchrun, str(worker)], tmp_path / "log", limit, dict(os.environ), None)
    assert done.code is None and time.monotonic() - t0 < limit + gc.DRAIN_S
    [pid] = pids(done.output, "worker")
    assert gone(pid)


def test_a_child_in_a_session_of_its_own_is_killed_with_the_command(tmp_path):
    setsid_child = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid(); print(f'child {os.getpid()}', flush=True); time.sleep(300)\n"
        "time.sleep(300)\n"
    )
    t0 = time.monotonic()
    done = gc.run_command([sys.executable, "-c", setsid_child], tmp_path / "log", 2, {}, None)
    assert done.code is None and time.monotonic() - t0 < 2 + gc.DRAIN_S
    [pid] = pids(done.output, "child")
    assert gone(pid)


def test_a_process_that_escaped_the_tree_cannot_keep_the_check_waiting(tmp_path):
    """A grandchild whose parent exited belongs to init, in a session of its own: no walk or group kill
    finds it, and it holds the output pipe. The reading stops DRAIN_S after the kill all the same."""
    escaped = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print(f'escaped {os.getpid()}', flush=True); time.sleep(300)\n"
        "    os._exit(0)\n"
        "time.sleep(300)\n"
    )
    t0 = time.monotonic()
    done = gc.run_command([sys.executable, "-c", escaped], tmp_path / "log", 2, {}, None)
    took = time.monotonic() - t0
    [pid] = pids(done.output, "escaped")
    os.kill(pid, 9)  # the test's own clean-up: the check cannot find it
    assert done.code is None and took < 2 + gc.DRAIN_S + 3
    assert "a process outside the killed tree holds it open" in (tmp_path / "log").read_text()


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


def test_a_partial_step_counts_as_run_for_the_steps_after_it(tmp_path):
    (tmp_path / "logs").mkdir()
    check = gc.Check(tmp_path, {}, {"capability": "9.0"}, None, time.monotonic() + 600)

    def one_gpu(_check):
        raise gc.StepPartial(gc.ONE_PROCESS, {"processes": 1})

    partial = check.results["torchrun-ddp"] = gc.run_step(check, gc.Step("torchrun-ddp", one_gpu))
    assert (partial["status"], partial["reason"], partial["figures"]) == (
        "PARTIAL",
        gc.ONE_PROCESS,
        {"processes": 1},
    )
    after = gc.run_step(check, gc.Step("after", lambda _check: {"ran": True}, ("torchrun-ddp",)))
    assert (after["status"], after["figures"]) == ("PASS", {"ran": True})


def test_torchrun_runs_2_processes_where_there_are_2_gpus_and_says_what_1_leaves_unchecked():
    assert gc.torchrun_processes(1) == (1, gc.ONE_PROCESS)
    assert gc.torchrun_processes(2) == gc.torchrun_processes(8) == (2, None)
    assert gc.ONE_PROCESS == (
        "one GPU, so torchrun ran 1 process: no collective crossed GPUs and no gloo checkpoint wait was made "
        "(they need 2 GPUs)"
    )


def test_partial_steps_are_counted_and_said_in_the_summary_and_exit_0():
    one_gpu = {"status": "PARTIAL", "reason": gc.ONE_PROCESS}
    results = {
        "sandbox": {"status": "PASS"},
        "train": {"status": "PASS"},
        "torchrun-fsdp": one_gpu,
        "torchrun-ddp": one_gpu,
    }
    assert gc.summary_line(results, 301.4) == (
        "gpu check: 2 passed, 2 partial, 0 failed, 0 skipped in 301 s (budget 480 s); torchrun-fsdp, "
        f"torchrun-ddp PARTIAL: {gc.ONE_PROCESS}"
    )
    assert gc.exit_status(results) == 0
    assert gc.exit_status(results | {"train": {"status": "FAIL"}}) == 1
    assert gc.exit_status(results | {"train": {"status": "SKIP"}}) == 0


NVIDIA_SMI_HEADER = """\
Mon Jan  5 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""
NVCC_VERSION = """\
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def test_the_driver_s_cuda_and_nvcc_s_release_are_read_and_compared():
    assert gc.driver_cuda(NVIDIA_SMI_HEADER) == (12, 4)
    assert gc.driver_cuda("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |") == (
        13,
        0,
    )
    assert (
        gc.driver_cuda("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver") is None
    )
    assert gc.nvcc_release(NVCC_VERSION) == (13, 0)
    assert gc.nvcc_release("bash: nvcc: command not found") is None

    assert gc.toolkit_mismatch((12, 4), (13, 0)) == (
        "the driver runs CUDA 12.4 at most but nvcc is release 13.0: none of the programs it builds can "
        "start; install a driver for CUDA 13 (nvidia-smi's header then says CUDA Version: 13.0 or more), or "
        "put the nvcc of a CUDA 12.x toolkit first on PATH"
    )
    assert gc.toolkit_mismatch((13, 0), (12, 4)) is None  # a newer driver runs older programs
    assert gc.toolkit_mismatch((12, 2), (12, 8)) is None  # minor version compatibility, machine code only
    assert gc.toolkit_mismatch(None, (13, 0)).startswith("neither nvidia-smi nor libcuda tells")
    assert gc.toolkit_mismatch((13, 0), None).startswith("nvcc --version names no release")


def stand_in(folder: Path, name: str, script: str) -> Path:
    """An executable `name` in `folder` that runs the shell `script`."""
    folder.mkdir(exist_ok=True)
    exe = folder / name
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)
    return exe


def test_a_driver_older_than_nvcc_fails_preflight_and_the_stage_04_steps_skip(tmp_path):
    stand_in(tmp_path / "bin", "nvcc", f"cat <<'EOF'\n{NVCC_VERSION}EOF")
    (tmp_path / "logs").mkdir()
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    check = gc.Check(
        tmp_path, env, {"capability": "9.0", "driver_cuda": "12.4"}, None, time.monotonic() + 600
    )
    steps = {step.name: step for step in gc.STEPS}
    assert gc.STEPS[0].name == "preflight"
    preflight = check.results["preflight"] = gc.run_step(check, steps["preflight"])
    assert (preflight["status"], preflight["reason"]) == ("FAIL", gc.toolkit_mismatch((12, 4), (13, 0)))
    assert preflight["figures"]["nvcc_release"] == "13.0"
    for name in ("gpu-probe", "reference-timing", "generate-hf", "generate-vllm"):
        skipped = gc.run_step(check, steps[name])
        assert (skipped["status"], skipped["reason"]) == ("SKIP", "needs preflight, which did not pass")

    check.gpu["driver_cuda"] = "13.0"
    assert gc.run_step(check, steps["preflight"])["status"] == "PASS"


def test_a_hung_nvidia_smi_is_one_line_within_its_time_limit(tmp_path, monkeypatch):
    """nvidia-smi on a hung driver never answers: the check stops at the limit with one line (exit 2). A
    stand-in that sleeps is that nvidia-smi; main() itself refuses first on this CPU-only torch."""
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(device, "NVIDIA_SMI_TIMEOUT_S", 1)
    stand_in(tmp_path, "nvidia-smi", "exec sleep 300")
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"^nvidia-smi  ?did not answer within 1 s"):
        gc.driver_cuda_version()
    assert time.monotonic() - t0 < 1 + 5

    stand_in(tmp_path, "nvidia-smi", f"cat <<'EOF'\n{NVIDIA_SMI_HEADER}EOF")
    assert gc.driver_cuda_version() == "12.4"


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


@pytest.fixture
def python_3_11_2(monkeypatch):
    """tarfile as Python 3.11.0-3.11.3 have it (Debian 12's python3 is 3.11.2): no data_filter, and an
    extractall without the filter argument, which extracts what it is given. Under such a Python (CI's
    Debian 12 run) tarfile is already so, and is left as it is."""
    if not hasattr(tarfile, "data_filter"):
        return
    extractall = tarfile.TarFile.extractall

    def without_filters(self, path=".", members=None, *, numeric_owner=False):
        return extractall(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

    monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.setattr(tarfile.TarFile, "extractall", without_filters)


@needs_dpkg_deb
def test_bwrap_comes_from_the_deb_where_tarfile_has_no_filters(tmp_path, monkeypatch, python_3_11_2):
    deb = build_deb(tmp_path, "xz")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dpkg-deb: the package is read in Python
    folder = gc.bwrap_folder(deb, tmp_path / "unpacked")
    r = subprocess.run([str(folder / "bwrap")], capture_output=True, text=True)
    assert r.stdout == "bubblewrap 0.0-test\n"


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


# Archives that would write outside the destination, or make what is not data: each after a harmless file.
HOSTILE = {
    "a '..' out": [member("./../outside/x")],
    "a link to an absolute path": [member("./usr/lib/l", tarfile.SYMTYPE, "/etc")],
    "a link out": [member("./usr/l", tarfile.SYMTYPE, "../../outside")],
    "a link out through a link": [
        member("./d", tarfile.DIRTYPE),
        member("./d/up", tarfile.SYMTYPE, ".."),  # the destination itself: inside
        member("./d/up/out", tarfile.SYMTYPE, ".."),  # lexically inside (d), really its parent
    ],
    "a device node": [member("./dev/mem", tarfile.CHRTYPE)],
}


def archive(members: list[tarfile.TarInfo]) -> tarfile.TarFile:
    """An in-memory tar archive of a file ./usr/bin/bwrap, then `members` (files empty)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info in [member("./usr/bin/bwrap"), *members]:
            tar.addfile(info, io.BytesIO(b"") if info.isfile() else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("filters", [True, False], ids=["data-filter", "3.11.2"])
def test_a_package_that_writes_outside_or_makes_devices_is_refused(tmp_path, request, kind, filters):
    if not filters:
        request.getfixturevalue("python_3_11_2")
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    with pytest.raises(UserError, match=r"^the deb: refused: "):
        gc.extract_tar(archive(HOSTILE[kind]), dest, "the deb")
    assert not outside.exists() and not (tmp_path / "out").exists()


def test_without_filters_only_plain_files_folders_and_links_inside_are_extracted(tmp_path, python_3_11_2):
    """The rules the Python check adds to what the data filter refuses: no absolute path at all (the filter
    strips its slash), no '..' even inside, no hard link; and no setuid bit or write for others."""
    for members, problem in [
        ([member("/x")], "has an absolute path or a '..'"),
        ([member("./a/../x")], "has an absolute path or a '..'"),
        ([member("./h", tarfile.LNKTYPE, "./usr/bin/bwrap")], "is not a file, a folder or a symbolic link"),
        (
            [member("./l", tarfile.SYMTYPE, "usr"), member("./l/x")],
            "passes through a symbolic link of the archive",
        ),
    ]:
        with pytest.raises(UserError, match=re.escape(problem)):
            gc.extract_tar(archive(members), tmp_path / "dest", "the deb")
    setuid = member("./usr/bin/suid")
    setuid.mode = 0o4777
    gc.extract_tar(
        archive([setuid, member("./usr/lib/l", tarfile.SYMTYPE, "../bin/bwrap")]), tmp_path / "ok", "x"
    )
    assert (tmp_path / "ok" / "usr" / "bin" / "suid").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "ok" / "usr" / "lib" / "l").resolve() == tmp_path / "ok" / "usr" / "bin" / "bwrap"


@needs_dpkg_deb
def test_the_unpacked_bwrap_outlives_the_check_in_its_out_folder(tmp_path):
    """--bwrap-deb lands in <out>/bwrap, which the check leaves behind, and stage 04 takes its bwrap with
    --bwrap; a package that cannot be unpacked is refused before a previous check's results are replaced,
    and leaves nothing beside them."""
    deb, out = build_deb(tmp_path, "xz"), tmp_path / "runs" / "gpu-check"
    bwrap = gc.prepare(out, deb)
    assert bwrap == out / "bwrap" / "usr" / "bin" / "bwrap" and (out / "logs").is_dir()
    assert subprocess.run([bwrap], capture_output=True, text=True).stdout == "bubblewrap 0.0-test\n"
    assert gc.bwrap_said(bwrap) == (
        f"bwrap {bwrap}: from --bwrap-deb, kept after the check; stage 04 takes it with --bwrap {bwrap}"
    )
    assert load_script("04_eval_kernels.py").parse_args(["--reference", "--bwrap", str(bwrap)]).bwrap == bwrap
    (out / "gpu_check.json").write_text("{}")  # the check's record: out is a previous check's now

    not_deb = tmp_path / "bubblewrap.deb"
    not_deb.write_text("hello")
    with pytest.raises(UserError, match="dpkg-deb cannot unpack it"):
        gc.prepare(out, not_deb)
    assert (out / "gpu_check.json").is_file() and bwrap.is_file()
    assert [p.name for p in out.parent.iterdir()] == ["gpu-check"]  # no unpacking folder left beside it

    assert gc.prepare(out, deb) == bwrap and not (out / "gpu_check.json").exists()  # replaced, bwrap again
    assert bwrap.is_file()


def test_the_sandbox_step_probes_the_bwrap_it_was_given_not_path_s(tmp_path):
    """The sandbox step probes the bwrap the stage-04 steps would take with --bwrap: a stand-in that is no
    bubblewrap fails it, whatever bwrap PATH holds, and the stage-04 steps keep --no-sandbox."""
    fake = stand_in(tmp_path / "bin", "bwrap", 'echo "bubblewrap 0.0-stand-in"; exit 1')
    (tmp_path / "logs").mkdir()
    check = gc.Check(tmp_path, gc.child_env(), {}, fake, time.monotonic() + 600)
    sandbox = gc.run_step(check, {step.name: step for step in gc.STEPS}["sandbox"])
    assert sandbox["status"] == "FAIL" and "0.0-stand-in" in sandbox["reason"], sandbox
    assert check.sandbox_flags == ["--no-sandbox"]


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
    assert gc.Finished(-9, "train (steps): 1/8\n\n").cause() == "train (steps): 1/8"
    assert gc.Finished(None, "").cause() == "(no output)"


def test_the_summary_says_when_stage_04_ran_without_the_sandbox():
    steps = {"profile": {"status": "PASS"}, "train": {"status": "FAIL"}}
    sandboxed = gc.summary_line({"sandbox": {"status": "PASS"}} | steps, 301.4)
    assert sandboxed == "gpu check: 2 passed, 0 partial, 1 failed, 0 skipped in 301 s (budget 480 s)"
    unsandboxed = gc.summary_line({"sandbox": {"status": "SKIP"}} | steps, 301.4)
    assert unsandboxed == (
        "gpu check: 1 passed, 0 partial, 1 failed, 1 skipped in 301 s (budget 480 s); the sandbox step was "
        "SKIPPED: stage 04 ran with --no-sandbox"
    )
