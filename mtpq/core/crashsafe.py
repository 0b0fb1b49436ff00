"""What lets a killed or concurrent apply.py run lose nothing: exclusive locks, atomic writes, and
private files and directories that a later run recognises as a dead run's leftovers.

A lock is an flock on the directory it guards. The git subprocesses of a run inherit it, so it is
held until the run's last process is gone, however the run ends, and there is no lock file to remove.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_held: dict[Path, int] = {}  # lock file -> descriptor, for the locks this process holds


def inherited_fds() -> tuple[int, ...]:
    """Descriptors a subprocess must inherit: the locks held, so that they outlive a killed parent."""
    return tuple(_held.values())


@contextmanager
def exclusive_lock(directory: Path, what: str) -> Iterator[None]:
    """Hold the lock of `directory` (an flock on the directory itself: no lock file is ever left
    behind) while the block runs. If another run holds it, say so once and wait."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another apply.py run to finish with {what}", file=sys.stderr, flush=True)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        _held[directory] = descriptor
        try:
            yield
        finally:
            del _held[directory]
    finally:
        os.close(descriptor)


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace `path` with `data` (and `mode`) whole or not at all, and durably: a killed run or a
    power cut leaves the old content or the new one. The temporary file is `.<name>.mtpq-tmp` beside
    it; only the holder of the lock guarding `path` writes it."""
    temporary = temporary_sibling(path)
    with open(temporary, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    if mode is not None:
        os.chmod(temporary, mode)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.mtpq-tmp")


def _private_name(prefix: str, suffix: str) -> str:
    return f"{prefix}{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def _owner_pid(name: str, prefix: str) -> int | None:
    pid = name[len(prefix) :].partition("-")[0]
    return int(pid) if pid.isdecimal() else None


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sweep_leftovers(directory: Path, prefix: str, suffix: str = "") -> None:
    """Remove what dead runs left under `directory` with `private_path`'s names for `prefix`: only
    entries whose creating process is gone and whose lock nobody holds."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        pid = _owner_pid(entry.name, prefix) if entry.name.startswith(prefix) else None
        if pid is None or not entry.name.endswith(suffix) or _is_running(pid):
            continue
        try:
            descriptor = os.open(entry, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # another run swept it first
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # alive in another pid namespace
        finally:
            os.close(descriptor)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@contextmanager
def private_path(directory: Path, prefix: str, suffix: str = "", *, is_dir: bool = False) -> Iterator[Path]:
    """A new file or directory `<prefix><pid>-<random><suffix>` in `directory`, locked while the block
    runs and removed after it (unless renamed away); dead runs' leftovers are swept first."""
    directory.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(directory, prefix, suffix)
    path = directory / _private_name(prefix, suffix)
    if is_dir:
        path.mkdir()
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    else:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    _held[path] = descriptor
    try:
        yield path
    finally:
        del _held[path]
        os.close(descriptor)
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
