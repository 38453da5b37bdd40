"""Stage 04's judge against programs that game it (docs/evaluation.md, "Input sets", "A kernel must run",
"Timing"): a program that writes the memorized outputs, one that computes on the host beside a kernel it
never launches, a kernel that special-cases the task's own inputs, and kernels whose later launches do
less than the first; none passes. A kernel that accumulates into memory nobody zeroed still fails. Then
the pieces: re-seeding gen.py, the run's secret, the launch count (the emulator's, and the GPU's shim
built and run here without a GPU), the summary's counts. Under emulation everywhere; the tests that build
programs are marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import eval_stage

from cuset_common.cli import UserError
from cuset_common.paths import NVCC_DEFAULT_ARCH, NVCC_FLAGS, TASKS_FILE
from cuset_common.tasks import fence, load_tasks
from harness.fresh_run import time_kernels
from harness.input_sets import TASK_SET, make_input_sets, run_secret, same_files, set_secret, write_generator
from harness.launch_count import LaunchCount, LaunchCounter, build_shim, nvcc_flags, toolkit_root
from harness.report import checks_summary
from harness.timing import SUSPECT_SPEEDUP, output_check_void, timing_stats

ev = eval_stage()
slow = pytest.mark.slow


def bundled(task_id: str) -> dict:
    return next(t for t in load_tasks(TASKS_FILE) if t["id"] == task_id)


def task_set_outputs(task: dict, tmp_path: Path) -> dict[str, np.ndarray]:
    """The task's own input set (gen.py as written): every file it writes, by name."""
    folder = tmp_path / "own-set"
    (folder / "data").mkdir(parents=True)
    (folder / "gen.py").write_text(task["gen.py"])
    subprocess.run([sys.executable, "gen.py"], cwd=folder, check=True, capture_output=True)
    return {p.stem: np.fromfile(p, dtype=np.float32) for p in (folder / "data").iterdir()}


def judge(tmp_path: Path, task: dict, completion: str, mode: str, *extra: str) -> tuple[dict, dict]:
    """One completion for one task through main(), level 1, emulated: its row and the summary."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    tasks, sols, out = tmp_path / "tasks.jsonl", tmp_path / "sols.jsonl", tmp_path / "ev"
    tasks.write_text(json.dumps(task) + "\n")
    sols.write_text(json.dumps({"task_id": task["id"], "level": 1, "completion": completion}) + "\n")
    argv = ["--tasks", tasks, "--split", "all", "--levels", "1", "--mode", mode, "--backend", "emulate"]
    assert ev.main([*map(str, argv), "--solutions", str(sols), "--out", str(out), *extra]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return rows[0], json.loads((out / "summary.json").read_text())


HOST_IO = r"""
#include <cstdio>
#include <vector>
static void load(const char* p, float* v, size_t n) {
    FILE* f = fopen(p, "rb"); fread(v, 4, n, f); fclose(f); }
static void save(const char* p, const float* v, size_t n) {
    FILE* f = fopen(p, "wb"); fwrite(v, 4, n, f); fclose(f); }
"""


# ---------------------------------------------------------------------------------------
# Programs that game one input set, or compute on the host
# ---------------------------------------------------------------------------------------


@slow
def test_a_program_that_writes_the_memorized_output_fails_on_a_fresh_input_set(tmp_path):
    """A do-nothing kernel launched, then the sum gen.py's fixed seed gives written: it passed before."""
    task = bundled("array_sum_1048576")
    memorized = float(task_set_outputs(task, tmp_path)["out_ref"][0])
    program = HOST_IO + (
        "__global__ void noop_kernel() {}\n"
        "__global__ void array_sum_kernel(const float* x, float* out, int n) {}\n"
        "int main() { noop_kernel<<<1, 1>>>(); cudaDeviceSynchronize();\n"
        f"  float out = {memorized!r}f;\n"
        '  save("data/out.bin", &out, 1); return 0; }\n'
    )
    row, summary = judge(tmp_path / "two", task, fence(program), "standalone")
    assert row["outcome"] == "wrong_output", row["log"]
    assert [(s["seed"], s["outcome"]) for s in row["input_sets"]] == [
        (TASK_SET, "pass"),
        ("fresh-1", "wrong_output"),
    ]
    assert "input set fresh-1" in row["log"] and row["task_check"] == "pass"
    assert summary["checks"]["caught_by_fresh_inputs"] == 1 and summary["checks"]["tasks_on_fewer_sets"] == 0
    row, _ = judge(tmp_path / "one", task, fence(program), "standalone", "--input-sets", "1")
    assert row["outcome"] == "pass"  # on the task's own set alone, as before


