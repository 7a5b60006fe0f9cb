"""The equal-work check of bench/speed/features.py: the stage and the naive pandas path got, and gave, the same
rows. Test and benchmark support (tests/test_bench_quick.py checks its one-line failure)."""

from __future__ import annotations

from typing import Any


class UnequalWork(SystemExit):
    """The two sides of the benchmark did not get, or did not give, the same rows: one line naming what differs."""

    def __init__(self, what: str) -> None:
        super().__init__(f"bench/speed/features.py: unequal work: {what}")


def _keys(frame: Any) -> Any:
    """(instrument_id, ts_event, trading_day) of a polars or pandas frame, as polars with one set of dtypes."""
    import polars as pl

    if not isinstance(frame, pl.DataFrame):
        frame = pl.from_pandas(frame[["instrument_id", "ts_event", "trading_day"]])
    return frame.select(
        pl.col("instrument_id").cast(pl.Int64),
        pl.col("ts_event").cast(pl.Datetime("ns", "UTC")),
        pl.col("trading_day").cast(pl.Date),
    )


def check_same_rows(stage: Any, naive: Any, what: str) -> int:
    """The same (instrument, bar open, trading day) rows on both sides, else ``UnequalWork`` naming the first
    row only one side has. Returns the row count."""
    a, b = _keys(stage), _keys(naive)
    only_stage, only_naive = a.join(b, on=a.columns, how="anti"), b.join(a, on=a.columns, how="anti")
    if a.height != b.height or only_stage.height or only_naive.height:
        side, row = ("stage", only_stage) if only_stage.height else ("naive", only_naive)
        first = f"; first row only in {side}: {row.sort('ts_event').row(0)}" if row.height else ""
        raise UnequalWork(f"{what}: stage {a.height:,} rows, naive {b.height:,}{first}")
    return a.height
