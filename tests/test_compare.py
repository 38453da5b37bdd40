"""research/compare_objectives.py: the comparison command end to end on a micro configuration (tiny model, 2
objectives x 2 seeds, 2 training steps, 3 held-out samples, stage 04 on one task under emulation, both
modes): stopped after 8 stage calls (--stop-after), killed (SIGKILL) in the middle of a training, continued
(finished runs and steps skipped, the training resumed), and called once more with everything done (it only
re-aggregates); the table checked against numbers recomputed here from the profiles and stage 04's rows;
how an interrupted stage is continued; refusals of misaligned profiles and bad options; a preset with a
greedy and a sampled evaluation; variants of stage 02 and stage 03; the paired bootstrap over seeds and
units and its power statement on matrices whose answer is known; the committed cpu-real record's table;
the presets as the options they give; no module under research/ past 500 lines."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from safetensors.numpy import load_file

from cuset_common.artifacts import args_to_json
from cuset_common.cli import UserError, run_main
from cuset_common.paths import EVAL_SFT_KERNEL_FILE, ROOT, SFT_KERNEL_FILE, TINY_MODEL
from research.comparison.bootstrap import paired_bootstrap
from research.comparison.command import main
from research.comparison.metrics import read_profile
from research.comparison.options import evaluations, parse_args
from research.comparison.plan import most_seeds, plan, seeds_text
from research.comparison.presets import PRESETS
from research.comparison.stages import stage_module
from research.comparison.steps import continuation, finished

OBJECTIVES, SEEDS = ("sft", "cuset"), 2
RUNS = [f"{o}-seed{s}" for s in range(SEEDS) for o in OBJECTIVES]  # seed by seed
SECOND = RUNS[1]  # cuset-seed0: the run killed during its training
MICRO = [
    "--preset",
    "cpu-quick",
    "--objectives",
    ",".join(OBJECTIVES),
    "--seeds",
    str(SEEDS),
    "--max-length",
    "512",
    "--standalone-args",
    "",
    "--regions-args",
    "--permutations 10 --html-samples 1",
    "--train-args",
    "--max-steps 2 --batch-size 4 --micro-batch-size 4 --save-every 1",
    "--eval-args",
    "--levels 1 --limit 1 --max-new-tokens 8 --backend emulate --jobs 2",
]


def artifact_mtimes(out: Path, runs: list[str]) -> dict[str, float]:
    return {
        str(p.relative_to(out)): p.stat().st_mtime_ns
        for r in runs
        for p in (out / r).rglob("*")
        if p.is_file() and p.name not in ("log.txt", "timings.json")
    }


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """The command run four times into one folder: stopped after 8 stage calls (base and sft-seed0), killed
    during cuset-seed0's training (after its first resume checkpoint), continued, called again."""
    tmp = tmp_path_factory.mktemp("compare")
    train, held = tmp / "train8.jsonl", tmp / "eval3.jsonl"
    train.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:8]))
    held.write_text("".join(EVAL_SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:3]))
    out = tmp / "out"
    argv = [
        sys.executable,
        str(ROOT / "research" / "compare_objectives.py"),
        *MICRO,
        "--data",
        str(train),
        "--eval-data",
        str(held),
        "--out",
        str(out),
    ]

    def call(*extra: str) -> str:
        r = subprocess.run([*argv, *extra], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout

    first = call("--stop-after", "8")  # base (4 calls) and sft-seed0 (4)
    after_first, md_after_first = artifact_mtimes(out, ["base", *RUNS]), (out / "comparison.md").exists()
    resume = out / SECOND / "ckpt" / "resume" / "state.pt"  # stage 03's checkpoint after step 1 of 2
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not resume.exists():
        assert proc.poll() is None and time.time() < deadline, (
            f"stage 03 of {SECOND} wrote no resume checkpoint"
        )
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1)  # the running stage gets SIGTERM from the kernel (PR_SET_PDEATHSIG)
    killed_mid_training = not (out / SECOND / "ckpt" / "meta.json").exists()
    second = call()
    after_second = artifact_mtimes(out, ["base", *RUNS])
    md_mtime = (out / "comparison.md").stat().st_mtime_ns
    third = call()
    return {
        "out": out,
        "train": train,
        "held": held,
        "logs": (first, second, third),
        "mtimes": (after_first, after_second, artifact_mtimes(out, ["base", *RUNS])),
        "md_mtime": md_mtime,
        "md_after_first": md_after_first,
        "killed_mid_training": killed_mid_training,
        "json": json.loads((out / "comparison.json").read_text()),
        "md": (out / "comparison.md").read_text(),
    }


