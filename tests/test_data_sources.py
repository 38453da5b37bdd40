"""--data beyond the bundled JSONL (cuset_common/data_sources.py): parquet, JSON and JSONL tables with any
column names, dataset folders and hub ids, mapped by --data-fields and filtered by --data-where.

Covers: a parquet file with unforeseen column names and a boolean filter column through stages 01 -> 02 ->
03 on the tiny model (stage 01 profiles exactly the kept rows; every meta names the data), stages 02 and
03 refusing another mapping or filter of the same file, bad mappings as one line naming the columns, the
filter's comparison rules, JSON arrays and JSON lines, parquet and `save_to_disk` folders, hub ids refused
offline in one line, and a plain JSONL file read and pinned exactly as before, without pyarrow or datasets.
Every fixture is written here from the bundled SFT records; no dataset is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SCRIPTS, load_script, make_artifacts, refused

pytest.importorskip("hypothesis", reason="hypothesis is not installed: pip install -r tests/requirements.txt")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cuset_common.cli import UserError
from cuset_common.data import load_sft
from cuset_common.data_sources import data_checks, load_data
from cuset_common.files import sha256_file
from cuset_common.paths import ROOT, TINY_MODEL

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SFT_SMALL = ROOT / "tests" / "fixtures" / "sft_small.jsonl"
STAGE = {stage: load_script(SCRIPTS[stage]) for stage in ("01", "02", "03")}
# Column names no code knows in advance: spaces, punctuation, mixed case.
FIELDS = "prompt=Port this module to CUDA:\\n{Torch Module},response=kernel.cu,system=Sys Prompt"
KEEP = "Passed?=true"


def table_rows() -> list[dict]:
    """Two rows per bundled record: the record itself (Passed? true) and a failed attempt at it (false,
    another answer), interleaved, so that the kept rows are rows 0, 2, 4, ..."""
    rows = []
    for i, rec in enumerate(load_sft(SFT_SMALL)):
        user = rec["prompt_messages"][-1]["content"]
        base = {"Torch Module": user, "Sys Prompt": "You write CUDA.", "Level #": 1 + i % 3}
        rows += [
            base | {"kernel.cu": rec["response"], "Passed?": True},
            base | {"kernel.cu": f"// attempt {i} failed\n", "Passed?": False},
        ]
    return rows


def data_args(data: Path, fields: str | None = FIELDS, where: tuple[str, ...] = (KEEP,)) -> list[str]:
    return (
        ["--data", str(data)]
        + (["--data-fields", fields] if fields else [])
        + [x for w in where for x in ("--data-where", w)]
    )


def namespace(data: Path, fields: str | None = None, where: tuple[str, ...] = ()) -> argparse.Namespace:
    """The arguments load_data reads, as a stage's parser leaves them (absent flags are absent)."""
    ns = argparse.Namespace(data=data)
    if fields:
        ns.data_fields = [fields]
    if where:
        ns.data_where = list(where)
    return ns


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tables") / "attempts.parquet"
    pq.write_table(pa.Table.from_pylist(table_rows()), path)
    return path


@pytest.fixture(scope="module")
def pipeline(parquet_file, tmp_path_factory) -> dict[str, Path]:
    """Stages 01, 02 and 03 (cuset, on those regions) on the parquet file, mapped and filtered: conftest's
    calls of the stages with this --data appended (argparse keeps the last), made once, read by several
    tests."""
    root = tmp_path_factory.mktemp("pipeline")
    w = {
        "data": parquet_file,
        "profile": root / "profile",
        "regions": root / "regions",
        "ckpt": root / "ckpt",
    }
    cuset = [
        "--objective",
        "cuset",
        "--regions",
        w["regions"],
        "--batch-size",
        "2",
        "--micro-batch-size",
        "2",
    ]
    make_artifacts(w, ["01", "02", "03"], [*data_args(parquet_file), "--model", TINY_MODEL], {"03": cuset})
    return w


# ---------------------------------------------------------------------------------------
# A parquet table through the three stages
# ---------------------------------------------------------------------------------------


