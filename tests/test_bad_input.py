"""Bad input to any stage exits 2 with one line, before any work, and loses nothing: --out replaces only an
artifact (never the user's files or an input), --force keeps the previous artifact until the new one is
complete, every number is checked, and the readers name file and line. A link as --out is followed to the
one real folder (a loop refused), a read-only --out is refused, artifact folders get the user's umask,
edited metas, a --device not present and a model whose config disagrees with its weights are one line,
stage 04's task rows and --solutions values are checked for type when read (before --out), an append never
keeps part of a line, and research/compare_objectives.py checks its options and forwarded stage arguments
before any work, refuses a loop of links, and names a damaged stage-04 summary. What pyarrow and the hub
library raise on a bad --data (a parquet file with two columns of one name or damaged pages, an id the library
refuses) and JSON nested deeper than Python reads are one line too; --data through a pipe is read once; Ctrl-C
is one line saying what is kept and how to go on (exit 130), a real SIGINT to stage 03 included.

Each test runs a stage's real main() on real artifacts that conftest's `world` fixture makes with the
bundled tiny model (stage 01, 02 and 03 artifacts and a stage-04 run folder), and checks the sha256 of every
file there afterwards."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ARGS, MADE, SCRIPTS, gpu_present, load_script, refused, snapshot

from cuset_common.cli import INTERRUPTED, UserError, run_main
from cuset_common.files import append_jsonl
from cuset_common.out_dir import aside_dir, finishes_out, open_out
from cuset_common.paths import ROOT, SFT_KERNEL_FILE, TINY_MODEL
from cuset_common.progress import Progress
from harness.run_folder import Run
from research.comparison.command import main as compare_main
from research.comparison.metrics import kernel_metrics
from research.comparison.steps import finished

STAGE = {stage: load_script(script) for stage, script in SCRIPTS.items()}
MAIN = {name: STAGE[name[:2]].main for name in ARGS}  # "04-gen" is stage 04 answering with the model

# Another stage's artifact for each stage (conftest's MADE: where each stage's own lies in the world).
OTHER = {"01": "regions", "02": "ckpt", "03": "profile", "04": "profile"}


def refuses_and_keeps(w: dict, stage: str, extra: list, says: str, capsys) -> tuple[str, str]:
    """The stage refuses the world's call + extra in one line naming `says`; every file stays as it was."""
    before = snapshot(w["root"])
    line, out = refused(MAIN[stage], [*ARGS[stage](w), *extra], capsys)
    assert says in line, line
    assert snapshot(w["root"]) == before
    return line, out


# ---------------------------------------------------------------------------------------
# --out: the one rule of every stage
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGE)
@pytest.mark.parametrize("force", [False, True], ids=["", "--force"])
def test_a_folder_of_the_users_files_is_never_replaced(world, stage, force, capsys):
    extra = ["--force"] if force and stage != "01" else []  # stage 01 has no --force
    refuses_and_keeps(
        world, stage, ["--out", world["mine"], *extra], "not an artifact of this project", capsys
    )


@pytest.mark.parametrize("stage", STAGE)
def test_a_file_as_out_is_refused_before_any_work(world, stage, capsys):
    refuses_and_keeps(world, stage, ["--out", world["afile"]], "is a file", capsys)
    refuses_and_keeps(world, stage, ["--out", world["afile"] / "sub"], "is a file", capsys)


@pytest.mark.parametrize(
    "stage, extra, says",
    [
        ("01", lambda w: ["--data", w["mine"] / "precious.jsonl", "--out", w["mine"]], "holds --data"),
        ("01", lambda w: ["--out", w["root"]], "holds --data"),
        ("02", lambda w: ["--out", w["profile"]], "holds --profile"),
        (
            "03",
            lambda w: ["--objective", "cuset", "--regions", w["regions"], "--out", w["regions"], "--force"],
            "holds --regions",
        ),
        ("03", lambda w: ["--model", w["ckpt"], "--out", w["ckpt"], "--force"], "holds --model"),
        (
            "04",
            lambda w: ["--tasks", w["mine"] / "tasks.jsonl", "--out", w["mine"], "--force"],
            "holds --tasks",
        ),
    ],
    ids=["01-data-folder", "01-ancestor", "02-profile", "03-regions", "03-model", "04-tasks-folder"],
)
def test_out_holding_an_input_is_refused(world, stage, extra, says, capsys):
    refuses_and_keeps(world, stage, extra(world), says, capsys)


@pytest.mark.parametrize("stage", STAGE)
def test_another_stages_artifact_is_replaced_only_with_force(world, stage, capsys):
    line, _ = refuses_and_keeps(world, stage, ["--out", world[OTHER[stage]]], "artifact, not a", capsys)
    assert ("--force" in line) == (stage != "01")


def test_stage_03_keeps_its_own_run_unless_told_resume_or_force(world, capsys):
    refuses_and_keeps(
        world, "03", ["--out", world["ckpt"]], "pass --resume to continue that run, --force", capsys
    )


@pytest.mark.parametrize(
    "stage, model, says",
    [
        ("03", None, "--rho 2: must be a finite number in [0, 1]"),
        ("03", "damaged", "cannot load the model"),
        ("04-gen", "no-weights", "holds no model weights"),
        ("04-gen", "damaged", "cannot load the model"),  # after the previous run was set aside
    ],
    ids=["03-bad-number", "03-damaged-weights", "04-no-weights", "04-damaged-weights"],
)
def test_force_keeps_the_previous_artifact_when_the_new_run_fails(
    world, stage, model, says, tmp_path, capsys
):
    """--force checks the new run before it touches the previous result: a run refused for a bad number or
    for bad weights leaves the previous artifact as it was."""
    shutil.copytree(TINY_MODEL, tmp_path / "damaged")
    weights = (TINY_MODEL / "model.safetensors").read_bytes()
    (tmp_path / "damaged" / "model.safetensors").write_bytes(weights[:4096])  # cut: a damaged download
    shutil.copytree(TINY_MODEL, tmp_path / "no-weights", ignore=shutil.ignore_patterns("*.safetensors"))
    out = world[MADE[stage[:2]]]
    extra = ["--model", tmp_path / model] if model else ["--rho", "2"]
    _, printed = refuses_and_keeps(world, stage, [*extra, "--out", out, "--force"], says, capsys)
    assert ("rows already done" in printed) == (model == "damaged" and stage == "04-gen")  # run folder opened
    assert not aside_dir(out).exists()


