"""The file system's refusals are one line, exit 2, in every stage, and lose nothing: a name too long, a path
under a file, a folder where a file is expected, a file missing, a folder this user may not enter (run as
`nobody`), text that is not UTF-8, a path whose bytes are not UTF-8, a full disk; a device or a pipe that
never ends as --data, --tasks or --solutions; timeouts the sandbox's wait cannot hold; a reader that must
not write to what it reads (research/outcome_table.py); a secret kept out of every closing line.

cuset_common/cli.py's run_main turns an OSError or UnicodeDecodeError about a file into one line wherever it
is raised, and keeps the traceback of one about no file (a bug's); the checks in cuset_common/files.py answer
instead of raising (file_mode). The stage tests run each stage's real main() on the artifacts of conftest's
`world` and check that every file there stays as it was."""

from __future__ import annotations

import errno
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import ARGS, SCRIPTS, load_script, refused, snapshot
from safetensors import SafetensorError

import cuset_common.files as files
from cuset_common import cli
from cuset_common.cli import UserError, register_secret, run_main, within
from cuset_common.files import replace_dir_atomic, write_text_atomic
from cuset_common.paths import ROOT
from harness.eval_options import RANGES as EVAL_RANGES
from harness.schedule import CANDIDATE_ALLOWANCE, REFERENCE_ALLOWANCE
from research.outcome_table import main as outcome_table_main

STAGE = {stage: load_script(script) for stage, script in SCRIPTS.items()}
MAIN = {name: STAGE[name[:2]].main for name in ARGS}  # "04-gen": stage 04 answering with the model

# Each stage's flags that name a path, with the arguments that make the stage read that path.
PATH_FLAGS = [
    ("01", "--data", []),
    ("01", "--model", []),
    ("01", "--out", []),
    ("02", "--profile", []),
    ("02", "--data", []),
    ("02", "--out", []),
    ("03", "--data", []),
    ("03", "--regions", ["--objective", "cuset"]),
    ("03", "--model", []),
    ("03", "--out", []),
    ("04", "--tasks", []),
    ("04", "--solutions", []),
    ("04", "--out", []),
    ("04-gen", "--model", []),
]
PATH_IDS = [f"{stage}{flag}" for stage, flag, _ in PATH_FLAGS]


def refuses_and_keeps(w: dict, stage: str, extra: list, says: str, capsys) -> str:
    """The stage refuses the world's call + extra in one line holding `says`; every file stays as it was."""
    before = snapshot(w["root"])
    line, _ = refused(MAIN[stage], [*ARGS[stage](w), *extra], capsys)
    assert says in line, line
    assert snapshot(w["root"]) == before
    return line


def raising(call):
    """A main that makes `call` and lets what it raises reach run_main."""

    def main(argv):
        call()
        return 0

    return main


def raises(error: BaseException):
    """A main that raises `error`."""

    def main(argv):
        raise error

    return main


# ---------------------------------------------------------------------------------------
# run_main: an OSError or UnicodeDecodeError about a file is one line; any other keeps its traceback
# ---------------------------------------------------------------------------------------

LONG = "a" * 300  # one path component over NAME_MAX (255 bytes)
# A real call that fails, the path it fails on (relative to the test's folder), and what the line says.
FAILING_CALLS = {
    "ENAMETOOLONG": (lambda d: open(d / LONG), LONG, "File name too long; a name in the path is longer"),
    "ENAMETOOLONG in Path.exists": (lambda d: (d / LONG).exists(), LONG, "File name too long;"),
    "ENOTDIR": (
        lambda d: (d / "notes.txt" / "x").read_text(),
        "notes.txt/x",
        "Not a directory; a part of the path is a file, not a folder",
    ),
    "EISDIR": (lambda d: (d / "folder").read_text(), "folder", "Is a directory; it is a folder where a file"),
    "ENOENT": (
        lambda d: (d / "missing").read_bytes(),
        "missing",
        "No such file or directory; check the path",
    ),
}


