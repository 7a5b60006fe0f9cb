"""Leakage-safe walk-forward folds: the plan (`results/folds.json`) and the row selection every job uses.

The plan is made from trading days only; bars enter when rows are selected, where the last `embargo_bars`
bars of every split that is followed by another split are purged per instrument. See docs/FOLDS.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import polars as pl

from marketrl.runtime.io import write_json_atomic

__all__ = [
    "LABEL_HORIZON_BARS",
    "PLAN_FORMAT",
    "Fold",
    "FoldConfig",
    "FoldError",
    "FoldPlan",
    "FoldSplit",
    "TuningSplit",
    "TuningWindow",
    "make_fold_plan",
    "select_rows",
    "select_tuning_rows",
    "trading_days_of",
    "write_fold_plan",
]

log = logging.getLogger(__name__)

# Rewards at bar t use the return of bar t+1, so a row's label reaches one bar into the future.
LABEL_HORIZON_BARS = 1
PLAN_FORMAT = "marketrl.folds/1"
SCHEMES = ("expanding", "rolling")
REQUIRED_COLUMNS = ("ts_event", "trading_day", "instrument_id")

FoldSplit = Literal["train", "validation", "train_full", "test"]
TuningSplit = Literal["train", "validation"]
FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)


class FoldError(ValueError):
    """Bad fold configuration, too little data, a malformed plan file or an impossible row selection."""


# --------------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class FoldConfig:
    """The `folds.*` config section. Day counts are trading days; the embargo is in bars."""

    n: int
    scheme: Literal["expanding", "rolling"]
    train_days: int
    test_days: int
    validation_days: int
    embargo_bars: int
    tuning_days: int
    tuning_validation_days: int
    # Cap on a training window (validation tail included), in trading days; None: no cap (expanding stays
    # expanding). With a cap an expanding window becomes a rolling one once the history is longer.
    max_train_days: int | None = None

    def __post_init__(self) -> None:
        for name in ("n", "train_days", "test_days", "validation_days", "embargo_bars", "tuning_days"):
            _require_int(name, getattr(self, name), minimum=1)
        _require_int("tuning_validation_days", self.tuning_validation_days, minimum=1)
        if self.scheme not in SCHEMES:
            raise FoldError(f"folds.scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.validation_days >= self.train_days:
            raise FoldError(
                f"folds.validation_days must be smaller than folds.train_days={self.train_days} "
                f"(the validation tail is part of the training window), got {self.validation_days}"
            )
        if self.tuning_validation_days >= self.tuning_days:
            raise FoldError(
                f"folds.tuning_validation_days must be smaller than folds.tuning_days={self.tuning_days}, "
                f"got {self.tuning_validation_days}"
            )
        if self.max_train_days is not None:
            value = self.max_train_days
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FoldError(f"folds.max_train_days must be null or a positive integer, got {value!r}")
            if self.max_train_days < self.train_days:
                raise FoldError(
                    f"folds.max_train_days must be null or at least folds.train_days={self.train_days} "
                    f"(the shortest training window), got {self.max_train_days}"
                )
        if self.embargo_bars < LABEL_HORIZON_BARS:
            raise FoldError(
                f"folds.embargo_bars must be at least the label horizon ({LABEL_HORIZON_BARS} bar), "
                f"got {self.embargo_bars}"
            )

    @property
    def required_days(self) -> int:
        """Trading days needed: the longer of the training and tuning windows, then `n` test windows."""
        return max(self.train_days, self.tuning_days) + self.n * self.test_days

    @classmethod
    def from_config(cls, config: Mapping[str, Any], feature_lookback_bars: int | None = None) -> FoldConfig:
        """Read `config["folds"]`; `feature_lookback_bars` (the longest feature lookback) is the default
        embargo and also its floor, so a training row's features never share bars with the next split's."""
        section = config.get("folds")
        if not isinstance(section, Mapping):
            raise FoldError(f"folds must be a mapping of fold settings, got {type(section).__name__}")
        known = {
            "n",
            "scheme",
            "train_days",
            "test_days",
            "validation_days",
            "embargo_bars",
            "tuning_days",
            "tuning_validation_days",
            "max_train_days",
        }
        unknown = sorted(set(section) - known)
        if unknown:
            raise FoldError(
                f"folds.{unknown[0]} is not a fold setting (expected one of {', '.join(sorted(known))})"
            )
        values = dict(section)
        # Absent or 0 (the schema's "automatic") both mean: the longest feature lookback.
        requested = values.get("embargo_bars", 0)
        if requested == 0 and not isinstance(requested, bool):
            if feature_lookback_bars is None:
                raise FoldError(
                    "folds.embargo_bars is required (no feature lookback was given to default it to)"
                )
            values["embargo_bars"] = max(feature_lookback_bars, LABEL_HORIZON_BARS)
        values.setdefault("max_train_days", None)  # absent: no cap
        missing = sorted(known - set(values))
        if missing:
            raise FoldError(f"folds.{missing[0]} is required")
        cfg = cls(**values)
        if feature_lookback_bars is not None and cfg.embargo_bars < feature_lookback_bars:
            raise FoldError(
                f"folds.embargo_bars must be at least the longest feature lookback ({feature_lookback_bars} "
                f"bars), got {cfg.embargo_bars}"
            )
        return cfg


def _require_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; `n: true` in YAML is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise FoldError(f"folds.{name} must be {kind}, got {value!r}")


# ----------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class TuningWindow:
    """Hyperopt's window: `days` ends before any test day; its last `validation_days` are the inner validation."""

    days: tuple[date, ...]
    validation_days: tuple[date, ...]
    embargo_bars: int

    @property
    def train_days(self) -> tuple[date, ...]:
        """Tuning days before the validation tail (the inner training part)."""
        return self.days[: len(self.days) - len(self.validation_days)]

    @property
    def first_day(self) -> date:
        return self.days[0]

    @property
    def last_day(self) -> date:
        return self.days[-1]