def stage_calls(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("[compare]   python ")]


def test_an_interrupted_comparison_continues_and_skips_what_is_finished(micro):
    first, second, _ = micro["logs"]
    assert len(stage_calls(first)) == 8 and "stopped after 8 stage calls" in first
    assert not micro["md_after_first"]  # a stopped comparison aggregates nothing
    before, after = micro["mtimes"][:2]
    assert "sft-seed0/eval-standalone/summary.json" in before
    assert not any(k.startswith(SECOND) for k in before)
    assert micro["killed_mid_training"]
    # after the kill: base and sft-seed0 skipped whole, cuset-seed0's training continued from its checkpoint
    assert "base stages 01+02: finished, skipped" in second
    assert "run 1/4 sft-seed0: finished, skipped" in second
    calls = stage_calls(second)
    assert len(calls) == 20 - 8 and "03_train_cuset.py" in calls[0] and " --resume " in calls[0]
    assert "resumed at step 1" in (micro["out"] / SECOND / "log.txt").read_text()
    assert json.loads((micro["out"] / SECOND / "ckpt" / "meta.json").read_text())["final_step"] == 2
    assert "ETA" in second and all(after[k] == v for k, v in before.items()), (
        "a finished artifact was rewritten"
    )


def test_a_call_with_everything_finished_only_reaggregates(micro):
    third = micro["logs"][2]
    assert stage_calls(third) == [] and "0 stage calls" in third
    assert all(f"run {i}/4 {r}: finished, skipped" in third for i, r in enumerate(RUNS, start=1))
    assert micro["mtimes"][2] == micro["mtimes"][1]
    assert not any((micro["out"] / r / "ckpt" / "resume").exists() for r in RUNS)  # deleted once trained
    assert (micro["out"] / "comparison.md").stat().st_mtime_ns > micro["md_mtime"]


def test_a_record_without_weights_gives_the_same_table_and_runs_runs_only_its_runs(micro, tmp_path, capsys):
    """--save-record copies the finished groups without checkpoint weights (twice: the second replaces
    what the first copied and keeps the rest); --report-only on the copy, its
    mtimes reversed (a git checkout leaves them in any order), makes the comparison's table; --runs runs the
    runs it names only and writes no table."""
    out, record = micro["out"], tmp_path / "record"
    argv = [*MICRO, "--data", str(micro["train"]), "--eval-data", str(micro["held"])]
    assert run_main(main, [*argv, "--out", str(out), "--save-record", str(record)]) == 0
    assert sorted(p.name for p in record.iterdir()) == sorted(["base", *RUNS])
    assert sorted(p.name for p in (record / SECOND / "ckpt").iterdir()) == ["log.jsonl", "meta.json"]
    # saved again: each step's copy is replaced, what only the record holds (another session's) stays
    (record / "base" / "eval-kernel").mkdir()
    (record / SECOND / "profile-heldout" / "stale.txt").write_text("")
    assert run_main(main, [*argv, "--out", str(out), "--save-record", str(record)]) == 0
    assert (record / "base" / "eval-kernel").is_dir() and not list(record.rglob("*.tmp"))
    assert not (record / SECOND / "profile-heldout" / "stale.txt").exists()
    for i, p in enumerate(sorted(record.rglob("*"))):  # a folder's files older than the folders before them
        os.utime(p, ns=(10**18 - i * 10**9,) * 2)
    assert run_main(main, [*argv, "--out", str(record), "--report-only"]) == 0
    res = json.loads((record / "comparison.json").read_text())
    assert res["table"] == micro["json"]["table"] and res["paired"] == micro["json"]["paired"]
    md_mtime = (out / "comparison.md").stat().st_mtime_ns
    capsys.readouterr()
    assert run_main(main, [*argv, "--out", str(out), "--runs", RUNS[-1]]) == 0
    log = capsys.readouterr().out
    assert f"{RUNS[-1]}: finished, skipped" in log and "no table" in log
    assert not any(r in log for r in RUNS[:-1]) and (out / "comparison.md").stat().st_mtime_ns == md_mtime
    shutil.rmtree(record / RUNS[-1] / "eval-kernel")
    assert run_main(main, [*argv, "--out", str(record), "--report-only"]) == 2
    assert f"lacks results of {RUNS[-1]} (eval-kernel)" in capsys.readouterr().err


def profile(path: Path) -> tuple[dict, dict]:
    return load_file(str(path / "tensors.safetensors")), json.loads((path / "meta.json").read_text())