@pytest.mark.parametrize("case", FAILING_CALLS)
def test_an_os_error_naming_a_file_is_one_line_with_the_file_the_error_and_a_hint(case, tmp_path, capsys):
    """Path.exists() on a name too long raises OSError on Python 3.11 (it returns False only for ENOENT,
    ENOTDIR, EBADF and ELOOP): a check like it anywhere in a stage is one line too."""
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    (tmp_path / "folder").mkdir()
    call, name, says = FAILING_CALLS[case]
    line, _ = refused(raising(lambda: call(tmp_path)), [], capsys)
    assert line.startswith(f"error: {tmp_path / name}: {says}"), line


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        ValueError("a bug"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ],
    ids=["OSError naming no file", "ValueError", "UnicodeEncodeError"],
)
def test_an_error_about_no_file_keeps_its_traceback(error):
    with pytest.raises(type(error)):
        run_main(raises(error), [])


def test_bytes_that_are_not_utf8_from_no_file_keep_their_traceback():
    """Decoding what came from no file (a process's output, a bug) is not the user's file's fault."""
    with pytest.raises(UnicodeDecodeError):
        run_main(raising(lambda: b"caf\xe9".decode("utf-8")), [])


def lines_of(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f]


TEXT_READS = {
    "Path.read_text": lambda p: p.read_text(encoding="utf-8"),
    "json.load": lambda p: json.load(open(p, encoding="utf-8")),
    "a loop over the lines": lines_of,
}


@pytest.mark.parametrize("read", TEXT_READS)
def test_a_file_that_is_not_utf8_is_one_line_naming_the_file(read, tmp_path, capsys):
    latin1 = tmp_path / "notes.json"
    latin1.write_bytes(b'{"text": "caf\xe9"}\n')
    line, _ = refused(raising(lambda: TEXT_READS[read](latin1)), [], capsys)
    assert line.startswith(f"error: {latin1}: not UTF-8 text (byte 0xe9: invalid continuation byte)"), line


@pytest.mark.parametrize(
    "code, says", [(errno.ENOSPC, "no space left on device"), (errno.EDQUOT, "disk quota exceeded")]
)
def test_a_full_disk_is_one_line_naming_the_file_being_written(code, says, tmp_path, capsys):
    """A write that fails for want of space is raised by the file object, which names no file: the line
    names the file the failing frame had open for writing."""
    out = tmp_path / "summary.md"

    def main(argv):
        with open(out, "w") as f:
            f.write("x")
            raise OSError(code, os.strerror(code))

    line, _ = refused(main, [], capsys)
    assert line == f"error: {says} writing {out}: free space or choose another --out", line


def test_a_full_disk_reported_by_safetensors_is_one_line(capsys):
    """safetensors (Rust) raises its own error type, the OS error in its message alone."""
    message = "Error while serializing: I/O error: No space left on device (os error 28)"
    line, _ = refused(raises(SafetensorError(message)), [], capsys)
    assert line.startswith("error: no space left on device writing a file (SafetensorError)"), line
    with pytest.raises(SafetensorError):  # another error of the library keeps its traceback
        run_main(raises(SafetensorError("Error while deserializing header: header too large")), [])


# What runs in a user and mount namespace over a 64 KiB tmpfs at argv[1]: the atomic writers, a plain
# write and an artifact, each far larger than the disk, through run_main; then what is on the disk.
FULL_DISK_SCRIPT = """
import json, os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from cuset_common.artifacts import write_artifact
from cuset_common.cli import run_main
from cuset_common.files import append_jsonl, write_text_atomic
disk = Path(sys.argv[1])
(disk / "summary.md").write_text("the previous summary\\n")
append_jsonl(disk / "rows.jsonl", [{"row": 1}])
(disk / "art").mkdir()
(disk / "art" / "meta.json").write_text("the previous artifact\\n")
codes = [
    run_main(lambda argv: write_text_atomic(disk / "summary.md", "x" * 200_000), []),
    run_main(lambda argv: append_jsonl(disk / "rows.jsonl", [{"row": "x" * 200_000}]), []),
    run_main(lambda argv: write_artifact(disk / "art", {"t": np.zeros(100_000, np.float32)}, {}), []),
    run_main(lambda argv: (disk / "notes.txt").write_text("x" * 200_000), []),
]
(disk / "notes.txt").unlink(missing_ok=True)
files = {str(p.relative_to(disk)): p.read_text() for p in sorted(disk.rglob("*")) if p.is_file()}
print(json.dumps({"codes": codes, "files": files}))
"""


