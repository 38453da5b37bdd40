"""Stages 01 and 02 on hostile but realistic input: settings at the edge of their ranges, a model or profile
that holds NaN, inputs rewritten while a stage reads them, a full disk, a folder name that is not UTF-8,
and a response that would make the tagger quadratic.

Each case either works, with finite results, or is refused in one line (`error: ...`, exit status 2),
nothing before overwritten or lost. Stage 02 runs on synthetic profiles (tests/test_label_regions.py:
make_profile); stage 01 on two or three samples of the bundled data with the tiny model.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import refused, snapshot
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file
from test_label_regions import make_profile, random_samples

import cuset_common.artifacts as artifacts
import cuset_common.labeling.options as regions_options
import cuset_common.profiler.options as profile_options
import cuset_common.profiler.shards as shards
from cuset_common.artifacts import file_records, tokenizer_fingerprint, write_artifact
from cuset_common.cli import UserError, load_script, run_main
from cuset_common.files import sha256_file
from cuset_common.labeling.artifact import room_needed
from cuset_common.labeling.inputs import load_profile
from cuset_common.labeling.options import parse_args as parse_regions_args
from cuset_common.out_dir import size_text
from cuset_common.paths import SFT_KERNEL_FILE, TINY_MODEL
from cuset_common.profiler.tagger import CATEGORIES, tag_tokens

stage01 = load_script("01_profile.py")
stage02 = load_script("02_label_regions.py")
NO_SPACE = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors 0.8


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def world(tmp_path, tiny_tokenizer) -> dict:
    """A data file, a synthetic profile of 30 samples made from it, and stage 02's arguments on them."""
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "p", "completion": "c"}\n')
    profile = make_profile(
        tmp_path / "profile",
        random_samples(30, seed=0),
        str(TINY_MODEL),
        data,
        tokenizer_fingerprint(tiny_tokenizer),
    )
    argv = ["--model", TINY_MODEL, "--data", data, "--profile", profile, "--permutations", "20"]
    return {
        "root": tmp_path,
        "data": data,
        "profile": profile,
        "argv": [*argv, "--out", tmp_path / "regions"],
    }


def rewrite_tensors(folder: Path, change) -> None:
    """Change an artifact's tensors as a damaged run would write them (write_artifact refuses NaN), and
    record the new file in its meta.json, so that only the values are wrong."""
    t = load_file(str(folder / "tensors.safetensors"))
    change(t)
    save_file(t, str(folder / "tensors.safetensors"))
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"] = file_records(folder)
    (folder / "meta.json").write_text(json.dumps(meta))


def read_regions(folder: Path) -> tuple[dict, dict]:
    return load_file(str(folder / "tensors.safetensors")), json.loads((folder / "meta.json").read_text())


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """Three samples of the bundled kernel SFT data, for stage 01."""
    path = tmp_path_factory.mktemp("data") / "d3.jsonl"
    path.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:3]))
    return path


