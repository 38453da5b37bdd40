"""research/nearest_train.py: the memorise-and-copy baseline of the kernel-mode compile rate.

Its answers must carry the eval task's exact signatures (else its compile rate says nothing about
copying), and stage 04 must score them for real: every answer compiles in its eval harness, and none
passes, since a train answer that computed a held-out op would mean the op leaked into training.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import load_script

from cuset_common.paths import TASKS_FILE
from cuset_common.tasks import KERNEL_SIGNATURE, load_tasks, signature_parts

nt = load_script("research/nearest_train.py")
ev = load_script("04_eval_kernels.py")


def test_renaming_touches_names_not_members_or_other_words():
    source = {
        "kernel_mode": {
            "signatures": ["__global__ void neg_kernel(const float* x, float* y, int n)"],
            "reference_kernels": "__global__ void neg_kernel(const float* x, float* y, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) y[i] = -x[i];  // n_x stays\n}\n",
        }
    }
    task = {
        "kernel_mode": {
            "signatures": ["__global__ void flip_kernel(const float* src, float* dst, int count)"]
        }
    }
    assert nt.renamed_kernels(source, task) == (
        "__global__ void flip_kernel(const float* src, float* dst, int count) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < count) dst[i] = -src[i];  // n_x stays\n}\n"
    )


def test_answers_carry_the_eval_signatures_compile_and_none_passes(tmp_path):
    sols, out = tmp_path / "nearest.jsonl", tmp_path / "ev"
    assert nt.main(["--out", str(sols)]) == 0
    rows = [json.loads(line) for line in sols.read_text().splitlines()]
    tasks = {t["id"]: t for t in load_tasks(TASKS_FILE)}
    answered = {r["task_id"] for r in rows}
    assert answered and all(tasks[t]["split"] == "eval" for t in answered)
    for r in rows:
        assert tasks[r["source"]]["split"] == "train"
        want = [signature_parts(s) for s in tasks[r["task_id"]]["kernel_mode"]["signatures"]]
        got = [signature_parts(m.group(0)) for m in KERNEL_SIGNATURE.finditer(r["completion"])]
        assert got == want, r["task_id"]

    # no task check: tests/test_tasks.py shows every bundled kernel-mode reference passing
    assert (
        ev.main(
            [
                "--solutions",
                str(sols),
                "--mode",
                "kernel",
                "--levels",
                "1",
                "--split",
                "eval",
                "--backend",
                "emulate",
                "--no-task-check",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by_outcome = Counter(r["outcome"] for r in results)
    eval_tasks = sum(t["split"] == "eval" for t in tasks.values())
    assert by_outcome["missing"] == eval_tasks - len(answered)
    assert by_outcome["compile_error"] == by_outcome["no_code"] == 0, by_outcome
    assert by_outcome["pass"] == 0, [r["task_id"] for r in results if r["outcome"] == "pass"]


def without_train_tasks(tasks: list[dict]) -> tuple[list[dict], str]:
    return [t for t in tasks if t["split"] == "eval"], "0 train"


def with_a_broken_signature(tasks: list[dict]) -> tuple[list[dict], str]:
    broken = next(t for t in tasks if t["split"] == "train" and t.get("kernel_mode"))
    broken["kernel_mode"]["signatures"][0] = broken["kernel_mode"]["signatures"][0].replace("__global__ ", "")
    return tasks, f"task {broken['id']}"


@pytest.mark.parametrize("spoil", [without_train_tasks, with_a_broken_signature])
def test_a_task_file_it_cannot_use_is_one_line_and_exit_2(tmp_path, capsys, spoil):
    tasks, where = spoil(load_tasks(TASKS_FILE))
    bad = tmp_path / "tasks.jsonl"
    bad.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "nearest.jsonl"
    code = nt.run_main(nt.main, ["--tasks", str(bad), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and where in err and not out.exists()
