"""Files written atomically, JSONL read with file:line errors, hashes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .cli import UserError


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~user_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: Path, records: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def json_safe(x):
    """NaN -> None in dicts, lists and tuples, recursively: strict JSON has no NaN (a figure that could not
    be computed is written as null)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and x != x else x  # x != x: NaN


def append_jsonl(path: Path, records: list[dict]) -> None:
    """Append records and fsync, so that a kill loses at most the line being written (a torn last
    line, which read_appended_jsonl drops). The lines are made and encoded before the file is opened (a
    string UTF-8 cannot hold raises with the file untouched), and an error while writing (a full disk, an
    interrupt) cuts the file back to its length before: it never keeps part of an append."""
    data = memoryview("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # 0666 less the umask, as open()'s
    try:
        before = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:  # os.write may write less than it is given
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, before)
            raise
    finally:
        os.close(fd)


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


def user_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status): setting it
    to read it back, as os.umask must, would give files other threads create meanwhile that mode."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    if found := re.search(r"^Umask:\s*([0-7]+)$", status, re.MULTILINE):
        return int(found.group(1), 8)
    umask = os.umask(0o077)  # meanwhile, files of other threads get the strictest usual mode, not 0666
    os.umask(umask)
    return umask


def give_user_modes(folder: Path) -> None:
    """Give a folder written in private (mkdtemp makes it 0700, safetensors writes its files 0600) and all
    in it the modes of any folder and file the user makes: 0777 and 0666 less the umask (a file with an x
    bit keeps them), so that others may read what the user's umask lets them read."""
    umask = user_umask()
    for root, _, files in os.walk(folder):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o111
                os.chmod(path, (0o777 if executable else 0o666) & ~umask)


def real_path(path: Path, what: str = "") -> Path:
    """`path` with every symbolic link followed (it need not exist yet), so that everything done to a
    folder named through a link is done to the one real folder, and the link is left as it is; a loop of
    links is a UserError. what: the option that named the path, for the message (e.g. "--out")."""
    real = Path(os.path.realpath(path))
    try:
        os.stat(real)
    except OSError as e:
        if e.errno == errno.ELOOP:
            name = f"{what} {path}" if what else str(path)
            raise UserError(
                f"{name}: its symbolic links form a loop (they never reach a folder); point the "
                f"link at a real folder, or name another path"
            ) from None
    return real


def replace_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move a completely written folder into place; the previous one is removed only after (a kill between
    the two renames leaves it as .<name>.old, which stage 03's resume state is read from then).

    A final_dir named through a symbolic link replaces the folder the link points to (real_path): the link
    stays. The new folder and its files get the modes of any the user makes (give_user_modes)."""
    final_dir = real_path(final_dir)
    give_user_modes(tmp_dir)
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


def read_json_object(path: Path, fix: str) -> dict:
    """A JSON file that must hold one object (a resume state's arguments, a meta.json); UserError naming the
    file and `fix` when it cannot be read, is not UTF-8 JSON (or nests deeper than Python's recursion
    limit) or holds no object."""
    try:
        obj = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else type(e).__name__
        raise UserError(f"{path}: not a readable JSON file ({why}); {fix}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: holds no JSON object; {fix}")
    return obj


# A \\u escape of a UTF-16 surrogate (D800-DFFF): JSON allows one alone, UTF-8 text cannot hold it.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_line(raw: bytes, path: Path, lineno: int) -> dict | None:
    """One line of a JSONL file as an object (None for a blank line); UserError with file:line otherwise:
    not UTF-8, not JSON (also numbers too long for Python, nesting deeper than its recursion limit), not
    an object, or a string holding half a surrogate pair (no UTF-8 file, tokenizer or JSON writer with
    ensure_ascii=False can take it: refused here rather than in whichever of them meets it first)."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
            f"{e.start + 1}); save the file as UTF-8 JSONL, one JSON object per line"
        ) from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); "
            f"each line must be one JSON object"
        ) from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise UserError(f"{path}:{lineno}: not valid JSON here ({e})") from None
    except RecursionError:
        raise UserError(
            f"{path}:{lineno}: JSON nested too deeply to read (arrays or objects inside each "
            f"other beyond Python's recursion limit); each line must be one plain JSON object"
        ) from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    if SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise UserError(
                f"{path}:{lineno}: a string holds half a UTF-16 surrogate pair "
                f"(\\u{ord(e.object[e.start]):04x} without its partner), which no UTF-8 text can "
                f"hold; fix or remove that escape"
            ) from None
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
    h = hashlib.sha256()
    with open_input(Path(path)) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
