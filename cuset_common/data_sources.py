"""--data in every form stages 01-03 read, turned into the SFT records of data.load_sft, with the identity
that each artifact's meta pins (docs/data.md, "Other data").

A JSONL file of SFT records (the four forms of data.normalize_record) is read exactly as load_sft reads it,
and its identity is what it always was: {path, sha256}. Anything else is a table of rows with named
columns: a .parquet, .json (an array of objects, or JSON lines) or .jsonl file, a folder of parquet files,
a folder written by `Dataset.save_to_disk`, or a hub dataset `hf:owner/name[@revision][:split]`.
`--data-fields` maps columns onto the record (a prompt may be a template over several columns), and
`--data-where COLUMN=VALUE` keeps only matching rows; without --data-fields each row must itself be a record
in one of the four forms. pyarrow and `datasets` are optional (not in requirements.txt), so they are
imported inside the functions that use them: pyarrow only for parquet, `datasets` only for a dataset folder
or the hub; the JSONL path needs only the stages' own four packages. A file that is a pipe (`--data
<(command)`, /dev/stdin) is read once, into memory, at most PIPE_LIMIT_BYTES (read_pipe), and read and
hashed from those bytes; a device (/dev/zero, a terminal) or socket is refused before it is read.

What the libraries raise on a bad file or id (pyarrow on a damaged parquet file or one with two columns of
one name, huggingface_hub on an id it refuses) is a UserError naming the file or id, as is JSON nested
deeper than Python's recursion limit: never a traceback.

The identity of a table names its source (sha256 of the file, or of the folder's files; for the hub the
dataset, revision, split and fingerprint), the mapping, the filter and the rows read and kept: a different
mapping or filter of the same file is different data, and stages 02 and 03 refuse it (data_checks).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import shlex
import stat
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
from huggingface_hub.errors import (
    CorruptedCacheException,
    EntryNotFoundError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
    XetDownloadError,
)
from huggingface_hub.utils import validate_repo_id

from .cli import UserError
from .data import jsonl_lines, load_sft, normalize_record
from .files import file_mode, is_dir, open_input, read_chunks, sha256_file
from .paths import SFT_KERNEL_FILE

ROLES = ("prompt", "response", "system")  # what --data-fields may map; prompt and response are required
# The columns of each record form data.normalize_record reads: a table without --data-fields needs one.
RECORD_FORMS = (("messages",), ("prompt", "completion"), ("instruction", "output"), ("text",))
HUB_PREFIX = "hf:"
HUB_ID = re.compile(
    r"hf:(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^:\s]+))?"
    r"(?::(?P<split>\S+))?"
)
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}  # in templates: shells pass `\n` inside quotes as two characters
# What a data identity holds besides the path as typed: sha256 of the file or folder (None for the hub), then
# for a table its format, mapping, filter and row counts, and for the hub what it resolved to.
IDENTITY_PARTS = (
    "sha256",
    "format",
    "fields",
    "where",
    "rows",
    "dataset",
    "revision",
    "split",
    "fingerprint",
)

DATA_HELP = (
    " (default: %(default)s). A JSONL file of SFT records (chat `messages`, "
    "`prompt`/`completion`, `instruction`/`input`/`output` or `text`); a .parquet, .json or .jsonl "
    "file with any columns, a folder of parquet files or a `save_to_disk` folder; or a hub dataset "
    "hf:owner/name[@revision][:split] (split default train). Parquet needs `pip install pyarrow`, "
    "dataset folders and the hub `pip install datasets`"
)
FIELDS_HELP = (
    "prompt=COLUMN,response=COLUMN[,system=COLUMN]: the columns that hold the prompt, the answer "
    "to learn and a system message. A value with {COLUMN} in it is a template over columns, e.g. "
    "'prompt=Write a CUDA kernel for this module:\\n{code}' (\\n: newline; {{ }}: braces). "
    "Without it, each row must be a record in one of the JSONL forms. Repeatable"
)
WHERE_HELP = (
    "COLUMN=VALUE: keep only rows whose COLUMN equals VALUE; repeatable, every one must hold. A "
    "boolean column takes true or false, a numeric one a number (compared by value: 1 = 1.0), any "
    "other the exact text; a row without a value never matches"
)


def add_data_arguments(ap: argparse.ArgumentParser, role: str) -> None:
    """--data, --data-fields and --data-where, the same in every stage; role: what the data is to this stage.

    The two new flags default to argparse.SUPPRESS, so that a run without them records the same args in
    meta.json (and checks --resume the same way) as before they existed."""
    ap.add_argument("--data", type=Path, default=SFT_KERNEL_FILE, help=role + DATA_HELP)
    ap.add_argument(
        "--data-fields",
        action="append",
        default=argparse.SUPPRESS,
        metavar="ROLE=COLUMN,...",
        help=FIELDS_HELP,
    )
    ap.add_argument(
        "--data-where", action="append", default=argparse.SUPPRESS, metavar="COLUMN=VALUE", help=WHERE_HELP
    )


def data_argv(args: argparse.Namespace) -> list[str]:
    """The data flags as typed, for a command that must read the same data (hints,
    research/compare_objectives.py)."""
    fields = [x for f in getattr(args, "data_fields", []) for x in ("--data-fields", f)]
    filters = [x for w in getattr(args, "data_where", []) for x in ("--data-where", w)]
    return ["--data", str(args.data), *fields, *filters]


def data_flags(args: argparse.Namespace) -> str:
    return shlex.join(data_argv(args))


def data_checks(identity: dict | None) -> dict:
    """What stages 02 and 03 compare (check_meta_matches) of a data identity: every part but the path as
    typed, as `data_<part>` (a plain JSONL file has only its sha256, the rest None on both sides, so artifacts
    made before tables existed still match)."""
    identity = identity or {}
    return {f"data_{part}": identity.get(part) for part in IDENTITY_PARTS}


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


@dataclass
class Table:
    """One source's rows. name: what messages call it; columns: {name: type as the source describes it};
    read(columns or None for all) -> [(where, line, row)], where naming the file and row (or line)."""

    name: str
    columns: dict[str, str]
    read: Callable[[list[str] | None], list[tuple[str, int, dict]]]


def load_data(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(records as load_sft returns them, the data's identity for meta.json) of --data, --data-fields and
    --data-where; bad data or a bad mapping raises UserError naming the file, row and columns."""
    fields = parse_fields(getattr(args, "data_fields", None))
    filters = parse_where(getattr(args, "data_where", None))
    path = Path(args.data)
    content = read_pipe(path)
    is_table = (
        str(path).startswith(HUB_PREFIX) or is_dir(path) or is_parquet(path) or is_json_array(path, content)
    )
    if not (is_table or fields or filters):
        return load_sft(path, content), {"path": str(path), "sha256": data_sha256(path, content)}
    table, identity = open_source(path, content)
    records, rows = table_records(table, fields, filters)
    if filters:
        print(
            f"[data] {table.name}: {rows['kept']} of {rows['read']} rows kept by --data-where "
            f"{' '.join(filters)}",
            flush=True,
        )
    return records, identity | {"fields": fields, "where": sorted(filters), "rows": rows}


