"""Stage 04 on real-CUDABench-shaped tasks: the task check on each way the real set names its
reference files, task-level errors, large and undeclared outputs, integer outputs, programs that
plant links, forged kernel timings, resume of the same run only, and bad input. The programs are
host-only C++ (run the same way on the GPU backend and under emulation), except the timing tests,
which use a real kernel-mode harness."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import eval_stage, refused

from cuset_common.files import sha256_file
from cuset_common.paths import ROOT, TASKS_FILE
from cuset_common.tasks import load_tasks

ev = eval_stage()
BIG = 520 << 20  # bytes: over the old fixed 512 MiB file-size limit
UNUSED_KERNEL = "__global__ void unused_kernel() {}\n"  # extraction wants CUDA; these programs are host-only
# save() launches a kernel that does nothing first: stage 04 judges a standalone program that launches none
# `no_kernel` (harness/launch_count.py), and these programs do their work on the host, on either backend.
FILE_IO = r"""
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <unistd.h>
__global__ void touch_kernel() {}
static void launch_a_kernel() { touch_kernel<<<1, 1>>>(); cudaDeviceSynchronize(); }
template <typename T> static void load(const char* p, T* v, size_t n) {
    FILE* f = fopen(p, "rb"); if (!f || fread(v, sizeof(T), n, f) != n) exit(1); fclose(f); }
template <typename T> static void save(const char* p, const T* v, size_t n) {
    launch_a_kernel();
    FILE* f = fopen(p, "wb"); if (!f || fwrite(v, sizeof(T), n, f) != n) exit(1); fclose(f); }