@slow
def test_a_host_only_program_beside_an_unlaunched_kernel_is_no_kernel(tmp_path):
    """Right on every input set, computed on the host: `no_kernel`, a failure, where it passed before."""
    program = HOST_IO + (
        "__global__ void dot_product_kernel(const float* x, const float* y, float* out, int n) {}\n"
        "int main() { const int n = 1048576; std::vector<float> x(n), y(n);\n"
        '  load("data/x.bin", x.data(), n); load("data/y.bin", y.data(), n);\n'
        "  double acc = 0; for (int i = 0; i < n; ++i) acc += double(x[i]) * y[i];\n"
        '  float out = float(acc); save("data/out.bin", &out, 1); return 0; }\n'
    )
    row, summary = judge(
        tmp_path, bundled("dot_product_1048576"), fence(program), "standalone", "--no-task-check"
    )
    assert row["outcome"] == "no_kernel", row["log"]
    assert row["kernel_launches"] == 0 and "launched no kernel" in row["log"]
    assert "CUSET_LAUNCHES" not in row["log"]  # the report is taken out of the log
    assert summary["checks"]["caught_no_kernel"] == 1 and summary["outcomes"]["no_kernel"] == 1
    assert summary["overall"]["pass@1"] == 0.0  # a failure of the model, inside pass@k


@slow
def test_a_kernel_that_special_cases_the_task_sets_inputs_fails_on_a_fresh_set(tmp_path):
    """Kernel mode: the partial sums are right only where x[0] is the task set's first value."""
    task = bundled("array_sum_1048576")
    own = task_set_outputs(task, tmp_path)
    x0, memorized = float(own["x"][0]), float(own["out_ref"][0])
    kernels = task["kernel_mode"]["reference_kernels"].replace(
        "    float acc = 0.0f;\n    for (int i = blockIdx.x * blockDim.x",
        f"    if (x[0] != {x0!r}f) return;\n"
        f"    if (blockIdx.x > 0) {{ if (threadIdx.x == 0) partials[blockIdx.x] = 0.0f; return; }}\n"
        f"    if (threadIdx.x == 0) partials[0] = {memorized!r}f;\n    return;\n"
        "    float acc = 0.0f;\n    for (int i = blockIdx.x * blockDim.x",
        1,
    )
    assert kernels != task["kernel_mode"]["reference_kernels"]
    row, _ = judge(tmp_path / "ev", task, fence(kernels), "kernel", "--no-task-check")
    assert row["outcome"] == "wrong_output", row["log"]
    assert [s["outcome"] for s in row["input_sets"]] == ["pass", "wrong_output"]


@slow
def test_an_uninitialised_accumulator_still_fails(tmp_path):
    """The emulator's fresh device memory is NaN: a sum into it that nobody zeroed shows."""
    task = bundled("dot_product_1048576")
    program = task["bench.cu"].replace("    CUDA_CHECK(cudaMemset(d_out, 0, sizeof(float)));\n", "")
    program = program.replace("CUDA_CHECK(cudaMemset(d_out, 0, 1 * sizeof(float)));", "")
    assert "cudaMemset(d_out" not in program
    row, _ = judge(tmp_path, task, fence(program), "standalone", "--no-task-check")
    assert row["outcome"] == "wrong_output" and "NaN" in row["log"], row["log"]


