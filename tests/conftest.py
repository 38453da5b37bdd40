"""Shared test setup: the repo root on sys.path; the `gpu` marker that skips without a GPU; the `slow`
marker that `python -m pytest -m "not slow"` leaves out (the fast tier); the fixtures and helpers that
several test files use (the tiny model's tokenizer, a refused command line, programs run through stage 04's
sandbox, a pipeline of real artifacts)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the repository root, whose packages the tests import

from cuset_common.cli import load_script, run_main  # noqa: E402,F401  (tests import load_script from here)
from cuset_common.device import nvidia_smi_lists_a_gpu
from cuset_common.models import load_tokenizer  # noqa: E402
from cuset_common.paths import NVCC_DEFAULT_ARCH, TINY_MODEL  # noqa: E402
from harness.gpu_probe import compute_capability, gencode_flags  # noqa: E402
from harness.programs import gpu_name, resolve_backend  # noqa: E402


@lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True when nvidia-smi lists at least one GPU (torch here may be a CPU build)."""
    return nvidia_smi_lists_a_gpu()


# The files whose every test runs a stage end to end, builds programs or starts processes: seconds to
# minutes each. The fast tier (-m "not slow") leaves them out; it keeps the method itself (the loss, the
# thresholds, the region rule, the tagger, the weights, the artifacts), which those files only exercise
# again through the stages. Files that mix both mark their slow tests one by one (@pytest.mark.slow).
SLOW_FILES = {
    "test_bad_input.py",
    "test_bad_input_runs.py",
    "test_bench.py",
    "test_compare.py",
    "test_copy_probe.py",
    "test_data_sources.py",
    "test_divergence.py",
    "test_emulator.py",
    "test_engines.py",
    "test_eval.py",
    "test_eval_realset.py",
    "test_fsdp.py",
    "test_nearest_train.py",
    "test_openai_engine.py",
    "test_openai_hostile.py",
    "test_profile.py",
    "test_real_model.py",
    "test_sandbox.py",
    "test_sandbox_compat.py",
    "test_sft_variants.py",
    "test_tasks.py",
    "test_trl.py",
    "test_trackers.py",
}


def pytest_collection_modifyitems(config, items):
    """Mark every test of SLOW_FILES `slow`; without a GPU, skip the tests marked `gpu`."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi -L lists none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The bundled tiny model's tokenizer, loaded once, the way the stages load it. Tests only read it."""
    return load_tokenizer(str(TINY_MODEL))


# Scripts that need a package outside requirements.txt: where it is missing, their tests skip, naming it (the
# fast tier runs with requirements.txt and pytest alone).
OPTIONAL_PACKAGES = {"research/trl_sft.py": "trl"}


def missing_package(script: str) -> str | None:
    """The optional package that `script` (a path from the root) needs and this Python lacks, or None."""
    package = OPTIONAL_PACKAGES.get(script)
    return package if package and importlib.util.find_spec(package) is None else None