"""


def task(tid: str, gen: str, compare: str, inputs=(), outputs=(), reference: str = "") -> dict:
    """A task in the CUDABench schema (the fields stage 04 reads; prompts are never shown here), with
    `reference` (a main() body, see program()) as its own reference program."""
    buf = lambda name, dtype, shape: {"name": name, "dtype": dtype, "shape": shape}  # noqa: E731
    return {
        "id": tid,
        "task_name": tid,
        "task_description": tid,
        "level1_prompt": tid,
        "level2_prompt": tid,
        "level3_prompt": tid,
        "bench.cu": FILE_IO + UNUSED_KERNEL + reference,
        "inputs": [buf(*b) for b in inputs],
        "outputs": [buf(*b) for b in outputs],
        "gen.py": gen,
        "compare.py": compare,
    }


GEN_X = (
    "import os\nimport numpy as np\nos.makedirs('data', exist_ok=True)\n"
    "x = np.arange(1, 1025, dtype=np.int32)\nx.tofile('data/x.bin')\n"
)
COMPARE_FILES = (
    "import os, sys\nimport numpy as np\n"
    "def same(name, dtype):\n"
    "    p = f'data/{name}.bin'\n"
    "    return os.path.isfile(p) and np.array_equal(np.fromfile(p, dtype), "
    "np.fromfile(f'data/{name}_ref.bin', dtype))\n"
)

PROGRAMS = {
    "needs_module": "int main() { return 0; }\n",
    "big_output": 'int main() { launch_a_kernel(); FILE* f = fopen("data/big.bin", "wb"); if (!f) return 1;\n'
    f"  if (ftruncate(fileno(f), {BIG}L) != 0) return 2; fclose(f); return 0; }}\n",
    "undeclared": 'int main() { int32_t x[1024]; load("data/x.bin", x, 1024);\n'
    '  for (int i = 0; i < 1024; ++i) x[i] *= 2; save("data/out.bin", x, 1024); return 0; }\n',
    "int_types": "int main() { int32_t x[1024]; int64_t w[1024]; uint32_t u[1024]; "
    'load("data/x.bin", x, 1024);\n'
    "  for (int i = 0; i < 1024; ++i) { w[i] = (int64_t)x[i] << 33; u[i] = (uint32_t)x[i] * 3000000u; }\n"
    '  save("data/wide.bin", w, 1024); save("data/u.bin", u, 1024); return 0; }\n',
    "broken_compare": "int main() { return 0; }\n",
}

TASKS = {
    # gen.py needs a package that is not installed (real CUDABench tasks import torch, scipy, PIL)
    "needs_module": task(
        "needs_module",
        "import cuset_no_such_package\n",
        "print('T')\n",
        [("x", "int32", "(1024,)")],
        [("y", "int32", "(1024,)")],
    ),
    # 520 MiB declared and written by gen.py (sparse) and by the program: over the old 512 MiB cap
    "big_output": task(
        "big_output",
        GEN_X + f"with open('data/big_ref.bin', 'wb') as f:\n    f.truncate({BIG})\n",
        f"import os\nok = os.path.isfile('data/big.bin') and os.path.getsize('data/big.bin') == {BIG}\n"
        "print('T' if ok else 'F')\n",
        [("x", "int32", "(1024,)")],
        [("big", "float32", f"({BIG // 4},)")],
    ),
    # the program writes a file compare.py reads but the task does not declare
    "undeclared": task(
        "undeclared",
        GEN_X + "(2 * x).tofile('data/out_ref.bin')\n",
        COMPARE_FILES + "print('T' if same('out', np.int32) else 'F')\n",
        [("x", "int32", "(1024,)")],
        [],
    ),
    "int_types": task(
        "int_types",
        GEN_X + "(x.astype(np.int64) << 33).tofile('data/wide_ref.bin')\n"
        "(x.astype(np.uint32) * 3000000).tofile('data/u_ref.bin')\n",
        COMPARE_FILES + "print('T' if same('wide', np.int64) and same('u', np.uint32) else 'F')\n",
        [("x", "int32", "(1024,)")],
        [("wide", "int64", "(1024,)"), ("u", "uint32", "(1024,)")],
    ),
    # compare.py cannot judge even the task's own reference program here
    "broken_compare": task(
        "broken_compare",
        GEN_X + "x.tofile('data/y_ref.bin')\n",
        "import cuset_no_such_package\n",
        [("x", "int32", "(1024,)")],
        [("y", "int32", "(1024,)")],
    ),
}
for tid, body in PROGRAMS.items():
    TASKS[tid]["bench.cu"] += body


# The ways real CUDABench gen.py scripts name their reference files (counted over its 500 tasks:
# data/reference.bin in 150, other names holding `ref` in about 290, data/<output>_ref.bin in 30,
# data/expected_*.bin in about 45; 10 tasks have two outputs). compare.py reads the program's output
# as data/<output>.bin. Each entry: outputs as (name, C++ type, numpy dtype, C++ expression of x[i],
# numpy expression of x, the reference file gen.py writes), all computed from x = 1..1024 (float32).
NAMINGS = {
    "single_reference": [("y", "float", "float32", "2 * x[i] + 1", "2 * x + 1", "reference")],
    "ref_prefix": [("img_out", "float", "float32", "x[i] / 4", "x / 4", "ref_img")],
    "expected_prefix": [
        (
            "idx",
            "int32_t",
            "int32",
            "(int32_t)x[i] * 3 % 7",
            "x.astype(np.int32) * 3 % 7",
            "expected_sampled_indices",
        )
    ],
    "output_ref": [("c", "float", "float32", "x[i] * x[i]", "x * x", "c_ref")],
    "two_outputs": [
        ("lo", "float", "float32", "x[i] - 1", "x - 1", "golden_first"),
        ("hi", "int32_t", "int32", "(int32_t)x[i] + 1", "x.astype(np.int32) + 1", "answer_b"),
    ],
    # the output has the input's name: the program writes data/x.bin over its input
    "in_place": [("x", "float", "float32", "x[i] * 0.5f", "x * np.float32(0.5)", "x_after")],
}


# x: 1024 whole numbers in 1..1024, drawn the ways real gen.py scripts seed (torch in 360 of the 500,
# numpy's legacy seed in about 146, default_rng in 5), so that stage 04 can draw fresh input sets of them
# (harness/input_sets.py); every output above is then exact in float32, whatever the draw.
DRAWS = {
    "single_reference": "np.random.seed(42)\nx = np.random.randint(1, 1025, 1024)",
    "ref_prefix": "import torch\ntorch.manual_seed(42)\nx = torch.randint(1, 1025, (1024,)).numpy()",
    "expected_prefix": "x = np.random.default_rng(7).integers(1, 1025, 1024)",
    "output_ref": "import random\nrandom.seed(3)\n"
    "x = np.array([random.randint(1, 1024) for _ in range(1024)])",
    "two_outputs": "x = np.random.RandomState(5).randint(1, 1025, 1024)",
    "in_place": "np.random.seed(11)\nx = np.random.randint(1, 1025, 1024)",
}


def naming_task(tid: str, outputs: list[tuple]) -> dict:
    gen = (
        "import os\nimport numpy as np\nos.makedirs('data', exist_ok=True)\n"
        f"{DRAWS.get(tid, 'x = np.arange(1, 1025)')}\nx = x.astype(np.float32)\nx.tofile('data/x.bin')\n"
    )
    gen += "".join(
        f"np.asarray({py}, dtype=np.{dt}).tofile('data/{ref}.bin')\n" for _, _, dt, _, py, ref in outputs
    )
    compare = (
        "import os\nimport numpy as np\ndef ok(out, ref, dtype):\n"
        "    return os.path.isfile(out) and "
        "np.array_equal(np.fromfile(out, dtype), np.fromfile(ref, dtype))\n"
    )
    compare += (
        "print('T' if all(["
        + ", ".join(f"ok('data/{name}.bin', 'data/{ref}.bin', np.{dt})" for name, _, dt, _, _, ref in outputs)
        + "]) else 'F')\n"
    )
    outs = [(name, dt, "(1024,)") for name, _, dt, *_ in outputs]
    return task(tid, gen, compare, [("x", "float32", "(1024,)")], outs, naming_program(outputs))


def naming_program(outputs: list[tuple], wrong: bool = False) -> str:
    """main(): read x, write each output; `wrong` spoils one element of each."""
    body = 'int main() { float x[1024]; load("data/x.bin", x, 1024);\n'
    for name, ctype, _, expr, _, _ in outputs:
        body += (
            f"  {{ static {ctype} o[1024]; for (int i = 0; i < 1024; ++i) o[i] = ({ctype})({expr});\n"
            f'    {"o[517] += 1; " if wrong else ""}save("data/{name}.bin", o, 1024); }}\n'
        )
    return body + "  return 0; }\n"


TASKS |= {tid: naming_task(tid, outputs) for tid, outputs in NAMINGS.items()}


def program(body: str) -> str:
    return "```cuda\n" + FILE_IO + UNUSED_KERNEL + body + "```\n"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def solution(tid: str, completion: str, level: int = 1, sample: int = 0) -> dict:
    return {"task_id": tid, "level": level, "sample": sample, "completion": completion}


@pytest.fixture(scope="module")
def realset(tmp_path_factory):
    """One stage-04 run over the CUDABench-shaped tasks above, levels 1 and 2, with the task check."""
    d = tmp_path_factory.mktemp("realset")
    tasks = write_jsonl(d / "tasks.jsonl", list(TASKS.values()))
    sols = [solution(tid, program(body)) for tid, body in PROGRAMS.items()]
    # level 2: a wrong answer for int_types (uint32 wraps differently), and no answer for `undeclared`
    sols.append(
        solution("int_types", program(PROGRAMS["int_types"].replace("3000000u", "3000001u")), level=2)
    )
    sols += [
        solution(tid, "no code at all", level=2) for tid in PROGRAMS if tid not in ("int_types", "undeclared")
    ]
    # the naming patterns: a right program at level 1, a wrong one at level 2
    sols += [
        solution(tid, program(naming_program(outputs, wrong)), level=1 + wrong)
        for tid, outputs in NAMINGS.items()
        for wrong in (False, True)
    ]
    out = d / "ev"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "04_eval_kernels.py"),
            "--tasks",
            str(tasks),
            "--split",
            "all",
            "--levels",
            "1,2",
            "--solutions",
            str(write_jsonl(d / "sols.jsonl", sols)),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {(row["task_id"], row["level"]): row for row in map(json.loads, (out / "results.jsonl").open())}
    checks = [json.loads(line) for line in (out / "task_checks.jsonl").open()]
    return r, rows, json.loads((out / "summary.json").read_text()), checks


@pytest.mark.parametrize("tid", NAMINGS)
def test_every_reference_naming_is_judged_both_ways(realset, tid):
    rows = realset[1]
    assert rows[(tid, 1)]["outcome"] == "pass" and rows[(tid, 1)]["task_check"] == "pass", rows[(tid, 1)][
        "log"
    ]
    assert rows[(tid, 2)]["outcome"] == "wrong_output", rows[(tid, 2)]["log"]


@pytest.mark.parametrize("tid", NAMINGS)
def test_each_reference_and_right_program_passes_on_a_fresh_input_set_too(realset, tid):
    """gen.py seeded as real CUDABench scripts seed (DRAWS) is drawn again under the run's secret: the
    task's reference passes on that fresh set (the task check) and so does the right program."""
    check = next(c for c in realset[3] if c["task_id"] == tid)
    assert [(s["seed"], s["outcome"]) for s in check["input_sets"]] == [("task", "pass"), ("fresh-1", "pass")]
    row = realset[1][(tid, 1)]
    assert [s["outcome"] for s in row["input_sets"]] == ["pass", "pass"] and "input_sets_dropped" not in row