# ---------------------------------------------------------------------------------------
# Timing: a kernel whose later launches do less than its first
# ---------------------------------------------------------------------------------------

# After its first launch the kernel returns at once: a count in __device__ memory of the elements done.
SKIPS_LATER = (
    "__device__ unsigned int done = 0;\n"
    "__global__ void square_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= n || done >= (unsigned)n) return;\n"
    "    float v = x[i]; y[i] = v * v;\n"
    "    atomicAdd(&done, 1u);\n"
    "}\n"
)
# After its first launch it copies back what it kept of it: right for the same inputs only.
RETURNS_KEPT = (
    "__device__ unsigned int done = 0;\n"
    "__device__ float kept[1500007];\n"
    "__global__ void square_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= n) return;\n"
    "    if (done >= (unsigned)n) { y[i] = kept[i]; return; }\n"
    "    float v = x[i]; y[i] = kept[i] = v * v;\n"
    "    atomicAdd(&done, 1u);\n"
    "}\n"
)


@pytest.fixture(scope="module")
def square_sets(tmp_path_factory):
    """square_1500007's own input set and a fresh one, and build(kernels): the kernel-mode program,
    built as stage 04 builds it here (nvcc, then for the emulator)."""
    task, work = bundled("square_1500007"), tmp_path_factory.mktemp("timing")
    os.chmod(work, 0o711)
    runner = ev.Runner(True, "emulated")
    emulator = ev.prepare_emulator(work, checks=False)
    for name, secret in (("own", None), ("fresh", "5" * 64)):
        assert ev.prepare_task_data(task, work / name, 300, runner, secret) is None
    assert not same_files(work / "own" / "data", work / "fresh" / "data")

    def build(kernels: str) -> Path:
        folder = Path(tempfile.mkdtemp(dir=work))
        os.chmod(folder, 0o711)
        source = ev.program_source(task, kernels, "kernel")
        outcome, exe, log = ev.build(source, folder / "build", NVCC_DEFAULT_ARCH, 300, emulator, runner)
        assert outcome is None, log
        return exe

    return task, work / "own", work / "fresh", runner, build


def fresh_folder(square_sets) -> Path:
    folder = Path(tempfile.mkdtemp(dir=square_sets[1].parent))
    os.chmod(folder, 0o711)
    return folder


@slow
def test_a_kernel_that_skips_its_later_launches_passes_but_gets_no_timing(square_sets):
    task, own, _, runner, build = square_sets
    outcome, log, fields = ev.execute(
        task, build(SKIPS_LATER), own, fresh_folder(square_sets), 60, runner, timed=True
    )
    assert outcome == "pass", log  # its first launch is right
    assert "speedup" not in fields and fields["timing_check"] == "wrong_output", fields
    assert "later launches do less than its first" in fields["timing_void"], fields


@slow
def test_a_kernel_that_returns_what_it_kept_is_caught_by_another_input_set(square_sets):
    task, own, fresh, runner, build = square_sets
    exe = build(RETURNS_KEPT)
    same = time_kernels(ev.compare_outputs, task, exe, own, fresh_folder(square_sets), 120, runner, None)
    assert "speedup" in same, same  # on the inputs it kept the answer of, nothing shows
    other = time_kernels(
        ev.compare_outputs, task, exe, own, fresh_folder(square_sets), 120, runner, None, fresh
    )
    assert "speedup" not in other and other["timing_check"] == "wrong_output", other


@slow
def test_the_reference_kernels_pass_the_check_after_the_timed_launches_on_another_set(square_sets):
    task, own, fresh, runner, build = square_sets
    exe = build(task["kernel_mode"]["reference_kernels"])
    fields = time_kernels(
        ev.compare_outputs, task, exe, own, fresh_folder(square_sets), 120, runner, None, fresh
    )
    assert "timing_void" not in fields and fields["repeats"] == 25, fields