def test_the_table_matches_numbers_recomputed_from_the_profiles(micro):
    """NLL and accuracy per group, mean and std over seeds, and the paired difference to sft (its point
    estimate), recomputed here from the base model's and each checkpoint's held-out profile."""
    out, res = micro["out"], micro["json"]
    base, _ = profile(out / "base" / "profile-heldout")
    tau = load_file(str(out / "base" / "regions-heldout" / "tensors.safetensors"))["tau"]
    region = load_file(str(out / "base" / "regions-heldout" / "tensors.safetensors"))["region_id"] >= 0
    off = base["sample_offsets"]
    sample = np.repeat(np.arange(len(off) - 1), np.diff(off))
    hard = base["p0"] < tau[sample]
    groups = {
        "all": np.ones(len(sample), bool),
        "sensitive": base["c"] > 0,
        "base_hard": hard,
        "base_region": region,
        "cat.indexing": base["c"] == 2,
    }
    assert 0 < hard.sum() < len(hard) and region.any() and (base["c"] > 0).any()
    values, per_sample = {}, {}
    for o in OBJECTIVES:
        for s in range(SEEDS):
            t, _ = profile(out / f"{o}-seed{s}" / "profile-heldout")
            assert np.array_equal(t["token_ids"], base["token_ids"])
            nll, acc = -np.log(t["p0"].astype(np.float64)), t["argmax_correct"].astype(np.float64)
            for g, mask in groups.items():
                values.setdefault((o, f"{g}.nll"), []).append(nll[mask].mean())
                values.setdefault((o, f"{g}.acc"), []).append(acc[mask].mean())
            per_sample.setdefault(o, []).append([nll[sample == i].mean() for i in range(len(off) - 1)])
    token_table = micro["md"].split("## Held-out token metrics")[1].split("\n## ")[0]
    md_rows = {line.split(" | ")[0][2:]: line for line in token_table.splitlines() if line.startswith("| ")}
    for (o, metric), v in values.items():
        got = res["table"][o][metric]
        assert got["n"] == SEEDS and math.isclose(got["mean"], np.mean(v), rel_tol=1e-9), (o, metric)
        assert math.isclose(got["std"], np.std(v, ddof=1), rel_tol=1e-6, abs_tol=1e-12), (o, metric)
        if not metric.startswith("cat."):
            assert f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" in md_rows[o], (o, metric)
    diff = np.mean(np.mean(per_sample["cuset"], 0) - np.mean(per_sample["sft"], 0))
    paired = res["paired"]["cuset"]["all.nll"]
    assert math.isclose(paired["diff"], diff, rel_tol=1e-9) and paired["units"] == len(off) - 1
    assert paired["ci95"][0] <= paired["ci95"][1]
    paired_table = micro["md"].split("## Paired differences to sft")[1].split("\n## ")[0]
    assert f"| cuset | {diff:+.3f} [{paired['ci95'][0]:+.3f}, {paired['ci95'][1]:+.3f}] |" in paired_table


def test_kernel_verdicts_match_stage_04_rows(micro):
    """compile rate and pass@1 per objective: recomputed from each run's results.jsonl, averaged over seeds;
    the backend is labelled."""
    out, res = micro["out"], micro["json"]
    for o in OBJECTIVES:
        for mode in ("kernel", "standalone"):
            compiled, passed = [], []
            for s in range(SEEDS):
                rows = [
                    json.loads(x)
                    for x in (out / f"{o}-seed{s}" / f"eval-{mode}" / "results.jsonl")
                    .read_text()
                    .splitlines()
                ]
                assert len(rows) == 1 and rows[0]["backend"] == "emulated"
                compiled.append(
                    np.mean([r["outcome"] not in ("missing", "no_code", "compile_error") for r in rows])
                )
                passed.append(np.mean([r["outcome"] == "pass" for r in rows]))
            assert math.isclose(res["table"][o][f"{mode}.compile_rate"]["mean"], np.mean(compiled))
            assert math.isclose(res["table"][o][f"{mode}.pass@1"]["mean"], np.mean(passed))
    assert res["backends"] == ["emulated"] and "**emulated**" in micro["md"]
    assert "python 03_train_cuset.py" in micro["md"] and len(res["commands"]) == 4 + 4 * len(RUNS)


