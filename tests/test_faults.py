"""Fault matrix: every bad input gives a one-line error that names the culprit, and leaves no output behind.

Library level here (the same functions the Snakemake jobs call); tests/test_faults_workflow.py runs a few of the
cases through real Snakemake jobs to show the non-zero exit and the missing output there. docs/RELIABILITY.md
lists the matrix with the message each case gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.demo import generate_demo_files
from marketrl.data.reader import DataFileError
from marketrl.features import build_feature_file
from marketrl.runtime.io import write_json_atomic
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.datasets import DatasetError, load_feature_tables
from marketrl.splits.folds import FoldError, write_fold_plan
from marketrl.training.train import HparamsError, load_hparams
from marketrl.workflow.pipeline import raw_data_files
from tests.conftest import REPO_ROOT
from tests.faults.mounts import read_only_dir, tiny_filesystem
from tests.support.synthetic import ohlcv_messages, random_walk_bars
from tests.test_reader import BAD_INPUTS, MINUTE_NS

TINY_FOLDS = {
    "n": 2,
    "scheme": "expanding",
    "train_days": 4,
    "validation_days": 2,
    "test_days": 2,
    "tuning_days": 4,
    "tuning_validation_days": 2,
    "embargo_bars": 0,
}


def assert_one_line(error: BaseException, *culprits: str) -> str:
    """The error is one line and names every culprit (file, column, config key...)."""
    message = str(error)
    assert "\n" not in message, message
    for culprit in culprits:
        assert culprit in message, f"{culprit!r} not named in: {message}"
    return message


def assert_nothing_written(directory: Path) -> None:
    """No output and no temp file in `directory` (it may not even exist)."""
    assert not directory.exists() or sorted(os.listdir(directory)) == []


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three days of demo DBN data."""
    return generate_demo_files(tmp_path_factory.mktemp("demo"), "2024-01-02", 3, seed=4)


