"""Property-based tests: inputs that hypothesis makes up (random bytes and encodings, JSON of any shape and
depth, artifact metas, stage-04 task rows, --solutions rows and stage-04 summaries with any value in any
field, argument strings forwarded by research/compare_objectives.py) end in the project's one-line error (a
UserError, or the parser's `error:` line with exit status 2) or in success, never in a traceback.

The readers are called directly (read_jsonl, read_artifact through the stages' own loaders, stage 04's
select_tasks and load_solutions, compare.py's parse_args and kernel_metrics), not whole stages, so that
each example takes milliseconds; a task the reader takes then goes through every use stage 04 makes of it
short of compiling. The artifacts are made once, by stages 01, 02 and 04 with the bundled tiny model.
Examples are derived from each test's name (derandomize): a run in CI tries the same inputs as the run
before it."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from conftest import load_script

pytest.importorskip("hypothesis", reason="hypothesis is not installed: pip install -r tests/requirements.txt")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cuset_common.artifacts import META_SCHEMAS, check_schema, tokenizer_fingerprint
from cuset_common.cli import UserError
from cuset_common.data_sources import load_data
from cuset_common.files import append_jsonl, read_jsonl
from cuset_common.labeling.inputs import load_profile
from cuset_common.labeling.options import parse_args as parse_regions_args
from cuset_common.paths import LEVELS, SFT_KERNEL_FILE, TASKS_FILE, TINY_MODEL
from cuset_common.tasks import load_tasks
from cuset_common.training.samples import load_regions
from harness.generation import prompt_ids
from harness.programs import MIN_OUTPUT_MB
from harness.run_folder import load_solutions, select_tasks
from research.comparison.metrics import kernel_metrics, read_profile
from research.comparison.options import parse_args as compare_parse_args

STAGE01, STAGE02, STAGE03, STAGE04 = (
    load_script(f)
    for f in ("01_profile.py", "02_label_regions.py", "03_train_cuset.py", "04_eval_kernels.py")
)


def properties(examples: int):
    """hypothesis settings for these tests: no deadline (a busy core must not fail a test), the same
    examples on every run, and no example database written into the repository."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def one_line_or_success(call):
    """Run call(); it may return or raise a one-line UserError, or exit 2 through the parser with one
    `error:` line on stderr. Anything else (another exception, a multi-line message) fails the test."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return call()
    except UserError as e:
        assert "\n" not in str(e), str(e)
    except SystemExit as e:
        lines = said.getvalue().strip().splitlines()
        assert e.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), said.getvalue()
    return None


# JSON values of any kind: scalars (floats with NaN and infinities, which Python's json writes and reads),
# arrays and objects nested a few levels.
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


# ---------------------------------------------------------------------------------------
# JSONL (read_jsonl): bytes, encodings, nesting, surrogates
# ---------------------------------------------------------------------------------------


def read_all(path: Path) -> list[tuple[int, dict]]:
    return list(read_jsonl(path))


def assert_names_the_line(path: Path, error: str, lines: int) -> None:
    """A refusal names the file and a line number within it."""
    assert error.startswith(f"{path}:"), error
    assert 1 <= int(error[len(f"{path}:") :].split(":")[0]) <= max(lines, 1), error


@properties(150)
@given(st.lists(st.binary(max_size=60), max_size=5))
def test_random_bytes_are_read_or_refused_with_file_and_line(tmp_path, lines):
    path = tmp_path / "random.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        rows = read_all(path)
    except UserError as e:
        assert_names_the_line(path, str(e), len(lines))
    else:
        assert all(isinstance(obj, dict) for _, obj in rows)


ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-32", "latin-1", "cp1252"]


@properties(150)
@given(JSON, st.sampled_from(ENCODINGS), st.booleans())
def test_any_json_value_in_any_encoding_is_its_object_or_one_line(tmp_path, value, encoding, ascii_only):
    """A UTF-8 line holding an object reads back as that object; anything else is refused with file:line
    (or, where other bytes happen to be UTF-8 too, read as what they say)."""
    path = tmp_path / "values.jsonl"
    text = json.dumps(value, ensure_ascii=ascii_only)
    try:
        path.write_bytes((text + "\n").encode(encoding))
    except UnicodeEncodeError:  # latin-1 and cp1252 hold only some characters; the file cannot be made
        return
    utf8 = encoding.startswith("utf-8") or (ascii_only and encoding in ("latin-1", "cp1252"))
    try:
        rows = read_all(path)
    except UserError as e:
        assert_names_the_line(path, str(e), 1)
        assert not (utf8 and isinstance(value, dict)), e
    else:
        assert len(rows) == 1 and isinstance(rows[0][1], dict)
        if utf8:  # compared as JSON text: NaN is not equal to itself
            assert json.dumps(rows[0][1]) == json.dumps(json.loads(text))


@properties(40)
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":']))
@example(100_000, "[")
def test_nesting_of_any_depth_is_read_or_one_line(tmp_path, depth, opener):
    inner, closer = ("", "]") if opener == "[" else ("0", "}")
    path = tmp_path / "deep.jsonl"
    path.write_text('{"x": ' + opener * depth + inner + closer * depth + "}\n")
    try:
        rows = read_all(path)
    except UserError as e:
        assert str(e).startswith(f"{path}:1: JSON nested too deeply"), e
    else:
        assert depth < 100_000 and len(rows) == 1  # Python's recursion limit stops far below that


# Text with surrogates (code points D800-DFFF, which hypothesis leaves out of text() unless asked).
TEXT_WITH_SURROGATES = st.text(st.characters(exclude_categories=()), max_size=6)


@properties(150)
@given(st.dictionaries(TEXT_WITH_SURROGATES, TEXT_WITH_SURROGATES, max_size=3))
@example({"a": "\ud83d\ude00"})  # a whole pair: JSON reads it as one character
@example({"a": "\ude00\ud83d"})  # the halves in the wrong order: two lone halves
def test_half_a_surrogate_pair_is_refused_and_whole_pairs_are_read(tmp_path, record):
    """json.dumps writes a surrogate as a \\u escape (ensure_ascii): valid JSON, but where it is not half of
    a pair, no UTF-8 text can hold it."""
    path = tmp_path / "surrogates.jsonl"
    path.write_text(json.dumps(record) + "\n")
    loaded = json.loads(json.dumps(record))  # an escaped high + low pair becomes one character
    try:
        json.dumps(loaded, ensure_ascii=False).encode("utf-8")
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    try:
        rows = read_all(path)
    except UserError as e:
        assert not encodable, e
        assert str(e).startswith(f"{path}:1: a string holds half a UTF-16 surrogate pair"), e
    else:
        assert encodable and rows == [(1, loaded)]


# ---------------------------------------------------------------------------------------
# Artifact metas: any value (or none) in any field the readers use
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """A stage-01 profile and a stage-02 regions artifact of four samples, made once."""
    root = tmp_path_factory.mktemp("metas")
    data, profile, regions = root / "d4.jsonl", root / "profile", root / "regions"
    data.write_text("".join(SFT_KERNEL_FILE.read_text().splitlines(keepends=True)[:4]))
    assert (
        STAGE01.main(["--data", str(data), "--max-length", "256", "--device", "cpu", "--out", str(profile)])
        == 0
    )
    assert (
        STAGE02.main(
            [
                "--data",
                str(data),
                "--profile",
                str(profile),
                "--permutations",
                "5",
                "--html-samples",
                "1",
                "--out",
                str(regions),
            ]
        )
        == 0
    )
    return {"data": data, "profile": profile, "regions": regions}


# (artifact, field path): the fields of the metas that the readers use, and two they do not check
# (their value must not matter).
FIELDS = [
    ("profile", f)
    for f in (
        "model",
        "tokenizer_fingerprint",
        "data",
        "max_length",
        "counts",
        "counts.samples",
        "counts.response_tokens",
        "categories",
        "categories.1",
        "stage",
        "schema_version",
        "chat_template",
    )
] + [
    ("regions", f)
    for f in (
        "tokenizer_fingerprint",
        "data",
        "max_length",
        "counts",
        "counts.samples",
        "profile",
        "profile.path",
        "profile.meta_sha256",
        "finding",
    )
]
DELETE = object()  # the field is removed


def edited(meta: dict, field: str, value) -> dict:
    """meta with `field` (dotted: counts.samples) set to value, or removed; a missing parent is made."""
    meta = json.loads(json.dumps(meta))
    *parents, last = field.split(".")
    holder = meta
    for key in parents:
        if not isinstance(holder.get(key), dict):
            holder[key] = {}
        holder = holder[key]
    if value is DELETE:
        holder.pop(last, None)
    else:
        holder[last] = value
    return meta


@contextlib.contextmanager
def meta_changed(folder: Path, field: str, value):
    meta_path = folder / "meta.json"
    original = meta_path.read_text()
    meta_path.write_text(json.dumps(edited(json.loads(original), field, value)))
    try:
        yield
    finally:
        meta_path.write_text(original)


@pytest.fixture(scope="module")
def readers(artifacts, tiny_tokenizer) -> dict[str, list]:
    """The readers of each artifact, each a call without arguments: stage 02's load_profile
    (cuset_common/labeling/inputs.py) and compare.py's read_profile for the profile; stage 03's load_regions
    (cuset_common/training/samples.py; --mask-source profile: it reads the profile too, through the regions
    meta's profile.path; --force: past the sha256 check) for both."""
    data, profile, regions = (str(artifacts[k]) for k in ("data", "profile", "regions"))
    args02 = parse_regions_args(["--data", data, "--profile", profile, "--model", str(TINY_MODEL)])
    args03 = STAGE03.parse_args(
        [
            "--data",
            data,
            "--objective",
            "cuset",
            "--regions",
            regions,
            "--mask-source",
            "profile",
            "--force",
            "--out",
            str(artifacts["data"].parent / "unused"),
        ]
    )
    tok_fp = tokenizer_fingerprint(tiny_tokenizer)
    data_id = load_data(args03)[1]
    train = [lambda: load_regions(args03, tok_fp, data_id)]
    return {
        "regions": train,
        "profile": [
            lambda: load_profile(args02),
            lambda: read_profile(Path(profile)),
            *train,
        ],
    }


def test_the_readers_read_the_artifacts_as_made(readers):
    """Without an edit every reader succeeds: the refusals below come from the edits."""
    for call in readers["profile"]:
        assert call() is not None


@properties(120)
@given(st.sampled_from(FIELDS), JSON | st.just(DELETE))
def test_any_value_in_any_meta_field_is_read_or_refused_in_one_line(artifacts, readers, field, value):
    which, key = field
    with meta_changed(artifacts[which], key, value):
        for call in readers[which]:
            one_line_or_success(call)


@properties(150)
@given(st.sampled_from(FIELDS), JSON | st.just(DELETE))
def test_a_refused_meta_names_the_file_and_the_key(artifacts, field, value):
    """The schema refuses only a field it lists, with a line naming meta.json and that (dotted) key."""
    which, key = field
    schema = META_SCHEMAS["01_profile" if which == "profile" else "02_label_regions"]
    meta_path = artifacts[which] / "meta.json"
    meta = edited(json.loads(meta_path.read_text()), key, value)
    try:
        check_schema(meta, schema, meta_path, "the stage")
    except UserError as e:
        top = key.split(".")[0]
        assert top in schema and str(e).startswith(f"{meta_path}: key '{top}") and "\n" not in str(e), e


# ---------------------------------------------------------------------------------------
# Stage 04's task rows and --solutions rows: any value (or none) in any field stage 04 uses
# ---------------------------------------------------------------------------------------

# Two eval tasks of ours with a kernel-mode harness, and a row as the real CUDABench set writes one (an
# integer id, a `gpu` field, a scalar shape "()"; no split, category or kernel_mode).
KERNEL_TASKS = [t for t in load_tasks(TASKS_FILE) if t["split"] == "eval" and t.get("kernel_mode")][:2]
REAL_SET_ROW = {
    "id": 0,
    "task_name": "Post_Process_GL",
    "task_description": "Compute the kernel.",
    "inputs": [
        {"name": "input_img", "dtype": "uint8", "shape": "(128, 128, 4)"},
        {"name": "scale", "dtype": "float32", "shape": "()"},
    ],
    "outputs": [{"name": "output_img", "dtype": "uint32", "shape": "(16384,)"}],
    "gpu": "unknown",
    "bench.cu": "__global__ void k() {}\nint main() { return 0; }\n",
    "gen.py": "print(1)\n",
    "compare.py": "print('T')\n",
    "level1_prompt": "Write k.",
    "level2_prompt": "Write k.",
    "level3_prompt": "Write k.",
}
# Paths to the fields (a number indexes an array): ("inputs", 0, "name") is the first input's name.
TASK_FIELDS = (
    [
        (k,)
        for k in (
            "id",
            "task_name",
            "task_description",
            *(f"level{lv}_prompt" for lv in LEVELS),
            "bench.cu",
            "gen.py",
            "compare.py",
            "split",
            "category",
            "kernel_mode",
        )
    ]
    + [("kernel_mode", k) for k in ("harness.cu", "marker", "launch", "reference_kernels")]
    + [("kernel_mode", "signatures"), ("kernel_mode", "signatures", 0)]
    + [
        (side, *part)
        for side in ("inputs", "outputs")
        for part in ((), (0,), (0, "name"), (0, "dtype"), (0, "shape"))
    ]
)
# Strings that mean something to a reader: file names, shapes too large for any machine, dtypes numpy
# parses as source, the kernel-mode marker.
TRICKY_TEXT = st.sampled_from(
    [
        "",
        "a/b",
        "..",
        "x" * 300,
        "(99999999999999999999,)",
        "()",
        "(1, 2)",
        "(2305843009213693952, 3)",
        "(4611686018427387904,)",
        "float64",
        "S999999999",
        "(2,)i4",
        "i4, i4",
        "1)",
        "bfloat16",
        "two\nlines",
        "\x00",
        KERNEL_TASKS[0]["kernel_mode"]["marker"],
    ]
)
FIELD_VALUES = JSON | TRICKY_TEXT | TEXT_WITH_SURROGATES | st.just(DELETE)


def with_field(record: dict, field: tuple, value) -> dict:
    """A copy of record with the field at path `field` set to value, or removed."""
    record = json.loads(json.dumps(record))
    *parents, last = field
    holder = record
    for key in parents:
        holder = holder[key]
    if value is not DELETE:
        holder[last] = value
    elif isinstance(holder, list) or last in holder:
        del holder[last]
    return record


def stage04_uses(tasks_path: Path, mode: str, tok, work: Path) -> None:
    """What stage 04 does with its tasks, but compile and run: select_tasks, each level's prompt as token
    ids, the reference as a completion and as the program built from it, the output-size limit, the buffers'
    and scripts' files, a row per task (appended as the run appends it) and the summary of the rows."""
    args = STAGE04.parse_args(
        [
            "--tasks",
            str(tasks_path),
            "--split",
            "all",
            "--mode",
            mode,
            "--reference",
            "--out",
            str(work / "out"),
        ]
    )
    tasks, _ = select_tasks(args)
    runner, rows = STAGE04.Runner(True, "emulated"), []
    for i, task in enumerate(tasks):
        for level in LEVELS:
            assert prompt_ids(tok, task, level, mode)
        assert MIN_OUTPUT_MB <= STAGE04.output_limit_mb(task) < 2**63 >> 20  # setrlimit: signed 64-bit bytes
        folder = work / f"task-{i}"
        folder.mkdir()
        code = STAGE04.extract_code(STAGE04.reference_completion(task, mode), mode) or ""
        (folder / "prog.cu").write_text(source := STAGE04.program_source(task, code, mode))
        assert code in source  # kernel mode: the kernels took the marker's place in the harness
        for buf in [*task["inputs"], *task["outputs"]]:
            (folder / f"{buf['name']}.bin").write_bytes(b"")
        for script in ("gen.py", "compare.py"):
            (folder / script).write_text(task[script])
        job = (str(task["id"]), 1, 0)
        row, _, _ = STAGE04.compile_job(task, job, "no code", args, [], runner, None, folder)
        rows.append(row)
    append_jsonl(work / "results.jsonl", rows)
    assert STAGE04.summarize(rows, 1, "emulated")["overall"]["rows"] == len(tasks)


@properties(150)
@given(st.sampled_from(TASK_FIELDS), FIELD_VALUES, st.sampled_from(["standalone", "kernel"]))
@example(("level1_prompt",), None, "standalone")  # the failures these tests were written for
@example(("inputs",), "x", "standalone")
@example(("gen.py",), None, "kernel")
@example(("inputs", 0, "name"), "a/b", "standalone")  # and what the reader checks beyond types
@example(("inputs", 0, "dtype"), "1)", "standalone")
@example(("outputs", 0, "shape"), "(4611686018427387904,)", "standalone")
@example(("outputs", 0, "shape"), "(" + "9" * 5000 + ",)", "standalone")
@example(("kernel_mode", "marker"), "// not in the harness", "kernel")
def test_any_value_in_any_task_field_is_used_or_refused_in_one_line_before_out(
    tmp_path, tiny_tokenizer, field, value, mode
):
    """A task file whose second line has any value in a field stage 04 uses: select_tasks refuses it with
    file:line (or the one line of an option it does not fit), before --out exists, or stage 04 can use
    every task it returns."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    other = KERNEL_TASKS[1] if mode == "kernel" else REAL_SET_ROW
    path = work / "tasks.jsonl"
    path.write_text(json.dumps(other) + "\n" + json.dumps(with_field(KERNEL_TASKS[0], field, value)) + "\n")
    try:
        stage04_uses(path, mode, tiny_tokenizer, work)
    except UserError as e:
        assert "\n" not in str(e), e
        if str(e).startswith(f"{path}:"):
            assert str(e).startswith(f"{path}:2: "), e
    assert not (work / "out").exists()


@pytest.mark.parametrize("mode", ["standalone", "kernel"])
def test_the_task_rows_as_given_are_all_used(tmp_path, tiny_tokenizer, mode):
    """Without an edit, the task files of the property above go through every use (the refusals there
    come from the edits)."""
    other = KERNEL_TASKS[1] if mode == "kernel" else REAL_SET_ROW
    (tmp_path / "tasks.jsonl").write_text(json.dumps(other) + "\n" + json.dumps(KERNEL_TASKS[0]) + "\n")
    stage04_uses(tmp_path / "tasks.jsonl", mode, tiny_tokenizer, tmp_path)


SOLUTION = {"task_id": KERNEL_TASKS[0]["id"], "level": 2, "sample": 1, "completion": "```cpp\n```"}
# Numbers a level or a sample might be written as, right or wrong (1e999 reads as infinity).
NUMBERS = st.sampled_from([1, 2, 3, 0, -1, 10**30, 1.0, 1.7, True, False, "1", float("inf"), float("nan")])


@properties(150)
@given(
    st.sampled_from([("task_id",), ("level",), ("sample",), ("completion",)]),
    JSON | NUMBERS | st.just(DELETE),
)
@example(("level",), 1.7)
@example(("level",), True)
@example(("sample",), float("inf"))
def test_any_value_in_a_solutions_row_is_an_integer_job_or_refused_with_file_and_line(tmp_path, field, value):
    """A --solutions row is taken only with an integer level of LEVELS and an integer sample >= 0 (a bool
    is no integer here), a known task id and a string completion or null (no answer); else the line is
    named."""
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "sols.jsonl"
    rows = [SOLUTION | {"level": 1}, with_field(SOLUTION, field, value)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = {str(t["id"]) for t in KERNEL_TASKS}
    wanted = {(str(t["id"]), lv, s) for t in KERNEL_TASKS for lv in LEVELS for s in range(3)}
    try:
        found = load_solutions(path, wanted, ids)
    except UserError as e:
        assert str(e).startswith(f"{path}:2: ") and "\n" not in str(e), e
    else:
        for (tid, level, sample), text in found.items():
            assert tid in ids and type(level) is int and level in LEVELS and type(sample) is int
            assert sample >= 0 and (text is None or isinstance(text, str))


# ---------------------------------------------------------------------------------------
# research/compare_objectives.py: stage 04's summary.json and results.jsonl, any value in any field it reads
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    """A stage-04 run folder: both kernel tasks, level 1, scored from --solutions (no compiles)."""
    root = tmp_path_factory.mktemp("eval")
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in KERNEL_TASKS))
    answers = [SOLUTION | {"task_id": t["id"], "level": 1, "sample": 0} for t in KERNEL_TASKS]
    (root / "sols.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    assert (
        STAGE04.main(
            [
                "--tasks",
                str(root / "tasks.jsonl"),
                "--split",
                "all",
                "--levels",
                "1",
                "--solutions",
                str(root / "sols.jsonl"),
                "--backend",
                "emulate",
                "--no-task-check",
                "--out",
                str(root / "run"),
            ]
        )
        == 0
    )
    return root / "run"


SUMMARY_FIELDS = [
    ("summary.json", f)
    for f in (
        ("num_samples",),
        ("backend",),
        ("overall",),
        ("overall", "compile_rate"),
        ("overall", "pass@1"),
        ("overall", "pass@3"),
    )
] + [("results.jsonl", (f,)) for f in ("task_id", "level", "outcome")]


@properties(100)
@given(st.sampled_from(SUMMARY_FIELDS), JSON | NUMBERS | st.just(DELETE))
def test_compare_reads_any_stage_04_summary_or_names_the_file(eval_run, field, value):
    """kernel_metrics (the table's reader of an evaluation) returns rates in [0, 1], a backend and k >= 1,
    or refuses in one line naming summary.json, or results.jsonl and the line."""
    (name, key), path = field, eval_run / field[0]
    original = path.read_text()
    if name == "summary.json":
        path.write_text(json.dumps(with_field(json.loads(original), key, value)))
    else:  # the first row edited
        first, rest = original.split("\n", 1)
        path.write_text(json.dumps(with_field(json.loads(first), key, value)) + "\n" + rest)
    try:
        metrics, _, backend, k = kernel_metrics(eval_run, "kernel")
    except UserError as e:
        assert str(e).startswith(f"{path}") and "\n" not in str(e), e
    else:
        assert isinstance(backend, str) and type(k) is int and k >= 1
        assert all(0 <= v <= 1 for v in metrics.values()), metrics
    finally:
        path.write_text(original)


# ---------------------------------------------------------------------------------------
# research/compare_objectives.py: forwarded argument strings, checked by the target stage's own parser
# ---------------------------------------------------------------------------------------

# Words a user might put in a forwarded string: flags of the stages, numbers in and out of range, quotes.
WORDS = st.sampled_from(
    [
        "--lr",
        "--max-steps",
        "--stop-after",
        "--epochs",
        "--batch-size",
        "--rho",
        "--tau-max",
        "--levels",
        "--num-samples",
        "--top-p",
        "--max-length",
        "--objective",
        "--backend",
        "--help",
        "--",
        "-1",
        "0",
        "1",
        "2.5",
        "nan",
        "inf",
        "1e999",
        "abc",
        "'",
        '"',
        "\\",
        "=",
        "1,2,3",
        "emulate",
        "cuset",
        "",
    ]
)
ARG_STRINGS = st.lists(WORDS, max_size=6).map(" ".join) | st.text(max_size=30)


@properties(120)
@given(st.sampled_from(["profile", "regions", "train", "eval", "standalone"]), ARG_STRINGS)
def test_compare_takes_or_refuses_any_forwarded_string_in_one_line(tmp_path, stage, given_args):
    out = tmp_path / "out"
    one_line_or_success(
        lambda: compare_parse_args(
            ["--preset", "cpu-quick", "--out", str(out), f"--{stage}-args={given_args}"]
        )
    )
    assert not out.exists()


@properties(60)
@given(
    st.sampled_from(
        [
            "--seeds",
            "--max-length",
            "--bootstrap",
            "--stop-after",
            "--preset",
            "--objectives",
            "--modes",
            "--runs",
        ]
    ),
    st.text(max_size=12),
)
def test_compare_takes_or_refuses_any_option_value_in_one_line(tmp_path, option, value):
    out = tmp_path / "out"
    one_line_or_success(
        lambda: compare_parse_args(["--preset", "cpu-quick", "--out", str(out), f"{option}={value}"])
    )
    assert not out.exists()


def test_the_helpers_here_can_fail():
    """one_line_or_success fails on another exception and on a multi-line refusal (else it proves nothing)."""
    with pytest.raises(ZeroDivisionError):
        one_line_or_success(lambda: 1 / 0)
    with pytest.raises(AssertionError):
        one_line_or_success(lambda: (_ for _ in ()).throw(UserError("two\nlines")))