def test_stage_01_profiles_exactly_the_kept_rows_and_its_meta_names_the_data(parquet_file, pipeline):
    meta = json.loads((pipeline["profile"] / "meta.json").read_text())
    samples = [json.loads(line) for line in (pipeline["profile"] / "samples.jsonl").read_text().splitlines()]
    rows = table_rows()
    kept = [i for i, row in enumerate(rows) if row["Passed?"]]
    fields = {
        "prompt": "Port this module to CUDA:\\n{Torch Module}",
        "response": "kernel.cu",
        "system": "Sys Prompt",
    }  # as typed: the template's \n is two characters here
    assert meta["data"] == {
        "path": str(parquet_file),
        "sha256": sha256_file(parquet_file),
        "format": "parquet",
        "fields": fields,
        "where": [KEEP],
        "rows": {"read": len(rows), "kept": len(kept)},
    }
    assert meta["counts"]["samples"] == len(kept) == len(samples)
    assert [s["line"] for s in samples] == kept
    for s, i in zip(samples, kept):
        assert s["id"] == f"{parquet_file} row {i}"
        # the answer, then the chat template's end of turn
        assert s["response_text"].startswith(rows[i]["kernel.cu"]), s["id"]


def test_stages_02_and_03_record_the_same_data(pipeline):
    profile = json.loads((pipeline["profile"] / "meta.json").read_text())["data"]
    for art in ("regions", "ckpt"):
        assert json.loads((pipeline[art] / "meta.json").read_text())["data"] == profile


def test_the_mapping_builds_chat_records_from_the_template(parquet_file):
    records, _ = load_data(namespace(parquet_file, FIELDS, (KEEP,)))
    for rec, original in zip(records, load_sft(SFT_SMALL)):
        user = original["prompt_messages"][-1]["content"]
        assert rec["prompt_messages"] == [
            {"role": "system", "content": "You write CUDA."},
            {"role": "user", "content": f"Port this module to CUDA:\n{user}"},
        ]
        assert rec["response"] == original["response"]


@pytest.mark.parametrize(
    "stage, changed, says",
    [
        (
            "02",
            data_args(Path("{file}"), where=("Passed?=false",)),
            "data_where: artifact has ['Passed?=true'], now ['Passed?=false']",
        ),
        ("02", data_args(Path("{file}"), where=(KEEP, "Level #=1")), "data_where:"),
        ("03", data_args(Path("{file}"), fields=FIELDS.replace(",system=Sys Prompt", "")), "data_fields:"),
    ],
    ids=["02-other filter", "02-one more filter", "03-other mapping"],
)
def test_another_mapping_or_filter_of_the_same_file_is_refused(
    stage, changed, says, parquet_file, pipeline, tmp_path, capsys
):
    argv = [a.replace("{file}", str(parquet_file)) for a in changed] + ["--model", str(TINY_MODEL)]
    argv += (
        ["--profile", str(pipeline["profile"])]
        if stage == "02"
        else ["--regions", str(pipeline["regions"]), "--max-steps", "1", "--device", "cpu"]
    )
    line, _ = refused(STAGE[stage].main, [*argv, "--out", str(tmp_path / "new")], capsys)
    assert "was made from different inputs" in line and says in line, line
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------
# Bad mappings: one line, exit 2, naming the columns
# ---------------------------------------------------------------------------------------

COLUMNS = (
    "its columns: Torch Module (string), Sys Prompt (string), Level # (int64), kernel.cu (string), "
    "Passed? (bool)"
)


