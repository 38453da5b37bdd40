"""Stage 04: metrics, code extraction, references, resume, the real sandbox path against hostile
host-side programs, and the full protocol with verdicts: on the GPU where one is present, under CPU
emulation everywhere (subtly wrong kernels, races, warp shuffles, unsupported features,
AddressSanitizer)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import eval_stage, plain_backend, refused

from cuset_common.data import load_sft
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.paths import ROOT, TASKS_FILE, TINY_MODEL
from cuset_common.tasks import load_tasks
from harness.eval_options import parse_args
from harness.generation import (
    LOOP_CHECK_EVERY,
    decode,
    looping,
    pick_token,
    stop_when_complete,
    stop_when_looping,
)
from harness.outcomes import APART, OUTCOMES
from harness.programs import LOG_KEEP, WORK_PREFIX, gpu_name

ev = eval_stage()
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and the sandbox uid need root")
BACKEND = plain_backend()
# Tests that must see verdicts run under emulation on any machine, and again on the GPU where one is.
BACKENDS = ["emulate", pytest.param("gpu", marks=pytest.mark.gpu)]


# ---------------------------------------------------------------------------------------
# pass@k and extraction
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 2), (4, 4, 4), (7, 1, 5), (3, 1, 3)]
)
def test_pass_at_k_matches_brute_force_enumeration(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert ev.pass_at_k(n, c, k) == pytest.approx(brute)


@pytest.mark.parametrize("n,c", [(3, 0), (3, 1), (2, 2), (1, 0)])
def test_a_prompt_judged_on_fewer_than_k_samples_gets_pass_at_n(n, c):
    """--num-samples 4 with some samples `unsupported`: the prompt's pass@4 is what its n judged samples
    say, pass@n (0 when none passed; a failing prompt once counted as passing here)."""
    assert ev.pass_at_k(n, c, 4) == ev.pass_at_k(n, c, n) == (1.0 if c else 0.0)


KERNEL = "__global__ void k(float* y) { y[threadIdx.x] = 1.0f; }"
PROGRAM = KERNEL + "\nint main() { return 0; }"


@pytest.mark.parametrize(
    "reply,mode,want",
    [
        # several blocks: the one with __global__ and main wins in standalone mode
        (
            f"Here:\n```bash\nnvcc a.cu\n```\n```cpp\n{KERNEL}\n```\n```cuda\n{PROGRAM}\n```\nDone.",
            "standalone",
            PROGRAM,
        ),
        # kernel mode takes the __global__ block even without main
        (f"```python\nprint(1)\n```\n```cpp\n{KERNEL}\n```", "kernel", KERNEL),
        # standalone falls back to a block with __global__ when none has main
        (f"```\n{KERNEL}\n```", "standalone", KERNEL),
        # prose only
        ("I would use a grid-stride loop and shared memory.", "standalone", None),
        # a fenced block without CUDA
        ("```python\nimport numpy\n```", "kernel", None),
        # unclosed final fence (generation hit max tokens)
        (f"Sure.\n```cpp\n{PROGRAM}", "standalone", PROGRAM),
        # no fence but plainly CUDA
        (PROGRAM, "standalone", PROGRAM),
    ],
)
def test_code_extraction_on_tricky_replies(reply, mode, want):
    got = ev.extract_code(reply, mode)
    assert (got.strip() if got else None) == (want.strip() if want else None)


@pytest.mark.parametrize("mode", ["standalone", "kernel"])
def test_generation_stops_right_after_the_code_block_the_mode_asks_for(mode):
    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False)
    prompt = tok("<|im_start|>user\nwrite it<|im_end|>\n<|im_start|>assistant\n").input_ids
    reply = f"Sure.\n```cuda\n{KERNEL}\n```\nNow main:\n```cuda\n{PROGRAM}\n```\nDone, and more text."
    ids = prompt + tok(reply).input_ids
    stop = stop_when_complete(tok, lambda reply: ev.reply_complete(reply, mode))
    import torch

    first_stop = next(
        n for n in range(len(prompt) + 1, len(ids) + 1) if stop(torch.tensor([ids[len(prompt) : n]]))[0]
    )
    text = tok.decode(ids[len(prompt) : first_stop])
    # kernel mode stops after the first block; standalone needs main(), so it stops after the second
    assert text.rstrip().endswith("```") and text.count("```") == (2 if mode == "kernel" else 4), text


LOOP_SPAN = parse_args([]).loop_stop


def real_code() -> list[str]:
    """Every reference program and kernel of the bundled tasks and every training response: code that
    does not loop."""
    texts = {r["response"] for f in sorted((ROOT / "data" / "sft").glob("*.jsonl")) for r in load_sft(f)}
    for t in load_tasks(TASKS_FILE):
        texts |= {t["bench.cu"], *([t["kernel_mode"]["reference_kernels"]] if "kernel_mode" in t else [])}
    return sorted(texts)


def longest_repeating_stretch(ids, max_period: int) -> int:
    """The most tokens in a row that repeat a stretch of at most max_period tokens three times or more
    (0: none): per period p, the longest run of ids[i] == ids[i - p], plus p. Written apart from
    looping(), which asks the same of one tail at a time."""
    import numpy as np

    best = 0
    for p in range(1, min(max_period, len(ids) - 1) + 1):
        same = np.concatenate([[0], (ids[p:] == ids[:-p]).astype(np.int64), [0]])
        edges = np.flatnonzero(np.diff(same))  # starts and ends of the runs of equal pairs
        run = int((edges[1::2] - edges[::2]).max(initial=0))
        if run + p >= 3 * p:
            best = max(best, run + p)
    return best


def test_no_reference_or_training_response_reads_as_a_loop_at_any_length():
    import numpy as np
    import torch

    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False)
    texts = real_code()
    assert len(texts) > 1000
    ids = [np.array(tok(text, add_special_tokens=False).input_ids) for text in texts]
    stretches = [longest_repeating_stretch(x, LOOP_SPAN // 3) for x in ids]
    worst = int(np.argmax(stretches))
    # docs/evaluation.md: 8 tokens with this tokenizer, against the 160 the stop needs
    assert max(stretches) < LOOP_SPAN, texts[worst][:300]
    x = torch.tensor(ids[worst])  # and looping() itself, at every length of the most repetitive text
    assert len(x) < LOOP_SPAN or not looping(x.unfold(0, LOOP_SPAN, 1), LOOP_SPAN).any()


def test_a_reply_that_repeats_a_line_is_cut_once_the_repeats_fill_the_span():
    import torch

    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False)
    head = tok("```cpp\n__global__ void k(float* y) {\n").input_ids
    line = tok("    int c = c + 1;\n").input_ids
    stop = stop_when_looping(LOOP_SPAN)
    ids = head + line * (3 * LOOP_SPAN // len(line))
    cut = next(n for n in range(1, len(ids) + 1) if stop(torch.tensor([ids[:n]]))[0])
    assert len(head) + LOOP_SPAN <= cut < len(head) + LOOP_SPAN + len(line) + LOOP_CHECK_EVERY
    # a stretch longer than a third of the span, repeated, is not a loop by this rule
    long_line = tok(" ".join(f"v{i} = w{i};" for i in range(LOOP_SPAN // 2))).input_ids[: LOOP_SPAN // 3 + 1]
    assert not looping(torch.tensor([(long_line * 4)[-LOOP_SPAN:]]), LOOP_SPAN).any()


def test_the_loop_stop_changes_no_reply_that_does_not_loop(tmp_path):
    """The tiny model at 256 new tokens with and without the stop: each reply is the same, or the one
    with the stop is a prefix of the other that ends in a loop; the same reply gets the same verdict."""
    import torch

    runs = {}
    for stop in (0, LOOP_SPAN):
        out = tmp_path / f"stop{stop}"
        assert (
            ev.main(
                [
                    "--mode",
                    "kernel",
                    "--levels",
                    "1,2,3",
                    "--limit",
                    "6",
                    "--max-new-tokens",
                    "256",
                    "--loop-stop",
                    str(stop),
                    "--no-task-check",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        runs[stop] = {
            (r["task_id"], r["level"]): r
            for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
        }
        runs[stop, "text"] = {
            (c["task_id"], c["level"]): c["completion"]
            for c in map(json.loads, (out / "completions.jsonl").read_text().splitlines())
        }
    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False)
    assert len(runs[0, "text"]) == 18
    for job, full in runs[0, "text"].items():
        cut = runs[LOOP_SPAN, "text"][job]
        if cut == full:
            assert runs[0][job]["outcome"] == runs[LOOP_SPAN][job]["outcome"]
        else:
            ids = torch.tensor(tok(cut, add_special_tokens=False).input_ids)
            assert full.startswith(cut) and looping(ids[None, -LOOP_SPAN:], LOOP_SPAN)[0], (full, cut)


def test_decode_writes_what_hf_generate_writes_while_finished_rows_leave_the_batch():
    """Greedy on the tiny model: decode() against model.generate() on the same left-padded prompts, with
    end-of-turn ids chosen so that rows finish at different steps (each leaves decode's batch, and its
    cache rows with it; generate() keeps it to the end)."""
    import argparse

    import torch

    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False, padding_side="left")
    model = load_causal_lm(str(TINY_MODEL), torch.float32).eval()
    texts = [
        f"<|im_start|>user\nwrite kernel {i}{' with padding' * i}<|im_end|>\n<|im_start|>assistant\n"
        for i in range(4)
    ]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    args = argparse.Namespace(num_samples=1, max_new_tokens=40, temperature=0.0, top_p=1.0)
    with torch.no_grad():
        free = decode(model, enc, args, [], [], lambda *_: None)
        hf = model.generate(**enc, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id)
        assert free == hf[:, enc["input_ids"].shape[1] :].tolist()
        # end each row at a token it writes at its own step: 6, 14, 22, 30
        eos = sorted({row[6 + 8 * j] for j, row in enumerate(free)})
        cut = decode(model, enc, args, [], eos, lambda *_: None)
        hf = model.generate(
            **enc, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=eos
        )[:, enc["input_ids"].shape[1] :].tolist()
    ends = [next((n + 1 for n, t in enumerate(row) if t in eos), len(row)) for row in hf]
    assert len(set(ends)) > 1, ends  # the rows did leave at different steps
    assert cut == [row[:n] for row, n in zip(hf, ends)]


def test_sampling_draws_only_from_the_top_p_nucleus():
    """pick_token at temperature 1, top-p 0.7: over many draws, only tokens of the smallest set of most
    likely ones whose mass reaches 0.7 come out (a naive walk down the sorted probabilities), each of
    them does, and the argmax at temperature 0."""
    import argparse

    import torch

    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.1, 0.25, 0.2]])).repeat(4000, 1)
    drawn = set(pick_token(logits, argparse.Namespace(temperature=1.0, top_p=0.7)).tolist())
    nucleus, mass = set(), 0.0
    for p, i in sorted(((p, i) for i, p in enumerate([0.05, 0.4, 0.1, 0.25, 0.2])), reverse=True):
        if mass >= 0.7:
            break
        nucleus.add(i)
        mass += p
    assert drawn == nucleus == {1, 3, 4}
    assert pick_token(logits[:1], argparse.Namespace(temperature=0.0, top_p=0.7)).tolist() == [1]


# ---------------------------------------------------------------------------------------
# References (every one of them: tests/test_tasks.py), labels, resume
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["standalone", "kernel"])
def test_references_pass_and_rows_say_how_they_ran(tmp_path, mode, capsys):
    out = tmp_path / "ev"
    assert (
        ev.main(
            [
                "--reference",
                "--split",
                "eval",
                "--levels",
                "1",
                "--mode",
                mode,
                "--limit",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == summary["overall"]["rows"] == 4
    assert summary["overall"]["pass@1"] == 1.0, summary["outcomes"]
    assert summary["backend"] == BACKEND and {r["backend"] for r in rows} == {BACKEND}
    if BACKEND == "emulated":  # honest labelling: no timings, no fast_p
        assert "backend: emulated" in (out / "summary.md").read_text()
        assert "backend: emulated" in capsys.readouterr().out
        assert not any("speedup" in r or "candidate_ms" in r for r in rows)
        assert not any(key.startswith(("fast_", "speedup")) for key in summary["overall"])
    elif mode == "kernel":
        assert all(r.get("speedup") for r in rows)


def test_backend_gpu_without_a_gpu_is_refused(tmp_path, capsys):
    if gpu_name():
        pytest.skip("a GPU is present")
    argv = ["--reference", "--backend", "gpu", "--limit", "1", "--out", tmp_path / "o"]
    line, _ = refused(ev.main, argv, capsys)
    assert "--backend gpu" in line


def test_rerun_with_the_same_out_keeps_finished_rows(tmp_path):
    out = tmp_path / "ev"
    args = ["--reference", "--split", "train", "--levels", "1", "--limit", "3", "--out", str(out)]
    assert ev.main(args) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    rows[0]["log"] = "kept from the first run"
    (out / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows[:2])
    )  # as if killed after 2
    assert ev.main(args) == 0
    again = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(again) == 3 and again[0]["log"] == "kept from the first run"


def test_solutions_file_is_scored_and_missing_answers_are_missing(tmp_path):
    tasks = [t for t in load_tasks(TASKS_FILE) if t["split"] == "eval"][:2]
    sols = tmp_path / "sols.jsonl"
    sols.write_text(
        json.dumps(
            {
                "task_id": tasks[0]["id"],
                "level": 1,
                "sample": 0,
                "completion": "```cpp\n" + tasks[0]["bench.cu"] + "\n```",
            }
        )
        + "\n"
        + json.dumps(
            {
                "task_id": tasks[1]["id"],
                "level": 1,
                "sample": 0,
                "completion": "```cpp\n__global__ void broken( {\n```",
            }
        )
        + "\n"
    )
    out = tmp_path / "ev"
    assert (
        ev.main(
            [
                "--solutions",
                str(sols),
                "--split",
                "eval",
                "--levels",
                "1,2",
                "--limit",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    by = {
        (r["task_id"], r["level"]): r
        for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    assert by[(tasks[0]["id"], 1)]["outcome"] == "pass"
    assert by[(tasks[1]["id"], 1)]["outcome"] == "compile_error" and "error" in by[(tasks[1]["id"], 1)]["log"]
    assert by[(tasks[0]["id"], 2)]["outcome"] == "missing"


def test_the_tiny_model_generates_and_its_replies_are_scored(tmp_path):
    import torch

    out, threads = tmp_path / "ev", torch.get_num_threads()
    assert (
        ev.main(
            [
                "--split",
                "eval",
                "--levels",
                "1,3",
                "--limit",
                "2",
                "--num-samples",
                "2",
                "--temperature",
                "0.8",
                "--max-new-tokens",
                "48",
                "--threads",
                str(threads + 1),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert torch.get_num_threads() == threads  # put back: later computations in this process keep their bits
    completions = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(completions) == len(rows) == 2 * 2 * 2
    assert all(c["completion"].strip() for c in completions)
    assert {r["outcome"] for r in rows} <= {*OUTCOMES, *APART}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["by_level"]) == {"L1", "L3"}


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["missing", "empty folder"])
def test_a_model_path_without_a_model_is_one_line_and_exit_2(tmp_path, capsys, make):
    make(tmp_path / "m")
    line, _ = refused(ev.main, ["--model", tmp_path / "m", "--limit", "1", "--out", tmp_path / "o"], capsys)
    assert str(tmp_path / "m") in line


def test_malformed_solutions_line_is_reported_with_file_and_line(tmp_path, capsys):
    sols = tmp_path / "sols.jsonl"
    tid = load_tasks(TASKS_FILE)[0]["id"]
    first = {"task_id": tid, "level": 1, "sample": 0, "completion": "a"}
    sols.write_text(json.dumps(first) + '\n{"task_id": "y"}\n')
    line, _ = refused(ev.main, ["--solutions", sols, "--limit", "1", "--out", tmp_path / "o"], capsys)
    assert f"{sols}:2" in line
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------
# The sandbox against hostile host-side programs (compiled by nvcc, run through execute(): run_program).
# ---------------------------------------------------------------------------------------

TOY_TASK = {
    "id": "toy_double",
    "inputs": [{"name": "x", "dtype": "float32", "shape": "(1024,)"}],
    "outputs": [{"name": "y", "dtype": "float32", "shape": "(1024,)"}],
    "gen.py": "import os\nimport numpy as np\nos.makedirs('data', exist_ok=True)\n"
    "x = np.arange(1, 1025, dtype=np.float32)\nx.tofile('data/x.bin')\n(2 * x).tofile('data/y_ref.bin')\n",
    "compare.py": "import os\nimport numpy as np\n"
    "ok = os.path.exists('data/y.bin') and np.array_equal(np.fromfile('data/y.bin', np.float32), "
    "np.fromfile('data/y_ref.bin', np.float32))\nprint('T' if ok else 'F')\n",
}

HONEST = r"""
#include <cstdio>
int main() {
    float x[1024];
    FILE* f = fopen("data/x.bin", "rb"); if (!f || fread(x, 4, 1024, f) != 1024) return 1; fclose(f);
    for (int i = 0; i < 1024; ++i) x[i] *= 2.0f;
    f = fopen("data/y.bin", "wb"); fwrite(x, 4, 1024, f); fclose(f);
    return 0;
}
"""

ENDLESS = "int main() { volatile unsigned long n = 0; for (;;) ++n; }"
FORK_BOMB = "#include <unistd.h>\nint main() { for (;;) fork(); }"
SEGFAULT = "int main() { volatile int* p = nullptr; *p = 1; return 0; }"
EXIT_3 = "#include <cstdlib>\nint main() { exit(3); }"
FLOOD = (
    "#include <cstdio>\n"
    'int main() { for (int i = 0; i < 400000; ++i) puts("all work and no play makes a kernel"); }'
)


def steal_program(ref_paths: list[str]) -> str:
    """Tries every path to the reference output; copies the first it can open to data/y.bin."""
    tries = "".join(
        f'    if (!f) {{ f = fopen("{p}", "rb"); if (f) printf("opened {p}\\n"); }}\n' for p in ref_paths
    )
    return (
        "#include <cstdio>\nint main() {\n    FILE* f = nullptr;\n"
        + tries
        + '    if (!f) { puts("no reference reachable"); return 0; }\n    float y[1024];\n'
        "    size_t n = fread(y, 4, 1024, f); fclose(f);\n"
        '    FILE* o = fopen("data/y.bin", "wb"); fwrite(y, 4, n, o); fclose(o);\n    return 0;\n}\n'
    )


def escape_program(targets: list[str]) -> str:
    writes = "".join(
        f'    f = fopen("{t}", "w"); printf("{t}: %s\\n", f ? "WROTE" : "denied"); if (f) fclose(f);\n'
        for t in targets
    )
    return "#include <cstdio>\nint main() {\n    FILE* f;\n" + writes + "    return 0;\n}\n"


def processes_under(prefix: str) -> list[str]:
    """Live processes (not zombies: a dead child of an init that does not reap is only a process-table
    entry) whose working directory starts with `prefix`: a job's processes run in its own folders, so
    this tells them from those of any other job or run on the machine."""
    live = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd, state = os.readlink(proc / "cwd"), (proc / "stat").read_text().rsplit(") ", 1)[1][:1]
        except OSError:  # gone meanwhile, or a zombie (no working directory)
            continue
        if cwd.startswith(prefix) and state != "Z":
            live.append(f"{proc.name}: {cwd}")
    return live


def test_an_honest_program_passes_through_the_sandbox(run_program):
    outcome, log, _ = run_program(HONEST, TOY_TASK)
    assert outcome == "pass", log


def test_an_endless_loop_times_out(run_program):
    outcome, _, _ = run_program(ENDLESS, TOY_TASK, timeout=3)
    assert outcome == "timeout"


@root_only
def test_a_process_spawning_loop_is_contained(run_program, tmp_path):
    outcome, _, _ = run_program(FORK_BOMB, TOY_TASK, timeout=3)
    assert outcome in ("timeout", "runtime_error")
    assert processes_under(f"{tmp_path}/") == []  # nothing it spawned survives
    assert subprocess.run(["true"]).returncode == 0  # and the machine still forks


# Forks until refused, then waits: it holds its whole process allowance (execute's 64, less bwrap's
# own two) as FORK_BOMB does, without spinning on the CPU, which would only make the test slow.
FORK_LOOP_REPLY = (
    "```cuda\n#include <unistd.h>\n__global__ void unused() {}\n"
    "int main() { for (;;) if (fork() < 0) pause(); }\n```\n"
)
HELD = 60  # processes in the forking run's folders once the loop is at its allowance, at least


@root_only
def test_a_fork_loop_in_one_run_leaves_another_runs_references_passing(tmp_path):
    """Two stage-04 runs, each its own process: while one run's candidate holds its processes, the
    other runs three tasks' references (nvcc in the sandbox, emulated runs). All pass, and once the
    forking run is killed nothing of either run is left."""
    task = next(t for t in load_tasks(TASKS_FILE) if t["split"] == "eval")
    sols = tmp_path / "fork_loop.jsonl"
    sols.write_text(json.dumps({"task_id": task["id"], "level": 1, "completion": FORK_LOOP_REPLY}))
    stage04 = [
        sys.executable,
        str(ROOT / "04_eval_kernels.py"),
        "--split",
        "eval",
        "--levels",
        "1",
        "--backend",
        "emulate",
    ]
    with open(tmp_path / "forking.log", "w") as log:
        forking = subprocess.Popen(
            [
                *stage04,
                "--solutions",
                str(sols),
                "--limit",
                "1",
                "--no-task-check",
                "--run-timeout",
                "600",
                "--out",
                str(tmp_path / "forking"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    forking_work = f"{tempfile.gettempdir()}/{WORK_PREFIX}{forking.pid}-"  # harness/programs.make_work_dir
    try:
        deadline = time.monotonic() + 300  # start, nvcc, the emulator's build, gen.py: seconds, here
        while (
            len(processes_under(forking_work)) < HELD
            and forking.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert len(processes_under(forking_work)) >= HELD, (tmp_path / "forking.log").read_text()
        reference = subprocess.Popen(
            [
                *stage04,
                "--reference",
                "--limit",
                "3",
                "--run-timeout",
                "10",
                "--out",
                str(tmp_path / "reference"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = reference.communicate(timeout=600)[0]
        reference_left = processes_under(f"{tempfile.gettempdir()}/{WORK_PREFIX}{reference.pid}-")
        held_throughout = len(processes_under(forking_work))
    finally:
        forking.kill()
        forking.wait()
    assert reference.returncode == 0, output[-3000:]
    outcomes = json.loads((tmp_path / "reference" / "summary.json").read_text())["outcomes"]
    assert outcomes["pass"] == sum(outcomes.values()) == 3, outcomes
    assert held_throughout >= HELD  # the loop held its processes while the references ran
    assert reference_left == []
    deadline = time.monotonic() + 10  # the killed run's sandbox dies with it (bwrap --die-with-parent)
    while processes_under(forking_work) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_under(forking_work) == []
    for folder in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}{forking.pid}-*"):
        shutil.rmtree(folder)  # what the killed run could not remove (a later stage 04 would)


@root_only
def test_writes_outside_the_sandbox_fail(run_program, tmp_path):
    tag = uuid.uuid4().hex
    targets = [
        f"/tmp/cuset-escape-{tag}",
        f"{tmp_path}/escape-{tag}",
        f"{ROOT}/escape-{tag}",
        f"../escape-{tag}",
        f"/var/tmp/cuset-escape-{tag}",
    ]
    outcome, log, _ = run_program(escape_program(targets), TOY_TASK)
    assert outcome == "wrong_output"
    for t in targets:
        path = Path(t) if t.startswith("/") else None
        assert path is None or not path.exists(), f"{t} was written: {log}"
    assert not list(tmp_path.rglob(f"escape-{tag}"))


def test_the_reference_output_is_not_reachable(run_program):
    gen_ref = run_program.gen_dir(TOY_TASK) / "data" / "y_ref.bin"
    paths = ["data/y_ref.bin", "../../gen/data/y_ref.bin", "../gen/data/y_ref.bin", str(gen_ref)]
    outcome, log, _ = run_program(steal_program(paths), TOY_TASK)
    assert outcome == "wrong_output", log
    assert "no reference reachable" in log


def test_megabytes_of_output_are_truncated(run_program):
    outcome, log, _ = run_program(FLOOD, TOY_TASK)
    assert outcome == "wrong_output"
    assert "bytes cut" in log and len(log) < 3 * LOG_KEEP


@pytest.mark.parametrize("source", [SEGFAULT, EXIT_3], ids=["segfault", "exit-3"])
def test_crashes_are_runtime_errors(run_program, source):
    outcome, log, _ = run_program(source, TOY_TASK)
    assert outcome == "runtime_error", log


# ---------------------------------------------------------------------------------------
# GPU: the full protocol
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["standalone", "kernel"])
def test_reference_passes_everything_on_the_gpu(tmp_path, mode):
    out = tmp_path / "ev"
    assert (
        ev.main(
            [
                "--reference",
                "--split",
                "eval",
                "--levels",
                "1",
                "--mode",
                mode,
                "--backend",
                "gpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    print(mode, summary["overall"], summary["outcomes"])
    assert summary["backend"] == "gpu" and summary["overall"]["pass@1"] == 1.0, summary["outcomes"]
    if mode == "kernel":
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert all(r.get("speedup") for r in rows)


def mutate(task_id: str, old: str, new: str) -> tuple[dict, str]:
    task = next(t for t in load_tasks(TASKS_FILE) if t["id"] == task_id)
    kernels = task["kernel_mode"]["reference_kernels"]
    assert old in kernels, f"{task_id}: mutation anchor {old!r} not found"
    return task, "```cpp\n" + kernels.replace(old, new) + "\n```"


def run_solution(tmp_path: Path, task: dict, completion: str, backend: str, *extra: str) -> dict:
    """One kernel-mode completion for one task through main(); its result row. Without the task check:
    tests/test_tasks.py shows every bundled reference passing, and these tests are about verdicts."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    sols = tmp_path / "sols.jsonl"
    sols.write_text(
        json.dumps({"task_id": task["id"], "level": 1, "sample": 0, "completion": completion}) + "\n"
    )
    out = tmp_path / "ev"
    assert (
        ev.main(
            [
                "--tasks",
                str(tasks),
                "--split",
                "all",
                "--levels",
                "1",
                "--mode",
                "kernel",
                "--backend",
                backend,
                "--solutions",
                str(sols),
                "--out",
                str(out),
                "--no-task-check",
                *extra,
            ]
        )
        == 0
    )
    return json.loads((out / "results.jsonl").read_text())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "task_id,old,new",
    [
        ("square_1500007", "if (i < n)", "if (i < n - 1)"),  # the guard drops the last element
        ("matmul_tiled_1000x750x900", "int kb = k0 + ty;", "int kb = ty;"),  # every step reads B's first tile
        # a warp-shuffle reduction that stops half way: lane 0 holds the sum of 16 lanes only
        (
            "dot_product_1048576",
            "for (int offset = 16; offset > 0; offset >>= 1)",
            "for (int offset = 8; offset > 0; offset >>= 1)",
        ),
        ("dot_product_1048576", "__shfl_down_sync", "__shfl_up_sync"),  # lane 0 keeps its own value
    ],
    ids=["guard-skips-last", "wrong-tile", "shuffle-stops-early", "shuffle-wrong-direction"],
)
def test_subtly_wrong_kernels_are_caught(tmp_path, backend, task_id, old, new):
    row = run_solution(tmp_path, *mutate(task_id, old, new), backend)
    assert row["outcome"] == "wrong_output", row