def table_records(table: Table, fields: dict | None, filters: list[str]) -> tuple[list[dict], dict]:
    """The kept rows as SFT records (each with its "line": line or row number), and {read, kept} counts."""
    templates = {role: parse_template(role, spec) for role, spec in (fields or {}).items()}
    conditions = [(spec, *spec.split("=", 1)) for spec in filters]
    needed = check_columns(table, fields, templates, conditions)
    rows = table.read(needed)
    kept = [r for r in rows if all(matches(r[2].get(c), v, c, r[0]) for _, c, v in conditions)]
    if not kept:
        raise UserError(no_rows(table, rows, conditions) if rows else f"{table.name}: no rows")
    records = [
        (row_record(row, templates, where, table) if fields else normalize_record(row, where))
        | {"line": line}
        for where, line, row in kept
    ]
    return records, {"read": len(rows), "kept": len(kept)}


def check_columns(table: Table, fields: dict | None, templates: dict, conditions: list) -> list[str] | None:
    """Refuse a mapping or filter that names a column the table lacks, and a table without --data-fields
    whose rows cannot be records; return the columns to read (None: all, for rows read as records)."""
    mapped = [
        (f"--data-fields {role}={fields[role]}", column)
        for role, parts in templates.items()
        for _, column in parts
        if column is not None
    ]
    for flag, column in mapped + [(f"--data-where {spec}", column) for spec, column, _ in conditions]:
        if column not in table.columns:
            raise UserError(f"{flag}: {table.name} has no column {column!r}; {columns_line(table)}")
    if fields:
        return sorted({c for _, c in mapped} | {c for _, c, _ in conditions})
    if not any(all(c in table.columns for c in form) for form in RECORD_FORMS):
        forms = ", ".join("+".join(form) for form in RECORD_FORMS)
        raise UserError(
            f"{table.name}: its rows are in none of the SFT record forms ({forms}); map its "
            f"columns with --data-fields prompt=COLUMN,response=COLUMN; {columns_line(table)}"
        )
    return None