def test_a_full_disk_loses_nothing_and_is_one_line_per_write(tmp_path):
    """On a real full file system (tmpfs in a user namespace): each write is one line naming its file,
    and the previous file, the appended rows and the previous artifact stay whole, no temp file left."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = 'mount -t tmpfs -o size=64k none "$1" && exec "$2" -c "$3" "$1" "$4"'
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
        + [str(disk), sys.executable, FULL_DISK_SCRIPT, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip(f"no user namespaces here: {r.stderr.strip()}")
    result = json.loads(r.stdout)
    assert result["codes"] == [2, 2, 2, 2], r.stderr
    assert result["files"] == {
        "art/meta.json": "the previous artifact\n",
        "rows.jsonl": '{"row": 1}\n',
        "summary.md": "the previous summary\n",
    }
    summary, rows, artifact, notes = r.stderr.strip().splitlines()
    for line, path in [(summary, "summary.md"), (rows, "rows.jsonl"), (notes, "notes.txt")]:
        assert (
            line
            == f"error: no space left on device writing {disk / path}: free space or choose another --out"
        )
    # cuset_common/artifacts.py says it in its own words (write_artifact), or run_main in its
    assert artifact.startswith("error: ") and "no space left on device" in artifact


def test_a_failed_swap_puts_the_previous_folder_back(tmp_path, monkeypatch, capsys):
    """replace_dir_atomic moves the previous folder aside, then the new one in: should the second rename
    fail, the previous folder is put back (it was left as .<name>.old, the folder itself gone)."""
    final, new = tmp_path / "regions", tmp_path / ".regions.tmp"
    final.mkdir()
    (final / "meta.json").write_text("the previous artifact\n")
    new.mkdir()
    (new / "meta.json").write_text("the new artifact\n")
    real_replace = os.replace

    def replace(src, dst):
        if Path(src) == new:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    line, _ = refused(raising(lambda: replace_dir_atomic(new, final)), [], capsys)
    assert line.startswith(f"error: {final}: Invalid cross-device link"), line
    assert (final / "meta.json").read_text() == "the previous artifact\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".regions.tmp", "regions"]


def test_an_atomic_write_onto_a_folder_names_the_file_and_leaves_no_temp_file(tmp_path, capsys):
    (tmp_path / "summary.json").mkdir()
    line, _ = refused(raising(lambda: write_text_atomic(tmp_path / "summary.json", "{}")), [], capsys)
    assert line.startswith(f"error: {tmp_path / 'summary.json'}: Is a directory;"), line
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


# ---------------------------------------------------------------------------------------
# A folder this user may not enter (EACCES): as `nobody`, with the system Python (cli and files use the
# standard library alone; tests run as root, whom no mode stops)
# ---------------------------------------------------------------------------------------

NOBODY = 65534
NOBODY_SCRIPT = """
import io, json, sys
from contextlib import redirect_stderr
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from cuset_common.cli import run_main
from cuset_common.files import exists, is_file, read_jsonl, real_path
private = Path(sys.argv[2])
rows = private / "rows.jsonl"
calls = {
    "read_jsonl": lambda argv: list(read_jsonl(rows)),
    "Path.exists": lambda argv: rows.exists(),
    "--out": lambda argv: real_path(private / "out", "--out"),
}
results = {"checks": [exists(rows), is_file(rows)]}
for name, main in calls.items():
    err = io.StringIO()
    with redirect_stderr(err):
        results[name] = [run_main(main, []), err.getvalue()]