@pytest.mark.parametrize(
    "fields, where, says",
    [
        (
            FIELDS.replace("kernel.cu", "kernel.cpp"),
            (KEEP,),
            "--data-fields response=kernel.cpp: {file} has no column 'kernel.cpp'; " + COLUMNS,
        ),
        (
            FIELDS.replace("{Torch Module}", "{Torch_Module}"),
            (KEEP,),
            "has no column 'Torch_Module'; " + COLUMNS,
        ),
        (FIELDS, ("Passed=true",), "--data-where Passed=true: {file} has no column 'Passed'; " + COLUMNS),
        (
            FIELDS,
            ("Passed?=yes",),
            (
                "--data-where keeps none of the 10 rows of {file} "
                "(Passed?=yes alone keeps 0 (Passed? is bool)); a boolean column takes true or false"
            ),
        ),
        (
            FIELDS.replace("kernel.cu", "Level #"),
            (),
            "{file} row 0: column 'Level #' holds a number (1), not text",
        ),
        ("prompt=Torch Module", (), "--data-fields prompt=Torch Module: maps no response"),
        (
            "answer=kernel.cu,prompt=Torch Module",
            (),
            "--data-fields 'answer=kernel.cu': "
            "expected ROLE=COLUMN with ROLE one of prompt, response, system",
        ),
        ("prompt=Port {Torch Module,response=kernel.cu", (), "not a template of {COLUMN} names"),
        (
            None,
            (KEEP,),
            "{file}: its rows are in none of the SFT record forms (messages, prompt+completion, "
            "instruction+output, text); map its columns with --data-fields prompt=COLUMN,response="
            "COLUMN; " + COLUMNS,
        ),
    ],
    ids=[
        "unknown field",
        "unknown template column",
        "unknown filter column",
        "filter keeps nothing",
        "number mapped as text",
        "no response",
        "unknown role",
        "unclosed brace",
        "no mapping",
    ],
)
def test_a_bad_mapping_is_one_line_naming_what_exists(fields, where, says, parquet_file, tmp_path, capsys):
    out = tmp_path / "profile"
    line, _ = refused(STAGE["01"].main, [*data_args(parquet_file, fields, where), "--out", str(out)], capsys)
    assert says.replace("{file}", str(parquet_file)) in line, line
    assert not out.exists()