def test_each_task_is_checked_once_and_only_where_a_program_is_judged(realset):
    r, rows, summary, checks = realset
    checked = [c["task_id"] for c in checks]
    assert sorted(checked) == sorted(set(checked))  # once per task, though two of its programs ran
    # needs_module's gen.py fails first; every other task has a program that built
    assert set(checked) == set(TASKS) - {"needs_module"}
    assert summary["overall"]["unchecked"] == 0


def test_a_failing_gen_py_is_a_task_error_and_the_run_goes_on(realset):
    r, rows, summary, _ = realset
    assert r.returncode == 0, r.stderr
    row = rows[("needs_module", 1)]
    assert row["outcome"] == "task_error" and "cuset_no_such_package" in row["log"], row
    assert rows[("undeclared", 1)]["outcome"] == "pass"  # the tasks after it were judged


def test_a_compare_py_that_rejects_the_tasks_own_reference_is_a_task_error(realset):
    row = realset[1][("broken_compare", 1)]
    assert row["outcome"] == "task_error" and row["cause"] == "reference judged F", row
    assert "own reference program ran here and compare.py judged it F" in row["log"], row
    assert realset[1][("needs_module", 1)]["cause"] == "gen.py failed"


def test_task_errors_are_outside_pass_at_k_and_counted(realset):
    _, rows, summary, _ = realset
    judged = [r for r in rows.values() if r["outcome"] not in ("task_error", "unsupported")]
    prompts = {(r["task_id"], r["level"]) for r in judged}
    passed = {(r["task_id"], r["level"]) for r in judged if r["outcome"] == "pass"}
    assert summary["outcomes"]["task_error"] == 2 and summary["overall"]["task_error"] == 2
    assert summary["overall"]["pass@1"] == pytest.approx(len(passed) / len(prompts))