def row_record(row: dict, templates: dict, where: str, table: Table) -> dict:
    """One row as an SFT record: a chat of an optional system turn, the prompt and the response."""
    text = {role: fill(parts, row, where, table) for role, parts in templates.items()}
    system = [{"role": "system", "content": text["system"]}] if text.get("system") else []
    return normalize_record(
        {
            "messages": system
            + [
                {"role": "user", "content": text["prompt"]},
                {"role": "assistant", "content": text["response"]},
            ]
        },
        where,
    )


def fill(parts: list[tuple[str, str | None]], row: dict, where: str, table: Table) -> str:
    """A template's text for one row; every column it names must hold text."""
    out = []
    for literal, column in parts:
        value = row.get(column) if column is not None else ""
        if not isinstance(value, str):
            raise UserError(
                f"{where}: column {column!r} holds {describe_value(value)}, not text; map text "
                f"columns with --data-fields ({columns_line(table)})"
            )
        out += [literal, value]
    return "".join(out)


# ---------------------------------------------------------------------------------------
# --data-fields and --data-where
# ---------------------------------------------------------------------------------------


def parse_fields(specs: list[str] | None) -> dict[str, str] | None:
    """{role: column or template} from one or more `prompt=...,response=...` strings. A comma starts a new
    pair only before `prompt=`, `response=` or `system=`, so a template may hold commas."""
    if not specs:
        return None
    fields: dict[str, str] = {}
    for spec in specs:
        for pair in re.split(rf",(?=\s*(?:{'|'.join(ROLES)})\s*=)", spec):
            role, sep, value = pair.partition("=")
            role = role.strip()
            if not sep or role not in ROLES or not value.strip():
                raise UserError(
                    f"--data-fields {pair!r}: expected ROLE=COLUMN with ROLE one of "
                    f"{', '.join(ROLES)}, e.g. prompt=question,response=answer"
                )
            if role in fields:
                raise UserError(f"--data-fields: {role} is mapped twice ({fields[role]!r} and {value!r})")
            fields[role] = value if "{" in value else value.strip()
    if missing := [r for r in ("prompt", "response") if r not in fields]:
        raise UserError(
            f"--data-fields {','.join(specs)}: maps no {' and no '.join(missing)}; both are "
            "needed, e.g. prompt=question,response=answer"
        )
    return fields


def parse_template(role: str, spec: str) -> list[tuple[str, str | None]]:
    """[(literal text, column or None)] of a field: a plain column name, or a template with {COLUMN}s."""
    if "{" not in spec and "}" not in spec:
        return [("", spec)]
    text = re.sub(r"\\([nt\\])", lambda m: ESCAPES[m.group(1)], spec)
    bad = f"--data-fields {role}={spec}: not a template of {{COLUMN}} names"
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as e:
        raise UserError(f"{bad} ({e}); write {{{{ and }}}} for literal braces") from None
    if any(column is not None and (not column or spec_ or conv) for _, column, spec_, conv in parts):
        raise UserError(f"{bad} (no format specs, conversions or empty {{}}); write {{COLUMN}}")
    return [(literal, column) for literal, column, _, _ in parts]


def parse_where(specs: list[str] | None) -> list[str]:
    for spec in specs or []:
        column, sep, _ = spec.partition("=")
        if not sep or not column:
            raise UserError(f"--data-where {spec!r}: expected COLUMN=VALUE, e.g. Correct=true")
    return list(specs or [])


def matches(value, wanted: str, column: str, where: str) -> bool:
    """Does a cell equal the VALUE of --data-where? Booleans take true/false (any case), numbers compare
    by value, text exactly; a missing value (null) matches nothing."""
    if value is None:
        return False
    if isinstance(value, bool):
        return wanted.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return value == float(wanted)
        except ValueError:
            return False
    if isinstance(value, str):
        return value == wanted
    raise UserError(
        f"{where}: column {column!r} holds {describe_value(value)}; --data-where compares "
        "booleans, numbers and text only"
    )


def no_rows(table: Table, rows: list, conditions: list[tuple[str, str, str]]) -> str:
    alone = [
        f"{spec} alone keeps {sum(matches(r[2].get(c), v, c, r[0]) for r in rows)} "
        f"({c} is {table.columns[c]})"
        for spec, c, v in conditions
    ]
    return (
        f"--data-where keeps none of the {len(rows)} rows of {table.name} ({'; '.join(alone)}); a "
        f"boolean column takes true or false, a numeric one a number, any other the exact text; "
        f"{columns_line(table)}"
    )


