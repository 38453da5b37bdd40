"""Artifacts (a folder with tensors.safetensors + meta.json + extra files, written atomically) and the
checks that refuse foreign ones. The --out folder a stage writes into: cuset_common/out_dir.py."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save_file

from .cli import NO_SPACE, RUST_OS_ERROR, UserError
from .files import real_path, replace_dir_atomic, sha256_file

# Schema 2 names the per-token and per-sample tensors in docs/method.md's notation (p0, c, m, w). Schema 1
# named them in words; a schema-1 artifact is still read, through this one mapping (read_artifact renames
# its tensors as it loads them; its files stay as they are), so folders written before stay usable.
SCHEMA_VERSION = 2
SCHEMA_1_TENSOR_NAMES = {"confidence": "p0", "sensitive": "c", "sample_mass": "m", "sample_weight": "w"}
READABLE_SCHEMAS = (1, SCHEMA_VERSION)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's full definition (vocab, merges, specials) and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    spec += "\n" + str(getattr(tokenizer, "chat_template", None))
    return hashlib.sha256(spec.encode()).hexdigest()


def library_versions() -> dict[str, str]:
    """The versions of Python and of the four packages every stage needs (their installed distributions)."""
    packages = ("torch", "transformers", "safetensors", "numpy")
    return {"python": platform.python_version()} | {p: importlib.metadata.version(p) for p in packages}


def artifact_meta(meta: dict, folder: Path | None = None) -> dict:
    """A meta.json as every stage writes it (write_artifact, stage 03's final checkpoint): the schema version
    first, then the stage's fields, the record of every file in `folder` (file_records: the artifact
    vouches for its own tensors; called once the folder holds all its files but meta.json), then the
    library versions."""
    files = {} if folder is None else {"files": file_records(folder)}
    return {"schema_version": SCHEMA_VERSION, **meta, **files, "versions": library_versions()}


def file_records(folder: Path) -> dict[str, dict]:
    """{name: {"sha256", "bytes"}} of every file in `folder` but meta.json, by name."""
    return {
        f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size}
        for f in sorted(Path(folder).iterdir())
        if f.is_file() and f.name != "meta.json"
    }


def check_file_records(
    art_dir: Path, meta: dict, must_record: list[str], rerun_hint: str, read: dict | None = None
) -> None:
    """Refuse an artifact whose files are not the ones its meta.json records (one line naming the file and
    the stage to rerun): a file replaced by another run's, cut short or missing, or a meta.json that
    records none of them (written before artifacts recorded their files) or not every name in must_record.
    The sizes are compared first: a file of another size is refused without reading it. read: {name:
    (size, sha256)} of the bytes the caller has read of a file (read_artifact_once), checked as read."""
    records, read = meta.get("files"), read or {}
    unrecorded = [name for name in must_record if not isinstance(records, dict) or name not in records]
    if unrecorded:
        raise UserError(
            f"{art_dir / 'meta.json'}: records no sha256 of {unrecorded[0]} (an artifact written before "
            f"artifacts vouched for their files, or an edited meta.json); rerun {rerun_hint}"
        )
    for name, record in records.items():
        path = art_dir / name
        if name not in read and not path.is_file():
            raise UserError(f"{path}: missing, though meta.json records it; rerun {rerun_hint}")
        size, sha = read.get(name) or (path.stat().st_size, None)
        if not isinstance(record, dict) or (
            size != record.get("bytes") or (sha or sha256_file(path)) != record.get("sha256")
        ):
            raise UserError(
                f"{path}: not the file this artifact wrote (its size or sha256 differs from the one "
                f"meta.json records: another run's, or changed since); rerun {rerun_hint}"
            )


def write_artifact(
    out_dir: Path, tensors: dict, meta: dict, extra_files: dict[str, str] | None = None
) -> None:
    """Write tensors (numpy arrays) + text files + meta.json (recording the others: artifact_meta) to a
    temp folder, then swap it in (into the folder a link out_dir points to: real_path).

    Refused, with nothing written: a float tensor holding NaN or infinity (no stage's artifact may hold
    one; check_finite). A full disk or quota while writing is a UserError too (disk_full), after the temp
    folder is removed: the previous artifact, if any, is as it was."""
    given, out_dir = out_dir, real_path(out_dir, "--out")
    check_finite(tensors, f"--out {path_text(given)}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp"))
    try:
        save_file({k: v for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        full_meta = artifact_meta(meta, tmp)
        (tmp / "meta.json").write_text(json.dumps(full_meta, indent=2, sort_keys=False) + "\n")
        replace_dir_atomic(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if why := disk_full(e):
            raise UserError(
                f"--out {path_text(given)}: {why} while the artifact was being written; nothing was "
                "replaced (a previous artifact there is as it was): free some space, or name another "
                "--out, and run the command again"
            ) from None
        raise


def disk_full(e: BaseException) -> str | None:
    """What ran out when e is a write that failed for want of room (cuset_common/cli.py: NO_SPACE), else
    None. An OSError carries its errno; safetensors' SafetensorError only names it in its text
    ("... (os error 28)")."""
    code = e.errno if isinstance(e, OSError) else None
    if isinstance(e, SafetensorError) and (found := RUST_OS_ERROR.search(str(e))):
        code = int(found[1])
    return NO_SPACE.get(code)


def check_finite(tensors: dict[str, np.ndarray], where: str) -> None:
    """Refuse to write a float tensor that holds NaN or infinity: every stage checks its inputs and computes
    so that none arises (stage 01 stops on a model that gives one, stage 02 refuses such a profile), so one
    here is a fault of the stage on these inputs, to be reported, not an artifact for the next stage."""
    for name, t in tensors.items():
        bad = np.flatnonzero(~np.isfinite(t)) if np.issubdtype(t.dtype, np.floating) else []
        if len(bad):
            raise UserError(
                f"{where}: not written: tensor {name} holds {len(bad)} values that are NaN or infinite "
                f"(the first at index {bad[0]}), which no artifact may hold; nothing was replaced. This is "
                "a fault of the stage: please report the command line"
            )


def read_artifact(
    art_dir: Path,
    expected_stage: str,
    rerun_hint: str,
    token_tensors: dict | None = None,
    sample_tensors: dict | None = None,
    schema: dict | None = None,
) -> tuple[dict, dict]:
    """Load (tensors, meta) of an artifact folder; a missing, foreign or damaged one is a UserError.

    token_tensors / sample_tensors: {name: numpy dtype} that must be present, 1-D, of that dtype, and as
    long as the response tokens (sample_offsets[-1]) / the samples (len(sample_offsets) - 1).
    schema: what meta.json must hold (check_schema); default: META_SCHEMAS of the stage, the fields its
    readers use.
    """
    art_dir = Path(art_dir)
    meta_path, tensor_path = artifact_paths(art_dir, expected_stage, rerun_hint)
    meta = checked_meta(read_input(meta_path, rerun_hint), art_dir, expected_stage, rerun_hint, schema)
    check_file_records(art_dir, meta, ["tensors.safetensors"], rerun_hint)
    tensors = parsed_tensors(lambda: load_file(str(tensor_path)), tensor_path, rerun_hint)
    return checked_tensors(tensors, meta, art_dir, rerun_hint, token_tensors, sample_tensors), meta


@dataclass(frozen=True)
class ReadOnce:
    """An artifact as read_artifact_once read it."""

    tensors: dict  # {name: numpy array}
    meta: dict  # meta.json
    files: dict  # {name: bytes} of each file asked for besides meta.json and the tensors (e.g. samples.jsonl)
    sha256: dict  # {name: sha256} of the bytes read of meta.json, tensors.safetensors and those files


def read_artifact_once(
    art_dir: Path,
    expected_stage: str,
    rerun_hint: str,
    token_tensors: dict | None = None,
    also: tuple[str, ...] = (),
) -> ReadOnce:
    """read_artifact with each file read once, its sha256 taken of the very bytes that are parsed, so that
    what a stage records of its input is what it worked on. read_artifact hashes a file and then reads it
    again, so a file rewritten in between is recorded under the hash of another than the one used (stage
    02 records the profile's sha256; stages 03 and 04 keep read_artifact). `also`: files of the folder to
    return as bytes (checked, as read, against meta.json's record of them). The price: a file's bytes and
    what is parsed from them are in memory together for a moment."""
    art_dir = Path(art_dir)
    meta_path, tensor_path = artifact_paths(art_dir, expected_stage, rerun_hint)
    raw = {"meta.json": read_input(meta_path, rerun_hint)}
    meta = checked_meta(raw["meta.json"], art_dir, expected_stage, rerun_hint, None)
    for name in ("tensors.safetensors", *also):
        if (art_dir / name).is_file():  # a missing one: check_file_records says so
            raw[name] = read_input(art_dir / name, rerun_hint)
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in raw.items()}
    read = {name: (len(raw[name]), sha[name]) for name in raw}
    check_file_records(art_dir, meta, ["tensors.safetensors"], rerun_hint, read)
    files = {name: raw[name] if name in raw else read_input(art_dir / name, rerun_hint) for name in also}
    tensors = parsed_tensors(lambda: load(raw.pop("tensors.safetensors")), tensor_path, rerun_hint)
    tensors = checked_tensors(tensors, meta, art_dir, rerun_hint, token_tensors, None)
    return ReadOnce(tensors, meta, files, sha)


def artifact_paths(art_dir: Path, expected_stage: str, rerun_hint: str) -> tuple[Path, Path]:
    """(meta.json, tensors.safetensors) of an artifact folder; a folder without both is a UserError."""
    meta_path, tensor_path = art_dir / "meta.json", art_dir / "tensors.safetensors"
    if not meta_path.is_file() or not tensor_path.is_file():
        raise UserError(
            f"{art_dir}: no {expected_stage} artifact here (meta.json + tensors.safetensors); "
            f"run {rerun_hint} first"
        )
    return meta_path, tensor_path


def read_input(path: Path, rerun_hint: str) -> bytes:
    """The bytes of a file of an input artifact; one that cannot be read is a UserError."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror}); rerun {rerun_hint}") from None


def checked_meta(
    raw: bytes, art_dir: Path, expected_stage: str, rerun_hint: str, schema: dict | None
) -> dict:
    """meta.json's bytes parsed and checked: JSON, the expected stage, a readable schema version, the fields
    (check_schema; schema None: META_SCHEMAS of the stage)."""
    meta_path = art_dir / "meta.json"
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{meta_path}: not valid JSON ({e}); rerun {rerun_hint}") from None
    if not isinstance(meta, dict) or meta.get("stage") != expected_stage:
        stage = meta.get("stage") if isinstance(meta, dict) else None
        raise UserError(f"{art_dir}: is a {stage!r} artifact, expected {expected_stage!r}")
    if meta.get("schema_version") not in READABLE_SCHEMAS:
        raise UserError(
            f"{art_dir}: schema version {meta.get('schema_version')} but this code reads "
            f"{' and '.join(map(str, READABLE_SCHEMAS))}; rerun {rerun_hint}"
        )
    check_schema(
        meta, META_SCHEMAS.get(expected_stage, {}) if schema is None else schema, meta_path, rerun_hint
    )
    return meta


def parsed_tensors(parse, tensor_path: Path, rerun_hint: str) -> dict:
    """parse() (safetensors' load_file, or load of the bytes read); a damaged file is a UserError."""
    try:
        return parse()
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError, on a damaged file
        raise UserError(
            f"{tensor_path}: cannot be read ({type(e).__name__}: {e}); it may be truncated; "
            f"rerun {rerun_hint}"
        ) from None


def checked_tensors(
    tensors: dict, meta: dict, art_dir: Path, rerun_hint: str, token_tensors, sample_tensors
) -> dict:
    """The tensors under schema 2's names (SCHEMA_1_TENSOR_NAMES), checked as flat per-token and per-sample
    data where token_tensors or sample_tensors name any (check_flat_tensors)."""
    if meta["schema_version"] == 1:
        tensors = {SCHEMA_1_TENSOR_NAMES.get(name, name): t for name, t in tensors.items()}
    if token_tensors is not None or sample_tensors is not None:
        check_flat_tensors(
            tensors, token_tensors or {}, sample_tensors or {}, meta, f"{art_dir}: ", rerun_hint
        )
    return tensors


# ---------------------------------------------------------------------------------------
# meta.json schemas: the fields the readers of an artifact use, with their types
# ---------------------------------------------------------------------------------------

# A schema is {key: kind}: every key must be present; a kind is (what it must be, test of the value), or a
# schema of its own (the value must be an object that holds it). Fields no reader uses are not checked.
TEXT = ("a string", lambda v: isinstance(v, str))
OBJECT = ("an object", lambda v: isinstance(v, dict))


def usable_path(value) -> bool:
    """A string the file system can be asked about: Path.exists raises instead of answering False for one
    with a NUL byte or a lone surrogate, a name over 255 bytes or a path over 4095 (NAME_MAX, PATH_MAX)."""
    try:
        raw = os.fsencode(value) if isinstance(value, str) else None
    except UnicodeEncodeError:
        return False
    return raw is not None and b"\0" not in raw and len(raw) < 4096 and max(map(len, raw.split(b"/"))) <= 255


PATH = ("a path or hub id (a string without NUL, as a file system takes it)", usable_path)


def path_text(path) -> str:
    """A path as text that any UTF-8 file or terminal takes, for what a stage writes or prints about it: a
    name's bytes that are not UTF-8 (which os.fsdecode keeps as lone surrogates, which no UTF-8 encoder
    takes) as \\x escapes, `\\xff`; any other path as str gives it."""
    try:
        return os.fsencode(path).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that no byte decoded to (typed, not read from the file system)
        return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


CATEGORY_NAMES = (
    'an object of category names by code, e.g. {"1": "signature"}',
    lambda v: (
        isinstance(v, dict)
        and all(re.fullmatch("[0-9]+", k) and isinstance(name, str) for k, name in v.items())
    ),
)


def whole(low: int) -> tuple:
    """An integer >= low (JSON's true and false are not integers here, nor is 2.0)."""
    return (f"an integer >= {low}", lambda v: type(v) is int and v >= low)


COUNTS = {"samples": whole(0), "response_tokens": whole(0)}
# Read by stage 02 (every field), stage 03 (--mask-source profile) and research/compare_objectives.py.
PROFILE_META = {
    "model": PATH,
    "tokenizer_fingerprint": TEXT,
    "data": OBJECT,
    "max_length": whole(1),
    "counts": COUNTS,
    "categories": CATEGORY_NAMES,
}
# Read by stage 03 (profile: with --mask-source profile) and research/compare_objectives.py (counts).
REGIONS_META = {
    "tokenizer_fingerprint": TEXT,
    "data": OBJECT,
    "max_length": whole(1),
    "counts": COUNTS,
    "profile": {"path": PATH, "meta_sha256": TEXT},
}
META_SCHEMAS = {"01_profile": PROFILE_META, "02_label_regions": REGIONS_META}


def check_schema(meta: dict, schema: dict, meta_path: Path, rerun_hint: str, prefix: str = "") -> None:
    """Refuse a meta.json (an edited or foreign one) whose fields break `schema`: one line naming the file
    and the key (dotted: profile.path), what it holds and what it must be."""
    for key, kind in schema.items():
        name = prefix + key
        if key not in meta:
            raise UserError(f"{meta_path}: key '{name}' is missing; rerun {rerun_hint}")
        value = meta[key]
        if isinstance(kind, dict) and isinstance(value, dict):
            check_schema(value, kind, meta_path, rerun_hint, f"{name}.")
        elif isinstance(kind, dict) or not kind[1](value):
            must = "an object" if isinstance(kind, dict) else kind[0]
            raise UserError(
                f"{meta_path}: key '{name}' is {json_kind(value)}, must be {must}; rerun {rerun_hint}"
            )


def json_kind(value) -> str:
    """A JSON value in a few words for a message: a scalar as written, a container by its kind."""
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40])}" + ("..." if len(value) > 40 else "")
    if isinstance(value, (dict, list)):
        return f"an {'object' if isinstance(value, dict) else 'array'} of {len(value)} entries"
    return json.dumps(value)