def argv01(data: Path, out: Path, *extra) -> list:
    return [
        "--data",
        data,
        "--max-length",
        "256",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--out",
        out,
        *extra,
    ]


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory) -> Path:
    """The tiny model with every weight NaN: what a diverged training run leaves."""
    from safetensors.torch import load_file as load_torch
    from safetensors.torch import save_file as save_torch

    folder = tmp_path_factory.mktemp("models") / "nan-lm"
    shutil.copytree(TINY_MODEL, folder)
    weights = load_torch(str(folder / "model.safetensors"))
    nan = {name: torch.full_like(w, float("nan")) for name, w in weights.items()}
    save_torch(nan, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# ---------------------------------------------------------------------------------------
# 1. No seed: no region, and every weight defined
# ---------------------------------------------------------------------------------------


def test_grow_regions_without_a_low_token_has_no_region():
    sample_of = np.array([0, 0, 1, 1, 1])
    for low in (np.zeros(5, bool), np.array([1, 0, 0, 1, 0], bool)):  # no low token; low tokens, no seed
        starts, ends = stage02.grow_regions(low, np.zeros(5, bool), sample_of, gap=2)
        assert starts.dtype == ends.dtype == np.int64 and len(starts) == len(ends) == 0


@pytest.mark.parametrize("knob", [["--rho", "0"], ["--tau-max", "1e-30"]])
def test_a_profile_without_seeds_has_no_regions_and_unit_weights(world, capsys, knob):
    """--rho 0 (no token below its sample's least p0) and --tau-max 1e-30 leave no low-confidence token:
    no region anywhere, m = 0 and w = 1 for every sample (docs/method.md "Regions", Sample weight)."""
    assert stage02.main([*map(str, world["argv"]), *knob]) == 0
    t, meta = read_regions(world["root"] / "regions")
    assert len(t["region_start"]) == 0 and (t["region_id"] == -1).all()
    assert (t["m"] == 0).all() and (t["w"] == 1).all()
    assert meta["counts"]["regions"] == 0 and meta["counts"]["seeds"] == 0
    assert "0 regions in 0 of 30 samples" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# 2. Weights at the ends of their ranges are finite
# ---------------------------------------------------------------------------------------


def test_weights_are_finite_at_the_largest_alpha_and_w_max():
    rng = np.random.default_rng(0)
    n = rng.integers(0, 4000, 500)
    m = np.where(n > 0, rng.random(500) * (rng.random(500) < 0.5), 0.0)
    for alpha, w_max in ((1e306, 1e306), (1.7976931348623157e308, 3.4028234663852886e38), (1e-300, 1e306)):
        for norm in ("token-mean", "none"):
            w = stage02.sample_weights(m, n, alpha, w_max, norm)
            assert np.isfinite(w).all() and (w >= 0).all() and w.max() <= w_max
        w = stage02.sample_weights(m, n, alpha, w_max)
        assert (n * w).sum() / n.sum() == pytest.approx(1.0, rel=1e-12)


def test_weights_in_the_usual_range_are_the_plain_formula_bit_for_bit():
    """The overflow guard scales by a power of 2 only where it must: the usual weights are
    clip(...) * sum n / sum n w, as docs/method.md writes them."""
    rng = np.random.default_rng(1)
    n = rng.integers(0, 3000, 400)
    m = np.where(n > 0, rng.random(400) * 0.3, 0.0)
    raw = np.clip(1.0 + 1.0 * m / m[n > 0].mean(), 1.0, 3.0)
    assert np.array_equal(stage02.sample_weights(m, n, 1.0, 3.0), raw * n.sum() / (n * raw).sum())


@pytest.mark.parametrize("norm", ["token-mean", "none"])
def test_stage_02_at_the_largest_alpha_and_w_max_writes_finite_weights(world, norm):
    """alpha 1e306 and w_max 3e38 (the largest in range: w is stored in float32): finite weights, and with
    the token-mean norm at token-weighted mean 1."""
    knobs = ["--alpha", "1e306", "--w-max", "3e38", "--weight-norm", norm]
    assert stage02.main([*map(str, world["argv"]), *knobs]) == 0
    t, meta = read_regions(world["root"] / "regions")
    n, w = np.diff(t["sample_offsets"]), t["w"].astype(np.float64)
    assert np.isfinite(w).all() and len(t["region_start"]) > 0 and w.max() <= np.float32(3e38)
    assert norm == "none" or (n * w).sum() / n.sum() == pytest.approx(1.0, rel=1e-5)


def test_w_max_beyond_float32_is_refused_before_any_work(world, capsys):
    """w is stored in float32: a clip above its largest value could write inf (--weight-norm none)."""
    line, _ = refused(stage02.main, [*world["argv"], "--alpha", "1e306", "--w-max", "1e306"], capsys)
    assert "--w-max 1e+306" in line and "3.4028234663852886e+38" in line
    assert not (world["root"] / "regions").exists()


def test_write_artifact_never_writes_a_non_finite_float(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "keep.txt").write_text("the folder as it was\n")
    before = snapshot(tmp_path)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(UserError, match="tensor w holds 1 values that are NaN or infinite"):
            write_artifact(tmp_path / "a", {"w": np.array([1.0, bad], np.float32)}, {"stage": "x"})
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------
# 3. Non-finite inputs: one line, before any work
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, 1.5])
def test_stage_02_refuses_a_profile_whose_p0_is_not_a_probability(world, capsys, value):
    def spoil(t):  # NaN: all of it, as a diverged model gives; the others: one token
        t["p0"][slice(None) if np.isnan(value) else 5] = value

    rewrite_tensors(world["profile"], spoil)
    line, _ = refused(stage02.main, world["argv"], capsys)
    assert f"{world['profile'] / 'tensors.safetensors'}: p0 holds" in line
    assert "rerun stage 01 with a model that gives finite probabilities: python 01_profile.py" in line
    assert not (world["root"] / "regions").exists()


