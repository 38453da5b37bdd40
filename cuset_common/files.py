"""Files written atomically, JSONL read with file:line errors, hashes; the kind of file a path names,
asked without raising; inputs read from a pipe with a size limit.

What an input may be: a regular file (read as it is, however large: its size is the user's data), a
pipe (`--data <(command)`, /dev/stdin fed by `|`: read once, at most PIPE_LIMIT_BYTES, since nothing says
how much a pipe will give, and `<(cat /dev/zero)` never ends), or a folder where a reader takes one. Any
other kind (a device such as /dev/zero or a terminal, a socket) is refused in one line before it is read:
reading it may never end."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from .cli import UserError, path_hint

# The most bytes an input read from a pipe may hold (it is held in memory whole, once: read_chunks). Data
# larger than this belongs in a regular file, which is read without a limit.
PIPE_LIMIT_BYTES = 1 << 30
CHUNK_BYTES = 1 << 20


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with naming(path):
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.chmod(tmp, 0o666 & ~user_umask())  # mkstemp makes 0600; give the file the usual mode
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def naming(path: Path):
    """Within: an OSError is raised again as one naming `path`, the file being written (a full disk is
    raised by the file object, which names no file, and a failed rename names our temp file first), so
    that the line run_main prints says which file could not be written (cli.file_error_line)."""
    try:
        yield
    except OSError as e:
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e  # of the subclass of its errno


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
            with naming(path):
                while data:  # os.write may write less than it is given
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, before)
            raise
    finally:
        os.close(fd)


def read_appended_jsonl(path: Path) -> list[dict]:
    """The records of a file written by append_jsonl ([] if there is none), for the process that appends
    to it next. A last line without its newline was cut by a kill: it is removed from the file, so that
    the next append starts clean. Any other reader reads with read_whole_lines_jsonl, which never writes."""
    data = appended_bytes(path)
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        os.truncate(path, len(whole))
    return [obj for _, obj in jsonl_records(whole, path)]


def read_whole_lines_jsonl(path: Path) -> list[dict]:
    """The records of the whole lines of a file written by append_jsonl ([] if there is none), read only:
    a last line without its newline (an append under way in another process, or cut by a kill) is left
    out and left in the file, which is its writer's to repair (read_appended_jsonl). Readers never write:
    cutting a line that a writer is appending would tear its record."""
    data = appended_bytes(path)
    return [obj for _, obj in jsonl_records(data[: data.rfind(b"\n") + 1], path)]


def appended_bytes(path: Path) -> bytes:
    """The bytes of a file that append_jsonl writes, b"" where there is none yet; a folder in its place,
    or a file that cannot be read, is a UserError."""
    path = Path(path)
    if not exists(path):
        return b""
    with open_input(path, fix="move it away: the run writes a file there") as f:
        return b"".join(read_chunks(f, path))


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
    folder named through a link is done to the one real folder, and the link is left as it is. A path no
    file can have is a UserError: a loop of links, a name too long, a folder on the way this user may not
    enter (each would make every later check raise). what: the option that named the path, for the
    message (e.g. "--out")."""
    real = Path(os.path.realpath(path))
    error = stat_error(real)
    code = error.errno if error is not None else None
    name = f"{what} {path}" if what else str(path)
    if code == errno.ELOOP:
        raise UserError(
            f"{name}: its symbolic links form a loop (they never reach a folder); point the "
            f"link at a real folder, or name another path"
        )
    if code in (errno.ENAMETOOLONG, errno.EACCES):
        raise UserError(f"{name}: {error.strerror}; {path_hint(code)}")
    return real


def stat_error(path: Path) -> OSError | None:
    """The OSError of os.stat(path), None if it succeeds (a NUL byte in the path: ENOENT's, as no file has
    that name)."""
    try:
        os.stat(path)
    except OSError as e:
        return e
    except ValueError:
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return None


def file_mode(path: Path) -> int | None:
    """The st_mode of what `path` names (links followed), or None where the file system has nothing to show
    there: absent, a part of the path a file, a name too long, a folder on the way this user may not
    enter. Path.exists, is_dir and is_file raise OSError for the last two (Python 3.11), so a check that
    asks them ends the stage in a traceback; the reader that opens the path afterwards says which it is."""
    try:
        return os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL byte
        return None