def test_outputs_over_512_mib_are_written_and_judged(realset):
    assert realset[1][("big_output", 1)]["outcome"] == "pass", realset[1][("big_output", 1)]["log"]


def test_undeclared_outputs_reach_compare(realset):
    assert realset[1][("undeclared", 1)]["outcome"] == "pass", realset[1][("undeclared", 1)]["log"]


def test_int64_and_uint32_outputs_are_judged_both_ways(realset):
    rows = realset[1]
    assert rows[("int_types", 1)]["outcome"] == "pass", rows[("int_types", 1)]["log"]
    assert rows[("int_types", 2)]["outcome"] == "wrong_output"


def test_a_missing_answer_is_missing_not_no_code_and_an_unknown_id_is_refused(realset, tmp_path, capsys):
    r, rows, summary, _ = realset
    assert rows[("undeclared", 2)]["outcome"] == "missing"
    assert rows[("big_output", 2)]["outcome"] == "no_code"
    assert summary["outcomes"]["missing"] == 1
    unknown = solution("no_such_task", program("int main() { return 0; }\n"))
    sols = write_jsonl(tmp_path / "sols.jsonl", [unknown])
    tasks = write_jsonl(tmp_path / "tasks.jsonl", list(TASKS.values()))
    argv = ["--tasks", tasks, "--split", "all", "--solutions", sols, "--out", tmp_path / "ev"]
    line, _ = refused(ev.main, argv, capsys)  # a typo in an id is bad input, not a `missing` row
    assert f"{sols}:1: task 'no_such_task' is not in --tasks" in line
    assert not (tmp_path / "ev").exists()