@pytest.mark.slow  # stage 01 runs the tiny model
def test_stage_01_stops_on_a_model_that_gives_nan(tmp_path, capsys, small_data, nan_model):
    """Every weight NaN: one line naming the model, exit 2, the previous profile in --out as it was and
    no partial state (the first batch is checked before it could be saved)."""
    out = tmp_path / "profile"
    assert stage01.main(list(map(str, argv01(small_data, out)))) == 0
    before = snapshot(tmp_path)
    line, _ = refused(
        stage01.main, argv01(small_data, out, "--model", nan_model, "--save-every", "0"), capsys
    )
    assert f"--model {nan_model}: gives non-finite log-probabilities" in line
    assert "Rerun stage 01 with a model that gives finite log-probabilities" in line
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------
# 4. What a stage records of its inputs is what it read
# ---------------------------------------------------------------------------------------


def test_stage_02_records_the_profile_it_read_not_the_one_on_disk_at_its_end(world, monkeypatch):
    """The profile is rewritten (another of 9 samples) while stage 02 labels the first one: meta.json names
    the sha256 of the files it read."""
    files = ("meta.json", "tensors.safetensors")
    read = {name: sha256_file(world["profile"] / name) for name in files}
    label, fingerprint = stage02.label_regions, json.loads((world["profile"] / "meta.json").read_text())

    def rewrite_then_label(t, args):
        make_profile(
            world["profile"],
            random_samples(9, seed=7),
            str(TINY_MODEL),
            world["data"],
            fingerprint["tokenizer_fingerprint"],
        )
        return label(t, args)

    monkeypatch.setattr(stage02, "label_regions", rewrite_then_label)
    assert stage02.main(list(map(str, world["argv"]))) == 0
    _, meta = read_regions(world["root"] / "regions")
    on_disk = sha256_file(world["profile"] / "meta.json")
    assert on_disk != read["meta.json"]
    assert meta["profile"]["meta_sha256"] == read["meta.json"]
    assert meta["profile"]["tensors_sha256"] == read["tensors.safetensors"]
    assert meta["counts"]["samples"] == 30


@pytest.mark.slow  # stage 01 runs the tiny model
def test_stage_01_records_the_sha256_of_the_data_it_read(tmp_path, monkeypatch, small_data):
    """--data is rewritten right after it is parsed: the profile records the sha256 of the bytes parsed
    (the data's reader hashed the file again, after parsing it, so it named the new one)."""
    data = tmp_path / "d.jsonl"
    shutil.copy(small_data, data)
    original = sha256_file(data)
    for module in (
        "cuset_common.data_sources",
        "cuset_common.profiler.inputs",
    ):  # where stage 01 parses JSONL from
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        parse = mod.load_sft

        def parse_then_rewrite(path, content=None, parse=parse):
            records = parse(path, content)
            Path(path).write_text(small_data.read_text().splitlines(keepends=True)[0])
            return records

        monkeypatch.setattr(mod, "load_sft", parse_then_rewrite)
    assert stage01.main(list(map(str, argv01(data, tmp_path / "profile")))) == 0
    meta = json.loads((tmp_path / "profile" / "meta.json").read_text())
    assert meta["data"]["sha256"] == original and meta["counts"]["samples"] == 3


