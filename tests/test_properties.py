"""Property-based tests: inputs that hypothesis makes up (random bytes and encodings, JSON of any shape and
depth, artifact metas with any value in any field, argument strings forwarded by experiments/compare.py)
end in the project's one-line error (a UserError, or the parser's `error:` line with exit status 2) or in
success, never in a traceback.

The readers are called directly (read_jsonl, read_artifact through the stages' own loaders, compare.py's
parse_args), not whole stages, so that each example takes milliseconds; the artifacts are made once, by
stages 01 and 02 on four samples with the bundled tiny model. Examples are derived from each test's name
(derandomize): a run in CI tries the same inputs as the run before it."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import load_script
from cuset_common import (SFT_KERNEL_FILE, TINY_MODEL, UserError, load_tokenizer, read_jsonl,
                          tokenizer_fingerprint)
from cuset_common.artifacts import META_SCHEMAS, check_schema
from cuset_common.data_sources import load_data

STAGE01, STAGE02, STAGE03 = (load_script(f) for f in ("01_profile.py", "02_label_regions.py",
                                                      "03_train_cuset.py"))
COMPARE = load_script("experiments/compare.py")


def properties(examples: int):
    """hypothesis settings for these tests: no deadline (a busy core must not fail a test), the same
    examples on every run, and no example database written into the repository."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


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
JSON = st.recursive(SCALARS, lambda inner: (st.lists(inner, max_size=4)
                                           | st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=10)


# ---------------------------------------------------------------------------------------
# JSONL (read_jsonl): bytes, encodings, nesting, surrogates
# ---------------------------------------------------------------------------------------


def read_all(path: Path) -> list[tuple[int, dict]]:
    return list(read_jsonl(path))


def assert_names_the_line(path: Path, error: str, lines: int) -> None:
    """A refusal names the file and a line number within it."""
    assert error.startswith(f"{path}:"), error
    assert 1 <= int(error[len(f"{path}:"):].split(":")[0]) <= max(lines, 1), error


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
    assert STAGE01.main(["--data", str(data), "--max-length", "256", "--device", "cpu",
                         "--out", str(profile)]) == 0
    assert STAGE02.main(["--data", str(data), "--profile", str(profile), "--permutations", "5",
                         "--html-samples", "1", "--out", str(regions)]) == 0
    return {"data": data, "profile": profile, "regions": regions}


# (artifact, field path): the fields of the metas that the readers use, and two they do not check
# (their value must not matter).
FIELDS = [("profile", f) for f in ("model", "tokenizer_fingerprint", "data", "max_length", "counts",
                                   "counts.samples", "counts.response_tokens", "categories", "categories.1",
                                   "stage", "schema_version", "chat_template")] + \
         [("regions", f) for f in ("tokenizer_fingerprint", "data", "max_length", "counts", "counts.samples",
                                   "profile", "profile.path", "profile.meta_sha256", "finding")]
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
def readers(artifacts) -> dict[str, list]:
    """The readers of each artifact, each a call without arguments: stage 02's load_profile and compare.py's
    read_profile for the profile; stage 03's load_regions (--mask-source profile: it reads the profile too,
    through the regions meta's profile.path; --force: past the sha256 check) for both."""
    data, profile, regions = (str(artifacts[k]) for k in ("data", "profile", "regions"))
    args02 = STAGE02.parse_args(["--data", data, "--profile", profile, "--model", str(TINY_MODEL)])
    args03 = STAGE03.parse_args(["--data", data, "--objective", "cuset", "--regions", regions,
                                 "--mask-source", "profile", "--force",
                                 "--out", str(artifacts["data"].parent / "unused")])
    tok_fp = tokenizer_fingerprint(load_tokenizer(str(TINY_MODEL)))
    data_id = load_data(args03)[1]
    train = [lambda: STAGE03.load_regions(args03, tok_fp, data_id)]
    return {"regions": train, "profile": [lambda: STAGE02.load_profile(args02),
                                          lambda: COMPARE.read_profile(Path(profile)), *train]}


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
# experiments/compare.py: forwarded argument strings, checked by the target stage's own parser
# ---------------------------------------------------------------------------------------

# Words a user might put in a forwarded string: flags of the stages, numbers in and out of range, quotes.
WORDS = st.sampled_from(["--lr", "--max-steps", "--stop-after", "--epochs", "--batch-size", "--rho",
                         "--tau-max", "--levels", "--num-samples", "--top-p", "--max-length", "--objective",
                         "--backend", "--help", "--", "-1", "0", "1", "2.5", "nan", "inf", "1e999", "abc",
                         "'", '"', "\\", "=", "1,2,3", "emulate", "cuset", ""])
ARG_STRINGS = st.lists(WORDS, max_size=6).map(" ".join) | st.text(max_size=30)


@properties(120)
@given(st.sampled_from(["profile", "regions", "train", "eval", "standalone"]), ARG_STRINGS)
def test_compare_takes_or_refuses_any_forwarded_string_in_one_line(tmp_path, stage, given_args):
    out = tmp_path / "out"
    one_line_or_success(lambda: COMPARE.parse_args(["--preset", "cpu-quick", "--out", str(out),
                                                    f"--{stage}-args={given_args}"]))
    assert not out.exists()


@properties(60)
@given(st.sampled_from(["--seeds", "--max-length", "--bootstrap", "--stop-after", "--preset", "--objectives",
                        "--modes", "--runs"]), st.text(max_size=12))
def test_compare_takes_or_refuses_any_option_value_in_one_line(tmp_path, option, value):
    out = tmp_path / "out"
    one_line_or_success(lambda: COMPARE.parse_args(["--preset", "cpu-quick", "--out", str(out),
                                                    f"{option}={value}"]))
    assert not out.exists()


def test_the_helpers_here_can_fail():
    """one_line_or_success fails on another exception and on a multi-line refusal (else it proves nothing)."""
    with pytest.raises(ZeroDivisionError):
        one_line_or_success(lambda: 1 / 0)
    with pytest.raises(AssertionError):
        one_line_or_success(lambda: (_ for _ in ()).throw(UserError("two\nlines")))
