"""Walk-forward folds: plan invariants over many configurations, per-instrument embargo, JSON round-trips."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from marketrl.splits.folds import (
    Fold,
    FoldConfig,
    FoldError,
    FoldPlan,
    make_fold_plan,
    select_rows,
    select_tuning_rows,
    write_fold_plan,
)
from marketrl.splits.normalize import FeatureNormalizer

FEATURES = ["f0", "f1"]
PROPERTY_SETTINGS = settings(
    max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _config(**overrides: object) -> FoldConfig:
    values: dict[str, object] = dict(
        n=3,
        scheme="rolling",
        train_days=5,
        test_days=2,
        validation_days=2,
        embargo_bars=2,
        tuning_days=4,
        tuning_validation_days=1,
    )
    values.update(overrides)
    return FoldConfig(**values)  # type: ignore[arg-type]


def _calendar(n_days: int, gaps: list[int] | None = None) -> list[date]:
    """Trading days with optional calendar gaps (weekends, holidays) between them."""
    days, current = [], date(2024, 1, 2)
    for i in range(n_days):
        days.append(current)
        current += timedelta(days=1 + (gaps[i % len(gaps)] if gaps else 0))
    return days


def _bars(days: list[date], n_instruments: int, bars_per_day: int, dropped: set[tuple[int, int]], seed: int):
    """A small feature table: per instrument, `bars_per_day` minute bars on every day it is not missing."""
    rng = np.random.default_rng(seed)
    rows = []
    for inst in range(n_instruments):
        for d, day in enumerate(days):
            if (inst, d) in dropped:
                continue
            open_time = datetime(day.year, day.month, day.day, 14, 30, tzinfo=UTC)
            for b in range(bars_per_day):
                rows.append((open_time + timedelta(minutes=b), day, 100 + inst, f"SYM{inst}"))
    ts, trading_day, instrument_id, symbol = zip(*rows, strict=True)
    return pl.DataFrame(
        {
            "ts_event": pl.Series(ts, dtype=pl.Datetime("ns", "UTC")),
            "trading_day": pl.Series(trading_day, dtype=pl.Date),
            "instrument_id": pl.Series(instrument_id, dtype=pl.UInt32),
            "symbol": symbol,
            "bar_return": rng.normal(0, 1e-3, len(rows)).astype(np.float32),
            **{name: rng.normal(0, 1, len(rows)).astype(np.float32) for name in FEATURES},
        }
    )


def _reference_rows(df: pl.DataFrame, days: tuple[date, ...], purge: int) -> set[tuple[int, datetime]]:
    """Independent, list-based statement of a split: its days' rows, minus each instrument's last `purge`."""
    wanted = set(days)
    keys: set[tuple[int, datetime]] = set()
    for inst in df["instrument_id"].unique().to_list():
        rows = sorted(
            ts
            for ts, day, i in zip(df["ts_event"], df["trading_day"], df["instrument_id"], strict=True)
            if i == inst and day in wanted
        )
        keys.update((inst, ts) for ts in rows[: max(len(rows) - purge, 0)])
    return keys


def _keys(df: pl.DataFrame) -> set[tuple[int, datetime]]:
    return set(zip(df["instrument_id"].to_list(), df["ts_event"].to_list(), strict=True))


def _positions(df: pl.DataFrame) -> dict[tuple[int, datetime], int]:
    """Each row's position in its instrument's full time-ordered bar sequence."""
    ordered = df.sort("instrument_id", "ts_event").with_columns(
        pl.int_range(pl.len()).over("instrument_id").alias("pos")
    )
    return {(i, ts): p for i, ts, p in ordered.select("instrument_id", "ts_event", "pos").iter_rows()}


def _assert_gap(df: pl.DataFrame, before: pl.DataFrame, after: pl.DataFrame, embargo: int) -> None:
    """Per instrument, the last row of `before` sits at least embargo + 1 bars before the first of `after`."""
    pos = _positions(df)
    for inst in set(before["instrument_id"].to_list()) & set(after["instrument_id"].to_list()):
        last = max(pos[k] for k in _keys(before.filter(pl.col("instrument_id") == inst)))
        first = min(pos[k] for k in _keys(after.filter(pl.col("instrument_id") == inst)))
        assert first - last >= embargo + 1, (inst, last, first, embargo)


def _select_or_expect_error(select, reference: set, window_has_rows: bool):
    """select(), or the one-line error when the embargo swallows the whole (non-empty) window."""
    if window_has_rows and not reference:
        event("embargo swallows a window")
        with pytest.raises(FoldError, match="embargo_bars"):
            select()
        return None
    out = select()
    assert _keys(out) == reference
    return out


# ------------------------------------------------------------------------------------------- property test

fold_setups = st.fixed_dictionaries(
    {
        "n": st.integers(1, 4),
        "scheme": st.sampled_from(["expanding", "rolling"]),
        "train_days": st.integers(2, 7),
        "test_days": st.integers(1, 3),
        "validation_frac": st.floats(0.0, 0.99),
        "tuning_days": st.integers(2, 6),
        "tuning_validation_frac": st.floats(0.0, 0.99),
        "embargo_bars": st.integers(1, 5),
        "max_train_extra": st.one_of(st.none(), st.integers(0, 6)),  # the cap, above train_days; None: no cap
        "extra_days": st.integers(-2, 3),
        "n_instruments": st.integers(1, 3),
        "bars_per_day": st.integers(1, 6),
        "gaps": st.lists(st.integers(0, 3), min_size=1, max_size=4),
        "missing": st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), max_size=6),
        "seed": st.integers(0, 2**16),
    }
)


@PROPERTY_SETTINGS
@given(setup=fold_setups)
def test_fold_plan_properties(setup: dict) -> None:
    cfg = _config(
        n=setup["n"],
        scheme=setup["scheme"],
        train_days=setup["train_days"],
        test_days=setup["test_days"],
        validation_days=1 + int(setup["validation_frac"] * (setup["train_days"] - 1)),
        tuning_days=setup["tuning_days"],
        tuning_validation_days=1 + int(setup["tuning_validation_frac"] * (setup["tuning_days"] - 1)),
        embargo_bars=setup["embargo_bars"],
        max_train_days=(
            None if setup["max_train_extra"] is None else setup["train_days"] + setup["max_train_extra"]
        ),
    )
    n_days = max(cfg.required_days + setup["extra_days"], 1)
    days = _calendar(n_days, setup["gaps"])
    if n_days < cfg.required_days:
        event("too few trading days")
        with pytest.raises(FoldError) as info:
            make_fold_plan(days, cfg)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"folds: need {cfg.required_days} trading days for n={cfg.n}")
        assert message.endswith(f"the data have {n_days}")
        return

    # Days listed out of order and repeated, as when gathered from several files.
    plan = make_fold_plan(list(reversed(days)) + days[:3], cfg)
    assert list(plan.trading_days) == days
    assert len(plan.folds) == cfg.n
    assert plan.folds[-1].last_test_day == days[-1]
    all_test_days = {d for fold in plan.folds for d in fold.test_days}

    # Tuning never sees a test day and ends before the first test day of any fold.
    assert not set(plan.tuning.days) & all_test_days
    assert plan.tuning.last_day < min(fold.first_test_day for fold in plan.folds)
    assert len(plan.tuning.days) == cfg.tuning_days
    assert plan.tuning.validation_days == plan.tuning.days[-cfg.tuning_validation_days :]

    for k, fold in enumerate(plan.folds):
        assert fold.index == k
        assert len(fold.test_days) == cfg.test_days
        assert fold.validation_days == fold.train_days[-cfg.validation_days :]
        assert len(fold.inner_train_days) == len(fold.train_days) - cfg.validation_days >= 1
        # Training holds no test day of this or any later fold, and ends right before the test window.
        assert max(fold.train_days) < fold.first_test_day
        assert not set(fold.train_days) & {d for later in plan.folds[k:] for d in later.test_days}
        assert days.index(fold.first_test_day) == days.index(fold.last_train_day) + 1
        history = len(days) - (cfg.n - k) * cfg.test_days  # trading days before this fold's test window
        cap = history if cfg.max_train_days is None else cfg.max_train_days
        if cfg.scheme == "rolling":
            assert len(fold.train_days) == cfg.train_days
        else:
            # expanding: all history, or with folds.max_train_days its most recent cap days
            assert len(fold.train_days) == min(history, cap) >= cfg.train_days
            assert fold.first_train_day == days[history - len(fold.train_days)]
            if history <= cap:
                assert fold.first_train_day == days[0]
        assert len(fold.train_days) <= cap
        if k:
            previous = plan.folds[k - 1]
            assert previous.last_test_day < fold.first_test_day
            assert days.index(fold.first_test_day) == days.index(previous.last_test_day) + 1

    dropped = {(inst, d) for inst, d in setup["missing"] if inst < setup["n_instruments"] and d < n_days}
    df = _bars(days, setup["n_instruments"], setup["bars_per_day"], dropped, setup["seed"])
    embargo = cfg.embargo_bars

    for fold in plan.folds:
        parts = {}
        for split, split_days, purge in [
            ("train", fold.inner_train_days, embargo),
            ("validation", fold.validation_days, embargo),
            ("train_full", fold.train_days, embargo),
            ("test", fold.test_days, 0),
        ]:
            has_rows = df["trading_day"].is_in(pl.Series(split_days, dtype=pl.Date).implode()).any()
            parts[split] = _select_or_expect_error(
                partial(select_rows, df, fold, split),
                _reference_rows(df, split_days, purge),
                has_rows,
            )
        test_days = set(fold.test_days)
        for split in ("train", "validation", "train_full"):
            if parts[split] is not None:
                assert not set(parts[split]["trading_day"].to_list()) & test_days
        if parts["train"] is not None and parts["validation"] is not None:
            _assert_gap(df, parts["train"], parts["validation"], embargo)
        for split in ("validation", "train_full"):
            if parts[split] is not None:
                _assert_gap(df, parts[split], parts["test"], embargo)

        # Normalization statistics depend on training rows only: perturbing test rows leaves them unchanged.
        if parts["train"] is not None:
            perturbed = df.with_columns(
                [
                    pl.when(pl.col("trading_day").is_in(pl.Series(fold.test_days, dtype=pl.Date).implode()))
                    .then(pl.col(name) * 1e3 + 7.0)
                    .otherwise(pl.col(name))
                    .alias(name)
                    for name in FEATURES
                ]
            )
            stats = select_rows(df, fold, "train").select(FEATURES).describe()
            assert stats.equals(select_rows(perturbed, fold, "train").select(FEATURES).describe())

    tuning_parts = {}
    for split, split_days in [("train", plan.tuning.train_days), ("validation", plan.tuning.validation_days)]:
        has_rows = df["trading_day"].is_in(pl.Series(split_days, dtype=pl.Date).implode()).any()
        tuning_parts[split] = _select_or_expect_error(
            partial(select_tuning_rows, df, plan, split),
            _reference_rows(df, split_days, embargo),
            has_rows,
        )
    if tuning_parts["train"] is not None and tuning_parts["validation"] is not None:
        _assert_gap(df, tuning_parts["train"], tuning_parts["validation"], embargo)
    first_test = select_rows(df, plan.folds[0], "test")
    if tuning_parts["validation"] is not None:
        _assert_gap(df, tuning_parts["validation"], first_test, embargo)

    assert FoldPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


# ---------------------------------------------------------------------------------------- worked examples


def test_rolling_plan_matches_hand_layout() -> None:
    days = _calendar(12)
    plan = make_fold_plan(days, _config(scheme="rolling"))
    # 12 days, 3 test windows of 2 at the end: tests start at days[6], days[8], days[10].
    assert [f.test_days for f in plan.folds] == [tuple(days[6:8]), tuple(days[8:10]), tuple(days[10:12])]
    assert [f.train_days for f in plan.folds] == [tuple(days[1:6]), tuple(days[3:8]), tuple(days[5:10])]
    assert plan.folds[1].validation_days == tuple(days[6:8])
    assert plan.folds[1].inner_train_days == tuple(days[3:6])
    assert plan.tuning.days == tuple(days[2:6])
    assert plan.tuning.train_days == tuple(days[2:5])


def test_expanding_plan_grows_from_the_first_day() -> None:
    days = _calendar(12)
    plan = make_fold_plan(days, _config(scheme="expanding"))
    assert [f.train_days for f in plan.folds] == [tuple(days[0:6]), tuple(days[0:8]), tuple(days[0:10])]
    assert plan.folds[2].validation_days == tuple(days[8:10])


def test_max_train_days_caps_expanding_windows_to_the_most_recent_days() -> None:
    days = _calendar(16, gaps=[0, 0, 0, 0, 2])  # weekends: the cap counts trading days, not calendar days
    plan = make_fold_plan(days, _config(scheme="expanding", max_train_days=7))
    # tests start at days[10], days[12], days[14]; fold 0 has 10 days of history, so all three folds are capped
    assert [f.train_days for f in plan.folds] == [tuple(days[3:10]), tuple(days[5:12]), tuple(days[7:14])]
    assert plan.folds[2].validation_days == tuple(days[12:14])
    # a cap above the history leaves the window expanding; the tuning window never depends on the cap
    uncapped = make_fold_plan(days, _config(scheme="expanding"))
    assert make_fold_plan(days, _config(scheme="expanding", max_train_days=14)).folds == uncapped.folds
    assert plan.tuning == uncapped.tuning
    assert [f.tuning for f in plan.folds] == [f.tuning for f in uncapped.folds]
    # rolling windows are train_days long, so a cap at or above train_days changes nothing
    rolling = make_fold_plan(days, _config(scheme="rolling"))
    assert make_fold_plan(days, _config(scheme="rolling", max_train_days=5)).folds == rolling.folds


def test_max_train_days_cuts_by_session_date_and_leaves_no_trace_of_cut_or_future_days() -> None:
    """The cut is by `trading_day` (the session), not by the UTC date of ts_event: a session that opens the
    evening before (CME Globex) is kept whole, and the session before the cut is dropped whole. Perturbing the
    days outside a fold's capped window (before the cut, and the test days and after) changes neither the
    training rows nor their normalization statistics."""
    days = _calendar(16)
    rows = []
    for d, day in enumerate(days):
        evening = datetime(day.year, day.month, day.day, 22, 0, tzinfo=UTC) - timedelta(days=1)
        for b in range(6):  # 3 bars on the evening before (previous UTC date), 3 on the day itself
            ts = evening + timedelta(minutes=b) if b < 3 else evening + timedelta(hours=12, minutes=b)
            rows.append((ts, day, d))
    ts, trading_day, index = zip(*rows, strict=True)
    df = pl.DataFrame(
        {
            "ts_event": pl.Series(ts, dtype=pl.Datetime("ns", "UTC")),
            "trading_day": pl.Series(trading_day, dtype=pl.Date),
            "instrument_id": pl.Series([7] * len(rows), dtype=pl.UInt32),
            "f0": pl.Series(index, dtype=pl.Float32),
            "f1": np.random.default_rng(0).normal(0, 1, len(rows)).astype(np.float32),
        }
    )
    plan = make_fold_plan(days, _config(scheme="expanding", max_train_days=7, embargo_bars=2))
    fold = plan.folds[1]  # tests days[12:14]; trains on days[5:12]
    full = select_rows(df, fold, "train_full")
    assert sorted(set(full["trading_day"].to_list())) == list(days[5:12])
    first = full.filter(pl.col("trading_day") == days[5])
    assert first.height == 6  # the whole first session, its evening bars dated the day before in UTC
    assert first["ts_event"].dt.date().min() == days[4]  # ... which is the cut session's date: not a date cut
    inside = pl.col("trading_day").is_in(pl.Series(fold.train_days, dtype=pl.Date).implode())
    perturbed = df.with_columns(
        pl.when(inside).then(pl.col(name)).otherwise(pl.col(name) * 1e3 + 7.0).alias(name)
        for name in FEATURES
    )
    for split in ("train", "validation", "train_full"):
        assert select_rows(df, fold, split).equals(select_rows(perturbed, fold, split))
    assert FeatureNormalizer().fit(select_rows(df, fold, "train"), FEATURES).state_dict() == (
        FeatureNormalizer().fit(select_rows(perturbed, fold, "train"), FEATURES).state_dict()
    )
    # the uncapped window does see the perturbed early days: the test above can fail
    uncapped = make_fold_plan(days, _config(scheme="expanding", embargo_bars=2)).folds[1]
    assert not select_rows(df, uncapped, "train").equals(select_rows(perturbed, uncapped, "train"))


def test_embargo_is_per_instrument_and_independent_of_row_order() -> None:
    days = _calendar(12)
    cfg = _config(embargo_bars=3)
    plan = make_fold_plan(days, cfg)
    # Instrument 101 misses the last training day; its purge must still drop its own last 3 bars.
    df = _bars(days, 2, 4, dropped={(1, 5)}, seed=0)
    fold = plan.folds[0]
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=1)
    full = select_rows(shuffled, fold, "train_full")
    per_instrument = full.group_by("instrument_id").len().sort("instrument_id")["len"].to_list()
    assert per_instrument == [5 * 4 - 3, 4 * 4 - 3]
    last_101 = full.filter(pl.col("instrument_id") == 101)["ts_event"].max()
    assert last_101 == datetime(2024, 1, 6, 14, 30, tzinfo=UTC)  # days[4] (Jan 6), bar 0 of 4
    # A LazyFrame gives the same rows.
    assert _keys(select_rows(shuffled.lazy(), fold, "train_full").collect()) == _keys(full)
    # An explicit embargo overrides the plan's.
    assert select_rows(df, fold, "train_full", embargo_bars=1).height == full.height + 2 * 2


def test_embargo_swallowing_a_window_is_a_one_line_error() -> None:
    plan = make_fold_plan(_calendar(12), _config(embargo_bars=9, validation_days=2))
    df = _bars(_calendar(12), 1, 4, dropped=set(), seed=0)
    with pytest.raises(FoldError, match=r"^fold 0 validation: .*at most 8 bars.*folds\.embargo_bars=9"):
        select_rows(df, plan.folds[0], "validation")


def test_select_rows_rejects_bad_split_and_missing_columns() -> None:
    plan = make_fold_plan(_calendar(12), _config())
    df = _bars(_calendar(12), 1, 2, dropped=set(), seed=0)
    with pytest.raises(FoldError, match="split must be one of"):
        select_rows(df, plan.folds[0], "tset")  # type: ignore[arg-type]
    with pytest.raises(FoldError, match="lacks column 'ts_event'"):
        select_rows(df.drop("ts_event"), plan.folds[0], "train")
    with pytest.raises(FoldError, match="tuning split must be one of"):
        select_tuning_rows(df, plan, "test")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- config


def _section(**overrides: object) -> dict:
    section: dict[str, object] = dict(
        n=2, scheme="expanding", train_days=20, test_days=5, validation_days=4, tuning_days=10,
        tuning_validation_days=3,
    )  # fmt: skip
    section.update(overrides)
    return {"folds": section}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n": -1}, "folds.n must be a positive integer, got -1"),
        ({"n": True}, "folds.n must be a positive integer, got True"),
        ({"test_days": 1.5}, "folds.test_days must be a positive integer, got 1.5"),
        ({"scheme": "sliding"}, "folds.scheme must be one of expanding, rolling, got 'sliding'"),
        ({"validation_days": 20}, "folds.validation_days must be smaller than folds.train_days=20"),
        ({"tuning_validation_days": 10}, "folds.tuning_validation_days must be smaller than"),
        ({"embargo_bars": -1}, "folds.embargo_bars must be a positive integer, got -1"),
        (
            {"embargo_bars": 5},
            r"folds.embargo_bars must be at least the longest feature lookback \(30 bars\)",
        ),
        ({"trian_days": 3}, "folds.trian_days is not a fold setting"),
        ({"max_train_days": 19}, r"folds.max_train_days must be null or at least folds.train_days=20"),
        ({"max_train_days": 0}, "folds.max_train_days must be null or a positive integer, got 0"),
        ({"max_train_days": "250"}, "folds.max_train_days must be null or a positive integer, got '250'"),
    ],
)
def test_from_config_errors_name_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(FoldError, match=message) as info:
        FoldConfig.from_config(_section(**overrides), feature_lookback_bars=30)
    assert "\n" not in str(info.value)


def test_from_config_defaults_embargo_to_feature_lookback() -> None:
    assert FoldConfig.from_config(_section(), feature_lookback_bars=30).embargo_bars == 30
    assert FoldConfig.from_config(_section(embargo_bars=0), feature_lookback_bars=30).embargo_bars == 30
    assert FoldConfig.from_config(_section(embargo_bars=45), feature_lookback_bars=30).embargo_bars == 45
    with pytest.raises(FoldError, match=r"^folds\.embargo_bars is required"):
        FoldConfig.from_config(_section())
    section = _section(embargo_bars=4)
    del section["folds"]["test_days"]
    with pytest.raises(FoldError, match=r"^folds\.test_days is required$"):
        FoldConfig.from_config(section)
    with pytest.raises(FoldError, match="folds must be a mapping"):
        FoldConfig.from_config({})


def test_make_fold_plan_rejects_timestamps() -> None:
    with pytest.raises(FoldError, match=r"datetime\.date values, got datetime"):
        make_fold_plan([datetime(2024, 1, 2)] * 12, _config())


# ------------------------------------------------------------------------------------------------- files


def test_save_load_round_trip_is_atomic_and_self_describing(tmp_path: Path) -> None:
    plan = make_fold_plan(_calendar(12, gaps=[0, 0, 0, 0, 2]), _config())
    path = tmp_path / "results" / "folds.json"
    plan.save(path)
    assert FoldPlan.load(path) == plan
    assert [p.name for p in path.parent.iterdir()] == ["folds.json"]  # no temp file left behind
    data = json.loads(path.read_text())
    assert data["config"]["embargo_bars"] == data["embargo_bars"] == 2
    assert data["n_folds"] == 3 and data["n_trading_days"] == 12
    assert data["folds"][2]["test"]["last_day"] == plan.trading_days[-1].isoformat()
    assert data["tuning"]["validation"]["n_days"] == 1
    assert data["config"]["max_train_days"] is data["max_train_days"] is None
    # every fold carries its own tuning window (nested tuning), ending right before its first test day
    for fold, entry in zip(plan.folds, data["folds"], strict=True):
        assert entry["tuning"]["last_day"] == fold.tuning.last_day.isoformat()
        assert entry["tuning"]["day_index"][1] == entry["test"]["day_index"][0]
    # the cap is recorded, round-trips, and a hand-edited cap that disagrees with the windows is refused
    capped = make_fold_plan(_calendar(16), _config(scheme="expanding", max_train_days=7))
    capped.save(path)
    data = json.loads(path.read_text())
    assert data["config"]["max_train_days"] == data["max_train_days"] == 7
    assert [entry["train"]["n_days"] for entry in data["folds"]] == [7, 7, 7]
    assert FoldPlan.load(path) == capped
    data["config"]["max_train_days"] = None
    with pytest.raises(FoldError, match="windows differ from the plan"):
        FoldPlan.from_json(data)


def test_load_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(FoldError, match=r"folds\.json: fold plan not found"):
        FoldPlan.load(tmp_path / "folds.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FoldError, match=r"bad\.json: not valid JSON"):
        FoldPlan.load(bad)
    bad.write_text("[]")
    with pytest.raises(FoldError, match="expected a JSON object, got list"):
        FoldPlan.load(bad)

    data = make_fold_plan(_calendar(12), _config()).to_json()
    del data["folds"][0]["test"]
    bad.write_text(json.dumps(data))
    with pytest.raises(FoldError, match=r"bad\.json: not a marketrl fold plan \(KeyError"):
        FoldPlan.load(bad)

    data = make_fold_plan(_calendar(12), _config()).to_json()
    data["folds"][1]["train"]["day_index"] = [2, 8]  # hand-edited start that disagrees with first_day
    bad.write_text(json.dumps(data))
    with pytest.raises(FoldError, match=r"folds\[1\]\.train day_index \[2, 8\] does not match"):
        FoldPlan.load(bad)

    data = make_fold_plan(_calendar(12), _config()).to_json()
    data["config"]["train_days"] = 4  # windows no longer follow from the config
    bad.write_text(json.dumps(data))
    with pytest.raises(FoldError, match="windows differ from the plan"):
        FoldPlan.load(bad)


def test_fold_lookup_by_index() -> None:
    plan = make_fold_plan(_calendar(12), _config())
    assert isinstance(plan.fold(2), Fold)
    with pytest.raises(FoldError, match=r"fold 3 does not exist: the plan has folds 0\.\.2"):
        plan.fold(3)


def test_write_fold_plan_uses_the_days_of_all_feature_files(tmp_path: Path) -> None:
    from marketrl.features import MAX_LOOKBACK

    days = _calendar(14, gaps=[0, 0, 0, 0, 2])
    # Two instruments' files with different missing days; the plan uses the union of their days.
    frame = _bars(days, 2, 2, dropped={(0, 13), (1, 0)}, seed=3)
    files = []
    for inst, part in enumerate(frame.partition_by("instrument_id", maintain_order=True)):
        files.append(tmp_path / f"features_{inst}.parquet")
        part.write_parquet(files[-1])
    section = _section(n=2, train_days=6, test_days=3, validation_days=2, tuning_days=5, embargo_bars=0)
    out = tmp_path / "results" / "folds.json"
    plan = write_fold_plan(files, section["folds"], out)
    assert list(plan.trading_days) == days
    assert plan.config.embargo_bars == MAX_LOOKBACK
    assert FoldPlan.load(out) == plan

    (tmp_path / "broken.parquet").write_text("not parquet")
    with pytest.raises(FoldError, match=r"broken\.parquet: cannot read column trading_day"):
        write_fold_plan([*files, tmp_path / "broken.parquet"], section["folds"], out)
    with pytest.raises(FoldError, match="no feature files given"):
        write_fold_plan([], section["folds"], out)