@pytest.mark.parametrize(
    "task_id,old,new",
    [
        # no barrier between filling the tree's cache and its first step: thread t reads cache[t + stride]
        ("array_sum_1048576", "cache[threadIdx.x] = v;\n    __syncthreads();", "cache[threadIdx.x] = v;"),
        # no barrier before the next tile overwrites the one other threads still read
        ("matmul_tiled_1000x750x900", "__syncthreads();  // the tiles are overwritten in the next step", ""),
    ],
    ids=["reduction-tree", "tiled-matmul"],
)
def test_a_missing_syncthreads_is_caught_under_emulation(tmp_path, task_id, old, new):
    assert run_solution(tmp_path / "ok", *mutate(task_id, old, old), "emulate")["outcome"] == "pass"
    row = run_solution(tmp_path / "race", *mutate(task_id, old, new), "emulate")
    assert row["outcome"] == "wrong_output", row


def test_a_butterfly_shuffle_reduction_passes_under_emulation(tmp_path):
    # __shfl_xor_sync leaves the warp's sum in every lane, so lane 0 still holds it
    row = run_solution(
        tmp_path, *mutate("dot_product_1048576", "__shfl_down_sync", "__shfl_xor_sync"), "emulate"
    )
    assert row["outcome"] == "pass", row