def columns_line(table: Table) -> str:
    return "its columns: " + ", ".join(f"{name} ({kind})" for name, kind in table.columns.items())


def describe_value(value) -> str:
    if value is None:
        return "no value (null or missing)"
    if isinstance(value, (bool, int, float)):
        return f"{'a boolean' if isinstance(value, bool) else 'a number'} ({value})"
    return f"a {kind_of(value)}"


def kind_of(value) -> str:
    """The JSON kind of a value, as a column type."""
    for kind, types in (
        ("null", type(None)),
        ("bool", bool),
        ("number", (int, float)),
        ("string", str),
        ("list", list),
    ):
        if isinstance(value, types):
            return kind
    return "object"


# ---------------------------------------------------------------------------------------
# Sources: JSON files, parquet files and folders, dataset folders, the hub
# ---------------------------------------------------------------------------------------


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() == ".parquet"


def read_pipe(path: Path) -> bytes | None:
    """The bytes of --data read once, when it is a pipe (`--data <(command)`, /dev/stdin fed by `|`): a pipe
    gives its bytes to its first reader only, and --data is read more than once (is_json_array looks at its
    start, the identity hashes it, the reader parses it). At most PIPE_LIMIT_BYTES (cuset_common/files.py:
    read_chunks refuses more in one line). Any other file that is not a regular one (/dev/zero, a
    terminal, a socket) is refused here, before anything reads it (open_input): reading it may never end.
    None for a regular file, a folder, a hub id or a path that is not there (read where needed, or
    refused there)."""
    if str(path).startswith(HUB_PREFIX):
        return None
    mode = file_mode(path)
    if mode is None or stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    with open_input(path) as f:
        return b"".join(read_chunks(f, path))


def data_sha256(path: Path, content: bytes | None) -> str:
    """sha256 of --data: of its bytes where read_pipe read them, else of the file (a missing or unreadable
    file is a UserError here)."""
    return sha256_file(path) if content is None else hashlib.sha256(content).hexdigest()