# ---------------------------------------------------------------------------------------
# 5. Room and a full disk
# ---------------------------------------------------------------------------------------


def test_stage_02_asks_for_the_room_of_what_it_writes(world, monkeypatch, capsys):
    """The room check asks for room_needed (an over-estimate of the regions artifact), not the profile's
    size: with one byte less free it refuses, naming that size; with that much it writes, and what it
    writes fits."""
    argv = list(map(str, world["argv"]))
    args = parse_regions_args(argv)
    tensors, _, samples, _, _ = load_profile(args)
    need = room_needed(tensors, samples, args.html_samples)
    usage = shutil.disk_usage(world["root"])
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda _: usage._replace(free=need - 1))
    line, _ = refused(stage02.main, argv, capsys)
    assert f"needs about {size_text(need)}" in line and not (world["root"] / "regions").exists()
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda _: usage._replace(free=need))
    assert stage02.main(argv) == 0
    written = sum(f.stat().st_size for f in (world["root"] / "regions").iterdir())
    assert written <= need


@pytest.mark.parametrize(
    "failure",
    [
        SafetensorError(NO_SPACE),
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
    ],
)
def test_stage_02_on_a_full_disk_is_one_line_and_keeps_the_previous_artifact(
    world, monkeypatch, capsys, failure
):
    assert stage02.main(list(map(str, world["argv"]))) == 0
    before = snapshot(world["root"])

    def full(*a, **kw):
        raise failure

    where = "save_file" if isinstance(failure, SafetensorError) else "artifact_meta"  # tensors, or meta.json
    monkeypatch.setattr(artifacts, where, full)
    line, _ = refused(stage02.main, world["argv"], capsys)
    said = (
        "disk quota exceeded"
        if getattr(failure, "errno", None) == errno.EDQUOT
        else "no space left on device"
    )
    assert line.startswith(f"error: --out {world['root'] / 'regions'}: {said}")
    assert "nothing was replaced" in line
    assert snapshot(world["root"]) == before  # no temp folder left either


@pytest.mark.slow  # stage 01 runs the tiny model
def test_stage_01_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys, small_data):
    """A full disk while the artifact is written, then while a shard of finished batches is: one line
    each; the shards saved before are kept for --resume, and no half-written shard is left."""
    out = tmp_path / "profile"

    def full(*a, **kw):
        raise SafetensorError(NO_SPACE)

    monkeypatch.setattr(artifacts, "save_file", full)
    line, _ = refused(stage01.main, argv01(small_data, out), capsys)
    assert line.startswith(f"error: --out {out}: no space left on device") and not out.exists()
    monkeypatch.undo()
    saved = shards.save_file
    calls = []

    def full_at_the_second_shard(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise SafetensorError(NO_SPACE)
        return saved(*a, **kw)

    monkeypatch.setattr(shards, "save_file", full_at_the_second_shard)
    partial = shards.partial_dir(out)
    line, _ = refused(stage01.main, argv01(small_data, out, "--save-every", "0", "--batch-size", "1"), capsys)
    assert line.startswith(f"error: {partial}: no space left on device") and "--resume" in line
    assert sorted(p.name for p in partial.iterdir()) == ["batches-000000-000001.safetensors", "state.json"]
    monkeypatch.undo()
    resume = argv01(small_data, out, "--save-every", "0", "--batch-size", "1", "--resume")
    assert stage01.main(list(map(str, resume))) == 0
    assert json.loads((out / "meta.json").read_text())["resumed_at_batch"] == 1


@pytest.mark.slow  # stage 01 runs the tiny model
def test_a_truncated_shard_on_resume_is_one_line(tmp_path, monkeypatch, capsys, small_data):
    out = tmp_path / "profile"
    argv = argv01(small_data, out, "--save-every", "0", "--batch-size", "1")

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage01, "write_artifact", interrupted)
    assert run_main(stage01.main, list(map(str, argv))) == 130
    monkeypatch.undo()
    shard = shards.partial_dir(out) / "batches-000000-000001.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    line, _ = refused(stage01.main, [*argv, "--resume"], capsys)
    assert line.startswith(f"error: {shard}: cannot be read") and "delete it" in line