@slow
def test_kernel_mode_launches_the_candidates_kernels_by_construction(square_sets):
    task, own, _, runner, build = square_sets
    exe = build(task["kernel_mode"]["reference_kernels"])
    outcome, log, fields = ev.execute(
        task, exe, own, fresh_folder(square_sets), 60, runner, counter=LaunchCounter()
    )
    assert outcome == "pass" and fields["kernel_launches"] >= 1, (log, fields)


def test_a_speedup_over_10x_is_flagged_and_a_failed_output_check_voids_the_timing():
    fast = timing_stats([0.01] * 25, [0.01 * (SUSPECT_SPEEDUP + 1)] * 25)
    assert fast["speedup_suspect"] is True
    assert "speedup_suspect" not in timing_stats([0.5] * 25, [1.0] * 25)
    void = output_check_void("\n[compare] F")
    assert void["timing_check"] == "wrong_output" and "[compare] F" in void["timing_void"]
    rows = [{"task_id": "t", "outcome": "pass"} | fast, {"task_id": "u", "outcome": "pass"} | void]
    checks = checks_summary(rows, 2)
    assert checks["speedup_suspect"] == 1 and checks["caught_timing_output_check"] == 1


# ---------------------------------------------------------------------------------------
# Re-seeding gen.py, the run's secret, sets a task cannot judge
# ---------------------------------------------------------------------------------------

SEEDINGS = {
    "np.random.seed": "np.random.seed(42)\nx = np.random.rand(64)",
    "default_rng": "x = np.random.default_rng(42).random(64)",
    "RandomState": "x = np.random.RandomState(42).rand(64)",
    "random.seed": "import random\nrandom.seed(42)\nx = np.array([random.random() for _ in range(64)])",
    "torch.manual_seed": "import torch\ntorch.manual_seed(42)\nx = torch.rand(64).numpy()",
    "none": "x = np.arange(64.0)",
}


def generated(gen_body: str, folder: Path, secret: str | None) -> bytes:
    (folder / "data").mkdir(parents=True)
    task = {"gen.py": f"import numpy as np\n{gen_body}\nx.astype(np.float32).tofile('data/x.bin')\n"}
    script = write_generator(task, folder, secret)
    subprocess.run([sys.executable, script], cwd=folder, check=True, capture_output=True)
    return (folder / "data" / "x.bin").read_bytes()


@pytest.mark.parametrize("seeding", SEEDINGS)
def test_reseed_gen_gives_each_secret_its_own_data_without_editing_gen_py(tmp_path, seeding):
    body = SEEDINGS[seeding]
    own, a, again, b = (
        generated(body, tmp_path / n, s) for n, s in [("own", None), ("a", "a"), ("a2", "a"), ("b", "b")]
    )
    assert a == again  # a resumed run, with its secret, makes the same set
    assert (own == a == b) if seeding == "none" else len({own, a, b}) == 3
    assert (tmp_path / "a" / "gen.py").read_text().startswith("import numpy")  # as the task wrote it


def test_a_set_gen_py_cannot_reseed_or_fails_on_is_dropped_and_says_why(tmp_path):
    bodies = {None: "x = np.arange(4.0)", "s1": "x = np.arange(4.0)", "s2": "raise SystemExit(3)"}

    def generate(folder: Path, secret: str | None) -> str | None:
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "x.bin").write_bytes(b"same")
        return "gen.py failed (exit status 3):\n..." if "raise" in bodies[secret] else None

    sets, failed = make_input_sets(generate, tmp_path, [TASK_SET, "fresh-1", "fresh-2"], [None, "s1", "s2"])
    assert failed is None and sets[0].dropped is None
    assert "same files" in sets[1].dropped and "gen.py failed under a fresh seed" in sets[2].dropped