@pytest.mark.parametrize(
    "snippet,reason",
    [
        (
            "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n__device__ unsigned r32() "
            "{ return cg::tiled_partition<32>(cg::this_thread_block()).thread_rank(); }\n",
            "cooperative groups beyond the thread block",
        ),
        (
            "#include <cuda_fp16.h>\n__device__ __half twice(__half h) { return __hadd(h, h); }\n",
            "half precision",
        ),
        (
            '__device__ int lane() { int l; asm("mov.u32 %0, %%laneid;" : "=r"(l)); return l; }\n',
            "inline PTX",
        ),
    ],
    ids=["tiled-partition", "half", "inline-ptx"],
)
def test_what_the_emulator_cannot_run_is_unsupported_not_a_verdict(tmp_path, snippet, reason):
    task, completion = mutate("square_1500007", "__global__", snippet + "__global__")
    row = run_solution(tmp_path, task, completion, "emulate")
    assert row["outcome"] == "unsupported" and reason in row["log"], row
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["overall"]["unsupported"] == 1 and summary["outcomes"]["unsupported"] == 1


def test_the_thread_block_part_of_cooperative_groups_runs_under_emulation(tmp_path):
    task, completion = mutate(
        "matmul_tiled_1000x750x900", "__syncthreads();", "cg::this_thread_block().sync();"
    )
    completion = completion.replace(
        "__global__", "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n__global__", 1
    )
    completion = completion.replace(
        "int tx = threadIdx.x,",
        "cg::thread_block tb = cg::this_thread_block();\n"
        "    if (tb.thread_rank() != threadIdx.y * 16 + threadIdx.x) return;\n    int tx = threadIdx.x,",
    )
    assert run_solution(tmp_path, task, completion, "emulate")["outcome"] == "pass"


def test_uninitialised_shared_memory_reads_fail_visibly(tmp_path):
    # the kernel reads a __shared__ array nobody wrote; on a GPU it often holds zeros and passes
    row = run_solution(
        tmp_path,
        *mutate(
            "square_1500007",
            "float v = x[i];",
            "__shared__ float junk[256]; float v = x[i] + junk[threadIdx.x] * 0.0f;",
        ),
        "emulate",
    )
    assert row["outcome"] == "wrong_output", row  # 0xFF bytes are NaN, and NaN * 0 is NaN


def test_emulate_checks_reports_out_of_bounds_device_accesses(tmp_path):
    task, completion = mutate("square_1500007", "if (i < n)", "if (i < n + 64)")
    assert run_solution(tmp_path / "plain", task, completion, "emulate")["outcome"] in (
        "pass",
        "runtime_error",
    )
    row = run_solution(tmp_path / "asan", task, completion, "emulate", "--emulate-checks")
    assert row["outcome"] == "runtime_error" and "AddressSanitizer" in row["log"], row
    assert row["emulate_checks"] is True