def test_a_wrong_field_name_on_the_command_line_is_one_line_without_traceback(parquet_file, tmp_path):
    argv = [*data_args(parquet_file, "prompt=Torch Module,response=cu"), "--out", str(tmp_path / "p")]
    r = subprocess.run(
        [sys.executable, "01_profile.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == f"error: --data-fields response=cu: {parquet_file} has no column 'cu'; {COLUMNS}\n"


def test_a_null_in_a_mapped_column_names_file_and_line(tmp_path):
    rows = table_rows()[:3]
    rows[1]["kernel.cu"] = None
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        UserError,
        match=rf"^{path}:2: column 'kernel.cu' holds no value \(null or missing\), "
        r"not text; map text columns with --data-fields \(its columns: Torch "
        r"Module \(string\)",
    ):
        load_data(namespace(path, FIELDS))


# ---------------------------------------------------------------------------------------
# --data-where: how VALUE compares
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where, kept",
    [
        (("flag=true",), [0, 2]),
        (("flag=TRUE",), [0, 2]),
        (("flag=false",), [1]),
        (("flag=1",), []),
        (("level=1",), [0, 1]),
        (("level=1.0",), [0, 1]),
        (("level=2.5",), [2]),
        (("level=one",), []),
        (("name=Relu",), [0]),
        (("name=relu",), []),
        (("name=",), [1]),
        (("flag=true", "level=1"), [0]),
        (("note=x",), [2]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_where_compares_booleans_numbers_and_text_by_their_kind(where, kept, tmp_path):
    """Booleans: true/false in any case; numbers by value; text exactly; null (row 1's note) never matches."""
    rows = [
        {"q": "a", "a": "x", "flag": True, "level": 1, "name": "Relu", "note": "y"},
        {"q": "b", "a": "y", "flag": False, "level": 1.0, "name": "", "note": None},
        {"q": "c", "a": "z", "flag": True, "level": 2.5, "name": "Gelu", "note": "x"},
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    ns = namespace(path, "prompt=q,response=a", where)
    if not kept:
        with pytest.raises(UserError, match="keeps none of the 3 rows"):
            load_data(ns)
        return
    records, identity = load_data(ns)
    assert [r["line"] for r in records] == kept
    assert identity["rows"] == {"read": 3, "kept": len(kept)} and identity["where"] == sorted(where)


def test_where_refuses_a_list_column(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"q": "a", "a": "b", "tags": ["x"]}) + "\n")
    with pytest.raises(UserError, match=rf"^{path}:1: column 'tags' holds a list; --data-where compares"):
        load_data(namespace(path, "prompt=q,response=a", ("tags=x",)))


# ---------------------------------------------------------------------------------------
# Formats: JSON array, JSON lines, rows in the record forms, folders
# ---------------------------------------------------------------------------------------


def test_json_array_json_lines_and_parquet_give_the_same_records(parquet_file, tmp_path):
    rows = table_rows()
    array, lines = tmp_path / "rows.json", tmp_path / "rows.jsonl"
    array.write_text(json.dumps(rows, indent=1))
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = {p.suffix: load_data(namespace(p, FIELDS, (KEEP,))) for p in (array, lines, parquet_file)}
    strip = [
        [{k: v for k, v in r.items() if k not in ("id", "line")} for r in records]
        for records, _ in read.values()
    ]
    assert strip[0] == strip[1] == strip[2] and len(strip[0]) == 5
    assert [r["line"] for r in read[".json"][0]] == [0, 2, 4, 6, 8]  # rows from 0
    assert [r["line"] for r in read[".jsonl"][0]] == [1, 3, 5, 7, 9]  # lines from 1, as in every JSONL
    assert {p: identity["format"] for p, (_, identity) in read.items()} == {
        ".json": "json",
        ".jsonl": "jsonl",
        ".parquet": "parquet",
    }


def test_rows_in_a_record_form_need_no_mapping(tmp_path):
    """A parquet file of chat `messages` rows (as TRL writes them) reads without --data-fields, filtered."""
    records = [json.loads(line) for line in SFT_SMALL.read_text().splitlines()]
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([r | {"keep": i != 1} for i, r in enumerate(records)]), path)
    got, identity = load_data(namespace(path, where=("keep=true",)))
    want = [r for i, r in enumerate(load_sft(SFT_SMALL)) if i != 1]
    assert [(g["id"], g["prompt_messages"], g["response"]) for g in got] == [
        (w["id"], w["prompt_messages"], w["response"]) for w in want
    ]
    assert identity["fields"] is None and identity["rows"] == {"read": 5, "kept": 4}


def test_a_folder_of_parquet_files_reads_them_in_order_and_names_each(tmp_path):
    rows = table_rows()
    (tmp_path / "data" / "b").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:4]), tmp_path / "data" / "a-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), tmp_path / "data" / "b" / "a-00001.parquet")
    (tmp_path / "data" / "README.md").write_text("not data\n")
    records, identity = load_data(namespace(tmp_path / "data", FIELDS, (KEEP,)))
    assert [r["id"] for r in records] == [f"{tmp_path}/data/a-00000.parquet row {i}" for i in (0, 2)] + [
        f"{tmp_path}/data/b/a-00001.parquet row {i}" for i in (0, 2, 4)
    ]
    assert identity["format"] == "parquet-folder" and identity["rows"] == {"read": 10, "kept": 5}
    before = identity["sha256"]
    (tmp_path / "data" / "README.md").write_text("still not data\n")  # not a parquet file: same data
    assert load_data(namespace(tmp_path / "data", FIELDS, (KEEP,)))[1]["sha256"] == before
    pq.write_table(pa.Table.from_pylist(rows[4:6]), tmp_path / "data" / "b" / "a-00001.parquet")
    assert load_data(namespace(tmp_path / "data", FIELDS, (KEEP,)))[1]["sha256"] != before


