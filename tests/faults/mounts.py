"""Storage faults for tests: a tiny filesystem that fills up, and a directory nobody can write to.

Root ignores permission bits, so as root both are tmpfs mounts (a size-limited one, a read-only one); without
root the read-only directory falls back to chmod 0555 and the tiny filesystem is skipped with the reason (the
file-size-limit test in tests/test_faults.py covers "disk full" without root).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount_tmpfs(path: Path, options: str) -> str | None:
    """Mount a tmpfs at `path`; return why not, or None on success."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if result.returncode == 0 else f"mount -t tmpfs failed: {result.stderr.strip()}"


def _unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=True)


@contextlib.contextmanager
def tiny_filesystem(path: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `path` (skips the test with the reason where that is impossible)."""
    path.mkdir(parents=True, exist_ok=True)
    reason = _mount_tmpfs(path, f"size={size_kib}k,mode=0755")
    if reason is not None:
        pytest.skip(f"no size-limited filesystem: {reason}")
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """An empty directory at `path` that cannot be written to: a read-only tmpfs as root, else mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    reason = _mount_tmpfs(path, "ro,size=64k")
    if reason is not None:
        pytest.skip(f"root ignores permission bits and a read-only mount is impossible: {reason}")
    try:
        yield path
    finally:
        _unmount(path)