def check_flat_tensors(
    t: dict, token_tensors: dict, sample_tensors: dict, meta: dict, where: str, rerun_hint: str
) -> None:
    """The artifact contract for flat per-token data: names, dtypes, lengths and sample_offsets."""

    def bad(msg: str) -> UserError:
        return UserError(f"{where}{msg}; rerun {rerun_hint}")

    for name, dtype in {**token_tensors, **sample_tensors, "sample_offsets": np.int64}.items():
        if name not in t or t[name].dtype != dtype or t[name].ndim != 1:
            raise bad(f"tensor {name} missing or not 1-D {np.dtype(dtype).name}")
    off = t["sample_offsets"]
    if len(off) == 0 or off[0] != 0 or np.any(np.diff(off) < 0):
        raise bad("sample_offsets must start at 0 and never decrease")
    n_tok, n_samples = int(off[-1]), len(off) - 1
    for name in token_tensors:
        if len(t[name]) != n_tok:
            raise bad(f"tensor {name} has {len(t[name])} entries but sample_offsets cover {n_tok} tokens")
    for name in sample_tensors:
        if len(t[name]) != n_samples:
            raise bad(f"tensor {name} has {len(t[name])} entries but there are {n_samples} samples")
    counts = meta.get("counts") or {}
    if counts.get("samples", n_samples) != n_samples or counts.get("response_tokens", n_tok) != n_tok:
        raise bad(
            f"meta.json counts ({counts.get('samples')} samples, {counts.get('response_tokens')} "
            f"tokens) disagree with the tensors ({n_samples}, {n_tok})"
        )


