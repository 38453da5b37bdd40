"""The bundled task suite and SFT data: schema, splits, reproducibility,
gen.py/compare.py behaviour, and every reference program and harness passing its own check:
everywhere, each compiled by nvcc, and run under CPU emulation through stage 04 (every standalone
program, the eval split's harnesses); on the GPU where one is present, every one of both run."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

from cuset_common.files import read_jsonl
from cuset_common.paths import (
    EVAL_SFT_FILE,
    EVAL_SFT_KERNEL_FILE,
    LEVELS,
    NVCC_DEFAULT_ARCH,
    NVCC_FLAGS,
    NVCC_NATIVE_ARCH,
    ROOT,
    SFT_FILE,
    SFT_KERNEL_FILE,
    TASKS_FILE,
)
from cuset_common.tasks import build_prompt, fence, load_tasks
from harness.timing import TIMING_ARGUMENT, read_timing

DTYPES = {"float32", "float64", "int32", "uint32", "int64", "uint8"}
SPLITS = {"train", "eval", "pretrain"}
JOBS = os.cpu_count() or 2


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    return load_tasks(TASKS_FILE)


def shape_of(buf: dict) -> tuple[int, ...]:
    shape = ast.literal_eval(buf["shape"])
    assert isinstance(shape, tuple) and shape and all(isinstance(d, int) and d > 0 for d in shape), buf
    return shape


def count_of(buf: dict) -> int:
    return int(np.prod(shape_of(buf)))


# ---------------------------------------------------------------------------------------
# Schema and splits
# ---------------------------------------------------------------------------------------


def test_every_task_matches_the_schema(tasks):
    for t in tasks:
        where = f"task {t['id']}"
        for key in (
            "id",
            "task_name",
            "task_description",
            "bench.cu",
            "gen.py",
            "compare.py",
            "level1_prompt",
            "level2_prompt",
            "level3_prompt",
            "split",
            "category",
            "op",
        ):
            assert isinstance(t[key], str) and t[key].strip(), f"{where}: {key} empty or not a string"
        assert t["split"] in SPLITS, where
        for buf in t["inputs"] + t["outputs"]:
            assert set(buf) == {"name", "dtype", "shape"}, where
            assert buf["dtype"] in DTYPES, where
            shape_of(buf)
            assert f'"data/{buf["name"]}.bin"' in t["bench.cu"], (
                f"{where}: bench.cu never touches {buf['name']}"
            )
        assert t["outputs"], where
        km = t["kernel_mode"]
        assert km["harness.cu"].count(km["marker"]) == 1, f"{where}: marker must appear once"
        assert km["signatures"] and km["launch"].strip(), where
        flat_kernels = " ".join(km["reference_kernels"].split())  # a signature may wrap over lines
        for sig in km["signatures"]:
            assert sig.startswith("__global__ void "), f"{where}: {sig}"
            assert " ".join(sig.split()) in flat_kernels, (
                f"{where}: signature not in reference kernels: {sig}"
            )


def test_ids_are_unique(tasks):
    dup = [i for i, c in Counter(t["id"] for t in tasks).items() if c > 1]
    assert not dup


def test_suite_size_and_splits(tasks):
    by_split = Counter(t["split"] for t in tasks)
    categories = {t["category"] for t in tasks}
    assert len(tasks) >= 120, len(tasks)
    assert len(categories) >= 10, categories
    assert by_split["train"] >= 80 and by_split["eval"] >= 30 and by_split["pretrain"] >= 1, by_split
    # Eval measures generalisation within a category, so each eval category is trained on.
    train_categories = {t["category"] for t in tasks if t["split"] == "train"}
    assert {t["category"] for t in tasks if t["split"] == "eval"} <= train_categories


def test_splits_are_disjoint_by_operation(tasks):
    ops = {s: {t["op"] for t in tasks if t["split"] == s} for s in SPLITS}
    assert not ops["train"] & ops["eval"]
    assert not ops["train"] & ops["pretrain"]
    assert not ops["eval"] & ops["pretrain"]
    # Held-out means held-out: no eval task shares a task name with a train task either.
    names = {s: {t["task_name"] for t in tasks if t["split"] == s} for s in SPLITS}
    assert not names["train"] & names["eval"]


@pytest.mark.parametrize("script", ["build_tasks.py", "build_sft.py"])
def test_builders_reproduce_committed_files_byte_for_byte(script):
    r = subprocess.run(
        [sys.executable, str(ROOT / "data" / script), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------
# SFT data
# ---------------------------------------------------------------------------------------


def test_sft_data_is_built_from_train_tasks_with_the_shared_prompt_builder(tasks):
    by_id = {t["id"]: t for t in tasks}
    records = [r for _, r in read_jsonl(SFT_FILE)]
    train_ids = {t["id"] for t in tasks if t["split"] == "train"}
    assert {(r["task_id"], r["level"]) for r in records} == {(i, lv) for i in train_ids for lv in LEVELS}
    for r in records:
        task = by_id[r["task_id"]]
        system, user, assistant = r["messages"]
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
        assert user["content"] == build_prompt(task, r["level"], "standalone")
        assert assistant["content"] == fence(task["bench.cu"])


def test_kernel_mode_sft_variant_covers_every_level(tasks):
    by_id = {t["id"]: t for t in tasks}
    # The renamed copies of train tasks (variant_of) are checked in tests/test_sft_variants.py.
    records = [r for _, r in read_jsonl(SFT_KERNEL_FILE) if "variant_of" not in r]
    assert {r["level"] for r in records} == set(LEVELS)
    assert {r["task_id"] for r in records} == {t["id"] for t in tasks if t["split"] == "train"}
    for r in records:
        task = by_id[r["task_id"]]
        assert r["messages"][1]["content"] == build_prompt(task, r["level"], "kernel")
        assert r["messages"][2]["content"] == fence(task["kernel_mode"]["reference_kernels"])
        assert "int main" not in r["messages"][2]["content"]


@pytest.mark.parametrize("path,mode", [(EVAL_SFT_FILE, "standalone"), (EVAL_SFT_KERNEL_FILE, "kernel")])
def test_held_out_sft_data_holds_eval_split_tasks_only(tasks, path, mode):
    """eval.jsonl / eval_kernel.jsonl: the train files' records, built the same way, from the eval split only
    (every eval task, held-out ops that no train record names), without renamed copies."""
    by_id = {t["id"]: t for t in tasks}
    records = [r for _, r in read_jsonl(path)]
    eval_ids = {t["id"] for t in tasks if t["split"] == "eval"}
    assert {r["task_id"] for r in records} == eval_ids and all(
        by_id[r["task_id"]]["split"] == "eval" for r in records
    )
    want = {(i, lv) for i in eval_ids for lv in LEVELS} if mode == "standalone" else None
    assert want is None or {(r["task_id"], r["level"]) for r in records} == want
    assert {r["level"] for r in records} == set(LEVELS) and len({r["id"] for r in records}) == len(records)
    train_ops = {t["op"] for t in tasks if t["split"] == "train"}
    for r in records:
        task = by_id[r["task_id"]]
        assert "variant_of" not in r and r["mode"] == mode and task["op"] not in train_ops
        code = task["bench.cu"] if mode == "standalone" else task["kernel_mode"]["reference_kernels"]
        assert r["messages"][1]["content"] == build_prompt(task, r["level"], mode)
        assert r["messages"][2]["content"] == fence(code)


# ---------------------------------------------------------------------------------------
# nvcc
# ---------------------------------------------------------------------------------------


def kernel_mode_source(task: dict, kernels: str) -> str:
    km = task["kernel_mode"]
    return km["harness.cu"].replace(km["marker"], kernels)


def nvcc(source: str, workdir: Path, arch: list[str]) -> tuple[Path, subprocess.CompletedProcess]:
    workdir.mkdir(parents=True, exist_ok=True)
    src, exe = workdir / "prog.cu", workdir / "prog"
    src.write_text(source)
    r = subprocess.run(
        ["nvcc", *NVCC_FLAGS, *arch, str(src), "-o", str(exe)], capture_output=True, text=True, timeout=600
    )
    return exe, r


def test_nvcc_is_available():
    assert shutil.which("nvcc"), "nvcc (CUDA toolkit) must be on PATH for the compile tests"


def reference_rows_under_emulation(out: Path, mode: str, split: str) -> list[dict]:
    """Stage 04 on the references of `split` in `mode`: its nvcc flags, CPU emulator, gen.py, compare.py."""
    ev = load_script("04_eval_kernels.py")
    assert (
        ev.main(
            [
                "--reference",
                "--split",
                split,
                "--levels",
                "1",
                "--mode",
                mode,
                "--backend",
                "emulate",
                "--jobs",
                str(JOBS),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def failed_rows(rows: list[dict]) -> list[str]:
    """The rows whose reference did not pass, on the task's own input set or on a fresh one (stage 04 drops
    a fresh set on which the reference fails, and judges the task on fewer: no bundled task may need it)."""
    return [
        f"{r['task_id']}: {r['outcome']} {r.get('input_sets_dropped', '')}\n{r['log'][-1500:]}"
        for r in rows
        if r["outcome"] != "pass"
        or r.get("input_sets_dropped")
        or [s["outcome"] for s in r["input_sets"]] != ["pass", "pass"]
    ]


def test_every_standalone_reference_compiles_and_passes_under_emulation(tasks, tmp_path):
    """The strongest check the data gets without a GPU: stage 04 compiles every reference with nvcc
    (its flags), rebuilds it for the CPU emulator, runs it on gen.py's inputs and on a fresh input set
    (gen.py under a seed of the run) and asks compare.py."""
    rows = reference_rows_under_emulation(tmp_path / "ev", "standalone", "all")
    failures = failed_rows(rows)
    print(f"standalone: {len(rows) - len(failures)}/{len(rows)} reference programs pass under emulation")
    assert len(rows) == len(tasks)
    assert not failures, f"{len(failures)} of {len(rows)} fail:\n" + "\n".join(failures[:5])


def test_every_kernel_mode_reference_compiles_and_the_eval_split_passes_under_emulation(tasks, tmp_path):
    """Kernel mode: every harness with its reference kernels inserted compiles with stage 04's nvcc
    command (what is specific to each task there: the namespaced reference copy beside the candidate,
    the timing code), and stage 04 runs the eval split's (the split kernel mode is scored on; every
    category) under emulation. Running the other splits there too would repeat the standalone test:
    under emulation a harness runs the host code of its bench.cu, rendered by the same helpers in
    data/taskgen/core.py, and stage 04 does not time it. On a GPU every split runs (below)."""
    rows = reference_rows_under_emulation(tmp_path / "ev", "kernel", "eval")
    failures = failed_rows(rows)
    assert sorted(r["task_id"] for r in rows) == sorted(t["id"] for t in tasks if t["split"] == "eval")

    def compiles(task: dict) -> str | None:
        d = tmp_path / "nvcc" / task["id"]
        _, r = nvcc(kernel_mode_source(task, task["kernel_mode"]["reference_kernels"]), d, NVCC_DEFAULT_ARCH)
        shutil.rmtree(d, ignore_errors=True)
        return f"{task['id']}: compile_error\n{r.stderr[-1500:]}" if r.returncode else None

    with ThreadPoolExecutor(JOBS) as pool:
        failures += [f for f in pool.map(compiles, [t for t in tasks if t["split"] != "eval"]) if f]
    print(
        f"kernel: {len(tasks) - len(failures)}/{len(tasks)} harnesses pass (nvcc for all, emulation for the "
        f"{len(rows)} of the eval split)"
    )
    assert not failures, f"{len(failures)} of {len(tasks)} fail:\n" + "\n".join(failures[:5])


# ---------------------------------------------------------------------------------------
# gen.py and compare.py
# ---------------------------------------------------------------------------------------


def run_script(code: str, cwd: Path, name: str) -> subprocess.CompletedProcess:
    path = cwd / name
    path.write_text(code)
    return subprocess.run([sys.executable, name], cwd=cwd, capture_output=True, text=True, timeout=300)


def compare(task: dict, cwd: Path) -> str:
    r = run_script(task["compare.py"], cwd, "compare.py")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def perturb(ref: np.ndarray) -> np.ndarray:
    out = ref.copy()
    i = out.size // 3
    out.flat[i] = out.flat[i] + (1 if out.dtype.kind in "iu" else 1.0 + 10.0 * abs(float(out.flat[i])))
    return out


def check_gen_and_compare(task: dict, workdir: Path) -> list[str]:
    workdir.mkdir(parents=True)
    problems = []
    r = run_script(task["gen.py"], workdir, "gen.py")
    if r.returncode:
        return [f"gen.py failed: {r.stderr[-800:]}"]
    data = workdir / "data"
    for buf, suffix in [(b, "") for b in task["inputs"]] + [(b, "_ref") for b in task["outputs"]]:
        path = data / f"{buf['name']}{suffix}.bin"
        want = count_of(buf) * np.dtype(buf["dtype"]).itemsize
        if not path.exists() or path.stat().st_size != want:
            problems.append(f"{path.name}: expected {want} bytes")
    if problems:
        return problems
    first = task["outputs"][0]
    out_path = data / f"{first['name']}.bin"
    # The other outputs right, so that only the first decides. That compare.py says T to the reference
    # outputs themselves is stage 04's self-check of every task (test_every_standalone_reference_...).
    for buf in task["outputs"]:
        shutil.copy(data / f"{buf['name']}_ref.bin", data / f"{buf['name']}.bin")
    ref = np.fromfile(data / f"{first['name']}_ref.bin", dtype=first["dtype"])
    for label, bad in [("zeros", np.zeros_like(ref)), ("perturbed", perturb(ref))]:
        bad.tofile(out_path)
        if (got := compare(task, workdir)) != "F":
            problems.append(f"{label} output judged {got!r}")
    out_path.unlink()
    if (got := compare(task, workdir)) != "F":
        problems.append(f"missing output judged {got!r}")
    return problems


def test_gen_writes_declared_files_and_compare_judges_correctly(tasks, tmp_path):
    def check(task):
        problems = check_gen_and_compare(task, tmp_path / task["id"])
        shutil.rmtree(tmp_path / task["id"], ignore_errors=True)  # 1M-element files add up
        return f"{task['id']}: " + "; ".join(problems) if problems else None

    with ThreadPoolExecutor(JOBS) as pool:
        failures = [f for f in pool.map(check, tasks) if f]
    assert not failures, "\n".join(failures[:10])


def test_gen_is_deterministic(tasks, tmp_path):
    task = tasks[0]
    digests = []
    for run in ("a", "b"):
        d = tmp_path / run
        d.mkdir()
        assert run_script(task["gen.py"], d, "gen.py").returncode == 0
        digests.append({p.name: p.read_bytes() for p in sorted((d / "data").iterdir())})
    assert digests[0] == digests[1]


# ---------------------------------------------------------------------------------------
# GPU: every reference program really passes its own check.
# ---------------------------------------------------------------------------------------


def run_reference_on_gpu(task: dict, exe: Path, workdir: Path) -> tuple[str, str]:
    """gen.py in one folder; the binary in a separate folder holding only the inputs; compare."""
    gen_dir, run_dir = workdir / "gen", workdir / "run"
    gen_dir.mkdir(parents=True)
    (run_dir / "data").mkdir(parents=True)
    r = run_script(task["gen.py"], gen_dir, "gen.py")
    assert r.returncode == 0, r.stderr
    for buf in task["inputs"]:
        shutil.copy(gen_dir / "data" / f"{buf['name']}.bin", run_dir / "data")
    # stdin carries the timing nonce that kernel-mode harnesses print back (stage 04 does the same)
    r = subprocess.run(
        [str(exe)], cwd=run_dir, input="test-nonce\n", capture_output=True, text=True, timeout=120
    )
    if r.returncode:
        return "runtime_error", r.stderr[-800:]
    for buf in task["outputs"]:
        src = run_dir / "data" / f"{buf['name']}.bin"
        if src.exists():
            shutil.copy(src, gen_dir / "data")
    verdict = run_script(task["compare.py"], gen_dir, "compare.py")
    return verdict.stdout.strip(), verdict.stderr[-800:] + r.stdout[-400:]


def time_reference_on_gpu(exe: Path, run_dir: Path) -> dict:
    """The timing run stage 04 makes of a kernel-mode program that passed (TIMING_ARGUMENT), read as stage
    04 reads it (harness/timing.py: read_timing)."""
    r = subprocess.run(
        [str(exe), TIMING_ARGUMENT],
        cwd=run_dir,
        input="test-nonce\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    return read_timing(r.stdout, "test-nonce") if r.returncode == 0 else {"timing_void": r.stderr[-800:]}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["standalone", "kernel"])
def test_every_reference_passes_on_gpu(tasks, tmp_path, mode):
    def check(task):
        d = tmp_path / task["id"]
        source = (
            task["bench.cu"]
            if mode == "standalone"
            else kernel_mode_source(task, task["kernel_mode"]["reference_kernels"])
        )
        exe, r = nvcc(source, d / "build", NVCC_NATIVE_ARCH)
        if r.returncode:
            return f"{task['id']}: compile error {r.stderr[-800:]}"
        verdict, log = run_reference_on_gpu(task, exe, d)
        if mode == "kernel" and verdict == "T":
            timing = time_reference_on_gpu(exe, d / "run")
            if "timing_void" in timing:
                return f"{task['id']}: {timing['timing_void']}"
        shutil.rmtree(d, ignore_errors=True)
        return None if verdict == "T" else f"{task['id']}: {verdict} {log}"

    with ThreadPoolExecutor(JOBS) as pool:
        failures = [f for f in pool.map(check, tasks) if f]
    print(f"{mode}: {len(tasks) - len(failures)}/{len(tasks)} reference programs pass on the GPU")
    assert not failures, f"{len(failures)} of {len(tasks)} fail:\n" + "\n".join(failures[:10])
