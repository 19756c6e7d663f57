"""The files a user names: one place that checks the path, reads only regular files of a
bounded size, and writes atomically without side effects on what the path names.

* :func:`checked_path`: a ``str``, ``bytes`` or ``os.PathLike`` without NUL characters,
  else a :class:`SessionFileError` (not Python's TypeError or ValueError).
* :func:`read_regular`: opens without blocking (a FIFO would wait for a writer),
  refuses anything but a regular file (``/dev/zero``, ``/dev/urandom``, a FIFO, a
  directory) and reads at most ``max_bytes`` (a file that grows while read included).
* :func:`write_atomic`: writes a temporary file beside the target and renames it over
  the target once complete. A symbolic link is kept (the file it points to is
  replaced, as an editor saving through it does), a device file, FIFO or directory is
  refused, the file's permission bits are kept. The temporary file
  (``.NAME.XXXXXXXX.tmp``) is removed whatever the write raises, and is locked
  (``flock``) while its save runs: a save killed outright (SIGKILL, a power cut) leaves
  its temporary file unlocked, and the next save to the same name removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .session import SessionError

STALE_AFTER_S = 2.0
"""A temporary file of a save is taken for a killed save's once it is unlocked and has
not changed for this long (a live save locks its file within microseconds of making it)."""


class SessionFileError(SessionError):
    """A session file that cannot be read or written; ``file`` and ``field`` say where."""

    def __init__(self, file: Any, field: str, message: str) -> None:
        self.file, self.field = _shown_path(file), field
        where = f"session file {self.file!r}" + (f", {field}" if field else "")
        super().__init__(f"{where}: {message}")


def _shown_path(path: Any) -> str:
    if isinstance(path, str | os.PathLike):
        with contextlib.suppress(TypeError):
            return os.fsdecode(os.fspath(path))
    if isinstance(path, bytes):
        return os.fsdecode(path)
    text = repr(path)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_path(path: Any) -> Path:
    """``path`` as a :class:`~pathlib.Path`: a non-empty ``str``, ``bytes`` or
    ``os.PathLike`` without NUL characters, else a SessionFileError saying which."""
    try:
        raw = os.fspath(path)
    except TypeError:
        raise SessionFileError(
            path,
            "",
            f"a file path must be a string or an os.PathLike, got {type(path).__name__}",
        ) from None
    text = os.fsdecode(raw)
    if not text:
        raise SessionFileError(path, "", "the file path is empty: name a file")
    if "\x00" in text:
        raise SessionFileError(
            path, "", "the file path holds a NUL character (\\x00), which no file name can"
        )
    return Path(text)


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file (None when it is)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: Any, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), at most ``max_bytes``;
    a SessionFileError for a path that is not one, or a file that is larger."""
    target = checked_path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(target, flags)
    except OSError as e:
        raise SessionFileError(target, "", f"cannot read it: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        kind = _not_regular(info.st_mode)
        if kind is not None:
            raise SessionFileError(target, "", f"cannot read it: it is {kind}, not a file")
        if info.st_size > max_bytes:
            raise SessionFileError(target, "", f"{info.st_size} bytes, more than {max_bytes}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise SessionFileError(target, "", f"more than {max_bytes} bytes (it grew)")
        return b"".join(chunks)
    except OSError as e:
        raise SessionFileError(target, "", f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _save_target(path: Any) -> Path:
    """The file a save to ``path`` replaces: the end of its symbolic links, which must be
    a regular file or nothing yet."""
    target = checked_path(path)
    real = Path(os.path.realpath(target))
    try:
        info = os.lstat(real)
    except FileNotFoundError:
        return real
    except OSError as e:
        raise SessionFileError(target, "", f"cannot write it: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode):  # realpath stops at a loop of links
        raise SessionFileError(target, "", "cannot write it: its symbolic links form a loop")
    kind = _not_regular(info.st_mode)
    if kind is not None:
        where = "" if real == target else f" ({real}, where its link points)"
        raise SessionFileError(
            target, "", f"cannot write it: it is {kind}{where}, not a file; name a file"
        )
    return real


def _new_file_mode() -> int:
    """The permission bits ``open(path, "w")`` would give a new file (0o666 less the
    umask, read from /proc: setting the umask to read it would race other threads)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    return 0o644


def remove_stale_temporaries(real: Path) -> list[Path]:
    """Remove the temporary files (``.NAME.*.tmp``) that earlier saves to ``real`` left
    when they were killed: unlocked, and unchanged for :data:`STALE_AFTER_S`. Returns
    what it removed."""
    removed = []
    prefix, now = f".{real.name}.", time.time()
    try:
        entries = list(os.scandir(real.parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        # mkstemp's names: the prefix, 8 random characters, the suffix
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        if len(name) != len(prefix) + 8 + len(".tmp"):
            continue
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(entry.path, flags)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < STALE_AFTER_S:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live save holds it
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue  # locked (a save running), or already gone
        finally:
            os.close(fd)
    return removed


def write_atomic(path: Any, write: Callable[[IO[str]], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path`` (beside the file its
    links point to), then rename it over that file (module doc). Returns ``path``.

    Whatever ``write`` raises, the file is as it was and no temporary file is left
    behind; an OSError (no such folder, no permission) becomes a SessionFileError, as
    does a path that names a directory, a device file or a FIFO.
    """
    target = checked_path(path)
    real = _save_target(target)
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        mode = _new_file_mode()
    remove_stale_temporaries(real)
    try:
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    except OSError as e:
        raise SessionFileError(target, "", f"cannot write there: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # this save is alive (see above)
        os.fchmod(fd, mode)
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SessionFileError(target, "", f"cannot write it: {e.strerror or e}") from None
        raise
    finally:
        os.close(fd)  # the lock goes with the last descriptor
    return target


__all__ = [
    "STALE_AFTER_S",
    "SessionFileError",
    "checked_path",
    "read_regular",
    "remove_stale_temporaries",
    "write_atomic",
]
