"""Reading what an untrusted program left in its folder.

The program may have replaced any file or folder of its run folder by a symbolic link (to a
root-only file holding the expected answer, say), a FIFO or a device node, and the harness reads
with more rights than the program had. So every path component is opened relative to the
previous one with O_NOFOLLOW, only regular files are read (fstat on the open file, never a check
on the path), and sizes are capped. The program is dead by then (the sandbox kills everything it
started before returning), so nothing swaps a file between the check and the read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO must not hang us
MAX_FILES = 256  # entries of one data folder worth looking at; CUDABench programs write a few


def open_dir(root: Path, parts: list[str]) -> int:
    """A descriptor of root/parts[0]/parts[1]/..., no component followed if it is a link.
    `root` is the harness's own folder. Raises OSError (ELOOP, ENOTDIR, ENOENT) otherwise."""
    fd = os.open(root, _DIR)
    try:
        for part in parts:
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise
    return fd


def copy_regular_file(dir_fd: int, name: str, dest: Path, max_bytes: int) -> str | None:
    """Copy dir_fd/name to dest if it is a regular file (not a link) of at most max_bytes.
    Returns None when copied, else why not (one phrase)."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as e:
        return "a symbolic link" if e.errno == errno.ELOOP else f"unreadable ({e.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if info.st_size > max_bytes:
            return f"{info.st_size} bytes, over the {max_bytes}-byte cap"
        with open(dest, "wb") as out:
            for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
                out.write(chunk)
        return None
    finally:
        os.close(fd)


def copy_written_files(root: Path, parts: list[str], dest: Path, skip: set[str], max_bytes: int) -> list[str]:
    """Copy the regular files the program left in root/parts (top level only) into dest, except the
    names in `skip` (the reference data already there wins). Returns one note per file left out."""
    where = "/".join(parts)
    try:
        fd = open_dir(root, parts)
    except OSError as e:
        return [f"{where}: not a folder we can read without following links ({e.strerror})"]
    notes = []
    try:
        names = sorted(os.listdir(fd))
        for name in names[:MAX_FILES]:
            if name in skip:
                notes.append(f"{where}/{name}: not copied, the name of a reference file")
                continue
            why = copy_regular_file(fd, name, dest / name, max_bytes)
            if why:
                notes.append(f"{where}/{name}: not copied, {why}")
        if len(names) > MAX_FILES:
            notes.append(f"{where}: {len(names) - MAX_FILES} more entries not looked at (over {MAX_FILES})")
    finally:
        os.close(fd)
    return notes