def names_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def stage_main(out: Path, start_over: bool, fails: bool):
    """A stage's main as 03 and 04 write theirs: open_out, write a new artifact in place, fail or not."""

    @finishes_out
    def main(argv):
        open_out(out, start_over)
        (out / "new.txt").write_text("a new artifact, half written")
        if fails:
            raise UserError("the new run failed")
        return 0

    return main


def test_force_puts_the_previous_artifact_back_if_main_fails_and_deletes_it_once_main_succeeds(tmp_path):
    """The mechanism under --force in stages 03 and 04 (cuset_common.artifacts: open_out and finishes_out)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("the previous artifact")
    assert run_main(stage_main(out, start_over=True, fails=True), []) == 2
    assert names_in(out) == ["old.txt"] and not aside_dir(out).exists()
    assert run_main(stage_main(out, start_over=True, fails=False), []) == 0
    assert names_in(out) == ["new.txt"] and not aside_dir(out).exists()


def test_after_a_killed_start_over_the_previous_artifact_waits_aside_until_a_run_succeeds(tmp_path):
    out, aside = tmp_path / "out", aside_dir(tmp_path / "out")

    def killed_start_over(note: str) -> None:  # what a --force run killed before it finished leaves
        aside.mkdir()
        (aside / "old.txt").write_text("the previous artifact")
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        (out / "partial.txt").write_text(note)

    killed_start_over("killed")
    assert run_main(stage_main(out, start_over=True, fails=True), []) == 2  # the killed run is discarded
    assert names_in(out) == ["old.txt"] and not aside.exists()
    killed_start_over("killed again")
    assert run_main(stage_main(out, start_over=False, fails=False), []) == 0  # resumed, and it finished
    assert names_in(out) == ["new.txt", "partial.txt"] and not aside.exists()


# ---------------------------------------------------------------------------------------
# Numbers: every numeric flag checked before any work, with the allowed range in the message
# ---------------------------------------------------------------------------------------

NUMBERS = [
    ("01", "--max-length", "0", "an integer >= 1"),
    ("01", "--batch-tokens", "-1", "an integer >= 1"),
    ("01", "--log-every", "nan", "a finite number >= 0"),
    ("01", "--save-every", "-1", ">= 0"),
    ("01", "--max-length", "abc", "invalid int value"),
    ("02", "--rho", "1.5", "in [0, 1]"),
    ("02", "--tau-max", "0", "in (0, 1]"),
    ("02", "--alpha", "inf", ">= 0"),
    ("02", "--w-max", "nan", "a finite number in [1, 3.4028234663852886e+38]"),
    ("02", "--gap", "-1", ">= 0"),
    ("02", "--seed", "-1", ">= 0"),
    ("03", "--max-steps", "0", ">= 1, or unset"),
    ("03", "--max-steps", "-1", ">= 1, or unset"),
    ("03", "--epochs", "0", "> 0"),
    ("03", "--epochs", "-1", "> 0"),
    ("03", "--lr", "-1", "> 0"),
    ("03", "--lr", "nan", "a finite number > 0"),
    ("03", "--min-lr-ratio", "-1", "in [0, 1]"),
    ("03", "--weight-decay", "-1", ">= 0"),
    ("03", "--rho", "2", "in [0, 1]"),
    ("03", "--chunk-rows", "0", ">= 1"),
    ("03", "--save-every", "0", ">= 1"),
    ("03", "--stop-after", "0", ">= 1"),
    ("03", "--warmup-steps", "-1", ">= 0"),
    ("03", "--tau-max", "1.5", "in (0, 1]"),
    ("03", "--grad-clip", "-1", ">= 0"),
    ("04", "--num-samples", "0", ">= 1"),
    ("04", "--temperature", "nan", ">= 0"),
    ("04", "--top-p", "0", "in (0, 1]"),
    ("04", "--run-timeout", "inf", "a finite number in (0, 43200]"),
    ("04", "--jobs", "0", ">= 1"),
]


@pytest.mark.parametrize("stage, flag, value, says", NUMBERS, ids=[f"{s}{f}={v}" for s, f, v, _ in NUMBERS])
def test_a_number_out_of_range_is_refused_with_the_range(world, stage, flag, value, says, capsys):
    line, _ = refuses_and_keeps(world, stage, [flag, value, "--out", world[MADE[stage]]], says, capsys)
    assert flag in line


@pytest.mark.parametrize("stage, max_length", [("01", "1"), ("03", "2")])
def test_data_without_a_response_token_is_refused_before_replacing_anything(world, stage, max_length, capsys):
    force = ["--force"] if stage == "03" else []
    refuses_and_keeps(
        world,
        stage,
        ["--max-length", max_length, "--out", world[MADE[stage]], *force],
        "raise --max-length",
        capsys,
    )


# ---------------------------------------------------------------------------------------
# Readers: encodings, binary files and folders named as files get file and line
# ---------------------------------------------------------------------------------------

EMPTY_ANSWER = {"messages": [{"role": "user", "content": "add"}, {"role": "assistant", "content": " "}]}
BAD_FILES = {
    "binary": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256))), ":1: not UTF-8 text"),
    "utf-16": (
        lambda p: p.write_text(SFT_KERNEL_FILE.read_text().splitlines()[0] + "\n", encoding="utf-16"),
        ":1: not UTF-8 text",
    ),
    "latin-1 on line 2": (lambda p: p.write_bytes(b'\n{"text": "caf\xe9"}\n'), ":2: not UTF-8 text"),
    "a folder": (lambda p: p.mkdir(), ": is a folder, not a file"),
    "nested 100,000 deep": (
        lambda p: p.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
        ":1: JSON nested too deeply to read",
    ),
    "a line of lists 100,000 deep": (
        lambda p: p.write_text("[" * 100_000 + "]" * 100_000 + "\n"),
        ":1: JSON nested too deeply to read",
    ),
    "half a surrogate pair": (
        lambda p: p.write_text('{"text": "a \\ud800 b"}\n'),
        ":1: a string holds half a UTF-16 surrogate pair (\\ud800",
    ),
    "empty answer": (
        lambda p: p.write_text(json.dumps(EMPTY_ANSWER) + "\n"),
        ":1: the response (the answer to learn) is empty",
    ),
}
READERS = [("01", "--data"), ("03", "--data"), ("04", "--tasks"), ("04", "--solutions")]
READ_CASES = [
    (stage, flag, kind)
    for stage, flag in READERS
    for kind in BAD_FILES
    if kind != "empty answer" or stage != "04"
]  # an empty answer is an SFT record's fault


@pytest.mark.parametrize("stage, flag, kind", READ_CASES, ids=[f"{s}{f}-{k}" for s, f, k in READ_CASES])
def test_a_bad_input_file_is_one_line_with_file_and_line(world, stage, flag, kind, tmp_path, capsys):
    bad = tmp_path / "input.jsonl"
    make, says = BAD_FILES[kind]
    make(bad)
    force = [] if stage == "01" else ["--force"]  # nothing is lost even where --force would replace --out
    refuses_and_keeps(world, stage, [flag, bad, "--out", world[OTHER[stage]], *force], f"{bad}{says}", capsys)


def test_a_data_folder_given_to_stage_02_is_named(world, capsys):
    refuses_and_keeps(world, "02", ["--data", world["mine"]], f"{world['mine']}: is a folder", capsys)


# ---------------------------------------------------------------------------------------
# Stage 04: task ids and --solutions rows
# ---------------------------------------------------------------------------------------


def test_duplicate_task_ids_are_refused_with_the_id(world, tmp_path, capsys):
    lines = world["tasks"].read_text().splitlines(keepends=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(lines + lines[:1]))
    tid = json.loads(lines[0])["id"]
    refuses_and_keeps(
        world,
        "04",
        ["--tasks", tasks, "--out", world["run"]],
        f"{tasks}:3: task id {tid!r} is already the id of line 1",
        capsys,
    )


@pytest.mark.parametrize(
    "row, says",
    [
        ({"task_id": "no_such_task"}, ":2: task 'no_such_task' is not in --tasks"),
        ({"level": 7}, ":2: level 7 sample 0: levels are 1, 2, 3"),
        ({"sample": -1}, ":2: level 1 sample -1: levels are 1, 2, 3 and samples count from 0"),
        (None, ": holds no answers"),
        (
            {"level": 1.7},
            ":2: level is 1.7; task_id must be a string or an integer, level and sample integers",
        ),
        ({"level": True}, ":2: level is true;"),
        ({"level": "1"}, ':2: level is the string "1";'),
        ({"level": float("inf")}, ":2: level is Infinity;"),
        ({"sample": 0.5}, ":2: sample is 0.5;"),
        ({"task_id": None}, ":2: task_id is null;"),
    ],
    ids=[
        "unknown task",
        "level 7",
        "sample -1",
        "no rows",
        "level 1.7",
        "level true",
        "level '1'",
        "level 1e999",
        "sample 0.5",
        "task_id null",
    ],
)
def test_a_solutions_row_naming_no_possible_job_is_refused_not_scored(world, row, says, tmp_path, capsys):
    """A level of 1.7 or true was once scored as level 1, and 1e999 (infinity) overflowed."""
    rows = [json.loads(line) for line in world["sols"].read_text().splitlines()]
    sols = tmp_path / "sols.jsonl"
    sols.write_text("" if row is None else "".join(json.dumps(r) + "\n" for r in [rows[0], rows[1] | row]))
    refuses_and_keeps(
        world, "04", ["--solutions", sols, "--out", world["run"], "--force"], f"{sols}{says}", capsys
    )


# A field of the first task set to a value, the arguments it needs, and what the refusal says after
# `<file>:1: task '<id>': `.
TASK_EDITS = {
    "null prompt": (("level1_prompt",), None, [], "level1_prompt must be a string, not null"),
    "inputs as a string": (("inputs",), "x.bin", [], "inputs must be an array of {name, dtype, shape}"),
    "null gen.py": (("gen.py",), None, [], "gen.py must be a string, not null"),
    "a name with a slash": (("inputs", 0, "name"), "../x", [], "inputs[0]: name '../x' must name one file"),
    "a shape no machine holds": (
        ("outputs", 0, "shape"),
        "(4611686018427387904,)",
        [],
        "outputs[0]: shape '(4611686018427387904,)' of 'float32' declares over",
    ),
    "null category": (("category",), None, [], "category must be a string, not null"),
    "signatures as a string": (
        ("kernel_mode", "signatures"),
        "__global__ void k()",
        ["--mode", "kernel"],
        'kernel_mode.signatures must be an array of strings, not the string "__',
    ),
    "a marker not in the harness": (
        ("kernel_mode", "marker"),
        "// @NOT_THERE@",
        ["--mode", "kernel"],
        "kernel_mode.marker must occur in kernel_mode.harness.cu",
    ),
}


@pytest.mark.parametrize("out", ["new", "run"], ids=["new --out", "its own run --force"])
@pytest.mark.parametrize("case", TASK_EDITS)
def test_a_task_field_of_the_wrong_type_is_refused_before_out_is_touched(world, case, out, tmp_path, capsys):
    """A null prompt, inputs given as a string or a null gen.py raised TypeError or AttributeError once --out
    was open, leaving a half-made run folder: now one line naming file, line, task and field."""
    (*parents, last), value, extra, says = TASK_EDITS[case]
    lines = world["tasks"].read_text().splitlines(keepends=True)
    task = json.loads(lines[0])
    holder = task
    for key in parents:
        holder = holder[key]
    holder[last] = value
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n" + "".join(lines[1:]))
    force = ["--force"] if out == "run" else []
    refuses_and_keeps(
        world,
        "04",
        ["--tasks", tasks, *extra, "--out", world[out], *force],
        f"{tasks}:1: task {task['id']!r}: {says}",
        capsys,
    )


def test_a_task_id_that_is_not_an_integer_or_one_line_is_refused(world, tmp_path, capsys):
    lines = world["tasks"].read_text().splitlines(keepends=True)
    tasks = tmp_path / "tasks.jsonl"
    for tid, kind in ((1.5, "1.5"), (None, "null"), ("a\nb", 'the string "a\\nb"'), ([1], "an array")):
        tasks.write_text(json.dumps(json.loads(lines[0]) | {"id": tid}) + "\n" + "".join(lines[1:]))
        refuses_and_keeps(
            world,
            "04",
            ["--tasks", tasks],
            f"{tasks}:1: id must be an integer or a one-line string, not {kind}",
            capsys,
        )


def test_a_null_kernel_mode_is_no_harness_for_kernel_mode(world, tmp_path, capsys):
    lines = world["tasks"].read_text().splitlines(keepends=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(json.loads(lines[0]) | {"kernel_mode": None}) + "\n" + "".join(lines[1:]))
    refuses_and_keeps(
        world,
        "04",
        ["--tasks", tasks, "--mode", "kernel"],
        "--mode kernel needs tasks with a kernel_mode harness; 1 have none",
        capsys,
    )


def test_a_damaged_row_of_a_run_being_resumed_is_one_line(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    rows = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text(
        json.dumps(json.loads(rows[0]) | {"outcome": None}) + "\n" + "".join(rows[1:])
    )
    before = snapshot(run)
    line, _ = refused(MAIN["04"], [*ARGS["04"](world), "--out", run], capsys)
    assert f"{run / 'results.jsonl'}: row 1 lacks outcome or holds another type there" in line
    assert snapshot(run) == before


def test_a_completion_utf8_cannot_hold_leaves_completions_jsonl_as_it_was(world, tmp_path):
    """Half a surrogate pair once crashed while writing and left an empty completions.jsonl: --solutions
    and --tasks refuse it when read (test_a_bad_input_file_is_one_line_with_file_and_line), a model's reply
    is decoded text; were one to reach the writer, the file and the run's memory stay as they were."""
    run_dir = tmp_path / "run"
    shutil.copytree(world["run"], run_dir)
    before, run = snapshot(run_dir), Run(run_dir)
    job, kept = next(iter(run.completions.items()))
    with pytest.raises(UnicodeEncodeError):
        run.keep_completions({job: "half a pair: \ud800"})
    assert snapshot(run_dir) == before and run.completions[job] == kept
    with pytest.raises(UnicodeEncodeError):
        Run(tmp_path).keep_completions({job: "\udfff"})
    assert not (tmp_path / "completions.jsonl").exists()


