"""features.user: loading and checking the file, the look-ahead / lookback / finiteness audit (every cheat fails
in one line naming the feature and the bar), the features appended to the table, the manifest and the code hash."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.features import CATALOG, FEATURE_NAMES, MAX_LOOKBACK, build_feature_file, feature_chunks
from marketrl.features.user import UserFeatureError, load_user_features
from marketrl.features.user_audit import audit_user_features, audited_user_features, write_user_audit
from marketrl.splits.datasets import DatasetError, feature_names_of, write_feature_manifest
from marketrl.workflow import stages
from tests.support.synthetic import ohlcv_messages, random_walk_bars
from tests.test_features import MINUTE_NS, _prepared

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "my_features.py"
HONEST = 'import polars as pl\nFEATURES = {"honest": pl.col("close").pct_change().rolling_mean(5)}\nLOOKBACK = {"honest": 5}\n'


def _file(tmp_path: Path, text: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _one_feature(tmp_path: Path, expr: str, lookback: int | None = None) -> Path:
    text = f"import polars as pl\nFEATURES = {{'honest': pl.col('ret_1'), 'cheat': {expr}}}\n"
    if lookback is not None:
        text += f"LOOKBACK = {{'cheat': {lookback}}}\n"
    return _file(tmp_path, text)


def _audit_error(path: Path) -> str:
    with pytest.raises(UserFeatureError) as caught:
        audit_user_features(load_user_features(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("features.user: ")
    return message


def test_the_example_passes_the_audit() -> None:
    summary = audit_user_features(load_user_features(EXAMPLE))
    assert summary["passed"] and summary["features"] == [
        "vwap_dev_session_atr",
        "overnight_gap",
        "spread_z_60",
    ]
    assert {probe.split()[1] for probe in summary["probes"]} == {
        "ES.c.0",
        "NQ.c.0",
    }  # both instruments probed


BAR = r"at bar \d{4}-\d\d-\d\d \d\d:\d\d UTC of \S+ of the audit window"


@pytest.mark.parametrize(
    "expr",
    [
        "pl.col('close').shift(-1)",  # the next bar
        "pl.col('close').rolling_mean(5, center=True)",  # a centred window
        "pl.col('close') - pl.col('close').mean()",  # a whole-column mean
        "pl.col('close').rank()",  # a whole-column rank
    ],
    ids=["shift-1", "centred", "mean", "rank"],
)
def test_cheating_expressions_fail_in_one_line(tmp_path: Path, expr: str) -> None:
    message = _audit_error(_one_feature(tmp_path, expr))
    assert re.search(rf"feature 'cheat' reads the future: its value {BAR}", message), message


@pytest.mark.parametrize(
    "expr",
    [
        "(pl.col('ts_event').shift(-1) - pl.col('ts_event')).dt.total_minutes().fill_null(0)",  # next bar's time
        "pl.int_range(pl.len()).cast(pl.Float64) / pl.len()",  # position in the whole window
    ],
    ids=["time-to-next-bar", "window-position"],
)
def test_reading_only_whether_later_bars_exist_fails(tmp_path: Path, expr: str) -> None:
    """No later price or volume enters these, so perturbing later bars cannot show them: cutting the window after t
    does."""
    message = _audit_error(_one_feature(tmp_path, expr))
    assert re.search(
        rf"feature 'cheat' reads the future: its value {BAR} changed when the bars after it", message
    )


def test_the_first_bar_that_read_the_future_is_named(tmp_path: Path) -> None:
    """Probes run in time order: a shift(-1) fails at the earliest probed bar, which the summary lists first."""
    probes = audit_user_features(load_user_features(_file(tmp_path, HONEST, "honest.py")))["probes"]
    first_ts, first_symbol = probes[0].split()
    message = _audit_error(_one_feature(tmp_path, "pl.col('close').shift(-1)"))
    assert f"at bar {first_ts[:10]} {first_ts[11:16]} UTC of {first_symbol} " in message, message


def test_a_cumulative_sum_breaks_the_lookback(tmp_path: Path) -> None:
    """A running sum per instrument reads no later bar, but every earlier one: the lookback check catches it (the
    engine computes a chunk with only MAX_LOOKBACK bars of context, so it would differ chunk to chunk)."""
    message = _audit_error(_one_feature(tmp_path, "pl.col('volume').cum_sum().over('instrument_id')"))
    assert re.search(
        rf"feature 'cheat' reads more than its lookback of {MAX_LOOKBACK} bars: its value {BAR}", message
    )


def test_an_undeclared_longer_lookback_fails(tmp_path: Path) -> None:
    message = _audit_error(_one_feature(tmp_path, "pl.col('close').rolling_mean(30)", lookback=10))
    assert "feature 'cheat' reads more than its lookback of 10 bars" in message
    # declared honestly (29 bars before t), the same window passes
    audit_user_features(load_user_features(_one_feature(tmp_path, "pl.col('close').rolling_mean(30)", 29)))


def test_a_catalog_features_lookback_counts(tmp_path: Path) -> None:
    """rv_60 reads 60 bars back: a feature that reads it inherits that lookback."""
    message = _audit_error(_one_feature(tmp_path, "pl.col('rv_60') * 2", lookback=5))
    assert "feature 'cheat' reads more than its lookback of 5 bars" in message


def test_non_finite_values_on_valid_data_fail(tmp_path: Path) -> None:
    message = _audit_error(_one_feature(tmp_path, "pl.col('ret_1') / (pl.col('volume') - pl.col('volume'))"))
    assert re.search(rf"feature 'cheat' is not finite \((nan|inf|-inf|NaN)\) {BAR}", message), message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x = 1\n", "expected a non-empty dict FEATURES"),
        ("FEATURES = {}\n", "expected a non-empty dict FEATURES"),
        ("FEATURES = {'a': 1.0}\n", "feature 'a': expected a polars expression, got float"),
        (
            "import polars as pl\nFEATURES = {'ret_5': pl.col('close')}\n",
            "feature 'ret_5': the name of a catalog",
        ),
        (
            "import polars as pl\nFEATURES = {'close': pl.col('close')}\n",
            "feature 'close': the name of a catalog",
        ),
        ("import polars as pl\nFEATURES = {'a b': pl.col('close')}\n", "FEATURES key 'a b'"),
        ("import polars as pl\nFEATURES = {'a': pl.col('clse')}\n", "feature 'a' reads 'clse'"),
        ("import polars as pl\nFEATURES = {'a': pl.col('ref_close')}\n", "(ref_close needs REFERENCE)"),
        (
            "import polars as pl\nFEATURES = {'a': pl.col('close')}\nLOOKBACK = 3\n",
            "LOOKBACK: expected a dict",
        ),
        (
            "import polars as pl\nFEATURES = {'a': pl.col('close')}\nLOOKBACK = {'b': 3}\n",
            "LOOKBACK names 'b'",
        ),
        (
            "import polars as pl\nFEATURES = {'a': pl.col('close')}\nLOOKBACK = {'a': 10_000}\n",
            f"LOOKBACK['a']: expected an integer 0..{MAX_LOOKBACK}",
        ),
        (
            "import polars as pl\nFEATURES = {'a': pl.col('close')}\nREFERENCE = 3\n",
            "REFERENCE: expected a symbol",
        ),
        ("raise RuntimeError('boom')\n", "cannot import it: RuntimeError: boom"),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(UserFeatureError) as caught:
        load_user_features(path)
    message = str(caught.value)
    assert message.startswith(f"features.user: {path}: ") and "\n" not in message
    assert expected in message, message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserFeatureError, match=r"^features.user: .*nope.py: no such file"):
        load_user_features(tmp_path / "nope.py")


def test_user_features_follow_the_catalog_as_float32(tmp_path: Path) -> None:
    user = load_user_features(_file(tmp_path, HONEST))
    bars = _prepared(random_walk_bars(3 * MAX_LOOKBACK, {1: 100.0, 2: 50.0}, seed=4))
    table = pl.concat(list(feature_chunks(bars, MINUTE_NS, path=Path("<memory>"), user=user)))
    plain = pl.concat(list(feature_chunks(bars, MINUTE_NS, path=Path("<memory>"))))
    assert table.columns == [*plain.columns, "honest"]
    assert table.schema["honest"] == pl.Float32
    assert table.drop("honest").equals(plain)  # the catalog's columns do not change
    expected = bars.select(
        "instrument_id",
        "ts_event",
        pl.col("close").pct_change().rolling_mean(5).over("instrument_id").alias("want"),
    )
    joined = table.join(expected, on=["instrument_id", "ts_event"])
    assert (joined["honest"] - joined["want"].cast(pl.Float32)).abs().max() < 1e-6
    assert table.columns.index("honest") == table.columns.index(FEATURE_NAMES[-1]) + 1


def test_a_missing_reference_symbol_is_named(tmp_path: Path) -> None:
    text = (
        "import polars as pl\nREFERENCE = 'ES.c.0'\nFEATURES = {'s': pl.col('close') / pl.col('ref_close')}\n"
    )
    user = load_user_features(_file(tmp_path, text))
    bars = _prepared(random_walk_bars(3 * MAX_LOOKBACK, {1: 100.0, 2: 50.0}, seed=4))
    with pytest.raises(UserFeatureError, match=r"REFERENCE symbol 'ES.c.0' has no bars in <memory>"):
        feature_chunks(bars, MINUTE_NS, path=Path("<memory>"), user=user)


def test_example_is_copied_verbatim_elsewhere(tmp_path: Path) -> None:
    """The example imports nothing relative to its folder: a copy loads the same features."""
    copy = tmp_path / "copy.py"
    shutil.copy(EXAMPLE, copy)
    assert load_user_features(copy).names == load_user_features(EXAMPLE).names


def _dbn(tmp_path: Path, name: str, seed: int) -> Path:
    bars = random_walk_bars(400, {7: 4000.0, 9: 15000.0}, seed=seed)
    start, end = int(bars["ts_event"].min()), int(bars["ts_event"].max()) + 1
    messages = ohlcv_messages(bars)
    encoded = encode_dbn(
        messages, schema="ohlcv-1m", start_ns=start, end_ns=end, symbols={"ESH4": 7, "NQH4": 9}
    )
    return write_dbn(tmp_path / name, encoded)


def test_tables_and_manifest_name_the_user_features(tmp_path: Path) -> None:
    """build_feature_file appends them (metadata too), feature_names_of hands them to training, and the
    manifest names them; tables built with another file are refused."""
    user = load_user_features(_file(tmp_path, HONEST))
    src = _dbn(tmp_path, "a.dbn.zst", seed=1)
    dst = tmp_path / "a.parquet"
    summary = build_feature_file(src, dst, user=user)
    table = pl.read_parquet(dst)
    assert table.columns[-1] == "honest" and summary["features"] == len(CATALOG) + 1
    meta = pl.read_parquet_metadata(dst)
    assert meta["marketrl.feature_names"].split(",") == [*FEATURE_NAMES, "honest"]
    assert json.loads(meta["marketrl.user_features"])["sha256"] == user.sha256
    assert feature_names_of(table) == [*FEATURE_NAMES, "honest"]

    manifest = write_feature_manifest([dst], tmp_path / "manifest.json")
    assert manifest["user_features"]["names"] == ["honest"] and manifest["user_features"]["lookbacks"] == {
        "honest": 5
    }
    plain = tmp_path / "b.parquet"
    build_feature_file(_dbn(tmp_path, "b.dbn.zst", seed=2), plain)
    assert write_feature_manifest([plain], tmp_path / "plain.json")["user_features"] is None
    with pytest.raises(DatasetError, match=r"b.parquet: built with other features.user features \(none\)"):
        write_feature_manifest([dst, plain], tmp_path / "mixed.json")


def test_a_book_feature_on_an_ohlcv_file_is_named(tmp_path: Path) -> None:
    user = load_user_features(
        _file(tmp_path, "import polars as pl\nFEATURES = {'b': pl.col('book_imbalance')}\n")
    )
    with pytest.raises(
        UserFeatureError, match=r"reads the book .* which a.dbn.zst \(ohlcv-1m\) does not have"
    ):
        build_feature_file(_dbn(tmp_path, "a.dbn.zst", seed=1), tmp_path / "a.parquet", user=user)
    assert not (tmp_path / "a.parquet").exists()


def test_the_content_hash_reruns_on_edits_only(tmp_path: Path) -> None:
    """The features rule's `user` param: a new content changes it, rewriting the same content does not."""
    path = _file(tmp_path, HONEST)
    config = {"features": {"user": str(path)}}
    before = stages.user_features_hash(config)
    path.write_text(HONEST, encoding="utf-8")
    assert stages.user_features_hash(config) == before
    path.write_text(HONEST + "# edited\n", encoding="utf-8")
    assert stages.user_features_hash(config) != before
    assert stages.user_features_hash({"features": {"user": ""}}) == ""
    assert "features.user" in stages.STAGE_KEYS["features"]
    assert stages.reruns("features.user")[:2] == ["user_features_audit", "features"]


def test_the_audit_job_writes_its_summary_and_the_features_job_trusts_it(tmp_path: Path) -> None:
    path = _file(tmp_path, HONEST)
    out = tmp_path / "audit.json"
    write_user_audit(path, {"features": {"user": str(path)}}, out)
    record = json.loads(out.read_text())
    assert record["passed"] and record["sha256"] == load_user_features(path).sha256
    assert record["provenance"]["inputs"] == {str(path): record["sha256"]}
    assert audited_user_features(path, out).names == ("honest",)
    # edited after the audit: the job audits it itself, and a cheat fails there
    path.write_text(
        "import polars as pl\nFEATURES = {'honest': pl.col('close').shift(-1)}\n", encoding="utf-8"
    )
    with pytest.raises(UserFeatureError, match="feature 'honest' reads the future"):
        audited_user_features(path, out)