def test_misaligned_profiles_are_refused(micro, tmp_path):
    base = read_profile(micro["out"] / "base" / "profile-heldout")
    for field, value in (("tokenizer_fingerprint", "0" * 64), ("data", {"path": "x", "sha256": "1" * 64})):
        copy = tmp_path / field
        shutil.copytree(micro["out"] / "sft-seed0" / "profile-heldout", copy)
        meta = json.loads((copy / "meta.json").read_text()) | {field: value}
        (copy / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(UserError, match="another (tokenizer|data)"):
            read_profile(copy, base)


def test_a_greedy_and_a_sampled_evaluation_a_regions_variant_and_the_base_model(tmp_path):
    """The cpu-power preset (on the tiny model, one seed): its two evaluations, `kernel` (greedy, one reply)
    and `kernel-sampled` (4 replies), each into eval-<name> of the base model and of every run, with the
    greedy verdict, the sampled pass@1 and pass@4 side by side in the table and both pass@1s paired;
    cuset.no-snap trains on regions stage 02 made with --no-snap-lines, whose coverage is reported."""
    train, held, out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl", tmp_path / "out"
    train.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:6]))
    held.write_text("".join(EVAL_SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:2]))
    argv = [
        "--preset",
        "cpu-power",
        "--model",
        str(ROOT / "data" / "models" / "tiny-cuda-lm"),
        "--seeds",
        "1",
        "--objectives",
        "sft,cuset.no-snap",
        "--data",
        str(train),
        "--eval-data",
        str(held),
        "--out",
        str(out),
        "--max-length",
        "512",
        "--regions-args",
        "--permutations 10 --html-samples 1",
        "--train-args",
        "--max-steps 1 --batch-size 2 --micro-batch-size 2",
        "--eval-args",
        "--levels 1 --limit 1 --max-new-tokens 8 --backend emulate --jobs 1",
    ]
    r = subprocess.run(
        [sys.executable, str(ROOT / "research" / "compare_objectives.py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res, base = json.loads((out / "comparison.json").read_text()), out / "base"
    md = (out / "comparison.md").read_text()
    sampled = evaluations(PRESETS["cpu-power"]["evaluation"], None)["kernel-sampled"]
    temperature = float(sampled[sampled.index("--temperature") + 1])
    assert json.loads((base / "regions.no-snap" / "meta.json").read_text())["args"]["snap_lines"] is False
    ckpt_meta = json.loads((out / "cuset.no-snap-seed0" / "ckpt" / "meta.json").read_text())
    assert Path(ckpt_meta["args"]["regions"]) == base / "regions.no-snap"
    for variant in ("regions", "regions.no-snap"):
        inside = load_file(str(base / variant / "tensors.safetensors"))["region_id"] >= 0
        assert math.isclose(res["region_coverage"][variant], inside.mean(), rel_tol=1e-9)
    for group, row in (("base", "base"), ("sft-seed0", "sft"), ("cuset.no-snap-seed0", "cuset.no-snap")):
        for name, n in (("kernel", 1), ("kernel-sampled", 4)):
            folder = out / group / f"eval-{name}"
            fingerprint = json.loads((folder / "fingerprint.json").read_text())
            assert json.loads((folder / "summary.json").read_text())["num_samples"] == n, folder
            assert fingerprint["temperature"] == (temperature if n > 1 else 0.0)
            rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
            assert sorted(x["sample"] for x in rows) == list(range(n))
            passed = np.mean([x["outcome"] == "pass" for x in rows])  # c / n of the one prompt
            assert res["table"][row][f"{name}.pass@1"]["mean"] == passed
            assert res["per_run"][group]["units"][f"{name}.pass@1"] == {f"{rows[0]['task_id']}/L1": passed}
        assert not (out / group / "eval-standalone").exists()  # the preset's evaluations: kernel mode only
    assert res["k"] == {"kernel": [1], "kernel-sampled": [4]}
    kernel_table = md.split("## Kernel verdicts")[1].split("\n## ")[0]
    assert (
        "| objective | kernel.compile_rate | kernel.pass@1 | kernel-sampled.compile_rate | "
        "kernel-sampled.pass@1 | kernel-sampled.pass@4 |"
    ) in kernel_table
    assert f"`kernel-sampled` ({' '.join(sampled)}; 4 replies" in kernel_table
    assert set(res["paired"]) == {"cuset.no-snap", "base"}
    for o in res["paired"]:
        for name in ("kernel", "kernel-sampled"):
            p = res["paired"][o][f"{name}.pass@1"]
            assert p["units"] == 1 and p["seeds"] == [1, 1]
            assert f"- {o}: resolves differences of " in md and f"in pass@1 ({name})" in md
    assert (
        "## Paired differences to sft (95% bootstrap interval; resampled: units; one seed, so no seed draw)"
        in md
        and "the seed draw is a no-op" in md
    )


def test_a_training_variant_adds_its_stage_03_arguments_to_its_objective_only(tmp_path):
    """profit.t01 trains profit with --profit-threshold 0.01 (as stage 03 parses it) on the default
    regions; no regions of its own are made; a variant is refused for an objective it does not apply to."""
    args = parse_args(
        [*MICRO, "--objectives", "sft,profit,profit.t01", "--seeds", "1", "--out", str(tmp_path)]
    )
    base_steps, runs = plan(args)
    assert [s["out"].name for s in base_steps if s["stage"] == "02"] == ["regions", "regions-heldout"]
    train = {r["objective"]: stage_module("03").parse_args(r["steps"][0]["argv"]) for r in runs}
    assert train["profit.t01"].profit_threshold == 0.01 and train["profit"].profit_threshold == 0.1
    assert train["profit.t01"].objective == "profit" and train["sft"].profit_threshold == 0.1
    assert train["profit.t01"].regions == train["profit"].regions == tmp_path / "base" / "regions"
    assert [r["name"] for r in runs] == ["sft-seed0", "profit-seed0", "profit.t01-seed0"]
    for label in ("cuset.t01", "sft.t01", "profit.no-snap", "cuset.bogus"):
        with pytest.raises(UserError, match=f"unknown objective {label}"):
            parse_args([*MICRO, "--objectives", f"sft,{label}", "--out", str(tmp_path)])


def test_more_seeds_for_some_objectives_come_after_every_objective_s_first_seeds(tmp_path):
    """--seeds-for sft=4 adds sft's seeds 2 and 3 after the seeds every objective has; the report counts
    each objective's own seeds; a preset's --seeds-for gives way to a --seeds typed on the command line."""
    args = parse_args([*MICRO, "--seeds-for", "sft=4", "--out", str(tmp_path)])
    assert [r["name"] for r in plan(args)[1]] == [*RUNS, "sft-seed2", "sft-seed3"]
    assert seeds_text(args) == "2 seeds (sft 4)" and most_seeds(args) == 4
    power = ["--preset", "cpu-power", "--model", str(TINY_MODEL), "--out", str(tmp_path)]
    more = {
        label: int(n)
        for label, _, n in (x.partition("=") for x in PRESETS["cpu-power"]["seeds_for"].split(","))
    }
    chosen = ["sft", "dft", "profit.t01"]
    assert parse_args([*power, "--objectives", ",".join(chosen)]).seeds_for == {
        label: more[label] for label in chosen if label in more
    }
    assert parse_args([*power, "--seeds", "2"]).seeds_for == {}


@pytest.mark.parametrize(
    "argv,msg",
    [
        ([*MICRO, "--seeds-for", "sft"], "write objective=N"),
        ([*MICRO, "--seeds-for", "sft=3,sft=4"], "each objective once"),
        ([*MICRO, "--seeds-for", "profit=3"], "name one of --objectives (sft,cuset)"),
        ([*MICRO, "--seeds-for", "cuset=0"], "with one seed or more"),
        (["--objectives", "sft,bogus"], "unknown objective"),
        (["--objectives", "sft.no-snap"], "unknown objective"),
        (["--objectives", "sft,cuset.t01"], "unknown objective cuset.t01"),
        (["--modes", "kernel", "--evaluation", "kernel"], "not both"),
        (["--evaluation", "greedy"], "a name begins with its mode"),
        (["--evaluation", "kernel", "--evaluation", "kernel"], "each name once"),
        (["--evaluation", "kernel-x=--mode standalone"], "leave --mode out"),
        (
            ["--evaluation", "kernel-x=--top-p 2"],
            "--evaluation kernel-x ('--top-p 2'): python 04_eval_kernels.py",
        ),
        (["--objectives", "cuset"], "must include sft"),
        (["--data", "nowhere.jsonl"], "pass --eval-data"),
        (["--runs", "sft-seed0,sft-seed9"], "no run sft-seed9"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv, msg, capsys):
    assert run_main(main, argv) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_an_interrupted_stage_is_continued_with_its_own_resume(tmp_path):
    """What a step killed mid-stage gets: stage 01 --resume when <out>.partial/ holds the same run (another
    run's
    partial folder is removed), stage 03 --resume when <ckpt>/resume/ holds the same run (--force when it
    holds
    another one), stage 04 --force when its folder holds another run (the same run resumes by itself)."""
    args = parse_args([*MICRO, "--out", str(tmp_path)])
    base_steps, runs = plan(args)
    train, held, ev = runs[0]["steps"][0], runs[0]["steps"][1], runs[0]["steps"][2]
    assert [s["stage"] for s in runs[0]["steps"]] == ["03", "01", "04", "04"] and continuation(
        train, print
    ) == ()

    def saved(step: dict, **change) -> dict:
        return args_to_json(stage_module(step["stage"]).parse_args(step["argv"])) | change

    state = stage_module("01").partial_dir(held["out"]) / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"args": saved(held, log_every=1.0)}))
    assert continuation(held, print) == ("--resume",)
    state.write_text(json.dumps({"args": saved(held, chunk_rows=7)}))
    assert continuation(held, print) == () and not state.parent.exists()
    state.parent.mkdir()
    state.write_text(json.dumps({"args": saved(held)}))
    (train["out"] / "meta.json").parent.mkdir(parents=True)
    (train["out"] / "meta.json").write_text("{}")
    os.utime(
        train["out"] / "meta.json", (state.stat().st_mtime + 10,) * 2
    )  # the checkpoint was trained again
    assert continuation(held, print) == () and not state.parent.exists()
    (train["out"] / "meta.json").unlink()

    (train["out"] / "resume").mkdir(parents=True)
    (train["out"] / "resume" / "args.json").write_text(json.dumps(saved(train, save_every=3)))
    assert continuation(train, print) == ("--resume",)
    (train["out"] / "resume" / "args.json").write_text(json.dumps(saved(train, lr=1.0)))
    assert continuation(train, print) == ("--force",)

    ev["out"].mkdir(parents=True)
    (ev["out"] / "fingerprint.json").write_text(json.dumps({"model": "another"}))
    assert continuation(ev, print) == ("--force",) and not finished(ev)


# ---------------------------------------------------------------------------------------
# The paired bootstrap over seeds and units, on matrices [seeds, units] whose answer is known
# ---------------------------------------------------------------------------------------

# Float tolerance of a statistic that is exact in real arithmetic: means of at most a few hundred values of
# magnitude <= 3 in float64 (eps 2.2e-16) round to within 1e-13; 1e-12 leaves a margin.
EXACT = 1e-12


def bootstrap_variance(d: np.ndarray, seed_offsets: list[np.ndarray]) -> float:
    """The bootstrap's own variance of the statistic when objective - sft is d[u] (per unit) plus additive
    seed offsets on each side: a mean of U units drawn with replacement has variance var_pop(d) / U, a
    mean of S seeds drawn with replacement var_pop(offsets) / S, and the draws are independent."""
    return d.var() / len(d) + sum(e.var() / len(e) for e in seed_offsets)


def test_identical_matrices_give_an_interval_around_0_as_narrow_as_the_seeds_allow():
    """The objective and sft the same matrix: every unit's value cancels in each resample (paired by unit),
    so the statistic is the mean of the objective's drawn seed offsets minus sft's; with seeds that agree
    the interval is exactly 0, with seeds that disagree it stays within the offsets' range."""
    units = np.random.default_rng(1).normal(0.0, 1.0, 120)  # [U]: prompts far apart
    agree = np.tile(units, (3, 1))  # [S, U]
    p = paired_bootstrap(agree, agree.copy(), 2000)
    assert p["units"] == 120 and p["seeds"] == [3, 3]
    assert all(abs(x) <= EXACT for x in (p["diff"], *p["ci95"], p["se"]))
    offsets = np.array([-0.01, 0.0, 0.02])  # [S]
    disagree = units + offsets[:, None]  # [S, U]
    p = paired_bootstrap(disagree, disagree.copy(), 2000)
    spread = offsets.max() - offsets.min()
    assert abs(p["diff"]) <= EXACT and -spread - EXACT <= p["ci95"][0] < 0 < p["ci95"][1] <= spread + EXACT


def test_a_known_shift_is_recovered_with_the_standard_error_of_the_design():
    """The objective is sft plus 0.05 at every entry: each resample's statistic is 0.05 (the units and
    seeds cancel). Then sft's values plus 0.05 plus noise per unit, seeds that agree: the estimate is the
    noise's mean plus 0.05, and the bootstrap's standard error that of a mean of U paired differences."""
    rng = np.random.default_rng(2)  # the matrices' values; the bootstrap draws with its own seed
    sft = rng.normal(0.5, 0.3, (3, 150)) + rng.normal(0, 0.05, (3, 1))  # [S, U], seeds that disagree
    p = paired_bootstrap(sft + 0.05, sft, 2000)
    assert math.isclose(p["diff"], 0.05, abs_tol=EXACT)
    assert max(abs(x - 0.05) for x in p["ci95"]) > 0.001  # the seeds are drawn apart: they do not cancel
    same = paired_bootstrap(np.tile(sft[0] + 0.05, (3, 1)), np.tile(sft[0], (3, 1)), 500)
    assert all(math.isclose(x, 0.05, abs_tol=EXACT) for x in (same["diff"], *same["ci95"]))
    noise = rng.normal(0, 0.2, 150)  # [U]
    shifted = paired_bootstrap(np.tile(sft[0] + 0.05 + noise, (3, 1)), np.tile(sft[0], (3, 1)), 2000)
    assert math.isclose(shifted["diff"], 0.05 + noise.mean(), abs_tol=EXACT)
    assert shifted["ci95"][0] < 0.05 + noise.mean() < shifted["ci95"][1]
    # 2,000 resamples estimate a standard error to about 1/sqrt(2 x 2000) = 1.6% (normal approximation)
    assert math.isclose(shifted["se"], np.sqrt(bootstrap_variance(noise, [])), rel_tol=0.08)


def test_resampling_seeds_widens_the_interval_when_seeds_disagree_and_not_when_they_agree():
    """The same units, with and without seed offsets. The offsets are the same on both sides: a bootstrap
    that drew one seed index for both would cancel them; drawn apart, each side adds var(offsets) / S."""
    rng = np.random.default_rng(3)
    sft = rng.normal(0.3, 0.3, 100)  # [U]
    d = rng.normal(0.02, 0.1, 100)  # [U]: objective - sft per unit
    offsets = np.array([-0.03, 0.0, 0.03])  # [S]: seed to seed, twice the units' standard error (0.01)
    agree = paired_bootstrap(np.tile(sft + d, (3, 1)), np.tile(sft, (3, 1)), 2000)
    one_seed = paired_bootstrap((sft + d)[None], sft[None], 2000)
    disagree = paired_bootstrap(sft + d + offsets[:, None], sft + offsets[:, None], 2000)
    assert one_seed["seeds"] == [1, 1] and agree["seeds"] == disagree["seeds"] == [3, 3]
    for p in (agree, one_seed, disagree):
        assert math.isclose(p["diff"], d.mean(), abs_tol=EXACT)
    # each standard error against the bootstrap's own variance of this design (1.6% Monte Carlo, above)
    assert math.isclose(agree["se"], np.sqrt(bootstrap_variance(d, [])), rel_tol=0.08)
    assert math.isclose(one_seed["se"], np.sqrt(bootstrap_variance(d, [])), rel_tol=0.08)
    assert math.isclose(disagree["se"], np.sqrt(bootstrap_variance(d, [offsets, offsets])), rel_tol=0.08)
    width = {k: p["ci95"][1] - p["ci95"][0] for k, p in (("agree", agree), ("disagree", disagree))}
    assert width["disagree"] > 1.5 * width["agree"]  # sqrt(1 + 2 x 0.0006 / 3 / (0.01 / 100)) = 2.2 expected


def test_units_without_a_value_and_one_seed_against_three():
    """A prompt without a verdict in one seed (stage 04's `unsupported`) counts with the seeds that have one;
    a unit with no value on a side is left out; the base model (one run) is paired with sft's three seeds."""
    rng = np.random.default_rng(4)
    base, sft = rng.random((1, 40)), rng.random((3, 40))  # [1, U], [3, U]
    base[0, 7], sft[1, 3], sft[:, 5] = np.nan, np.nan, np.nan
    p = paired_bootstrap(base, sft, 2000)
    keep = [u for u in range(40) if u not in (5, 7)]
    expected = np.mean([base[0, u] - np.nanmean(sft[:, u]) for u in keep])
    assert p["units"] == 38 and p["seeds"] == [1, 3] and math.isclose(p["diff"], expected, abs_tol=EXACT)
    assert p["ci95"][0] < expected < p["ci95"][1] and not math.isnan(p["se"])
    assert paired_bootstrap(np.full((2, 3), np.nan), sft[:, :3], 100)["units"] == 0


def test_the_power_statement_is_the_difference_detected_four_times_in_five():
    """resolves = (z_0.975 + z_0.8) x SE: a true difference of that size, estimated with that standard
    error, lies beyond the 5% two-sided critical value (1.96 SE) with probability 0.8."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.1, 0.3, (3, 80)), rng.normal(0.0, 0.3, (3, 80))
    p = paired_bootstrap(a, b, 2000)
    z = NormalDist()
    power = 1 - z.cdf(z.inv_cdf(0.975) - p["resolves"] / p["se"])
    assert math.isclose(power, 0.8, abs_tol=1e-9)
    assert math.isclose(p["resolves"] / p["se"], 1.96 + 0.84, abs_tol=0.005)
    assert p == paired_bootstrap(a.copy(), b.copy(), 2000)  # the same draws every time (seed 0)


def test_the_committed_cpu_real_record_still_makes_its_table(tmp_path):
    """--report-only on a copy of docs/records/cpu-real (its evaluations are the old `kernel` mode): the
    table comes out, the point estimates of the paired differences are those the record holds (the
    bootstrap changed, not the estimate), every interval brackets its estimate, and the kernel verdicts
    are each run's stage-04 summary averaged over seeds."""
    record = tmp_path / "cpu-real"
    shutil.copytree(ROOT / "docs" / "records" / "cpu-real", record)
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "research" / "compare_objectives.py"),
            "--preset",
            "cpu-real",
            "--report-only",
            "--out",
            str(record),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((record / "comparison.json").read_text())
    committed = json.loads((ROOT / "docs" / "records" / "cpu-real" / "comparison.json").read_text())
    assert set(res["paired"]) == set(committed["paired"]) == {"profit", "cuset", "cuset.no-snap", "base"}
    for o, metrics in committed["paired"].items():
        for key, old in metrics.items():
            new = res["paired"][o][key]
            assert math.isclose(new["diff"], old["diff"], abs_tol=EXACT) and new["units"] == old["units"]
            assert new["ci95"][0] <= new["diff"] <= new["ci95"][1]
            assert new["seeds"] == [1 if o == "base" else 2, 2] and new["resolves"] > 0
    for o in ("sft", "profit", "cuset", "cuset.no-snap"):
        passes = [
            json.loads((record / f"{o}-seed{s}" / "eval-kernel" / "summary.json").read_text())["overall"][
                "pass@1"
            ]
            for s in range(2)
        ]
        assert math.isclose(res["table"][o]["kernel.pass@1"]["mean"], np.mean(passes), abs_tol=EXACT)
    md = (record / "comparison.md").read_text()
    assert "| objective | kernel.compile_rate | kernel.pass@1 |" in md
    assert "resampled: seeds and units)" in md and "- cuset: resolves differences of " in md
    assert "Every metric's resolvable difference" in md


# ---------------------------------------------------------------------------------------
# The presets as data (research/comparison/presets.py) and the modules' size
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_is_the_options_it_gives_and_a_typed_option_overrides_it(name, tmp_path):
    """Naming a preset plans the same comparison as typing its options (presets.py holds them as typed);
    an option typed beside it wins: a typed --seeds drops the preset's --seeds-for, a typed --modes its
    evaluations, a typed --train-args its training arguments, and the rest stays the preset's."""
    options = {k: v for k, v in PRESETS[name].items() if k != "note"}
    objectives = f"{options.pop('objectives')},profit.t01"  # every objective a --seeds-for may name
    common = ["--preset", name, "--report-only", "--out", str(tmp_path), "--objectives", objectives]
    typed_out = []
    for option, value in options.items():
        flag = "--" + option.replace("_", "-")
        if isinstance(value, bool):
            typed_out.append(flag if value else f"--no-{flag[2:]}")
        else:
            typed_out += [x for v in (value if isinstance(value, list) else [value]) for x in (flag, str(v))]
    args = parse_args(common)
    assert vars(args) == vars(parse_args([*common, *typed_out]))
    typed = parse_args([*common, "--seeds", "1", "--modes", "kernel", "--train-args", "--max-steps 1"])
    assert typed.seeds == 1 and typed.seeds_for == {} and typed.evaluations == {"kernel": []}
    assert typed.train_args == ["--max-steps", "1"] and typed.eval_args == args.eval_args


def test_every_module_of_the_comparison_is_at_most_500_lines():
    """The comparison is split by concept (research/comparison/, one idea a module): no module of it, nor
    its command, holds more than 500 lines."""
    comparison = [
        ROOT / "research" / "compare_objectives.py",
        *(ROOT / "research" / "comparison").glob("*.py"),
    ]
    lines = {p: len(p.read_text().splitlines()) for p in comparison}
    assert not {str(p.relative_to(ROOT)): n for p, n in lines.items() if n > 500}