# ---------------------------------------------------------------------------------------
# 6. A folder name that is not UTF-8
# ---------------------------------------------------------------------------------------


def test_stage_02_under_a_folder_not_in_utf8(world, monkeypatch, capsys):
    """Linux names are bytes: the repository under b'\\xff' (os.fsdecode: a lone surrogate), stage 02 on its
    default --profile and --out reads the profile and names it in report.md, regions.html and on stdout
    with a \\xff escape; meta.json keeps the real path."""
    root = world["root"] / os.fsdecode(b"repo-\xff")
    (root / "artifacts").mkdir(parents=True)
    profile = Path(shutil.move(world["profile"], root / "artifacts" / "profile"))
    monkeypatch.setattr(regions_options, "DATA", root)  # the defaults of --profile and --out are under it
    capsys.readouterr()
    argv = ["--model", TINY_MODEL, "--data", world["data"], "--permutations", "20"]
    assert run_main(stage02.main, list(map(str, argv))) == 0  # capsys writes strict UTF-8, as a terminal may
    shown, out = f"{world['root']}/repo-\\xff/artifacts/profile", root / "artifacts" / "regions"
    assert shown in (out / "report.md").read_text(encoding="utf-8")
    assert shown in (out / "regions.html").read_text(encoding="utf-8")
    assert f"wrote {world['root']}/repo-\\xff/artifacts/regions" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["profile"]["path"] == str(profile.resolve())


def test_a_profile_named_not_in_utf8_is_read_or_refused_in_one_line(world, capsys):
    """--profile b'...\\xff...' on the command line: either refused in one line before any work (the
    argument parser may refuse every argument that is not UTF-8), or read, and named with an escape."""
    folder = world["root"] / os.fsdecode(b"runs-\xff")
    folder.mkdir()
    profile = Path(shutil.move(world["profile"], folder / "profile"))
    argv = [*world["argv"][:-1], folder / "regions"]
    argv[argv.index(world["profile"])] = profile
    capsys.readouterr()
    code = run_main(stage02.main, list(map(str, argv)))
    out, err = capsys.readouterr()
    if code == 2:
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not (folder / "regions").exists()
    else:
        assert code == 0 and f"{world['root']}/runs-\\xff/profile" in out