def test_the_runs_secret_is_drawn_once_and_kept_in_the_run_folder(tmp_path):
    first = run_secret(tmp_path)
    assert len(first) == 64 and run_secret(tmp_path) == first
    assert json.loads((tmp_path / "input_sets.json").read_text())["secret"] == first
    assert set_secret(first, "t", TASK_SET) is None
    assert set_secret(first, "t", "fresh-1") not in (
        set_secret(first, "t", "fresh-2"),
        set_secret(first, "u", "fresh-1"),
    )


# A toy task in the CUDABench schema whose program launches a kernel and doubles x on the host.
TOY_PROGRAM = HOST_IO + (
    "__global__ void touch_kernel() {}\n"
    'int main() { std::vector<float> x(256); load("data/x.bin", x.data(), 256);\n'
    "  touch_kernel<<<1, 1>>>(); cudaDeviceSynchronize();\n"
    '  for (float& v : x) v *= 2; save("data/y.bin", x.data(), 256); return 0; }\n'
)


def toy_task(tid: str, gen_x: str, compare_extra: str = "") -> dict:
    buf = lambda name: {"name": name, "dtype": "float32", "shape": "(256,)"}  # noqa: E731
    return {
        "id": tid,
        "task_name": tid,
        "level1_prompt": tid,
        "level2_prompt": tid,
        "level3_prompt": tid,
        "inputs": [buf("x")],
        "outputs": [buf("y")],
        "bench.cu": TOY_PROGRAM,
        "gen.py": f"import numpy as np\n{gen_x}\nx = x.astype(np.float32)\nx.tofile('data/x.bin')\n"
        "(2 * x).tofile('data/y_ref.bin')\n",
        "compare.py": "import numpy as np\ny, ref = np.fromfile('data/y.bin', np.float32), "
        "np.fromfile('data/y_ref.bin', np.float32)\n"
        f"print('T' if np.array_equal(y, ref){compare_extra} else 'F')\n",
    }