def is_json_array(path: Path, content: bytes | None = None) -> bool:
    """A file whose text starts with `[` (after a byte-order mark and blanks): a JSON array of rows.
    content: the file's bytes where read_pipe read them."""
    if content is None:
        try:
            with open(path, "rb") as f:
                content = f.read(4096)
        except OSError:
            return False  # load_sft or open_source says what is wrong with it
    return content[:4096].removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[")


def open_source(path: Path, content: bytes | None = None) -> tuple[Table, dict]:
    """The table behind --data and its identity (without mapping, filter and counts); content: its bytes
    where read_pipe read them."""
    text = str(path)
    if text.startswith(HUB_PREFIX):
        return open_hub(text)
    if is_dir(path):
        return open_folder(path)
    identity = {"path": text, "sha256": data_sha256(path, content)}  # a missing file: one line, here
    if is_parquet(path):
        return open_parquet([path], text, content), identity | {"format": "parquet"}
    json_kind = "json" if is_json_array(path, content) else "jsonl"
    return open_json(path, json_kind == "json", content), identity | {"format": json_kind}


def open_json(path: Path, array: bool, content: bytes | None = None) -> Table:
    """A JSON array of objects (rows numbered from 0) or JSON lines (numbered from 1, as read_jsonl does);
    content: the file's bytes where read_pipe read them."""
    if array:
        rows = read_json_array(path, content)
        items = [(f"{path} row {i}", i, row) for i, row in enumerate(rows)]
    else:
        items = [(f"{path}:{lineno}", lineno, row) for lineno, row in jsonl_lines(path, content)]
    for where, _, row in items:
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object, got {kind_of(row)}")
    kinds: dict[str, set[str]] = {}
    for _, _, row in items:
        for key, value in row.items():
            kinds.setdefault(key, set()).add(kind_of(value))
    columns = {key: "|".join(sorted(k)) for key, k in kinds.items()}
    return Table(str(path), columns, lambda needed: items)


def read_json_array(path: Path, content: bytes | None) -> list:
    """A file of one JSON array, decoded; what is wrong with it is a UserError naming file and line."""
    if content is None:
        with open_input(path) as f:
            content = f.read()
    try:
        return json.loads(content.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{content[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise UserError(f"{path}: not valid JSON here ({e})") from None
    except RecursionError:
        raise UserError(
            f"{path}:{deepest_line(content)}: JSON nested too deeply to read (arrays or objects inside "
            "each other beyond Python's recursion limit); each row must be one plain JSON object"
        ) from None


# One token of JSON's nesting: a string (skipped whole: brackets inside it are text), or a bracket.
JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def deepest_line(content: bytes) -> int:
    """The line of a JSON text on which it nests deepest: where to look when it nests too deep to decode
    (json's RecursionError says nowhere)."""
    depth = deepest = where = 0
    for token in JSON_NESTING.finditer(content):
        if token.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest, where = depth, token.start()
        elif token.group() in (b"]", b"}"):
            depth -= 1
    return content.count(b"\n", 0, where) + 1


def open_parquet(files: list[Path], name: str, content: bytes | None = None) -> Table:
    """Parquet files read with pyarrow, only the columns needed; rows numbered from 0 within each file.
    content: the one file's bytes, where read_pipe read them."""
    pq = import_or_refuse("pyarrow.parquet", "pyarrow", name)
    import pyarrow as pa

    if content is not None:
        # Read from a copy that Arrow owns: reading through a buffer over the Python bytes themselves, in a
        # process that has loaded torch, could end the interpreter with a C++ abort at exit
        piped = pa.allocate_buffer(len(content))
        pa.FixedSizeBufferWriter(piped).write(content)

    def source(f: Path):  # the file, or the bytes of the pipe that named it
        return f if content is None else pa.BufferReader(piped)

    schemas = {}
    for f in files:
        try:
            schemas[f] = pq.read_schema(source(f))
        except (pa.ArrowException, OSError) as e:
            raise UserError(f"{f}: not a parquet file ({reason(e)})") from None
        names = schemas[f].names
        if repeated := sorted({name for name in names if names.count(name) > 1}):
            raise UserError(
                f"{f}: has more than one column named {', '.join(map(repr, repeated))} (a name could "
                "not say which one is meant); write the file again with each column named once"
            )
    columns = {}
    for schema in schemas.values():
        for field in schema:
            columns.setdefault(field.name, str(field.type))

    def read(needed: list[str] | None) -> list[tuple[str, int, dict]]:
        items = []
        for f, schema in schemas.items():
            if missing := sorted(set(needed or ()) - set(schema.names)):
                raise UserError(
                    f"{f}: has no column {', '.join(missing)} (its columns: "
                    f"{', '.join(schema.names)}); give a folder whose files share their columns"
                )
            # The pages are read only here: damaged ones behind an intact footer fail now, in pyarrow or,
            # as text that is not UTF-8, in Python (a ValueError)
            try:
                rows = pq.read_table(source(f), columns=needed).to_pylist()
            except (pa.ArrowException, OSError, ValueError) as e:
                raise UserError(
                    f"{f}: its data cannot be read ({reason(e)}); the file is damaged: write or "
                    "download it again"
                ) from None
            items += [(f"{f} row {i}", i, row) for i, row in enumerate(rows)]
        return items

    return Table(name, columns, read)


def open_folder(path: Path) -> tuple[Table, dict]:
    """A `save_to_disk` folder (datasets), or a folder of parquet files (searched recursively)."""
    saved = (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
    files = sorted(f for f in (path.rglob("*") if saved else path.rglob("*.parquet")) if f.is_file())
    if not files:
        raise UserError(
            f"{path}: is a folder, not a file, and holds no dataset (no parquet file, no "
            "`save_to_disk` folder); name a JSONL, JSON or parquet file, or a dataset folder"
        )
    identity = {"path": str(path), "sha256": sha256_files(path, files)}
    if not saved:
        return open_parquet(files, str(path)), identity | {"format": "parquet-folder"}
    datasets = import_or_refuse("datasets", "datasets", str(path))
    import pyarrow as pa  # datasets' own storage: it needs it

    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError, pa.ArrowException) as e:
        raise UserError(f"{path}: not a dataset folder that `save_to_disk` wrote ({reason(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise UserError(
            f"{path}: holds the splits {', '.join(ds)}; name one split's folder, e.g. {path / next(iter(ds))}"
        )
    return dataset_table(ds, str(path)), identity | {"format": "datasets-folder"}


def dataset_table(ds, name: str) -> Table:
    """A `datasets.Dataset` as a table; rows numbered from 0, as ds[i] numbers them."""
    import pyarrow as pa  # datasets' own storage: it needs it

    columns = {c: getattr(f, "dtype", None) or type(f).__name__.lower() for c, f in ds.features.items()}

    def read(needed: list[str] | None) -> list[tuple[str, int, dict]]:
        # The files are memory-mapped, read only here: damage fails now, in pyarrow or, as text that is
        # not UTF-8, in Python (a ValueError)
        try:
            rows = (ds.select_columns(needed) if needed else ds).to_list()
        except (OSError, ValueError, pa.ArrowException) as e:
            raise UserError(
                f"{name}: its data cannot be read ({reason(e)}); it is damaged: make it again"
            ) from None
        return [(f"{name} row {i}", i, row) for i, row in enumerate(rows)]

    return Table(name, columns, read)


def open_hub(text: str) -> tuple[Table, dict]:
    """hf:owner/name[@revision][:split] through `datasets` (downloaded once into its cache)."""
    m = HUB_ID.fullmatch(text)
    if m is None:
        raise UserError(
            f"--data {text}: not a hub dataset id; write hf:owner/name, optionally with "
            "@revision and :split (e.g. hf:SakanaAI/AI-CUDA-Engineer-Archive:level_1)"
        )
    check_hub_id(text, m["repo"])
    import_or_refuse("datasets", "datasets", text)
    check_hub_dataset(text, m["repo"], m["revision"])
    return hub_split(text, m["repo"], m["revision"], m["split"] or "train")


def hub_split(text: str, repo: str, revision: str | None, split: str) -> tuple[Table, dict]:
    """One split (or `datasets` split expression: `a+b`, `train[:1000]`) of a dataset, as load_dataset
    builds it; the identity records the revision it resolved to (the repo's commit on the hub) and the
    split's fingerprint (a hash of that revision and the split expression)."""
    import datasets
    import pyarrow as pa

    # No network, no such split, a damaged file, a failed download: most raise an OSError or a ValueError;
    # datasets' and pyarrow's base classes and the hub library's errors that are neither catch the rest
    failures = (OSError, ValueError, datasets.exceptions.DatasetsError, pa.ArrowException)
    hub_failures = (EntryNotFoundError, XetDownloadError, CorruptedCacheException)
    try:
        builder = datasets.load_dataset_builder(repo, revision=revision)
        builder.download_and_prepare()
        ds = builder.as_dataset(split=split)
    except failures + hub_failures as e:
        raise UserError(f"--data {text}: {reason(e)}") from None
    identity = {
        "path": text,
        "sha256": None,
        "format": "hub",
        "dataset": repo,
        "revision": builder.hash,
        "split": split,
        "fingerprint": ds._fingerprint,
    }
    return dataset_table(ds, text), identity


def check_hub_id(text: str, repo: str) -> None:
    """Refuse an owner/name the hub library would refuse (two dots or dashes in a row, a name ending in a
    dot, over 96 characters, ...): its rules, checked before anything is looked up, cached or online."""
    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise UserError(
            f"--data {text}: not a hub dataset id ({reason(e)}); copy the id from the dataset's page"
        ) from None


def check_hub_dataset(text: str, repo: str, revision: str | None) -> None:
    """Refuse, after one request with a 2-second timeout, a dataset that is neither in the local cache nor
    reachable on the hub; without this, datasets retries at length, printing each retry (docs/notebook.md
    gives how long)."""
    cached = huggingface_hub.try_to_load_from_cache(repo, "README.md", revision=revision, repo_type="dataset")
    if isinstance(cached, str):
        return
    fix = "check the id, or download the dataset where the hub is reachable and pass its folder"
    try:
        huggingface_hub.dataset_info(repo, revision=revision, timeout=2)
    except RepositoryNotFoundError:
        raise UserError(
            f"--data {text}: no dataset {repo} on the hub (or it is private: log in with "
            f"`hf auth login`); {fix}"
        ) from None
    except HfHubHTTPError:
        return  # the hub answered (an error of its own, e.g. gated): datasets says what it needs
    except Exception as e:  # the HTTP client's own errors (no network, DNS, timeout), and offline mode
        raise UserError(
            f"--data {text}: not in the local cache and the hub cannot be reached ({reason(e)}); {fix}"
        ) from None


def reason(error: Exception) -> str:
    """A library's exception in one line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def import_or_refuse(module: str, package: str, data: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"--data {data}: reading it needs the {package} package; `pip install {package}`"
        ) from None


def sha256_files(folder: Path, files: list[Path]) -> str:
    """One sha256 over a folder's files: each one's path relative to the folder and its own sha256."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(folder).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()