@pytest.mark.slow  # stage 01 runs the tiny model
def test_stage_01_under_a_folder_not_in_utf8(tmp_path, monkeypatch, capsys, small_data):
    """Stage 01 on its default --data and --out under b'\\xff': records without an id are named by their
    file and line, which samples.jsonl and stdout write with the escape."""
    root = tmp_path / os.fsdecode(b"repo-\xff")
    root.mkdir()
    rows = [json.loads(line) for line in small_data.read_text().splitlines()]
    without_ids = [{k: v for k, v in row.items() if k != "id"} for row in rows]
    (root / "d.jsonl").write_text("".join(json.dumps(row) + "\n" for row in without_ids))
    monkeypatch.setattr(profile_options, "DATA", root)  # the default of --out is under it
    monkeypatch.setattr(
        importlib.import_module("cuset_common.data_sources"), "SFT_KERNEL_FILE", root / "d.jsonl"
    )
    capsys.readouterr()
    argv = ["--max-length", "256", "--device", "cpu", "--precision", "fp32"]
    assert run_main(stage01.main, argv) == 0  # the default of --data too
    samples = (root / "artifacts" / "profile" / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(samples[0])["id"] == f"{tmp_path}/repo-\\xff/d.jsonl:1"
    assert f"wrote {tmp_path}/repo-\\xff/artifacts/profile" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# 7. The tagger is linear in the length of what it tags
# ---------------------------------------------------------------------------------------

KERNEL_HEAD = (
    "```cpp\n__global__ void k(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {\n"
    "    int row = blockIdx.x;\n    int j = threadIdx.x;\n"
)
# What a response cut off or stuck in a loop repeats: an `if (` that is never closed, first of all
HOSTILE = [
    "    if (",
    "    if (j < cols\n",
    "for (",
    "while (",
    "y[",
    "x + row * ",
    "y + j(",
    "int i = ",
    "a = (a = ",
    "(n + 255) / 256||*()int i = ",
    "float* p = (",
    "<<<",
    "__device__ ",
    "__global__ void f(int* y) {",
]


@contextmanager
def cpu_limit(seconds: float):
    """Raise TimeoutError once this process has used `seconds` of CPU time (SIGPROF)."""

    def stop(*_):
        raise TimeoutError

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def tagging_seconds(text: str, limit: float) -> float:
    """CPU seconds tag_tokens takes on text, one token per 4 characters; inf past `limit` seconds."""
    spans = [(k, min(k + 4, len(text))) for k in range(0, len(text), 4)]
    start = time.process_time()
    try:
        with cpu_limit(limit):
            tag_tokens(text, spans)
    except TimeoutError:
        return float("inf")
    return time.process_time() - start


@pytest.mark.parametrize("piece", HOSTILE, ids=repr)
def test_tagging_time_grows_linearly_with_the_text(piece):
    """30 kB and 120 kB of one piece repeated inside a kernel, measured in this one run: 4 times the text
    may take at most 8 times the CPU time (a quadratic tagger takes 16 times; before, an unclosed `if (`
    took 29 s on 60 kB). The shorter text's time has a floor of 20 ms, below which timing is noise."""
    texts = [KERNEL_HEAD + piece * (size // len(piece)) + "\n}\n```\n" for size in (30_000, 120_000)]
    short = max(min(tagging_seconds(texts[0], 5.0) for _ in range(3)), 0.02)
    assert short < 5.0, f"{piece!r}: 30 kB took over 5 s of CPU"
    long = min(tagging_seconds(texts[1], 8 * short) for _ in range(2))
    assert long < 8 * short, f"{piece!r}: 120 kB took {long:.3f} s, 30 kB {short:.3f} s"


def category(text: str, needle: str) -> str:
    """The category of a token spanning the first occurrence of needle in text."""
    a = text.index(needle)
    return {0: "none", **CATEGORIES}[int(tag_tokens(text, [(a, a + len(needle))])[0])]


def test_what_is_cut_off_or_broken_reads_no_further_than_it_may():
    """The three rules that keep tagging linear on text cut off or broken (cuset_common/profiler/tagger.py:
    conditions, LEXEMES[7]; cuset_common/profiler/cuda_source.py: device_functions), each beside the closed
    case, as it was."""
    head = "__global__ void k(float* y, int n) {\n    int i = threadIdx.x;\n"
    # an `if (` never closed has no condition; closed, it is a guard
    assert category(head + "    if (i < n", "i < n") == "none"
    assert category(head + "    if (i < n) y[i] = 0;\n}\n", "i < n") == "guard"
    # a body never closed ends where the next definition starts: g's store is through g's const pointer
    g = "__global__ void g(const float* y) {\n    int j = threadIdx.x;\n    y[j] = 0;\n}\n"
    assert category(head + g, "y[j] =") == "none"
    assert category(head + "}\n" + g.replace("const ", ""), "y[j] =") == "write_back"
    # a launch configuration holds no other `<<<`
    assert category("k<<<a <<<b, c>>>(y);", "a ") == "none"
    assert category("k<<<b, c>>>(y);", "b, c") == "launch"