def test_an_append_cut_short_by_a_full_disk_is_taken_back(tmp_path):
    """A write error part way (here: a file-size limit 10 bytes past the end, as a full disk would stop it)
    cuts the file back to its last whole line, so that a later append does not land behind a torn one."""
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, [{"a": 1}])
    limit = path.stat().st_size + 10
    script = (
        "import resource, signal, sys\n"
        "from cuset_common.files import append_jsonl\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write() fails with EFBIG\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "try:\n    append_jsonl(sys.argv[1], [{'a': 'x' * 100}])\n"
        "except OSError as e:\n    print(e.errno)\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.strip() == str(errno.EFBIG), r.stdout + r.stderr
    assert path.read_text() == '{"a": 1}\n'


# ---------------------------------------------------------------------------------------
# Models and disks: fail fast, before the work
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["01", "03", "04-gen"])
def test_a_mistyped_model_name_fails_fast_naming_folder_and_hub_id(world, stage, capsys):
    name = "tiny-cuda-lm-no-such-model"
    start = time.time()
    line, _ = refuses_and_keeps(
        world, stage, ["--model", name], f"no local folder {name}, and hub id {name}", capsys
    )
    assert time.time() - start < 15, line  # not the 45 s of retries from_pretrained spends


def test_a_hub_id_in_the_local_cache_passes_offline(tmp_path):
    """The fast check must not refuse what from_pretrained can load: a cached hub id, with no network."""
    snapshot_dir = tmp_path / "models--org--tiny" / "snapshots" / "abc"
    snapshot_dir.mkdir(parents=True)
    (snapshot_dir / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc")
    env = os.environ | {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    check = (
        "from cuset_common.models import check_hub_id; check_hub_id('org/tiny'); check_hub_id('org/other')"
    )
    r = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "UserError: --model org/other: no local folder org/other" in r.stderr, r.stderr  # not org/tiny


def in_namespace_with(mount: str, argv: list[str]) -> subprocess.CompletedProcess:
    """argv[1:] run with a file system mounted by `mount` at argv[0] (user + mount namespaces: no root)."""
    script = f'mkdir -p "$1" && {mount} "$1" && shift && exec "$@"'
    namespace = ["unshare", "--user", "--map-root-user", "--mount"]
    return subprocess.run(
        [*namespace, "sh", "-c", script, "sh", *argv], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "mount, says",
    [("mount -t tmpfs -o ro none", "Read-only file system"), ("mount -t tmpfs -o size=4k none", "KB free")],
    ids=["read-only", "full"],
)
def test_an_out_that_cannot_be_written_is_refused_before_the_work(world, mount, says, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    disk = tmp_path / "disk"
    before = snapshot(world["root"])
    r = in_namespace_with(
        mount,
        [
            str(disk),
            sys.executable,
            str(ROOT / "02_label_regions.py"),
            *map(str, ARGS["02"](world)),
            "--out",
            str(disk / "regions"),
        ],
    )
    if "Operation not permitted" in r.stderr and r.returncode != 2:
        pytest.skip(f"no user namespaces here: {r.stderr.strip()}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0] and "--out" in lines[0], r.stderr
    assert snapshot(world["root"]) == before


# ---------------------------------------------------------------------------------------
# Links, loops, read-only folders and modes: one real --out folder
# ---------------------------------------------------------------------------------------


def linked_copy(world: dict, stage: str, parent: Path) -> tuple[Path, Path]:
    """(real, link): a copy of the stage's artifact in parent/real, and parent/link -> real (relative)."""
    parent.mkdir(exist_ok=True)
    real, link = parent / "real", parent / "link"
    shutil.copytree(world[MADE[stage]], real)
    link.symlink_to("real")
    return real, link


def still_linked(real: Path, link: Path) -> bool:
    """The link still points at the real folder, which is a folder, and nothing lies beside them."""
    return (
        link.is_symlink()
        and os.readlink(link) == "real"
        and real.is_dir()
        and not real.is_symlink()
        and names_in(real.parent) == ["link", "real"]
    )


def config_at_odds(tmp_path: Path, change: dict) -> Path:
    """A copy of the tiny model whose config.json differs from its weights by `change`."""
    folder = tmp_path / f"model-{'-'.join(change)}"
    shutil.copytree(TINY_MODEL, folder)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("stage", ["01", "02"])
def test_a_link_to_the_stages_own_artifact_as_out_is_followed(world, stage, tmp_path):
    """A link to the stage's own artifact as --out is followed: the new artifact lands in the real folder
    and the link stays a link, so whatever pointed at the result still does."""
    real, link = linked_copy(world, stage, tmp_path / "out")
    assert STAGE[stage].main([*map(str, ARGS[stage](world)), "--out", str(link)]) == 0
    assert still_linked(real, link)
    assert json.loads((real / "meta.json").read_text())["args"]["out"] == str(link)  # the new artifact
    assert STAGE[stage].main([*map(str, ARGS[stage](world)), "--out", str(real)]) == 0  # again, directly
    assert still_linked(real, link)


@pytest.mark.parametrize("stage", ["03", "04"])
def test_force_through_a_link_then_a_failed_force_on_the_real_folder_keeps_the_last_result(
    world, stage, tmp_path, capsys
):
    """A --force through a link keeps the link a link, and a refused --force on the real folder after it
    keeps that run's result. Stage 04's failure comes after its run folder was opened (the previous run
    set aside, then put back)."""
    real, link = linked_copy(world, stage, tmp_path / "out")
    assert STAGE[stage].main([*map(str, ARGS[stage](world)), "--force", "--out", str(link)]) == 0
    assert still_linked(real, link)
    last = snapshot(real)
    bad = config_at_odds(tmp_path, {"vocab_size": 9000})
    argv = [*ARGS["04-gen" if stage == "04" else stage](world), "--model", bad, "--force", "--out", real]
    line, printed = refused(MAIN[stage], argv, capsys)
    assert "config.json disagrees with the weight files" in line
    assert ("rows already done" in printed) == (stage == "04")
    assert snapshot(real) == last and still_linked(real, link)


def test_a_killed_force_through_a_link_keeps_the_previous_checkpoint_beside_the_real_folder(world, tmp_path):
    """A --force of stage 03 through a link, killed while training, keeps the previous checkpoint: it
    waits in the real folder's hidden sibling, and a later --force on the real folder that finishes
    deletes it only then."""
    real, link = linked_copy(world, "03", tmp_path / "out")
    before, aside = snapshot(real), aside_dir(real)
    argv = [
        sys.executable,
        str(ROOT / "03_train_cuset.py"),
        *map(str, ARGS["03"](world)),
        "--max-steps",
        "500",
        "--save-every",
        "1",
        "--force",
        "--out",
        str(link),
    ]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (aside.exists() and (real / "resume" / "args.json").exists()):
        assert proc.poll() is None and time.time() < deadline, "stage 03 wrote no resume state"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    # the killed run's lock file stays behind, stale (cuset_common/out_lock.py): the next run takes it over
    assert link.is_symlink() and names_in(real.parent) == [".real.lock", aside.name, "link", "real"]
    assert snapshot(aside) == before and not (real / "model.safetensors").exists()
    assert STAGE["03"].main([*map(str, ARGS["03"](world)), "--force", "--out", str(real)]) == 0
    assert still_linked(real, link) and (real / "model.safetensors").exists()


def test_open_out_and_finishes_out_act_on_the_folder_a_link_points_to(tmp_path):
    """The mechanism under stages 03 and 04, through a link and then on the real folder."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    (real / "old.txt").write_text("the previous artifact")
    link.symlink_to("real")
    assert aside_dir(link) == aside_dir(real) == tmp_path / ".real.previous"
    assert run_main(stage_main(link, start_over=True, fails=True), []) == 2
    assert names_in(real) == ["old.txt"] and still_linked(real, link)
    assert run_main(stage_main(link, start_over=True, fails=False), []) == 0
    assert names_in(real) == ["new.txt"] and still_linked(real, link)
    (real / "new.txt").write_text("the last complete artifact")
    assert run_main(stage_main(real, start_over=True, fails=True), []) == 2
    assert (real / "new.txt").read_text() == "the last complete artifact" and still_linked(real, link)


@pytest.mark.parametrize("loop", ["itself", "a pair", "inside"])
@pytest.mark.parametrize("stage", STAGE)
def test_a_loop_of_links_as_out_is_refused(world, stage, loop, tmp_path, capsys):
    links = {"itself": [("a", "a")], "a pair": [("a", "b"), ("b", "a")], "inside": [("a", "a")]}[loop]
    for name, target in links:
        (tmp_path / name).symlink_to(target)
    out = tmp_path / "a" / "sub" if loop == "inside" else tmp_path / "a"
    before = sorted(os.listdir(tmp_path))
    line, _ = refused(MAIN[stage], [*ARGS[stage](world), "--out", out], capsys)
    assert f"--out {out}: its symbolic links form a loop" in line
    assert sorted(os.listdir(tmp_path)) == before


def make_read_only(path: Path):
    """Make path read-only for this process, returning the undo. Root passes over modes, not over an
    immutable flag: chattr +i as root (skipped where the file system has none), chmod a-w otherwise."""
    if os.geteuid() != 0:
        mode = stat.S_IMODE(path.stat().st_mode)
        path.chmod(mode & ~0o222)
        return lambda: path.chmod(mode)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("root, and no immutable flag here (chattr) to make a file read-only for root")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize(
    "stage, what",
    [
        ("01", "meta.json"),
        ("02", "meta.json"),
        ("02", "."),
        ("03", "."),
        ("04", "."),
        ("04", "results.jsonl"),
    ],
    ids=["01-meta", "02-meta", "02-folder", "03-folder", "04-folder", "04-results"],
)
def test_a_read_only_out_or_file_in_it_is_refused_before_the_work(world, stage, what, tmp_path, capsys):
    """A read-only artifact, or a read-only file in it, is refused in one line before any work, rather than
    replaced or failing halfway with a PermissionError; stage 04 checks --out itself, not only its
    parent."""
    out = tmp_path / "out"
    shutil.copytree(world[MADE[stage]], out)
    undo = make_read_only(out / what)
    try:
        before = snapshot(tmp_path)
        force = ["--force"] if stage in ("03", "04") else []
        line, _ = refused(MAIN[stage], [*ARGS[stage](world), "--out", out, *force], capsys)
        assert f"--out {out}: {(out / what).resolve()} is read-only here" in line
        assert snapshot(tmp_path) == before and names_in(tmp_path) == ["out"]
    finally:
        undo()


@pytest.mark.parametrize("umask", [0o022, 0o007])
@pytest.mark.parametrize("stage", ["02", "03", "04"])
def test_an_artifact_gets_the_users_umask(world, stage, umask, tmp_path):
    """Not the temp folder's 0700 (stage 02 writes its artifact in a temp folder and renames it), nor the
    0600 safetensors gives its files (the profile's tensors, stage 03's weights and resume state)."""
    old = os.umask(umask)
    try:
        assert STAGE[stage].main([*map(str, ARGS[stage](world)), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    made = [tmp_path / "out", *(tmp_path / "out").rglob("*")]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in made}
    assert modes == {str(p.relative_to(tmp_path)): (0o777 if p.is_dir() else 0o666) & ~umask for p in made}


# ---------------------------------------------------------------------------------------
# Artifact metas, devices and model configs: one line naming what is wrong
# ---------------------------------------------------------------------------------------

META_EDITS = {
    "categories": (
        "02",
        "profile",
        lambda m: m | {"categories": {"api": "api"}},
        "'categories' is an object of 1 entries",
    ),
    "data": ("02", "profile", lambda m: m | {"data": "d8.jsonl"}, "'data' is the string \"d8.jsonl\""),
    "counts": ("02", "profile", lambda m: m | {"counts": [8, 100]}, "'counts' is an array of 2 entries"),
    "counts.samples": (
        "02",
        "profile",
        lambda m: m | {"counts": m["counts"] | {"samples": "8"}},
        "'counts.samples' is the string \"8\", must be an integer >= 0",
    ),
    "max_length": (
        "03",
        "regions",
        lambda m: m | {"max_length": "256"},
        "'max_length' is the string \"256\"",
    ),
    "no max_length": (
        "03",
        "regions",
        lambda m: {k: v for k, v in m.items() if k != "max_length"},
        "'max_length' is missing",
    ),
    "profile": ("03", "regions", lambda m: m | {"profile": "profile"}, "'profile' is the string \"profile\""),
    "profile.path": (
        "03",
        "regions",
        lambda m: m | {"profile": m["profile"] | {"path": 7}},
        "'profile.path' is 7, must be a path",
    ),
}


@pytest.mark.parametrize("case", META_EDITS)
def test_an_edited_meta_is_refused_naming_file_and_key(world, case, tmp_path, capsys):
    stage, artifact, edit, says = META_EDITS[case]
    copy = tmp_path / artifact
    shutil.copytree(world[artifact], copy)
    meta = copy / "meta.json"
    meta.write_text(json.dumps(edit(json.loads(meta.read_text()))))
    reader = ["--profile", copy] if stage == "02" else ["--objective", "cuset", "--regions", copy]
    refuses_and_keeps(world, stage, reader, f"{meta}: key {says}", capsys)


DEVICES = ["gpu", "nonsense", "cuda:99"] + ([] if gpu_present() else ["cuda"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", ["01", "03", "04-gen"])
def test_a_device_that_is_not_there_is_one_line(world, stage, device, capsys):
    refuses_and_keeps(world, stage, ["--device", device], f"--device {device}: ", capsys)


CONFIG_CHANGES = {
    "vocab": ({"vocab_size": 9000}, "disagrees with the weight files (1 tensor(s) of another shape"),
    "fewer layers": ({"num_hidden_layers": 3}, "disagrees with the weight files (9 tensor(s) that it has no"),
    "more layers": ({"num_hidden_layers": 5}, "disagrees with the weight files (9 tensor(s) that they lack"),
    "a string": ({"hidden_size": "256"}, "Field 'hidden_size' expected int, got str"),
    "negative": ({"vocab_size": -1}, "its config.json cannot describe a model"),
}


@pytest.mark.parametrize("case", CONFIG_CHANGES)
@pytest.mark.parametrize("stage", ["01", "03", "04-gen"])
def test_a_model_whose_config_disagrees_with_its_weights_is_one_line(world, stage, case, tmp_path, capsys):
    change, says = CONFIG_CHANGES[case]
    out = ["--out", world["run"], "--force"] if stage == "04-gen" else []  # 04 fails with its folder open
    refuses_and_keeps(world, stage, ["--model", config_at_odds(tmp_path, change), *out], says, capsys)


# ---------------------------------------------------------------------------------------
# research/compare_objectives.py: every option and forwarded stage argument checked before any work
# ---------------------------------------------------------------------------------------

COMPARE_BAD = {
    "preset": (["--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
    "seeds": (["--seeds", "abc"], "argument --seeds: invalid int value: 'abc'"),
    "lr": (["--train-args", "--lr -1"], "--train-args '--lr -1': python 03_train_cuset.py refuses"),
    "quote": (["--train-args", "--lr '1"], '--train-args "--lr \'1": No closing quotation'),
    "stop-after": (["--stop-after", "-1"], "--stop-after -1: must be an integer >= 1"),
    "max-length": (["--max-length", "0"], "--max-length 0: must be an integer >= 1"),
    "profile": (["--profile-args", "--batch-tokens 0"], "--profile-args '--batch-tokens 0': python 01_"),
    "regions": (["--regions-args", "--rho 2"], "--regions-args '--rho 2': python 02_label_regions.py"),
    "eval": (["--eval-args", "--top-p 2"], "--eval-args '--top-p 2': python 04_eval_kernels.py"),
    "standalone": (["--standalone-args", "--num-samples 0"], "--standalone-args '--num-samples 0': python"),
    "record-file": (["--save-record", "{tmp}/notes.txt"], "notes.txt is a file; name a folder"),
    "record-out": (["--save-record", "{tmp}/out"], "overlap"),
    "record-inside": (["--save-record", "{tmp}/out/record"], "overlap"),
    "record-group-file": (["--save-record", "{tmp}/record"], "record/base is a file where the record keeps"),
    "out-file": (["--out", "{tmp}/notes.txt"], "--out {tmp}/notes.txt is a file"),
}


@pytest.mark.parametrize("case", COMPARE_BAD)
def test_compare_refuses_a_bad_option_before_any_work(case, tmp_path, monkeypatch, capsys):
    """Each bad option is refused in one `error:` line before any work: before the base stages run and
    before --out or a record is made or touched, with no usage block and no traceback (an unclosed
    quote, a record folder inside --out)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "comparison.md").write_text("an earlier comparison\n")
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    (tmp_path / "record").mkdir()
    (tmp_path / "record" / "base").write_text("a file where a record keeps the base stages\n")
    monkeypatch.chdir(tmp_path)  # the default --out (runs/...) would be made here
    argv, says = COMPARE_BAD[case]
    argv, says = [a.replace("{tmp}", str(tmp_path)) for a in argv], says.replace("{tmp}", str(tmp_path))
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert run_main(compare_main, ["--preset", "cpu-quick", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("option", ["--out", "--save-record"])
def test_compare_refuses_a_loop_of_links_before_any_work(option, tmp_path, monkeypatch, capsys):
    (tmp_path / "loop").symlink_to("loop")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert (
        run_main(
            compare_main,
            ["--preset", "cpu-quick", "--out", str(tmp_path / "out"), option, str(tmp_path / "loop")],
        )
        == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} {tmp_path / 'loop'}: its symbolic links")
    assert snapshot(tmp_path) == before


def test_compare_makes_a_damaged_stage_04_summary_again_and_names_it_in_a_report(world, tmp_path):
    """compare.py read stage 04's summary.json and results.jsonl unchecked: a damaged or hand-edited summary
    now leaves its step unfinished (a run makes it again), and the table (--report-only, which runs nothing)
    names the file, as it names a row of results.jsonl that lacks what it reads."""
    run = tmp_path / "eval-kernel"
    shutil.copytree(world["run"], run)
    argv = [*map(str, ARGS["04"](world)), "--out", str(run)]  # as the world's run was made, there
    step = {"stage": "04", "out": run, "inputs": [], "argv": argv}
    summary_path, results_path = run / "summary.json", run / "results.jsonl"
    summary, results = json.loads(summary_path.read_text()), results_path.read_text()
    assert finished(step) and kernel_metrics(run, "kernel")[3] == 1
    for damaged, says in [
        ("{", "absent, or not a JSON object"),
        ("[]", "absent, or not a JSON object"),
        (json.dumps(summary | {"num_samples": 1.5}), "num_samples must be an integer >= 1"),
        (json.dumps(summary | {"overall": "n/a"}), "overall must be an object"),
        (json.dumps(summary | {"num_samples": 4}), "overall.pass@4 must be a number"),
        (
            json.dumps(summary | {"overall": summary["overall"] | {"pass@1": None}}),
            "overall.pass@1 is null: no row was judged",
        ),
        (
            json.dumps(summary | {"overall": summary["overall"] | {"pass@1": 1.5}}),
            "overall.pass@1 must be a number in [0, 1]",
        ),
    ]:
        summary_path.write_text(damaged)
        assert not finished(step)
        with pytest.raises(UserError, match=f"^{re.escape(f'{summary_path}: {says}')}"):
            kernel_metrics(run, "kernel")
    summary_path.write_text(json.dumps(summary))
    first, rest = results.split("\n", 1)
    results_path.write_text(json.dumps(json.loads(first) | {"level": "1"}) + "\n" + rest)
    with pytest.raises(UserError, match=f"^{re.escape(f'{results_path}:1: a row needs task_id')}"):
        kernel_metrics(run, "kernel")


# ---------------------------------------------------------------------------------------
# What the data libraries raise, pipes and Ctrl-C: one line, never a traceback
# ---------------------------------------------------------------------------------------

PARQUET_ROWS = {
    "prompt": [f"Write kernel {i} in CUDA." for i in range(40)],
    "completion": [f"__global__ void k{i}(float* y) {{ y[0] = {i}; }}" for i in range(40)],
}
PARQUET_FIELDS = ["--data-fields", "prompt=prompt,response=completion"]


def same_named_columns(path: Path) -> None:
    """A parquet file with two columns named `prompt` (pyarrow writes it; a name cannot pick one)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    columns = [pa.array(PARQUET_ROWS[name]) for name in ("prompt", "completion", "completion")]
    pq.write_table(pa.Table.from_arrays(columns, names=["prompt", "prompt", "completion"]), path)


def damaged_pages(path: Path, page: str) -> None:
    """A parquet file whose header and footer are intact and whose first column's dictionary or data page
    is overwritten at its start (what a bad disk or a botched copy leaves): its schema reads, its rows not."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(PARQUET_ROWS), path)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset if page == "dictionary" else chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 16] = b"\xff" * 16
    path.write_bytes(data)
    assert pq.read_schema(path).names == list(PARQUET_ROWS)


BAD_PARQUET = {
    "two columns of one name": (same_named_columns, "has more than one column named 'prompt'"),
    "damaged dictionary page": (lambda p: damaged_pages(p, "dictionary"), "its data cannot be read"),
    "damaged data page": (lambda p: damaged_pages(p, "data"), "its data cannot be read"),
}


@pytest.mark.parametrize("stage", ["01", "03"])
@pytest.mark.parametrize("kind", BAD_PARQUET)
def test_a_parquet_file_pyarrow_cannot_read_is_one_line_naming_it(world, stage, kind, tmp_path, capsys):
    bad = tmp_path / "rows.parquet"
    make, says = BAD_PARQUET[kind]
    make(bad)
    refuses_and_keeps(world, stage, ["--data", bad, *PARQUET_FIELDS], f"{bad}: {says}", capsys)


def test_a_json_array_nested_too_deeply_names_the_line(world, tmp_path, capsys):
    bad = tmp_path / "rows.json"
    deep = "[" * 100_000 + "]" * 100_000
    bad.write_text(f'[\n{{"text": "a row"}},\n{{"text": {deep}}}\n]\n')
    refuses_and_keeps(world, "01", ["--data", bad], f"{bad}:3: JSON nested too deeply to read", capsys)


def test_a_run_whose_fingerprint_nests_too_deeply_is_another_run(world, tmp_path, capsys):
    """Stage 04 reads the fingerprint.json of the run in --out: one it cannot read is not this run's."""
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    (run / "fingerprint.json").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    before = snapshot(run)
    line, _ = refused(MAIN["04"], [*ARGS["04"](world), "--out", run], capsys)
    assert "holds another run" in line and "fingerprint.json" in line, line
    assert snapshot(run) == before


# Ids the hub library refuses although they look like hf:owner/name.
BAD_HUB_IDS = ["hf:owner/a..b", "hf:owner/a--b", "hf:owner/" + "a" * 120, "hf:owner/name.", "hf:owner./name"]


@pytest.mark.parametrize(
    "data", BAD_HUB_IDS, ids=["two-dots", "two-dashes", "120-chars", "dot-end", "owner-dot"]
)
def test_a_hub_id_the_hub_library_refuses_is_one_line_before_any_lookup(world, data, capsys):
    # The id is refused before any lookup: the hub library's own validation of the name. The time limit
    # catches a lookup made anyway, which retries for longer without network.
    start = time.time()
    refuses_and_keeps(
        world, "01", ["--data", data, *PARQUET_FIELDS], f"--data {data}: not a hub dataset id", capsys
    )
    assert time.time() - start < 15


def test_data_from_a_pipe_is_read_once_and_hashed(world, tmp_path):
    """--data <(command) is a pipe named /dev/fd/N, as here: the profile made from it equals the one made
    from the file, and its meta pins the bytes that came through. (A pipe gives its bytes once: a stage
    that opened --data twice would find the second read starting where the first stopped.)"""
    data = world["data"].read_bytes()
    read_end, write_end = os.pipe()

    def feed():  # in a thread: a pipe holds 64 KiB, the stage's reads make room for the rest
        with open(write_end, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    out = tmp_path / "profile"
    argv = [*ARGS["01"](world), "--data", f"/dev/fd/{read_end}", "--out", out]
    try:
        assert run_main(STAGE["01"].main, [*map(str, argv)]) == 0
    finally:
        writer.join(timeout=60)
        os.close(read_end)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["data"]["sha256"] == hashlib.sha256(data).hexdigest()
    tensors = [(folder / "tensors.safetensors").read_bytes() for folder in (out, world["profile"])]
    assert tensors[0] == tensors[1]


def test_ctrl_c_is_one_line_saying_what_is_kept_and_exit_130(monkeypatch, capsys):
    """run_main's answer to Ctrl-C: the stage's own words (or the default), status 130; under torchrun
    only rank 0 says it."""

    def main(argv):
        raise KeyboardInterrupt

    assert run_main(main, [], interrupted="the shards are kept; rerun with --resume") == 130
    assert capsys.readouterr().err == "interrupted: the shards are kept; rerun with --resume\n"
    assert run_main(main, []) == 130
    assert capsys.readouterr().err == f"interrupted: {INTERRUPTED}\n"
    monkeypatch.setenv("RANK", "1")
    assert run_main(main, []) == 130
    assert capsys.readouterr().err == ""


def test_the_closing_line_starts_below_an_open_progress_line(capsys):
    """Stage 04's progress line is redrawn in place, without a newline; Ctrl-C or an error part way must
    not glue its line to it."""

    class Terminal:  # stderr as a terminal, where the line is redrawn in place
        def isatty(self):
            return True

        def write(self, text):
            return sys.stderr.write(text)

        def flush(self):
            sys.stderr.flush()

    def main(argv):
        Progress("compile", 3, stream=Terminal())()
        raise KeyboardInterrupt

    assert run_main(main, []) == 130
    lines = capsys.readouterr().err.split("\n")
    assert lines[0].startswith("\rcompile: 1/3") and lines[1] == f"interrupted: {INTERRUPTED}", lines


def test_ctrl_c_during_training_keeps_the_previous_checkpoint_and_says_how_to_resume(world, tmp_path):
    """A real SIGINT to stage 03 running with --force on a copy of a finished checkpoint, after its second
    step: exit 130, one line, and the previous checkpoint waits aside, as it was; --resume, as the line
    says, goes on from the stopped run."""
    out = tmp_path / "ckpt"
    shutil.copytree(world["ckpt"], out)
    before = snapshot(out)
    argv = [*ARGS["03"](world), "--max-steps", "10000", "--save-every", "1", "--log-every", "0"]
    argv += ["--out", out, "--force"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "03_train_cuset.py", *map(str, argv)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.startswith("train (steps): 2/"):  # step 1's checkpoint is written before step 2 starts
                proc.send_signal(signal.SIGINT)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("interrupted: ") and "--resume" in err, err
    assert snapshot(aside_dir(out)) == before
    resume = [*argv[:-1], "--resume", "--stop-after", "1"]  # the same run, without --force
    assert run_main(STAGE["03"].main, [*map(str, resume)]) == 0


DAMAGED_STATE = {
    "nested too deeply": "[" * 100_000 + "]" * 100_000,
    "not JSON": "{not json",
    "not an object": "[1, 2]",
}


@pytest.mark.parametrize("damage", list(DAMAGED_STATE), ids=list(DAMAGED_STATE))
def test_a_damaged_resume_state_of_stage_03_is_one_line(world, tmp_path, capsys, damage):
    out = tmp_path / "ckpt"
    argv = [*map(str, ARGS["03"](world)), "--max-steps", "2", "--save-every", "1", "--out", str(out)]
    assert STAGE["03"].main([*argv, "--stop-after", "1"]) == 0
    (out / "resume" / "args.json").write_text(DAMAGED_STATE[damage])
    before = snapshot(out)
    line, _ = refused(MAIN["03"], [*argv, "--resume"], capsys)
    assert f"{out / 'resume' / 'args.json'}:" in line and "--force" in line, line
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "state", [*DAMAGED_STATE.values(), '{"args": 1}'], ids=[*DAMAGED_STATE, "arguments not an object"]
)
def test_a_damaged_partial_state_of_stage_01_is_one_line(world, tmp_path, capsys, state):
    out = tmp_path / "profile"
    partial = tmp_path / "profile.partial"
    partial.mkdir()
    (partial / "state.json").write_text(state)
    before = snapshot(tmp_path)
    argv = [*ARGS["01"](world)[:-1], out, "--resume"]
    line, _ = refused(MAIN["01"], argv, capsys)
    assert f"{partial / 'state.json'}:" in line and f"delete {partial}" in line, line
    assert snapshot(tmp_path) == before