def test_a_save_to_disk_folder_reads_like_the_parquet_file(parquet_file, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(table_rows())
    ds.save_to_disk(str(tmp_path / "saved"))
    got, identity = load_data(namespace(tmp_path / "saved", FIELDS, (KEEP,)))
    want, _ = load_data(namespace(parquet_file, FIELDS, (KEEP,)))
    assert [(g["prompt_messages"], g["response"], g["line"]) for g in got] == [
        (w["prompt_messages"], w["response"], w["line"]) for w in want
    ]
    assert identity["format"] == "datasets-folder" and len(identity["sha256"]) == 64
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(UserError, match=r"holds the splits train, test; name one split's folder, e\.g\."):
        load_data(namespace(tmp_path / "dict", FIELDS))


def test_a_damaged_save_to_disk_folder_is_one_line_naming_it(tmp_path):
    """The folder's arrow file is memory-mapped and read only when the rows are: bytes overwritten amid
    its text show there (as text that is not UTF-8), and are a UserError naming the folder."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(table_rows()).save_to_disk(str(tmp_path / "saved"))
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    data = bytearray(arrow.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64
    arrow.write_bytes(data)
    with pytest.raises(
        UserError, match=rf"^{tmp_path / 'saved'}: its data cannot be read \(UnicodeDecodeError"
    ):
        load_data(namespace(tmp_path / "saved", FIELDS, (KEEP,)))


def test_a_folder_without_a_dataset_is_named(tmp_path, capsys):
    line, _ = refused(
        STAGE["01"].main,
        ["--data", str(tmp_path), "--data-fields", "prompt=q,response=a", "--out", str(tmp_path / "p")],
        capsys,
    )
    assert line.startswith(f"error: {tmp_path}: is a folder, not a file, and holds no dataset"), line


# ---------------------------------------------------------------------------------------
# The hub, offline
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", ["hf:no-slash", "hf:owner/name:", "hf:/name", "hf:owner/na me"])
def test_a_malformed_hub_id_is_refused_in_one_line(data):
    with pytest.raises(UserError, match=rf"^--data {data}: not a hub dataset id; write hf:owner/name"):
        load_data(namespace(Path(data)))


HUB_CHILD = """
import json, sys
from cuset_common.cli import UserError
from cuset_common.data_sources import hub_split, table_records

repo, keep = sys.argv[1:]
out = {}
for split in ("train", "train[:4]", "train[:4]"):
    table, identity = hub_split("hf:local/repo", repo, None, split)
    records, rows = table_records(table, {"prompt": "Torch Module", "response": "kernel.cu"}, [keep])
    out.setdefault(split, []).append([identity, [r["line"] for r in records], rows])
try:
    hub_split("hf:local/repo", repo, None, "level_9")
except UserError as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def test_the_hub_loader_builds_a_split_and_pins_revision_and_fingerprint(tmp_path):
    """hub_split, the part of the hf: path after the reachability check, on a dataset repository laid out as
    on the hub (data/train-*.parquet) in a local folder, which `datasets` builds with the same builder;
    in a child process, so that its cache goes to a temporary HF_HOME."""
    pytest.importorskip("datasets")
    (tmp_path / "repo" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(table_rows()), tmp_path / "repo" / "data" / "train-00000.parquet")
    env = os.environ | {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", HUB_CHILD, str(tmp_path / "repo"), KEEP],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    ((whole, lines, rows),) = out["train"]
    assert lines == [0, 2, 4, 6, 8] and rows == {"read": 10, "kept": 5}
    assert whole["format"] == "hub" and whole["sha256"] is None and whole["split"] == "train"
    assert len(whole["revision"]) >= 8 and len(whole["fingerprint"]) >= 8
    first, again = out["train[:4]"]
    assert first == again and first[1] == [0, 2] and first[0]["revision"] == whole["revision"]
    assert first[0]["fingerprint"] != whole["fingerprint"]  # another split expression is other data
    assert out["error"] == (
        "--data hf:local/repo: ValueError: Unknown split \"level_9\". Should be one of ['train']."
    )


def test_a_hub_dataset_out_of_reach_is_one_line_in_seconds(tmp_path):
    """No network here; HF_HUB_OFFLINE makes the same refusal certain where there is one."""
    pytest.importorskip("datasets")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run(
        [
            sys.executable,
            "01_profile.py",
            "--data",
            "hf:cuset-tests/no-such-archive:level_1",
            "--data-fields",
            "prompt=a,response=b",
            "--out",
            str(tmp_path / "p"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        "error: --data hf:cuset-tests/no-such-archive:level_1: not in the local cache "
        "and the hub cannot be reached"
    ), r.stderr


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":']), st.sampled_from(["json", "jsonl"]))
@example(100_000, "[", "json")
def test_a_table_nested_to_any_depth_is_read_or_one_line_naming_the_line(tmp_path, depth, opener, form):
    """A row whose extra column nests `depth` deep, on line 2 of a JSON array or of JSON lines: read, or
    refused naming that line (json's RecursionError says no line: the reader finds it)."""
    inner, closer = ("", "]") if opener == "[" else ("0", "}")
    row = '{"q": "a question", "r": "an answer", "extra": ' + opener * depth + inner + closer * depth + "}"
    path = tmp_path / f"deep.{form}"
    path.write_text(f"[\n{row}\n]\n" if form == "json" else '{"q": "x", "r": "y"}\n' + row + "\n")
    try:
        records, _ = load_data(namespace(path, "prompt=q,response=r"))
    except UserError as e:
        assert str(e).startswith(f"{path}:2: JSON nested too deeply to read"), e
    else:
        assert depth < 100_000 and records[-1]["response"] == "an answer"  # the limit is far below that


# ---------------------------------------------------------------------------------------
# Pipes: --data <(command) is /dev/fd/N, read once
# ---------------------------------------------------------------------------------------


def through_a_pipe(data: bytes, read):
    """read(path) of a real pipe that `data` is written into, as the shell makes one for <(command)."""
    read_end, write_end = os.pipe()

    def feed():  # in a thread: a pipe holds 64 KiB, the reader makes room for the rest
        with open(write_end, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        return read(Path(f"/dev/fd/{read_end}"))
    finally:
        writer.join(timeout=60)
        os.close(read_end)


@pytest.mark.parametrize("form", ["json", "jsonl"])
def test_a_table_from_a_pipe_reads_as_the_file_does(form, tmp_path):
    """A JSON array or JSON lines through a pipe: the same records as from the file, and the same sha256,
    though the pipe gives its bytes only once (the stage looks at its start, hashes it and parses it)."""
    rows = table_rows()
    text = json.dumps(rows, indent=1) if form == "json" else "".join(json.dumps(r) + "\n" for r in rows)
    path = tmp_path / f"rows.{form}"
    path.write_text(text)
    piped, piped_id = through_a_pipe(text.encode(), lambda p: load_data(namespace(p, FIELDS, (KEEP,))))
    records, identity = load_data(namespace(path, FIELDS, (KEEP,)))
    assert [r | {"id": None} for r in piped] == [r | {"id": None} for r in records]
    assert piped_id | {"path": None} == identity | {"path": None}


PARQUET_FIFO_CHILD = """
import sys
from argparse import Namespace
from pathlib import Path
from cuset_common.data_sources import load_data

fifo, fields, keep = sys.argv[1:]
records, identity = load_data(Namespace(data=Path(fifo), data_fields=[fields], data_where=[keep]))
print(len(records), identity["sha256"], identity["format"])
"""


def test_a_parquet_file_through_a_named_pipe_is_read_from_its_bytes(parquet_file, tmp_path):
    """Parquet is read from its end, which a pipe cannot seek to, and a named pipe opened again waits for
    a writer that never comes: the bytes read once serve. The reader is a child process with a time
    limit; this process writes into the pipe, as another program would."""
    fifo = tmp_path / "rows.parquet"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(parquet_file.read_bytes(),))
    writer.start()  # it waits for the child to open the pipe
    r = subprocess.run(
        [sys.executable, "-c", PARQUET_FIFO_CHILD, str(fifo), FIELDS, KEEP],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    writer.join(timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].split() == ["5", sha256_file(parquet_file), "parquet"]


# ---------------------------------------------------------------------------------------
# Plain JSONL: exactly as before
# ---------------------------------------------------------------------------------------


def test_a_plain_jsonl_file_is_read_and_pinned_as_before_without_pyarrow_or_datasets():
    code = (
        "import sys; from argparse import Namespace; from pathlib import Path; "
        "from cuset_common.data_sources import load_data; "
        f"records, identity = load_data(Namespace(data=Path({str(SFT_SMALL)!r}))); "
        "print(len(records), identity, 'pyarrow' in sys.modules, 'datasets' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    identity = {"path": str(SFT_SMALL), "sha256": sha256_file(SFT_SMALL)}
    assert r.stdout.strip() == f"5 {identity} False False"
    records, _ = load_data(namespace(SFT_SMALL))
    assert records == load_sft(SFT_SMALL)
    # what stages 02 and 03 compare: an artifact written before tables existed ({path, sha256}) matches
    assert data_checks({"path": "elsewhere.jsonl", "sha256": identity["sha256"]}) == data_checks(identity)