@pytest.fixture(scope="module")
def feature_tables(demo_files: list[Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Feature tables of the demo days (the second with the first as lookback context)."""
    out = tmp_path_factory.mktemp("features")
    tables = []
    for index, src in enumerate(demo_files):
        dst = out / src.name.replace(".dbn.zst", ".parquet")
        build_feature_file(src, dst, prev_src=demo_files[index - 1] if index else None)
        tables.append(dst)
    return tables


# --------------------------------------------------------------------------------------------- DBN input files


def _too_few_bars(tmp: Path) -> Path:
    bars = random_walk_bars(30, {3: 100.0}, seed=5, gap_probability=0.0)
    start = int(bars["ts_event"].min())
    return write_dbn(
        tmp / "short.dbn.zst",
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", start_ns=start, end_ns=start + 30 * MINUTE_NS),
    )


def _unsupported_schema(tmp: Path) -> Path:
    return write_dbn(tmp / "stats.dbn.zst", encode_dbn([], schema="statistics", start_ns=0, end_ns=1))


DBN_FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    **{case: BAD_INPUTS[case] for case in ("empty file", "truncated zstd", "random bytes", "no records")},
    "zstd-wrapped garbage": BAD_INPUTS["zstd wrapping garbage"],
    "schema mismatch": BAD_INPUTS["header schema != record type"],
    "schema mismatch (same record size)": BAD_INPUTS["header schema != rtype (same size)"],
    "unsupported schema": (_unsupported_schema, "unsupported schema 'statistics'"),
}


@pytest.mark.parametrize("case", list(DBN_FAULTS))
def test_bad_dbn_file_fails_features_without_output(tmp_path: Path, case: str) -> None:
    make, fault = DBN_FAULTS[case]
    src = make(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(DataFileError, match=fault) as info:
        build_feature_file(src, out / "table.parquet")
    assert_one_line(info.value, str(src))
    assert_nothing_written(out)


def test_too_few_bars_without_context_is_a_warm_up_only_table_not_an_error(tmp_path: Path) -> None:
    # The first file(s) of the data: every bar is warm-up, so the table is empty and says so (docs/FEATURES.md).
    src = _too_few_bars(tmp_path)
    summary = build_feature_file(src, tmp_path / "out" / "table.parquet")
    assert summary["rows"] == 0 and summary["warmup_only"].startswith("all 30 bars are warm-up")
    assert summary["skipped"] is None


def test_mixed_schema_file_fails_features_without_output(dbn_samples: Path, tmp_path: Path) -> None:
    src = dbn_samples / "databento-python" / "LIVE" / "test_data.live.dbn.zst"
    with pytest.raises(DataFileError, match="mixed-schema file") as info:
        build_feature_file(src, tmp_path / "out" / "table.parquet")
    assert_one_line(info.value, str(src))
    assert_nothing_written(tmp_path / "out")


def test_bad_previous_day_file_fails_without_output(demo_files: list[Path], tmp_path: Path) -> None:
    prev = BAD_INPUTS["truncated zstd"][0](tmp_path)
    with pytest.raises(DataFileError) as info:
        build_feature_file(demo_files[1], tmp_path / "out" / "table.parquet", prev_src=prev)
    assert_one_line(info.value, str(prev))
    assert_nothing_written(tmp_path / "out")


# --------------------------------------------------------------------------------------------- config and data


def test_empty_files_glob_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({"data": {"source": "files", "files": "  "}})
    assert_one_line(info.value, "data.files", "empty glob")


def test_glob_matching_nothing_names_the_key_and_glob(tmp_path: Path) -> None:
    pattern = str(tmp_path / "nowhere" / "*.dbn.zst")
    config = validate_config({"data": {"source": "files", "files": pattern}})
    with pytest.raises(ConfigError) as info:
        raw_data_files(config)
    assert_one_line(info.value, "data.files", pattern, "matched no files")


def test_overlapping_days_from_two_files(feature_tables: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "copy-of-day-2.parquet"
    copy.write_bytes(feature_tables[1].read_bytes())
    with pytest.raises(DatasetError) as info:
        load_feature_tables([feature_tables[0], feature_tables[1], copy])
    assert_one_line(info.value, str(feature_tables[1]), str(copy), "overlapping data")


def test_fold_config_longer_than_the_data(feature_tables: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out" / "folds.json"
    with pytest.raises(FoldError) as info:
        write_fold_plan(feature_tables, TINY_FOLDS, out)  # 3 trading days, the folds need 10
    assert isinstance(info.value, ValueError)
    message = assert_one_line(info.value)
    assert "folds." in message or "trading days" in message
    assert_nothing_written(out.parent)


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        ('{"algo": "dqn"}', "'best_params'"),
        ('{"algo": "dqn", "best_params": {"learning_rate": [0.1]}}', "best_params.learning_rate"),
        ('{"algo": "dqn", "best_params": {"gamma": true}}', "best_params.gamma"),
        ('{"algo": "ppo", "best_params": {}}', "not 'dqn'"),
        ('{"algo": "dqn", "best_params": ', "cannot read hyperparameters"),
        ("[1, 2]", "'best_params'"),
    ],
)
def test_bad_hyperopt_json(tmp_path: Path, content: str, fault: str) -> None:
    path = tmp_path / "dqn.json"
    path.write_text(content)
    with pytest.raises(HparamsError) as info:
        load_hparams(path, "dqn")
    assert_one_line(info.value, str(path), fault)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None])
def test_features_with_non_finite_values(
    feature_tables: list[Path], tmp_path: Path, bad: float | None
) -> None:
    table = pl.read_parquet(feature_tables[1])
    column = "vol_30" if "vol_30" in table.columns else table.columns[-1]
    row = pl.int_range(pl.len()) == table.height // 2
    poisoned = tmp_path / "poisoned.parquet"
    table.with_columns(
        pl.when(row).then(pl.lit(bad, dtype=pl.Float32)).otherwise(pl.col(column)).alias(column)
    ).write_parquet(poisoned)
    with pytest.raises(DatasetError) as info:
        load_feature_tables([feature_tables[0], poisoned])
    assert_one_line(info.value, str(poisoned), repr(column), "non-finite")


def test_clean_feature_tables_load(feature_tables: list[Path]) -> None:
    """The baseline the data faults above corrupt: intact tables combine without error."""
    table = load_feature_tables(feature_tables)
    assert table.height > 0 and table["trading_day"].n_unique() == 3
    assert np.isfinite(table.select(pl.col(pl.Float32)).to_numpy()).all()


# ------------------------------------------------------------------------------------------------------ storage


def test_disk_full_while_writing_features(demo_files: list[Path], tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "small", size_kib=64) as small:
        out = small / "features" / "table.parquet"
        with pytest.raises(OSError) as info:
            build_feature_file(demo_files[0], out)
        assert_one_line(info.value, str(out), "cannot write")
        assert info.value.errno in (28, 27)  # ENOSPC (tmpfs) or EFBIG (file size limit)
        assert_nothing_written(out.parent)
        with pytest.raises(OSError):
            write_json_atomic(small / "big.json", {"values": list(range(100_000))})
        assert sorted(os.listdir(small)) == ["features"]  # no JSON, no temp file


_SIZE_LIMITED_WRITER = """
import resource, signal, sys
from pathlib import Path
from marketrl.features import build_feature_file

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write() fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
build_feature_file(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_file_size_limit_while_writing_features(demo_files: list[Path], tmp_path: Path) -> None:
    """Disk full without root: a process whose files may not grow past 64 KiB."""
    out = tmp_path / "out" / "table.parquet"
    result = subprocess.run(
        [sys.executable, "-c", _SIZE_LIMITED_WRITER, str(demo_files[0]), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("OSError: [Errno 27] cannot write") and str(out) in last_line
    assert_nothing_written(out.parent)


def test_unwritable_results_dir(demo_files: list[Path], tmp_path: Path) -> None:
    with read_only_dir(tmp_path / "results") as results:
        out = results / "features" / "table.parquet"
        with pytest.raises(OSError) as info:
            build_feature_file(demo_files[0], out)
        assert_one_line(info.value, str(out), "cannot write")
        with pytest.raises(OSError) as info:
            write_json_atomic(results / "folds.json", {"a": 1})
        assert_one_line(info.value, str(results / "folds.json"))
        assert sorted(os.listdir(results)) == []


def test_storage_errors_keep_the_previous_output(tmp_path: Path) -> None:
    """A failed rewrite (disk full) leaves the earlier, complete file untouched."""
    with tiny_filesystem(tmp_path / "small", size_kib=64) as small:
        write_json_atomic(small / "summary.json", {"version": 1})
        with pytest.raises(OSError):
            write_json_atomic(small / "summary.json", {"version": 2, "padding": "x" * 200_000})
        assert json.loads((small / "summary.json").read_text()) == {"version": 1}
        assert sorted(os.listdir(small)) == ["summary.json"]