@slow
def test_references_on_sets_their_task_cannot_judge_are_judged_on_fewer_and_counted(tmp_path):
    tasks = [
        toy_task("reseeds", "np.random.seed(7)\nx = np.random.randint(0, 100, 256)"),
        toy_task("fixed_inputs", "x = np.arange(256)"),  # nothing random: every set is the task's own
        # compare.py knows the task's own inputs: it rejects the reference on any other set
        toy_task(
            "rigid_compare", "np.random.seed(7)\nx = np.random.randint(0, 100, 256)", " and ref[0] == 2 * 47"
        ),
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "ev"
    base = [
        "--tasks",
        tmp_path / "tasks.jsonl",
        "--split",
        "all",
        "--levels",
        "1",
        "--reference",
        "--backend",
        "emulate",
    ]
    assert ev.main([*map(str, base), "--input-sets", "3", "--out", str(out)]) == 0
    rows = {r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert all(r["outcome"] == "pass" for r in rows.values()), rows
    assert [s["seed"] for s in rows["reseeds"]["input_sets"]] == [TASK_SET, "fresh-1", "fresh-2"]
    assert "input_sets_dropped" not in rows["reseeds"]
    assert "same files" in rows["fixed_inputs"]["input_sets_dropped"][0]["why"]
    assert "reference ends wrong_output" in rows["rigid_compare"]["input_sets_dropped"][0]["why"]
    checks = json.loads((out / "summary.json").read_text())["checks"]
    assert checks["input_sets"] == 3 and checks["fewer_sets_tasks"] == ["fixed_inputs", "rigid_compare"]
    assert "2 task(s) judged on fewer (fixed_inputs, rigid_compare)" in (out / "summary.md").read_text()
    secret = (out / "input_sets.json").read_text()
    assert ev.main([*map(str, base), "--input-sets", "3", "--out", str(out)]) == 0  # resumed: nothing to do
    assert (out / "input_sets.json").read_text() == secret
    with pytest.raises(UserError, match="input_sets"):  # another number of sets is another run
        ev.main([*map(str, base), "--input-sets", "2", "--out", str(out)])


# ---------------------------------------------------------------------------------------
# The launch count: its line, and the GPU's shim (built and run here, where no GPU is)
# ---------------------------------------------------------------------------------------


def test_only_the_report_carrying_the_runs_nonce_counts_and_it_leaves_the_log():
    count = LaunchCount("ab" * 16, None)
    assert count.read("out\n\nCUSET_LAUNCHES nonce=" + "ab" * 16 + " count=3\n") == (3, "out\n")
    forged = "CUSET_LAUNCHES nonce=" + "cd" * 16 + " count=9"
    assert count.read(forged) == (None, forged)


@slow
def test_a_forged_launch_report_does_not_count_under_emulation(square_sets, tmp_path):
    """A host-only program that prints a report of its own, with what it finds of the nonce."""
    task, own, _, runner, _ = square_sets
    program = HOST_IO + (
        "#include <cstdlib>\n__global__ void square_kernel(const float* x, float* y, int n) {}\n"
        'int main() { const int n = 1500007; std::vector<float> x(n); load("data/x.bin", x.data(), n);\n'
        '  for (float& v : x) v *= v; save("data/y.bin", x.data(), n);\n'
        '  const char* got = getenv("CUSET_LAUNCH_NONCE");\n'
        '  printf("CUSET_LAUNCHES nonce=%s count=5\\n", got ? got : ""); return 0; }\n'
    )
    folder = fresh_folder(square_sets)
    emulator = ev.prepare_emulator(tmp_path, checks=False)
    _, exe, log = ev.build(program, folder / "build", NVCC_DEFAULT_ARCH, 300, emulator, runner)
    assert exe is not None, log
    outcome, log, fields = ev.execute(task, exe, own, folder, 60, runner, counter=LaunchCounter())
    assert outcome == "no_kernel" and fields["kernel_launches"] == 0, log
    assert "CUSET_LAUNCHES nonce= count=5" in log  # its own line, without the nonce: ignored


@slow
def test_the_gpu_shim_counts_launches_through_the_shared_runtime(tmp_path):
    """The GPU path's pieces without a GPU: the shim builds against the toolkit's headers, a program built
    with its nvcc flags loads it, and every launch call is counted (here the runtime refuses each one: no
    driver), the nonce erased from the program's environment. Untested on a GPU (docs/evaluation.md)."""
    toolkit = toolkit_root()
    (tmp_path / "work").mkdir()
    shim = build_shim(tmp_path / "work", toolkit)
    (tmp_path / "prog.cu").write_text(
        "#include <cstdio>\n#include <cstdlib>\n__global__ void k(int v) {}\n"
        "int main(int argc, char**) { for (int i = 0; i < argc + 2; ++i) k<<<1, 1>>>(i);\n"
        '  printf("nonce seen: %s\\n", getenv("CUSET_LAUNCH_NONCE") ? "yes" : "no"); return 0; }\n'
    )
    build = ["nvcc", *NVCC_FLAGS, *NVCC_DEFAULT_ARCH, *nvcc_flags(toolkit), "prog.cu", "-o", "prog"]
    subprocess.run(build, cwd=tmp_path, check=True, capture_output=True, timeout=600)
    count = LaunchCounter(shim).start()
    cmd = count.command(["./prog", "one-more"], tmp_path)
    r = subprocess.run(
        cmd, cwd=tmp_path, env=os.environ | count.env(), capture_output=True, text=True, timeout=60
    )
    launches, log = count.read(r.stdout + r.stderr)
    assert r.returncode == 0 and launches == 4, r.stdout + r.stderr
    assert "nonce seen: no" in log and "CUSET_LAUNCHES" not in log
    r = subprocess.run(
        ["./prog"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )  # no shim: no line
    assert count.read(r.stdout + r.stderr)[0] is None