def args_to_json(args) -> dict:
    """argparse values as JSON-friendly values (paths as strings), for meta.json and resume checks."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def check_resume_args(
    saved: dict, now: dict, may_change: set[str], where: Path, restart: str = "another --out, or --force"
) -> None:
    """--resume continues one run: refuse other arguments than the ones it started with, since a result
    made half under one configuration and half under another is neither's.

    may_change: arguments that do not change the result (logging, --stop-after, --resume itself);
    restart: how this stage starts a run afresh instead.
    """
    diff = [
        f"--{k.replace('_', '-')}: the run has {saved.get(k)!r}, now {now.get(k)!r}"
        for k in sorted(set(saved) | set(now))
        if k not in may_change and saved.get(k) != now.get(k)
    ]
    if diff:
        raise UserError(
            f"{where}: --resume with arguments other than the run's own ({'; '.join(diff)}); "
            f"resume with the same arguments, or start a new run ({restart})"
        )


def check_meta_matches(
    meta: dict, expected: dict[str, str], art_dir: Path, rerun_hint: str, force: bool
) -> None:
    """Refuse an artifact made from another model, tokenizer or data (unless --force)."""
    wrong = [f"{k}: artifact has {meta.get(k)!r}, now {v!r}" for k, v in expected.items() if meta.get(k) != v]
    if wrong and not force:
        raise UserError(
            f"{art_dir} was made from different inputs ({'; '.join(wrong)}); "
            f"rerun {rerun_hint}, or pass --force to use it anyway"
        )
