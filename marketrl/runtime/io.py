"""Atomic file writes: a reader never sees a half-written output, and a failed write leaves nothing behind.

:func:`atomic_write` yields a temp *path* (for ``write_parquet``, ``torch.save``, ``Path.write_bytes``...);
:func:`atomic_open` yields an open binary/text handle instead. Either way the data goes to a hidden temp file
in the destination's own directory (so ``os.replace`` is a same-filesystem rename), is fsynced, and then
replaces the destination in one step. On any exception the temp file is removed and the destination is left
exactly as it was; temp files of an earlier writer of the same destination that was killed (SIGKILL leaves no
chance to clean up) are removed when the next write starts.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

from marketrl.runtime.testing_hooks import hold_point

__all__ = ["atomic_open", "atomic_write", "atomic_writes", "json_text", "write_json_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_DEFAULT_MODE = 0o666 & ~_umask()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows fsync on a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# Errors of the storage itself (full, quota, file size limit, read-only, no permission): a writer reports ENOSPC
# without naming any file, so these are re-raised naming the output that could not be written.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


def _naming(exc: OSError, dest: Path | str) -> OSError:
    reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
    return type(exc)(exc.errno, f"cannot write {dest}: {reason}")


def _remove_stale_temps(dest: Path) -> None:
    # A writer killed with SIGKILL cannot clean up; its rerun (the only writer of `dest`) removes the leftovers.
    for stale in dest.parent.glob(f".{glob.escape(dest.name)}.*.tmp{glob.escape(dest.suffix)}"):
        stale.unlink(missing_ok=True)


def _temp_beside(dest: Path) -> Path:
    """A new hidden temp file in `dest`'s directory (created with its parents), keeping `dest`'s suffix."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=f".tmp{dest.suffix}", dir=dest.parent)
    os.close(fd)
    return Path(tmp_name)


def _finish(tmp: Path, dest: Path) -> None:
    """Check, fsync and chmod a written temp file (not yet renamed)."""
    if not tmp.exists():
        raise FileNotFoundError(f"{dest}: the writer did not create the temp file {tmp}")
    _fsync_file(tmp)
    os.chmod(tmp, _DEFAULT_MODE)  # mkstemp creates 0600; outputs get the usual umask-derived mode


@contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is fsynced and renamed onto ``path``.

    For writers that want a file name rather than a handle (``polars.DataFrame.write_parquet``,
    ``torch.save``, ``matplotlib.savefig``...). Parent directories are created. The temp file keeps the
    destination's suffix so writers that infer the format from it still work.
    """
    with atomic_writes([path]) as (tmp,):
        yield tmp


@contextmanager
def atomic_writes(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[Path]]:
    """`atomic_write` for outputs that stand or fall together: yields one temp path per output; when the block
    succeeds, all are fsynced, then renamed onto their destinations. On any exception, in the block or in a
    rename, every temp file is removed and so is every destination already renamed: all of them or none."""
    dests = [Path(path) for path in paths]
    tmps: list[Path] = []
    renamed: list[Path] = []
    writing: Path | str = ""  # the output an error is about, for the message
    try:
        for dest in dests:
            writing = dest
            tmps.append(_temp_beside(dest))
        writing = dests[0] if len(dests) == 1 else f"{dests[0]} (and {len(dests) - 1} more outputs)"
        yield tmps
        for tmp, dest in zip(tmps, dests, strict=True):
            _finish(tmp, dest)
        for tmp, dest in zip(tmps, dests, strict=True):
            writing = dest
            hold_point(f"atomic_write_before_rename:{dest}")
            os.replace(tmp, dest)
            renamed.append(dest)
    except BaseException as exc:
        for path in (*tmps, *renamed):
            path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
            raise _naming(exc, writing) from exc
        raise
    for directory in dict.fromkeys(dest.parent for dest in dests):
        _fsync_dir(directory)


@contextmanager
def atomic_open(
    path: str | os.PathLike[str],
    mode: Literal["wb", "w"] = "wb",
    *,
    encoding: str = "utf-8",
) -> Iterator[IO[Any]]:
    """Yield an open file (binary ``"wb"`` or text ``"w"``) whose content atomically replaces ``path``."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open mode must be 'wb' or 'w', got {mode!r}")
    with atomic_write(path) as tmp:
        if mode == "wb":
            with open(tmp, "wb") as handle:
                yield handle
        else:
            with open(tmp, "w", encoding=encoding, newline="") as handle:
                yield handle


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """`obj` as the JSON text `write_json_atomic` writes (keys sorted, no NaN, trailing newline)."""
    return json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Serialize ``obj`` as JSON (keys sorted, trailing newline) and atomically write it to ``path``.

    The object is serialized before the file is opened, so a non-serializable object leaves no trace.
    """
    text = json_text(obj, indent=indent)
    with atomic_open(path, "w") as handle:
        handle.write(text)