def refused(main, argv: list, capsys) -> tuple[str, str]:
    """Run a main(argv) as the command line does (run_main); assert exit 2 and one `error:` line on stderr,
    no traceback. Returns that line and what the command printed on stdout."""
    capsys.readouterr()
    code = run_main(main, [*map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0], out


@lru_cache(maxsize=1)
def eval_stage():
    """04_eval_kernels.py, loaded once for the test files that run programs through it (run_program)."""
    return load_script("04_eval_kernels.py")


def plain_backend() -> str:
    """The backend a plain stage-04 run picks on this machine (--backend auto): gpu, or emulated."""
    return resolve_backend("auto", gpu_name())


@pytest.fixture
def run_program(tmp_path):
    """Build and run programs in the sandbox the way stage 04's main() does, on the backend a plain run
    picks here: gen.py once per task, then per program its own folder, nvcc and (emulated backend) the
    g++ build for the emulator, then execute(). run_program(source, task, timeout, timed) returns
    execute()'s (outcome, log, timing); run_program.gen_dir(task) is the folder of a task's data."""
    ev, backend, work = eval_stage(), plain_backend(), tmp_path / "work"
    work.mkdir(mode=0o711)
    runner = ev.Runner(True, backend)
    emulator = ev.prepare_emulator(work, checks=False) if backend == "emulated" else None
    # the GPU's own architecture, as stage 04's probe builds for it (harness/gpu_probe.py)
    arch = gencode_flags(compute_capability()) if backend == "gpu" else NVCC_DEFAULT_ARCH

    def gen_dir(task: dict) -> Path:
        folder = work / task["id"]
        if not folder.exists():
            folder.mkdir(mode=0o711)
            failed = ev.prepare_task_data(task, folder / "gen", 120, runner)
            assert failed is None, failed
        return folder / "gen"

    # 60 s: far beyond what any program of the tests takes, even on a loaded machine; the tests of
    # timeouts pass their own
    def run(source: str, task: dict, timeout: float = 60.0, timed: bool = False):
        data = gen_dir(task)
        workdir = Path(tempfile.mkdtemp(dir=data.parent))
        os.chmod(workdir, 0o711)
        outcome, exe, log = ev.build(source, workdir / "build", arch, 120, emulator, runner)
        assert outcome is None, log
        assert (exe.name == "prog_emu") == (backend == "emulated")
        return ev.execute(task, exe, data, workdir, timeout, runner, timed=timed)

    run.gen_dir = gen_dir
    return run


# ---------------------------------------------------------------------------------------
# A small pipeline of real artifacts, for the tests of bad input and of runs that meet in one --out
# ---------------------------------------------------------------------------------------


def eval_args(w: dict, *source) -> list:
    """Stage 04 on the world's two tasks at level 1, emulated, without the task check, its replies from
    `source` (--solutions, or the model with generation flags)."""
    tasks = ["--tasks", w["tasks"], "--split", "all", "--levels", "1"]
    return [*tasks, *source, "--backend", "emulate", "--no-task-check", "--out", w["new"]]


# A valid call of each stage on the world's files (a test appends what it spoils: argparse keeps the last).
# 04-gen: stage 04 with the model answering instead of --solutions.
ARGS = {
    "01": lambda w: ["--data", w["data"], "--max-length", "256", "--device", "cpu", "--out", w["new"]],
    "02": lambda w: [
        "--data",
        w["data"],
        "--profile",
        w["profile"],
        "--permutations",
        "5",
        "--html-samples",
        "1",
        "--out",
        w["new"],
    ],
    "03": lambda w: [
        "--data",
        w["data"],
        "--objective",
        "sft",
        "--max-length",
        "256",
        "--max-steps",
        "1",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "4",
        "--device",
        "cpu",
        "--out",
        w["new"],
    ],
    "04": lambda w: eval_args(w, "--solutions", w["sols"]),
    "04-gen": lambda w: eval_args(w, "--max-new-tokens", "8"),
}
# The script of each stage, and where its real artifact lies in the world.
SCRIPTS = {
    "01": "01_profile.py",
    "02": "02_label_regions.py",
    "03": "03_train_cuset.py",
    "04": "04_eval_kernels.py",
}
MADE = {"01": "profile", "02": "regions", "03": "ckpt", "04": "run"}


def make_artifacts(
    w: dict, stages: list[str], extra: list | tuple = (), stage_extra: dict | None = None
) -> None:
    """Each stage's valid call (ARGS) on the world `w`, into w[MADE[stage]], in the order given (stage 02
    reads the profile, 03 the regions); `extra` is appended to every call, stage_extra[stage] to that
    stage's (argparse keeps the last of a flag)."""
    for stage in stages:
        argv = [*ARGS[stage](w | {"new": w[MADE[stage]]}), *extra, *(stage_extra or {}).get(stage, [])]
        assert load_script(SCRIPTS[stage]).main([*map(str, argv)]) == 0


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A folder with the user's files and one real artifact of each stage, made here once per module with
    the bundled tiny model: 8 samples of the kernel SFT data, 2 eval tasks answered by --solutions."""
    import json

    from cuset_common.paths import SFT_KERNEL_FILE, TASKS_FILE
    from cuset_common.tasks import load_tasks

    root = tmp_path_factory.mktemp("world")
    w = {
        "root": root,
        "new": root / "new",
        "data": root / "d8.jsonl",
        "tasks": root / "tasks.jsonl",
        "sols": root / "sols.jsonl",
        "mine": root / "mine",
        "afile": root / "notes.txt",
        **{MADE[stage]: root / MADE[stage] for stage in MADE},
    }
    w["data"].write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:8]))
    tasks = [t for t in load_tasks(TASKS_FILE) if t["split"] == "eval"][:2]
    w["tasks"].write_text("".join(json.dumps(t) + "\n" for t in tasks))
    answers = [{"task_id": t["id"], "level": 1, "sample": 0, "completion": "no code"} for t in tasks]
    w["sols"].write_text("".join(json.dumps(a) + "\n" for a in answers))
    make_artifacts(w, list(MADE))
    w["mine"].mkdir()
    shutil.copy(w["data"], w["mine"] / "precious.jsonl")
    shutil.copy(w["tasks"], w["mine"] / "tasks.jsonl")
    w["afile"].write_text("the user's notes\n")
    return w


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under root (hidden ones too), and every folder, by relative path."""
    from cuset_common.files import sha256_file

    return {
        str(p.relative_to(root)): sha256_file(p) if p.is_file() else "dir" for p in sorted(root.rglob("*"))
    }