print(json.dumps(results))
"""


def test_a_folder_this_user_may_not_enter_is_one_line(capsys):
    python = Path("/usr/bin/python3")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not python.exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run as nobody")
    if closed := [str(p) for p in (ROOT, *ROOT.parents) if not p.stat().st_mode & 0o001]:
        pytest.skip(f"nobody cannot enter the checkout ({closed[0]} has no o+x), so cannot import it")
    base = Path(tempfile.mkdtemp(prefix="cuset-eacces-"))  # pytest's tmp_path is closed to nobody
    try:
        base.chmod(0o755)
        (base / "private").mkdir(mode=0o700)
        (base / "private" / "rows.jsonl").write_text('{"text": "x"}\n')
        r = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(python), "-c"]
            + [NOBODY_SCRIPT, str(ROOT), str(base / "private")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(base)
    if r.returncode == 2 and "too old" in r.stderr:
        pytest.skip(r.stderr.strip())
    results = json.loads(r.stdout)
    assert results["checks"] == [False, False]  # answered, not raised
    rows = base / "private" / "rows.jsonl"
    for name, says in [
        ("read_jsonl", f"error: {rows}: cannot be read (Permission denied); this user may not use it"),
        ("Path.exists", f"error: {rows}: Permission denied; this user may not use it"),
        ("--out", f"error: --out {base / 'private' / 'out'}: Permission denied; this user may not use it"),
    ]:
        code, err = results[name]
        assert code == 2 and err.count("\n") == 1 and err.startswith(says), (name, err)


# ---------------------------------------------------------------------------------------
# Every stage: each kind of OSError on each path flag is one line, before any work
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stage, flag, extra", PATH_FLAGS, ids=PATH_IDS)
def test_a_name_too_long_is_one_line_in_every_stage(world, stage, flag, extra, tmp_path, capsys):
    path = tmp_path / LONG
    line = refuses_and_keeps(world, stage, [*extra, flag, path], "File name too long", capsys)
    assert str(path) in line and "shorten it" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("stage, flag, extra", PATH_FLAGS, ids=PATH_IDS)
def test_a_path_under_a_file_is_one_line_in_every_stage(world, stage, flag, extra, capsys):
    refuses_and_keeps(world, stage, [*extra, flag, world["afile"] / "x"], str(world["afile"]), capsys)


@pytest.mark.slow
@pytest.mark.parametrize("stage, flag, extra", PATH_FLAGS, ids=PATH_IDS)
def test_a_path_whose_bytes_are_not_utf8_is_refused_before_any_work(world, stage, flag, extra, capsys):
    """Such a path reached the files a stage writes after its work (stage 03's checkpoint, stage 04's
    summary): UnicodeEncodeError once the training or the runs were done. Now the parser refuses it."""
    path = Path(os.fsdecode(bytes(world["root"]) + b"/caf\xe9-\xff"))
    line = refuses_and_keeps(world, stage, [*extra, flag, path], "holds bytes that are not UTF-8", capsys)
    assert f"{world['root']}/caf\\xe9-\\xff" in line, line


DEVICES = {
    "01 --data": ("01", "--data"),
    "02 --data": ("02", "--data"),
    "03 --data": ("03", "--data"),
    "04 --tasks": ("04", "--tasks"),
    "04 --solutions": ("04", "--solutions"),
}
# Runs each stage on /dev/zero in one process whose memory is limited (a stage that read it without end
# fails there, in seconds, and leaves the machine alone), and prints each run's exit status and stderr.
DEVICE_DRIVER = """
import io, json, resource, sys
from contextlib import redirect_stderr, redirect_stdout
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from cuset_common.cli import load_script, run_main
results = {}
for name, (script, argv) in json.loads(sys.argv[2]).items():
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            results[name] = [run_main(load_script(script).main, argv), err.getvalue()]
        except BaseException as e:
            results[name] = [type(e).__name__, err.getvalue()]