def exists(path: Path) -> bool:
    return file_mode(path) is not None


def is_dir(path: Path) -> bool:
    mode = file_mode(path)
    return mode is not None and stat.S_ISDIR(mode)


def is_file(path: Path) -> bool:
    """A regular file (not a folder, pipe or device)."""
    mode = file_mode(path)
    return mode is not None and stat.S_ISREG(mode)


def replace_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move a completely written folder into place; the previous one is removed only after (a kill between
    the two renames leaves it as .<name>.old, which stage 03's resume state is read from then).

    A final_dir named through a symbolic link replaces the folder the link points to (real_path): the link
    stays. The new folder and its files get the modes of any the user makes (give_user_modes). Should the
    second rename fail (an error, not a kill), the previous folder is put back before the error goes on."""
    final_dir = real_path(final_dir)
    give_user_modes(tmp_dir)
    old = final_dir.with_name(f".{final_dir.name}.old")
    moved = final_dir.exists()
    if moved:
        if old.exists():  # left by a kill after an earlier swap; while final_dir is absent, the one copy
            shutil.rmtree(old)
        os.replace(final_dir, old)
    try:
        with naming(final_dir):
            os.replace(tmp_dir, final_dir)
    except BaseException:
        if moved:
            os.replace(old, final_dir)
        raise
    if old.exists():
        shutil.rmtree(old)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a bad line raises UserError with file:line.

    Bad means: not UTF-8 (a UTF-16 or binary file), not JSON, or not an object. A UTF-8 byte-order mark
    on the first line is accepted (editors on Windows write one). A pipe is read whole first, within
    PIPE_LIMIT_BYTES (read_chunks): a line of it could otherwise grow without end."""
    path = Path(path)
    with open_input(path) as f:
        lines = b"".join(read_chunks(f, path)) if is_piped(f) else f
        yield from jsonl_records(lines, path)


def jsonl_records(lines: Iterable[bytes] | bytes, path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of JSONL `lines` (bytes, or an iterable of lines such
    as a file object) read from `path`; a bad line raises UserError with file:line (parse_json_line)."""
    if isinstance(lines, bytes):
        lines = io.BytesIO(lines)  # split as a file object splits: at each newline
    for lineno, raw in enumerate(lines, start=1):
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


def open_input(path: Path, fix: str = "name the JSONL file inside it"):
    """An input file (a regular file or a pipe: the module's docstring) opened for reading in binary; a
    folder (fix: what to do then), a device or socket (reading /dev/zero or a terminal may never end), a
    missing or unreadable file is a UserError."""
    mode = file_mode(path)
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a folder, not a file; {fix}")
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file"
        raise UserError(
            f"{path}: is {kind}, not a regular file or a pipe; name a file, or give a command's output "
            "through a pipe, e.g. <(command)"
        )
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror}); {path_hint(e.errno)}") from None


def read_chunks(f, path: Path) -> Iterator[bytes]:
    """The bytes of an input opened by open_input, in chunks; from a pipe at most PIPE_LIMIT_BYTES in all,
    past which it is a UserError that says the limit and how to pass the data instead."""
    piped = is_piped(f)
    total = 0
    for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
        total += len(chunk)
        if piped and total > PIPE_LIMIT_BYTES:
            raise UserError(
                f"{path}: a pipe that gives more than {PIPE_LIMIT_BYTES:,} bytes, the most an input read "
                "through a pipe may hold (PIPE_LIMIT_BYTES, cuset_common/files.py); write the data to a "
                "regular file (command > data.jsonl) and pass that file"
            )
        yield chunk


def is_piped(f) -> bool:
    """Whether an open file is a pipe."""
    return stat.S_ISFIFO(os.fstat(f.fileno()).st_mode)


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of an input file's bytes, read in chunks (open_input, read_chunks): the one file hash
    of the project, what artifacts and runs record of the files they read."""
    h = hashlib.sha256()
    with open_input(Path(path)) as f:
        for chunk in read_chunks(f, Path(path)):
            h.update(chunk)
    return h.hexdigest()
