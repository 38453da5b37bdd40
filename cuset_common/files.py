"""Files written atomically, JSONL read with file:line errors, hashes."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .cli import UserError


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: Path, records: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append records and fsync, so that a kill loses at most the line being written (a torn last
    line, which read_appended_jsonl drops)."""
    with open(path, "a", encoding="utf-8", newline="\n") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def read_appended_jsonl(path: Path) -> list[dict]:
    """The records of a file written by append_jsonl ([] if there is none). A last line without its
    newline was cut by a kill: it is removed from the file, so that the next append starts clean."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        os.truncate(path, len(whole))
    return [obj for _, obj in read_jsonl(path)]


def replace_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move a completely written folder into place; the previous one is removed only after (a kill between
    the two renames leaves it as .<name>.old, which stage 03's resume state is read from then)."""
    final_dir = Path(final_dir)
    old = final_dir.with_name(f".{final_dir.name}.old")
    if final_dir.exists():
        if old.exists():  # left by a kill after an earlier swap; while final_dir is absent, the one copy
            shutil.rmtree(old)
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a bad line raises UserError with file:line.

    Bad means: not UTF-8 (a UTF-16 or binary file), not JSON, or not an object. A UTF-8 byte-order mark
    on the first line is accepted (editors on Windows write one)."""
    path = Path(path)
    with open_input(path) as f:
        for lineno, raw in enumerate(f, start=1):
            obj = parse_json_line(raw, path, lineno)
            if obj is not None:
                yield lineno, obj


def parse_json_line(raw: bytes, path: Path, lineno: int) -> dict | None:
    """One line of a JSONL file as an object (None for a blank line); UserError with file:line otherwise."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                        f"{e.start + 1}); save the file as UTF-8 JSONL, one JSON object per line") from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                        f"each line must be one JSON object") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def open_input(path: Path):
    """An input file opened for reading in binary; a folder, a missing or unreadable file is a UserError."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not a file; name the JSONL file inside it")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror})") from None

def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open_input(Path(path)) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
