"""marketrl.runtime.io: atomic writes leave either the old file or the complete new one, never a partial file."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from marketrl.runtime.io import atomic_open, atomic_write, write_json_atomic


class Boom(RuntimeError):
    pass


def test_atomic_write_yields_a_temp_path_then_replaces(tmp_path: Path) -> None:
    dst = tmp_path / "sub" / "table.parquet"
    frame = pl.DataFrame({"a": [1, 2, 3]})
    with atomic_write(dst) as tmp:
        assert tmp.parent == dst.parent and tmp != dst and tmp.suffix == ".parquet"
        frame.write_parquet(tmp)
        assert not dst.exists()  # nothing visible until the block succeeds
    assert pl.read_parquet(dst).equals(frame)
    assert [p.name for p in dst.parent.iterdir()] == ["table.parquet"]


def test_exception_keeps_old_file_and_removes_temp(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old")
    with pytest.raises(Boom):
        with atomic_write(dst) as tmp:
            tmp.write_bytes(b"half-written")
            raise Boom
    assert dst.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    new = tmp_path / "new.bin"
    with pytest.raises(Boom):
        with atomic_open(new, "wb") as handle:
            handle.write(b"partial")
            raise Boom
    assert not new.exists() and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_writer_that_creates_nothing_is_an_error(tmp_path: Path) -> None:
    dst = tmp_path / "x.txt"
    with pytest.raises(FileNotFoundError, match="did not create"):
        with atomic_write(dst) as tmp:
            tmp.unlink()
    assert list(tmp_path.iterdir()) == []


def test_text_and_json_helpers(tmp_path: Path) -> None:
    with atomic_open(tmp_path / "a.txt", "w") as handle:
        handle.write("héllo\n")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    write_json_atomic(tmp_path / "b.json", {"z": 1, "a": [1.5, None]})
    assert json.loads((tmp_path / "b.json").read_text()) == {"a": [1.5, None], "z": 1}
    with pytest.raises(ValueError):
        write_json_atomic(
            tmp_path / "c.json", {"bad": float("nan")}
        )  # not valid JSON: refused, nothing written
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "c.json", {"bad": object()})
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(tmp_path / "d.txt", "a"):  # type: ignore[arg-type]
            pass