@dataclass(frozen=True)
class Fold:
    """One walk-forward fold. `train_days` is the whole training window and includes the validation tail.

    `tuning` is the fold's own tuning window for nested tuning (hyperopt.per_fold): the `folds.tuning_days`
    trading days right before its first test day, so it holds no test day of this fold or a later one.
    """

    index: int
    train_days: tuple[date, ...]
    validation_days: tuple[date, ...]
    test_days: tuple[date, ...]
    embargo_bars: int
    tuning: TuningWindow

    @property
    def inner_train_days(self) -> tuple[date, ...]:
        """Training-window days before the validation tail."""
        return self.train_days[: len(self.train_days) - len(self.validation_days)]

    @property
    def first_train_day(self) -> date:
        return self.train_days[0]

    @property
    def last_train_day(self) -> date:
        return self.train_days[-1]

    @property
    def first_validation_day(self) -> date:
        return self.validation_days[0]

    @property
    def last_validation_day(self) -> date:
        return self.validation_days[-1]

    @property
    def first_test_day(self) -> date:
        return self.test_days[0]

    @property
    def last_test_day(self) -> date:
        return self.test_days[-1]


@dataclass(frozen=True)
class FoldPlan:
    """All folds and the tuning window, made from the trading days of all featurized files."""

    config: FoldConfig
    trading_days: tuple[date, ...]
    tuning: TuningWindow
    folds: tuple[Fold, ...]

    @property
    def first_test_day(self) -> date:
        return self.folds[0].first_test_day

    def tuning_for(self, fold: int | None = None) -> TuningWindow:
        """The window a study tunes on: the single study's (`fold` None) or fold `fold`'s own (nested tuning)."""
        return self.tuning if fold is None else self.fold(fold).tuning

    def fold(self, index: int) -> Fold:
        """The fold with this index, with a clear error for an index outside the plan."""
        if not 0 <= index < len(self.folds):
            raise FoldError(f"fold {index} does not exist: the plan has folds 0..{len(self.folds) - 1}")
        return self.folds[index]

    def to_json(self) -> dict[str, Any]:
        """A self-describing JSON object: config, embargo, every window as ISO dates with index ranges and counts."""
        position = {day: i for i, day in enumerate(self.trading_days)}

        def window(days: Sequence[date]) -> dict[str, Any]:
            return {
                "first_day": days[0].isoformat(),
                "last_day": days[-1].isoformat(),
                "n_days": len(days),
                # [start, stop) into `trading_days`; windows are contiguous runs of trading days.
                "day_index": [position[days[0]], position[days[-1]] + 1],
            }

        def tuning(window_: TuningWindow) -> dict[str, Any]:
            return {
                **window(window_.days),
                "train": window(window_.train_days),
                "validation": window(window_.validation_days),
            }

        return {
            "format": PLAN_FORMAT,
            "description": (
                "Walk-forward folds. Windows are contiguous runs of `trading_days` (day_index is [start, stop)). "
                "Each fold's train window includes its validation tail and holds at most max_train_days "
                "trading days (null: no cap), the most recent before its test window. When rows are selected, the last "
                "embargo_bars bars per instrument of tuning.train, tuning.validation, fold train, validation "
                "and train_full are dropped; test rows are not. Each fold's tuning window (used when "
                "hyperopt.per_fold is true) ends right before that fold's first test day. See docs/FOLDS.md."
            ),
            "config": asdict(self.config),
            "embargo_bars": self.config.embargo_bars,
            "max_train_days": self.config.max_train_days,
            "label_horizon_bars": LABEL_HORIZON_BARS,
            "n_folds": len(self.folds),
            "n_trading_days": len(self.trading_days),
            "first_trading_day": self.trading_days[0].isoformat(),
            "last_trading_day": self.trading_days[-1].isoformat(),
            "first_test_day": self.first_test_day.isoformat(),
            "trading_days": [day.isoformat() for day in self.trading_days],
            "tuning": tuning(self.tuning),
            "folds": [
                {
                    "index": fold.index,
                    "train": window(fold.train_days),
                    "inner_train": window(fold.inner_train_days),
                    "validation": window(fold.validation_days),
                    "test": window(fold.test_days),
                    "tuning": tuning(fold.tuning),  # this fold's study window under hyperopt.per_fold
                }
                for fold in self.folds
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "folds JSON") -> FoldPlan:
        """Rebuild a plan from `to_json()` output, checking that every window agrees with its dates."""
        try:
            if data.get("format") != PLAN_FORMAT:
                raise FoldError(f"format must be {PLAN_FORMAT!r}, got {data.get('format')!r}")
            config = FoldConfig(**data["config"])
            trading_days = tuple(date.fromisoformat(day) for day in data["trading_days"])

            def window(entry: Mapping[str, Any], name: str) -> tuple[date, ...]:
                start, stop = entry["day_index"]
                days = trading_days[start:stop]
                expected = (entry["first_day"], entry["last_day"], entry["n_days"])
                if not days or (days[0].isoformat(), days[-1].isoformat(), len(days)) != expected:
                    raise FoldError(
                        f"{name} day_index {[start, stop]} does not match its first/last day and n_days"
                    )
                return days

            def tuning_window(entry: Mapping[str, Any], name: str) -> TuningWindow:
                return TuningWindow(
                    days=window(entry, name),
                    validation_days=window(entry["validation"], f"{name}.validation"),
                    embargo_bars=config.embargo_bars,
                )

            tuning = tuning_window(data["tuning"], "tuning")
            folds = tuple(
                Fold(
                    index=entry["index"],
                    train_days=window(entry["train"], f"folds[{k}].train"),
                    validation_days=window(entry["validation"], f"folds[{k}].validation"),
                    test_days=window(entry["test"], f"folds[{k}].test"),
                    embargo_bars=config.embargo_bars,
                    tuning=tuning_window(entry["tuning"], f"folds[{k}].tuning"),
                )
                for k, entry in enumerate(data["folds"])
            )
        except FoldError as err:
            raise FoldError(f"{source}: {err}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise FoldError(f"{source}: not a marketrl fold plan ({type(err).__name__}: {err})") from None
        plan = cls(config=config, trading_days=trading_days, tuning=tuning, folds=folds)
        if plan != make_fold_plan(trading_days, config):
            # A hand-edited file must not silently carry windows the rules above would never produce.
            raise FoldError(f"{source}: windows differ from the plan its config and trading_days produce")
        return plan

    def save(self, path: str | Path) -> None:
        """Write the plan atomically (temp file in the same folder, then os.replace)."""
        write_json_atomic(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: str | Path) -> FoldPlan:
        """Read a plan written by `save`, with a one-line error for a missing or malformed file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FoldError(f"{path}: fold plan not found (make it with the folds rule first)") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise FoldError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(data, Mapping):
            raise FoldError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return cls.from_json(data, source=str(path))


def make_fold_plan(trading_days: Sequence[date], cfg: FoldConfig) -> FoldPlan:
    """Place `cfg.n` test windows at the end of the data, a training window before each and the tuning
    window right before the first test day; each fold also gets its own tuning window right before its own
    first test day (nested tuning). Duplicates are dropped and days are sorted first."""
    for day in trading_days:
        # datetime is a subclass of date; a timestamp here means the caller passed the wrong column.
        if not isinstance(day, date) or isinstance(day, datetime):
            raise FoldError(f"trading days must be datetime.date values, got {type(day).__name__} {day!r}")
    days = tuple(sorted(set(trading_days)))
    if len(days) < cfg.required_days:
        raise FoldError(
            f"folds: need {cfg.required_days} trading days for n={cfg.n}, train_days={cfg.train_days}, "
            f"test_days={cfg.test_days}, tuning_days={cfg.tuning_days}; the data have {len(days)}"
        )
    first_test = len(days) - cfg.n * cfg.test_days
    folds = []
    for k in range(cfg.n):
        test_start = first_test + k * cfg.test_days
        # Expanding windows use all history from the first day; `train_days` is then fold 0's minimum.
        train_start = 0 if cfg.scheme == "expanding" else test_start - cfg.train_days
        if cfg.max_train_days is not None:
            # the cap: only the most recent max_train_days trading days before the test window
            train_start = max(train_start, test_start - cfg.max_train_days)
        train = days[train_start:test_start]
        folds.append(
            Fold(
                index=k,
                train_days=train,
                validation_days=train[-cfg.validation_days :],
                test_days=days[test_start : test_start + cfg.test_days],
                embargo_bars=cfg.embargo_bars,
                tuning=_tuning_window(days, test_start, cfg),
            )
        )
    # The single study's window is fold 0's own: required_days guarantees its tuning_days exist, and every later
    # fold's window ends later, so no fold's window is ever short.
    tuning = _tuning_window(days, first_test, cfg)
    return FoldPlan(config=cfg, trading_days=days, tuning=tuning, folds=tuple(folds))


def _tuning_window(days: Sequence[date], end: int, cfg: FoldConfig) -> TuningWindow:
    """The `cfg.tuning_days` days before position `end` (a first test day), its validation tail last."""
    window = tuple(days[end - cfg.tuning_days : end])
    return TuningWindow(
        days=window,
        validation_days=window[-cfg.tuning_validation_days :],
        embargo_bars=cfg.embargo_bars,
    )


def trading_days_of(feature_files: Sequence[str | Path]) -> list[date]:
    """Sorted unique `trading_day` values over all featurized Parquet files."""
    if not feature_files:
        raise FoldError("folds: no feature files given; the fold plan is made from their trading days")
    days: set[date] = set()
    for path in feature_files:
        try:
            column = pl.read_parquet(path, columns=["trading_day"])["trading_day"]
        except Exception as err:  # polars raises several unrelated types for a bad file
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise FoldError(f"{path}: cannot read column trading_day ({reason})") from None
        if column.dtype != pl.Date:
            raise FoldError(f"{path}: column trading_day must be Date, got {column.dtype}")
        days.update(column.drop_nulls().unique().to_list())
    return sorted(days)


def write_fold_plan(
    feature_files: Sequence[str | Path], folds_section: Mapping[str, Any], output: str | Path
) -> FoldPlan:
    """The `folds` rule: plan from the feature files' trading days and the `folds` config, saved to `output`."""
    # Imported here so the plan and row selection stay usable without the feature pipeline.
    from marketrl.features import MAX_LOOKBACK

    cfg = FoldConfig.from_config({"folds": folds_section}, feature_lookback_bars=MAX_LOOKBACK)
    plan = make_fold_plan(trading_days_of(feature_files), cfg)
    plan.save(output)
    log.info(
        "fold plan: %d %s folds (training window cap %s days), tests %s..%s, tuning %s..%s, embargo %d bars, "
        "%d trading days -> %s",
        len(plan.folds),
        cfg.scheme,
        cfg.max_train_days,
        plan.first_test_day,
        plan.trading_days[-1],
        plan.tuning.first_day,
        plan.tuning.last_day,
        cfg.embargo_bars,
        len(plan.trading_days),
        output,
    )
    return plan


# -------------------------------------------------------------------------------------------- row selection


def select_rows(frame: FrameT, fold: Fold, split: FoldSplit, embargo_bars: int | None = None) -> FrameT:
    """Rows of one fold split (a DataFrame or LazyFrame), with the per-instrument embargo applied.

    train: inner training days, minus each instrument's last `embargo_bars` rows (validation follows).
    validation: validation-tail days, minus each instrument's last `embargo_bars` rows (test follows).
    train_full: all training-window days, minus each instrument's last `embargo_bars` rows (test follows).
    test: test days, nothing purged.
    `embargo_bars` defaults to the plan's.
    """
    windows: dict[str, tuple[tuple[date, ...], bool]] = {
        "train": (fold.inner_train_days, True),
        "validation": (fold.validation_days, True),
        "train_full": (fold.train_days, True),
        "test": (fold.test_days, False),
    }
    if split not in windows:
        raise FoldError(f"split must be one of {', '.join(windows)}, got {split!r}")
    days, purged = windows[split]
    embargo = fold.embargo_bars if embargo_bars is None else embargo_bars
    return _select(frame, days, embargo if purged else 0, f"fold {fold.index} {split}")


def select_tuning_rows(frame: FrameT, plan: FoldPlan, split: TuningSplit, fold: int | None = None) -> FrameT:
    """Rows of hyperopt's window: `train` (tuning days before its validation tail) or `validation`;
    both lose each instrument's last `embargo_bars` rows (validation, then a first test day, follows).
    `fold`: that fold's own window (hyperopt.per_fold); None, the single study's."""
    tuning = plan.tuning_for(fold)
    windows = {"train": tuning.train_days, "validation": tuning.validation_days}
    if split not in windows:
        raise FoldError(f"tuning split must be one of {', '.join(windows)}, got {split!r}")
    label = "tuning" if fold is None else f"fold {fold} tuning"
    return _select(frame, windows[split], tuning.embargo_bars, f"{label} {split}")


def _date_list(days: Sequence[date]) -> pl.Series:
    # A one-element list column: `is_in` then means membership, not element-wise comparison.
    return pl.Series(days, dtype=pl.Date).implode()


def _select(frame: FrameT, days: Sequence[date], purge_bars: int, label: str) -> FrameT:
    columns = frame.collect_schema().names() if isinstance(frame, pl.LazyFrame) else frame.columns
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise FoldError(
            f"{label}: the frame lacks column {missing[0]!r} (needs {', '.join(REQUIRED_COLUMNS)})"
        )
    in_window = frame.filter(pl.col("trading_day").is_in(_date_list(days)))
    if purge_bars == 0:
        return in_window
    # Rank 1 is each instrument's latest bar; ranking by time does not rely on the frame's row order.
    bars_from_end = pl.col("ts_event").rank("ordinal", descending=True).over("instrument_id")
    selected = in_window.filter(bars_from_end > purge_bars)
    if isinstance(in_window, pl.DataFrame) and in_window.height > 0 and selected.height == 0:
        most = in_window.group_by("instrument_id").len()["len"].max()
        raise FoldError(
            f"{label}: its {len(days)} trading days hold at most {most} bars per instrument, all inside "
            f"folds.embargo_bars={purge_bars}; lengthen the window or shorten the embargo"
        )
    return selected