def run_tasks(d: Path, tasks: list[dict], sols: list[dict], *extra: str) -> tuple[dict, Path]:
    """main() on these tasks and answers, level 1; the rows by task id and the --out folder."""
    d.mkdir(exist_ok=True)
    out = d / "ev"
    assert (
        ev.main(
            [
                "--tasks",
                str(write_jsonl(d / "tasks.jsonl", tasks)),
                "--split",
                "all",
                "--levels",
                "1",
                "--solutions",
                str(write_jsonl(d / "sols.jsonl", sols)),
                "--out",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    return {row["task_id"]: row for row in map(json.loads, (out / "results.jsonl").open())}, out


def test_a_reference_that_cannot_finish_here_leaves_its_task_unchecked_not_removed(tmp_path):
    outputs = NAMINGS["single_reference"]
    slow = naming_task("slow_reference", outputs)
    slow["bench.cu"] = slow["bench.cu"].replace("int main() {", "int main() { sleep(600);")
    rows, out = run_tasks(
        tmp_path, [slow], [solution("slow_reference", program(naming_program(outputs)))], "--run-timeout", "2"
    )  # the reference may take 10x: 20 s
    assert rows["slow_reference"]["outcome"] == "pass" and rows["slow_reference"]["task_check"] == "timeout"
    check = json.loads((out / "task_checks.jsonl").read_text())
    assert check["run_s"] >= 20 and "no exit within 20 s" in check["log"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["unchecked"] == 1 and summary["overall"]["pass@1"] == 1.0
    assert "`unchecked`" in (out / "summary.md").read_text()


def test_a_candidate_may_take_a_few_times_its_reference_though_over_run_timeout(tmp_path):
    outputs = NAMINGS["output_ref"]
    heavy = naming_task("heavy", outputs)
    heavy["bench.cu"] = heavy["bench.cu"].replace("int main() {", "int main() { sleep(2);")
    slower = program(naming_program(outputs).replace("int main() {", "int main() { sleep(3);"))
    rows, out = run_tasks(tmp_path, [heavy], [solution("heavy", slower)], "--run-timeout", "1")
    assert rows["heavy"]["outcome"] == "pass" and rows["heavy"]["run_s"] >= 3, rows["heavy"]


def test_a_resumed_run_keeps_its_task_checks_and_no_task_check_skips_them(tmp_path):
    tasks = [naming_task(tid, NAMINGS[tid]) for tid in ("ref_prefix", "two_outputs")]
    sols = [solution(t["id"], program(naming_program(NAMINGS[t["id"]]))) for t in tasks]
    rows, out = run_tasks(tmp_path, tasks, sols)
    checks = (out / "task_checks.jsonl").read_text()
    assert checks.count("\n") == 2 and all(r["outcome"] == "pass" for r in rows.values())
    (out / "results.jsonl").write_text("")  # as if killed after both checks, before any row was kept
    rows, _ = run_tasks(tmp_path, tasks, sols)
    assert (out / "task_checks.jsonl").read_text() == checks  # not paid again
    assert all(r["outcome"] == "pass" and r["task_check"] == "pass" for r in rows.values())
    # without the check, a compare.py that rejects everything reads as the candidate's fault
    broken = TASKS["broken_compare"]
    rows, out = run_tasks(
        tmp_path / "skip",
        [broken],
        [solution(broken["id"], program(PROGRAMS[broken["id"]]))],
        "--no-task-check",
    )
    assert rows[broken["id"]]["outcome"] == "wrong_output" and rows[broken["id"]]["task_check"] == "skipped"
    assert not (out / "task_checks.jsonl").exists()


# ---------------------------------------------------------------------------------------
# Links planted by the program, timings forged by candidate code
# ---------------------------------------------------------------------------------------

TOY = task(
    "toy",
    GEN_X + "(2 * x).tofile('data/y_ref.bin')\n",
    COMPARE_FILES + "print('T' if same('y', np.int32) else 'F')\n",
    [("x", "int32", "(1024,)")],
    [("y", "int32", "(1024,)")],
)


def test_a_data_folder_replaced_by_a_link_to_the_answer_does_not_pass(run_program, tmp_path):
    answer = tmp_path / "root-only"  # a folder only the harness's uid can read, holding the right answer
    answer.mkdir(mode=0o700)
    (2 * np.arange(1, 1025, dtype=np.int32)).tofile(answer / "y.bin")
    source = (
        FILE_IO
        + UNUSED_KERNEL
        + (
            'int main() { unlink("data/x.bin"); if (rmdir("data") != 0) return 1;\n'
            f'  return symlink("{answer}", "data") == 0 ? 0 : 2; }}\n'
        )
    )
    outcome, log, _ = run_program(source, TOY)
    assert outcome == "wrong_output" and "without following links" in log, log


def test_an_output_file_linked_to_the_reference_does_not_pass(run_program):
    source = (
        FILE_IO
        + UNUSED_KERNEL
        + ('int main() { return symlink("../../gen/data/y_ref.bin", "data/y.bin") == 0 ? 0 : 1; }\n')
    )
    outcome, log, _ = run_program(source, TOY)
    assert outcome == "wrong_output" and "y.bin: not copied, a symbolic link" in log, log


def kernel_mode_program(task_: dict, extra: str) -> str:
    """The task's real kernel-mode harness around its reference kernels plus `extra` candidate code."""
    code = extra + task_["kernel_mode"]["reference_kernels"]
    return ev.program_source(task_, code, "kernel")


FORGED = "CUSET_TIMING nonce=0123456789abcdef0123456789abcdef candidate_ms=0.000001 reference_ms=1000"
CONSTRUCTOR_FORGERY = f'static int forged_ = (printf("{FORGED}\\n"), fflush(stdout), 0);\n'
# reads the nonce from stdin before main does and prints a line carrying it
NONCE_THIEF = (
    "#include <unistd.h>\nstatic int stolen_ = [] { char n[80] = {0}; fgets(n, sizeof n, stdin);\n"
    '  n[strcspn(n, "\\n")] = 0; '
    'printf("CUSET_TIMING nonce=%s candidate_ms=0.000001 reference_ms=1000\\n", n);\n'
    "  fflush(stdout); return 0; }();\n"
)


@pytest.fixture(scope="module")
def small_kernel_task():
    return next(t for t in load_tasks(TASKS_FILE) if t["id"] == "square_1500007")


def test_the_harness_timing_line_carries_the_nonce_and_is_taken(run_program, small_kernel_task):
    outcome, log, timing = run_program(
        kernel_mode_program(small_kernel_task, ""), small_kernel_task, timed=True
    )
    assert outcome == "pass", log
    assert timing["candidate_ms"] > 0 and timing["speedup"] > 0, (timing, log)


@pytest.mark.parametrize(
    "forgery",
    [CONSTRUCTOR_FORGERY, "#include <cstring>\n" + NONCE_THIEF],
    ids=["static-constructor", "nonce-thief"],
)
def test_a_forged_timing_line_is_discarded(run_program, small_kernel_task, forgery):
    outcome, log, timing = run_program(
        kernel_mode_program(small_kernel_task, forgery), small_kernel_task, timed=True
    )
    assert outcome == "pass", log  # the kernels are right; only the timing is void
    assert "speedup" not in timing and "timing_void" in timing, (timing, log)


# ---------------------------------------------------------------------------------------
# Resume only the same run; appends survive a kill
# ---------------------------------------------------------------------------------------


def reference_solutions(path: Path, tasks: list[dict], mutate=lambda c: c) -> Path:
    return write_jsonl(
        path, [solution(t["id"], mutate("```cuda\n" + t["bench.cu"] + "```\n")) for t in tasks]
    )


def test_another_source_into_the_same_out_is_refused_and_force_starts_over(tmp_path, capsys):
    tasks = [t for t in load_tasks(TASKS_FILE) if t["split"] == "eval"][:2]
    a = reference_solutions(tmp_path / "a.jsonl", tasks)
    b = reference_solutions(tmp_path / "b.jsonl", tasks, lambda c: c.replace("cuda", "cpp", 1))
    out = tmp_path / "ev"
    base = ["--split", "eval", "--limit", "2", "--levels", "1", "--out", str(out)]
    assert ev.main([*base, "--solutions", str(a)]) == 0
    before = (out / "results.jsonl").read_text()
    line, _ = refused(ev.main, [*base, "--solutions", b], capsys)
    assert "holds another run" in line and "solutions_sha256" in line and "--force" in line
    assert (out / "results.jsonl").read_text() == before  # nothing lost
    refused(ev.main, [*base, "--solutions", a, "--mode", "kernel"], capsys)  # settings count too
    assert ev.main([*base, "--solutions", str(b), "--force"]) == 0
    assert json.loads((out / "fingerprint.json").read_text())["solutions_sha256"] == sha256_file(b)


def test_a_killed_run_resumes_from_its_appended_rows(tmp_path):
    out = tmp_path / "ev"
    cmd = [
        sys.executable,
        str(ROOT / "04_eval_kernels.py"),
        "--reference",
        "--split",
        "train",
        "--levels",
        "1",
        "--limit",
        "6",
        "--jobs",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.time() + 600
    while (
        proc.poll() is None
        and time.time() < deadline
        and (not results.exists() or results.read_text().count("\n") < 2)
    ):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = results.read_text().splitlines()
    assert 2 <= len(kept) < 6, "the run must be killed part way (make --limit larger if it finished)"
    with results.open("a") as f:
        f.write('{"task_id": "torn')  # a row cut by the kill
    left = list(Path(tempfile.gettempdir()).glob(f"cuset-eval-{proc.pid}-*"))
    assert len(left) == 1 and any(left[0].iterdir())  # the kill skipped the clean-up: builds, task data
    live = Path(tempfile.mkdtemp(prefix=f"cuset-eval-{os.getpid()}-"))  # a running process's folder
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        assert not left[0].exists() and live.is_dir()  # the next run removed the dead run's folder only
    finally:
        shutil.rmtree(live)
    assert f"{len(kept)} rows already done" in r.stdout
    final = [json.loads(x) for x in results.read_text().splitlines()]
    assert len(final) == 6 and all(row["outcome"] == "pass" and "task_check" not in row for row in final)
    assert not (out / "task_checks.jsonl").exists()  # with --reference the rows are the check
    assert json.loads(kept[0]) in final  # the rows made before the kill were kept as they were


# ---------------------------------------------------------------------------------------
# Bad input: one line, exit 2, before any work
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--num-samples", "0"], "--num-samples 0: must be an integer >= 1"),
        (["--limit", "0"], "--limit 0: must be an integer >= 1"),
        (["--limit", "-1"], "--limit -1: must be an integer >= 1"),
        (["--run-timeout", "0"], "--run-timeout 0: must be a finite number in (0, 43200]"),
        (["--solutions", "/nonexistent/sols.jsonl"], "file not found"),
    ],
)
def test_bad_numbers_and_paths_exit_2(tmp_path, capsys, argv, says):
    line, _ = refused(ev.main, [*argv, "--out", tmp_path / "o"], capsys)
    assert says in line
    assert not (tmp_path / "o").exists()


def test_out_naming_a_file_is_refused_before_generation(tmp_path, capsys):
    (tmp_path / "o").write_text("keep me")
    line, _ = refused(ev.main, ["--limit", "1", "--out", tmp_path / "o"], capsys)
    assert "is a file" in line
    assert (tmp_path / "o").read_text() == "keep me"


def test_duplicate_answers_are_refused_with_both_lines(tmp_path, capsys):
    tid, other = (t["id"] for t in load_tasks(TASKS_FILE)[:2])
    sols = write_jsonl(tmp_path / "s.jsonl", [solution(tid, "a"), solution(other, "b"), solution(tid, "c")])
    line, _ = refused(ev.main, ["--solutions", sols, "--split", "all", "--out", tmp_path / "o"], capsys)
    assert f"{sols}:3" in line and "line 1" in line


def test_crlf_replies_are_recognised():
    reply = "Here you go:\r\n```cuda\r\n__global__ void k() {}\r\nint main() { return 0; }\r\n```\r\n"
    assert ev.extract_code(reply, "standalone") == "__global__ void k() {}\nint main() { return 0; }\n"


# ---------------------------------------------------------------------------------------
# No isolation possible: refuse, unless told --no-sandbox
# ---------------------------------------------------------------------------------------


def without_user_namespaces(argv: list[str]) -> subprocess.CompletedProcess:
    """Stage 04 where user namespaces are disabled: inside a user namespace whose own limit of nested
    ones is 0 (/proc/sys/user limits are per user namespace), so bubblewrap cannot build its sandbox."""
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            str(ROOT / "04_eval_kernels.py"),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_isolation_stage_04_refuses_and_runs_only_when_told(tmp_path):
    argv = ["--reference", "--split", "eval", "--levels", "1", "--limit", "1", "--out", str(tmp_path / "o")]
    r = without_user_namespaces(argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot isolate generated code" in r.stderr and "max_user_namespaces" in r.stderr
    assert "--no-sandbox" in r.stderr and not (tmp_path / "o").exists()
    r = without_user_namespaces([*argv, "--no-sandbox"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING: --no-sandbox" in r.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["sandbox"] is False and summary["overall"]["pass@1"] == 1.0
    assert "NOT sandboxed" in (tmp_path / "o" / "summary.md").read_text()