print(json.dumps(results))
"""


@pytest.mark.slow
def test_a_device_as_an_input_is_refused_before_it_is_read(world):
    """/dev/zero as --data was read without end (a pipe is read whole, and the reader took any file that
    is not a regular one for a pipe); as --tasks or --solutions, a line without end."""
    before = snapshot(world["root"])
    cases = {
        name: (SCRIPTS[stage], [*map(str, ARGS[stage](world)), flag, "/dev/zero"])
        for name, (stage, flag) in DEVICES.items()
    }
    r = subprocess.run(
        [sys.executable, "-c", DEVICE_DRIVER, str(ROOT), json.dumps(cases)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = json.loads(r.stdout)
    for name, (code, err) in results.items():
        assert code == 2 and err.count("\n") == 1, (name, err)
        assert err.startswith("error: /dev/zero: is a device, not a regular file or a pipe;"), (name, err)
    assert snapshot(world["root"]) == before


@pytest.mark.slow
@pytest.mark.parametrize("stage, flag", [("01", "--data"), ("04", "--tasks")])
def test_a_pipe_past_the_limit_is_one_line_saying_the_limit(world, stage, flag, monkeypatch, capsys):
    """A pipe is read whole into memory, at most PIPE_LIMIT_BYTES (here lowered to 1000 bytes, below what
    the world's file gives); the line says the limit and how to pass a regular file instead."""
    monkeypatch.setattr(files, "PIPE_LIMIT_BYTES", 1000)
    data = world["data" if flag == "--data" else "tasks"].read_bytes()
    assert len(data) > 1000
    read_end, write_end = os.pipe()

    def feed():
        with open(write_end, "wb") as pipe:
            try:
                pipe.write(data)
            except BrokenPipeError:  # the stage stopped reading: what it refuses
                pass

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        line = refuses_and_keeps(world, stage, [flag, f"/dev/fd/{read_end}"], "more than 1,000 bytes", capsys)
    finally:
        os.close(read_end)
        writer.join(timeout=60)
    assert "PIPE_LIMIT_BYTES" in line and "regular file" in line, line


# ---------------------------------------------------------------------------------------
# Files inside an artifact or run that are not what the run wrote: a folder in a file's place, not UTF-8
# ---------------------------------------------------------------------------------------

RUN_FILES = ["results.jsonl", "completions.jsonl", "task_checks.jsonl", "fingerprint.json"]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_folder_in_place_of_a_run_file_is_one_line(world, name, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    (run / name).unlink(missing_ok=True)
    (run / name).mkdir()
    before = snapshot(run)
    line, _ = refused(MAIN["04"], [*ARGS["04"](world), "--out", run], capsys)
    assert line.startswith(f"error: {run / name}: "), line
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_folder_in_place_of_the_summary_is_one_line_and_keeps_the_rows(world, tmp_path, capsys):
    """The summary is written last: the line names it, and the rows stay for the rerun to take."""
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    rows = (run / "results.jsonl").read_bytes()
    (run / "summary.json").unlink()
    (run / "summary.json").mkdir()
    line, _ = refused(MAIN["04"], [*ARGS["04"](world), "--out", run], capsys)
    assert line.startswith(f"error: {run / 'summary.json'}: Is a directory;"), line
    assert (run / "results.jsonl").read_bytes() == rows


@pytest.fixture(scope="module")
def stopped_training(world, tmp_path_factory) -> tuple[Path, list[str]]:
    """A stage-03 run stopped after its first step (its resume state in <out>/resume), and its argv."""
    out = tmp_path_factory.mktemp("stopped") / "ckpt"
    argv = [*map(str, ARGS["03"](world)), "--max-steps", "2", "--save-every", "1", "--out", str(out)]
    assert STAGE["03"].main([*argv, "--stop-after", "1"]) == 0
    return out, argv


RESUME_DAMAGE = {
    "log.jsonl a folder": ("log.jsonl", None),
    "state.pt a folder": ("state.pt", None),
    "log.jsonl in Latin-1": ("log.jsonl", b'{"loss": "caf\xe9"}\n'),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", RESUME_DAMAGE)
def test_a_damaged_resume_state_file_is_one_line_naming_it(stopped_training, damage, tmp_path, capsys):
    """cuset_common/training/checkpoint.py reads these files; what it does not catch itself, run_main does
    (the file named by the OSError, or the text file being decoded)."""
    stopped, argv = stopped_training
    out = tmp_path / "ckpt"
    shutil.copytree(stopped, out)
    name, content = RESUME_DAMAGE[damage]
    (out / "resume" / name).unlink()
    if content is None:
        (out / "resume" / name).mkdir()
    else:
        (out / "resume" / name).write_bytes(content)
    before = snapshot(out)
    line, _ = refused(MAIN["03"], [*argv[:-1], str(out), "--resume"], capsys)
    assert line.startswith(f"error: {out / 'resume' / name}: "), line
    assert snapshot(out) == before


# ---------------------------------------------------------------------------------------
# Timeouts: no budget past what the sandbox's wait can hold
# ---------------------------------------------------------------------------------------

# harness/sandbox.py waits for a program with poll(), whose timeout is a C int of milliseconds.
POLL_LIMIT_S = (2**31 - 1) / 1000
TIMEOUTS = ["compile_timeout", "run_timeout", "task_timeout", "timing_timeout", "api_timeout"]


def test_within_takes_a_closed_upper_bound():
    assert within(604800, "(0, 604800]") and not within(604800.001, "(0, 604800]")
    assert not within(0, "(0, 604800]") and not within(float("nan"), "(0, 604800]")
    assert cli.describe("(0, 604800]") == "in (0, 604800]"


def test_no_timeout_of_stage_04_can_overflow_the_sandboxs_wait():
    """A program may run REFERENCE_ALLOWANCE x --run-timeout (a reference) and CANDIDATE_ALLOWANCE x its
    reference's time (a candidate; harness/schedule.py: run_budget); every other timeout is one wait."""
    ranges = EVAL_RANGES
    for dest in TIMEOUTS:
        upper = float(ranges[dest][1:-1].split(",")[1])
        longest = upper * (REFERENCE_ALLOWANCE * CANDIDATE_ALLOWANCE if dest == "run_timeout" else 1)
        assert longest <= POLL_LIMIT_S, (
            f"--{dest.replace('_', '-')} {ranges[dest]}: waits up to {longest:g} s"
        )


@pytest.mark.slow
@pytest.mark.parametrize("dest", TIMEOUTS)
def test_a_timeout_past_the_bound_is_refused_before_any_work(world, dest, capsys):
    """--run-timeout 3e6 once passed the range check and overflowed poll() (OverflowError) in the sandbox."""
    flag = f"--{dest.replace('_', '-')}"
    refuses_and_keeps(world, "04", [flag, "3e6"], f"{flag} 3e+06: must be a finite number in (0, ", capsys)


# ---------------------------------------------------------------------------------------
# Readers never write; secrets never print
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_outcome_table_leaves_the_results_it_reads_as_they_are(world, tmp_path, capsys):
    """A last line without its newline (stage 04 appending it now, or killed while it did) was cut from
    results.jsonl by the table, which only reads it: the writer's append then lands on a torn file."""
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    whole = (run / "results.jsonl").read_bytes()
    torn, rows = whole + b'{"task_id": "half a row', whole.count(b"\n")
    (run / "results.jsonl").write_bytes(torn)
    assert run_main(outcome_table_main, [str(run)]) == 0
    assert (run / "results.jsonl").read_bytes() == torn
    assert f"\n{rows} rows.\n" in (run / "outcomes.md").read_text()


@pytest.fixture
def secrets(monkeypatch):
    """A registry of secrets of the test's own, and sys.excepthook put back after it."""
    monkeypatch.setattr(cli, "SECRETS", set())
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    return cli.SECRETS


KEY = "sk-test-0123456789abcdef\r"  # as pasted from a Windows file: with its carriage return


def test_a_key_is_redacted_from_the_error_line_that_quotes_it(secrets, capsys):
    """http.client refuses a header value with a \\r and quotes it, key and all, as bytes: the line that
    reports it must not carry the key in any form."""
    register_secret(KEY)

    def main(argv):
        connection = http.client.HTTPConnection("127.0.0.1")  # putrequest sends nothing yet
        connection.putrequest("GET", "/v1/models")
        try:
            connection.putheader("Authorization", f"Bearer {KEY}")
        except ValueError as e:
            raise UserError(f"--base-url http://127.0.0.1/v1: a malformed request ({e})") from None

    line, _ = refused(main, [], capsys)
    assert "Invalid header value b'Bearer [redacted]'" in line, line
    assert "0123456789abcdef" not in line


def test_a_key_is_redacted_from_a_traceback(secrets, capsys):
    register_secret(KEY)
    try:
        raise RuntimeError(f"a library quoting the key: {KEY!r}, {KEY.strip()}")
    except RuntimeError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert "RuntimeError: a library quoting the key: '[redacted]', [redacted]" in err, err
    assert "0123456789abcdef" not in err


def test_no_key_registers_nothing(secrets):
    register_secret(None)
    register_secret("")
    assert secrets == set() and cli.redact("error: a line") == "error: a line"
