"""Benchmark: DBN.zst → Parquet feature table, against the naive pandas path and the decode-only floor.

    python bench/speed/features.py                 # 1,000,000 ohlcv-1m bars (2 instruments), median of 3 rounds
    python bench/speed/features.py --bars 100000   # smaller
    python bench/speed/features.py --quick         # 20,000 bars, 1 round: a sanity run (tests/test_bench_quick.py)

The input is CME-shaped: every minute of CME Globex sessions (marketrl.calendars.cme_hours: Sunday 17:00 CT open,
the 16:00-17:00 CT halt, DST changes, early-halt and closed holidays, from 2024-01-10, so Martin Luther King Jr.
Day falls in the first week). Both paths get the same bars and label the same sessions: the stage by its
calendar, the naive path with pandas (``tz_convert``, the halt, the holiday roll); before anything is timed, a
check file of the same shape goes through both paths untimed and the bench stops with one line naming what
differs unless the bars in, the rows out and the features agree (the full tables are compared again after).

Phases, each in a fresh subprocess so its peak RSS is its own (VmHWM after the phase minus the RSS measured
just before it, with all imports done); "cpu s" is the process's user+system time over the phase,
all threads (the machine is shared, so it is steadier than wall time); each phase runs ``--repeats`` times,
interleaved, and the median is reported:

  (a) stage  - ``marketrl.features.build_feature_file`` (decode, bars, sessions, 51 features, checks, Parquet)
  (b) naive  - databento ``to_df()`` + pandas sessions, groupby/rolling for the same 51 features + ``to_parquet``
  (c) floor  - ``DBNStore.from_file(p).to_ndarray()`` only
and parts of (a) alone, to show where its time goes:
  bars       - ``read_bars`` with the dataset's CME calendar (decode + bars + symbols + sessions)
  bars_utc   - ``read_bars`` with a UTC calendar (open 22:00 UTC, no halt or holidays: it keeps the same bars)
  compute    - the feature chunks alone (``feature_chunks`` over ``read_bars``' bars, read before the clock)
  write      - writing (a)'s finished table again, chunk by chunk, with the stage's Parquet settings (each
               chunk's finite check and ``to_arrow`` included, as in the stage)

``--codecs`` instead writes (a)'s table once per Parquet setting (codec and level, BYTE_STREAM_SPLIT on/off,
rows per row group, without the derivable key columns), median of 3 writes each, and prints CPU s, wall s and
the file size: the evidence behind the constants in ``marketrl.features`` (docs/PERFORMANCE.md).

The input is generated with a numpy structured array in databento's own record layout written after
``bytes(databento_dbn.Metadata)`` (building a million record objects in Python would dominate the run).
The naive path uses pandas' untruncated ``ewm`` where the stage truncates its EMAs (docs/FEATURES.md), so the
EMA-based columns differ slightly; all other features are compared and the largest difference is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/speed/features.py`: sys.path holds bench/speed/, not the checkout that tests.support is in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.equal_work import UnequalWork, check_same_rows  # noqa: E402

EMA_FEATURES = ("atr_14", "rsi_6", "rsi_14", "macd", "macd_signal", "macd_hist")


BENCH_START = dt.date(2024, 1, 10)  # Martin Luther King Jr. Day (an early-halt holiday) is 2024-01-15
MINUTE_NS = 60_000_000_000
UTC_SESSION = {"timezone": "UTC", "open": "22:00"}  # no halt, no holidays: keeps every bar of a CME session


def cme_minutes(n_minutes: int, start: dt.date = BENCH_START) -> np.ndarray:
    """The first ``n_minutes`` bar open times (UTC ns) of every minute inside CME sessions from ``start``."""
    from marketrl.calendars.cme_hours import cme_sessions

    sessions = cme_sessions(start, n_minutes // 1380 + 8)  # at most 1380 minutes per trading day
    times = np.concatenate([np.arange(s.open_ns, s.close_ns, MINUTE_NS, dtype=np.int64) for s in sessions])
    if len(times) < n_minutes:
        raise ValueError(f"cme_minutes: {len(times)} session minutes, {n_minutes} asked for")
    return times[:n_minutes]


def generate_ohlcv_file(path: Path, n_bars: int, n_instruments: int = 2, seed: int = 0) -> int:
    """Write ``n_bars`` ohlcv-1m bars (random walks, interleaved by time, every minute of CME sessions) as
    .dbn.zst; returns the byte size."""
    import databento_dbn as dbn
    import zstandard
    from databento.common.constants import SCHEMA_STRUCT_MAP

    from marketrl.data.dbn_writer import MappingInterval, SymbolMapping

    rng = np.random.default_rng(seed)
    dtype = np.dtype(SCHEMA_STRUCT_MAP[dbn.Schema.OHLCV_1M]._dtypes)
    per = n_bars // n_instruments
    records = np.zeros(per * n_instruments, dtype=dtype)
    times = cme_minutes(per)
    for k in range(n_instruments):
        close = np.exp(np.cumsum(rng.normal(0, 1e-3, per))) * (4000 + 1000 * k)
        open_ = np.concatenate([[close[0]], close[:-1]])
        high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0, 3e-4, per)))
        low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0, 3e-4, per)))
        view = records[k::n_instruments]  # Databento orders by time, then instrument
        view["ts_event"], view["instrument_id"] = times, 100 + k
        for field, values in (("open", open_), ("high", high), ("low", low), ("close", close)):
            view[field] = np.round(values * 1e9).astype(np.int64)
        view["volume"] = rng.integers(1, 500, per)
    records["length"], records["rtype"], records["publisher_id"] = (
        dtype.itemsize // 4,
        int(dbn.RType.OHLCV_1M),
        1,
    )
    first = dt.datetime.fromtimestamp(int(times[0]) // 10**9, tz=dt.UTC).date()
    last = dt.datetime.fromtimestamp(int(times[-1]) // 10**9, tz=dt.UTC).date()
    mappings = [
        SymbolMapping(f"SYM{k}", [MappingInterval(first, last + dt.timedelta(days=1), str(100 + k))])
        for k in range(n_instruments)
    ]
    metadata = dbn.Metadata(
        dataset="GLBX.MDP3",
        start=int(times[0]),
        end=int(times[-1]) + MINUTE_NS,
        stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.OHLCV_1M,
        symbols=[m.raw_symbol for m in mappings],
        mappings=mappings,
    )
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(bytes(metadata) + records.tobytes()))
    return path.stat().st_size


def naive_session_bars(src: Path) -> Any:
    """What a user would write to get bars with a CME trading day: ``to_df()``, then pandas ``tz_convert`` to
    Chicago time, the 16:00-17:00 halt and weekend days dropped, holiday sessions rolled to the next business day
    (the same holiday list as the stage's calendar). Returns the pandas frame, sorted by (instrument, time)."""
    import databento
    import pandas as pd

    from marketrl.calendars.holidays import holiday_dates, next_business_day

    df = databento.DBNStore.from_file(src).to_df().reset_index()
    local = df["ts_event"].dt.tz_convert("America/Chicago")
    minutes = local.dt.hour * 60 + local.dt.minute
    halted = (minutes >= 16 * 60) & (minutes < 17 * 60)
    # The session opening at 17:00 CT is named after the next day.
    day = (local.dt.tz_localize(None) + pd.Timedelta(hours=7)).dt.normalize()
    years = range(int(day.dt.year.min()) - 1, int(day.dt.year.max()) + 2)
    holidays = holiday_dates("us", years.start, years.stop)
    roll = {pd.Timestamp(h): pd.Timestamp(next_business_day(h, holidays)) for h in holidays}
    day = day.map(lambda d: roll.get(d, d)) if day.isin(list(roll)).any() else day
    weekend = day.dt.day_of_week >= 5
    df["trading_day"] = day.dt.date
    df = df[~halted & ~weekend]
    return df.sort_values(["instrument_id", "ts_event"], kind="stable").reset_index(drop=True)


def naive_pandas_features(src: Path, dst: Path) -> int:
    """What a user would write: ``naive_session_bars``, then pandas rolling per instrument for the same 51
    features, and ``to_parquet``; returns the rows written."""
    table = naive_feature_table(naive_session_bars(src))
    table.to_parquet(dst, compression="zstd")
    return len(table)


def naive_feature_table(df: Any) -> Any:
    """The naive path's feature table (pandas) of ``naive_session_bars``' frame."""
    import pandas as pd

    from marketrl.features import FEATURE_NAMES, MAX_LOOKBACK

    out = []
    for _, g in df.groupby("instrument_id", sort=True):
        g = g.reset_index(drop=True)
        c, o, h, lo, v = g["close"], g["open"], g["high"], g["low"], g["volume"].astype(float)
        r = np.log(c).diff()
        lhl, loc = np.log(h / lo), np.log(c / o)
        lv = np.log1p(v)
        tpv = (h + lo + c) / 3 * v
        prev = c.shift(1)
        f = pd.DataFrame(index=g.index)
        for n in (1, 5, 15, 30, 60):
            f[f"ret_{n}"] = np.log(c / c.shift(n))
        for n in (5, 15, 60):
            f[f"rv_{n}"] = r.rolling(n).std()
        f["parkinson_15"] = np.sqrt((lhl**2).rolling(15).mean() / (4 * np.log(2)))
        f["parkinson_60"] = np.sqrt((lhl**2).rolling(60).mean() / (4 * np.log(2)))
        gk = (0.5 * lhl**2 - (2 * np.log(2) - 1) * loc**2).rolling(15).mean()
        f["garman_klass_15"] = np.sqrt(gk.clip(lower=0))
        rs = np.log(h / c) * np.log(h / o) + np.log(lo / c) * np.log(lo / o)
        f["rogers_satchell_15"] = np.sqrt(rs.rolling(15).mean().clip(lower=0))
        f["rv_ratio_5_60"] = (f["rv_5"] / f["rv_60"]).where(f["rv_60"] > 1e-9, 1.0)
        tr = pd.concat([h, prev], axis=1).max(axis=1) - pd.concat([lo, prev], axis=1).min(axis=1)
        f["atr_14"] = tr.ewm(alpha=1 / 14, adjust=False).mean() / c
        for n in (6, 14):
            gain = r.clip(lower=0).ewm(alpha=1 / n, adjust=False).mean()
            loss = (-r).clip(lower=0).ewm(alpha=1 / n, adjust=False).mean()
            f[f"rsi_{n}"] = (gain / (gain + loss)).fillna(0.5) - 0.5
        macd = (c.ewm(span=12, adjust=False).mean() - c.ewm(span=26, adjust=False).mean()) / c
        f["macd"], f["macd_signal"] = macd, macd.ewm(span=9, adjust=False).mean()
        f["macd_hist"] = f["macd"] - f["macd_signal"]
        sma20, sd20 = c.rolling(20).mean(), c.rolling(20).std()
        f["bb_pctb_20"] = ((c - (sma20 - 2 * sd20)) / (4 * sd20)).where(sd20 > 1e-12, 0.5)
        f["bb_width_20"] = 4 * sd20 / sma20
        ll, hh = lo.rolling(14).min(), h.rolling(14).max()
        f["stoch_k_14"] = ((c - ll) / (hh - ll)).where(hh > ll, 0.5)
        f["stoch_d_3"] = f["stoch_k_14"].rolling(3).mean()
        for n in (5, 15, 60):
            f[f"close_sma_{n}"] = c / c.rolling(n).mean() - 1
        f["dist_high_60"] = c / h.rolling(60).max() - 1
        f["dist_low_60"] = c / lo.rolling(60).min() - 1
        f["up_frac_15"] = (r > 0).astype(float).rolling(15).mean()
        f["ret_autocorr_30"] = r.rolling(30).corr(r.shift(1)).fillna(0.0)
        f["efficiency_15"] = (np.log(c / c.shift(15)).abs() / r.abs().rolling(15).sum()).fillna(0.0)
        f["log_volume"] = lv
        f["volume_z_15"] = ((lv - lv.rolling(15).mean()) / lv.rolling(15).std()).fillna(0.0)
        f["volume_ratio_5_60"] = np.log((v.rolling(5).mean() + 1) / (v.rolling(60).mean() + 1))
        for n in (15, 60):
            f[f"vwap_dev_{n}"] = np.log(c * v.rolling(n).sum() / tpv.rolling(n).sum())
        day = g["trading_day"]
        f["vwap_dev_day"] = np.log(c * v.groupby(day).cumsum() / tpv.groupby(day).cumsum())
        f["signed_volume_15"] = (np.sign(r) * v).rolling(15).sum() / v.rolling(15).sum()
        f["ret_volume_corr_15"] = r.abs().rolling(15).corr(lv).fillna(0.0)
        rng_ = (h - lo).where(h > lo)
        f["bar_body"] = ((c - o) / rng_).fillna(0.0)
        f["bar_upper_wick"] = ((h - np.maximum(o, c)) / rng_).fillna(0.0)
        f["bar_lower_wick"] = ((np.minimum(o, c) - lo) / rng_).fillna(0.0)
        f["bar_close_loc"] = ((c - lo) / rng_).fillna(0.5)
        f["bar_range"], f["gap_open"], f["ret_oc"] = lhl, np.log(o / prev), loc
        ts = g["ts_event"]
        seconds = ts.dt.hour * 3600 + ts.dt.minute * 60 + ts.dt.second
        f["tod_sin"], f["tod_cos"] = np.sin(2 * np.pi * seconds / 86400), np.cos(2 * np.pi * seconds / 86400)
        f["dow_sin"], f["dow_cos"] = (
            np.sin(2 * np.pi * ts.dt.day_of_week / 7),
            np.cos(2 * np.pi * ts.dt.day_of_week / 7),
        )
        f["bars_since_prev"] = np.log(ts.diff().dt.total_seconds() / 60)
        f = f[list(FEATURE_NAMES)].astype("float32")
        base = g[
            ["ts_event", "trading_day", "instrument_id", "symbol", "open", "high", "low", "close", "volume"]
        ]
        out.append(
            pd.concat([base, (c / prev - 1).astype("float32").rename("bar_return"), f], axis=1).iloc[
                MAX_LOOKBACK:
            ]
        )
    return pd.concat(out, ignore_index=True)


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def run_phase(phase: str, src: Path, dst: Path) -> dict[str, Any]:
    """Run one phase in this process (imports first, then measure)."""
    import databento

    from marketrl.data.reader import read_bars
    from marketrl.features import build_feature_file

    if phase == "naive":
        import pandas  # noqa: F401  (import cost is not part of the phase)
    table = None
    if phase == "write":  # the input of this phase is (a)'s output; reading it is not part of the phase
        import polars as pl

        table = pl.read_parquet(dst.with_name("stage.parquet"))
    bar_file = read_bars(src) if phase == "compute" else None  # this phase's input, read before the clock
    rss_before = _rss_bytes()
    cpu_before = _cpu_seconds()
    start = time.perf_counter()
    extra: dict[str, float] = {}
    if phase == "floor":
        array = databento.DBNStore.from_file(src).to_ndarray()
        extra["array_bytes"] = float(array.nbytes)
        extra["records"] = float(len(array))
    elif phase == "stage":
        extra["rows"] = float(build_feature_file(src, dst)["rows"])
    elif phase == "naive":
        extra["rows"] = float(naive_pandas_features(src, dst))
    elif phase in ("bars", "bars_utc"):
        extra["rows"] = float(
            read_bars(src, session=UTC_SESSION if phase == "bars_utc" else None).bars.height
        )
    elif phase == "compute":
        from marketrl.features import feature_chunks

        assert bar_file is not None
        chunks = feature_chunks(bar_file.bars, bar_file.bar_ns, path=src)
        extra["rows"] = float(sum(chunk.height for chunk in chunks))
    elif phase == "codecs":
        return {"codecs": codec_phase(dst.with_name("stage.parquet"), dst)}
    elif phase == "write":
        from marketrl.features import CHUNK_BARS
        from marketrl.features.build import _write_chunks

        assert table is not None
        extra["rows"] = float(_write_chunks(table.iter_slices(CHUNK_BARS), dst, {}, src))
    else:
        raise ValueError(
            f"phase: expected floor, stage, naive, bars, bars_utc, compute or write, got {phase!r}"
        )
    wall = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu_before
    peak = _peak_rss_bytes()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_delta_bytes": float(max(peak - rss_before, 0)), **extra}


# (label, compression, level, byte_stream_split, rows per row group, drop derivable key columns)
CODEC_SETTINGS: list[tuple[str, str, int | None, bool, int, bool]] = [
    ("zstd -1 + BSS (stage)", "zstd", -1, True, 24_576, False),
    ("zstd 1 + BSS", "zstd", 1, True, 24_576, False),
    ("zstd 3 + BSS", "zstd", 3, True, 24_576, False),
    ("zstd -1, no BSS", "zstd", -1, False, 24_576, False),
    ("lz4 + BSS", "lz4", None, True, 24_576, False),
    ("lz4, no BSS", "lz4", None, False, 24_576, False),
    ("snappy + BSS", "snappy", None, True, 24_576, False),
    ("snappy, no BSS", "snappy", None, False, 24_576, False),
    ("none + BSS", "none", None, True, 24_576, False),
    ("none, no BSS", "none", None, False, 24_576, False),
    ("zstd -1 + BSS, 12,288 rows/group", "zstd", -1, True, 12_288, False),
    ("zstd -1 + BSS, 98,304 rows/group", "zstd", -1, True, 98_304, False),
    ("zstd -1 + BSS, 1 group", "zstd", -1, True, 10**9, False),
    ("zstd -1 + BSS, no trading_day/symbol", "zstd", -1, True, 24_576, True),
]


def codec_phase(table_path: Path, dst: Path, repeats: int = 3) -> list[dict[str, float | str]]:
    """Write the stage's table with every ``CODEC_SETTINGS`` entry; median CPU/wall of ``repeats`` writes."""
    import pyarrow.parquet as pq

    from marketrl.features.build import _PARQUET_KEY_COLUMNS

    table = pq.read_table(table_path)
    table = table.replace_schema_metadata(None)
    floats = [f.name for f in table.schema if str(f.type) in ("float", "double")]
    rows = []
    for label, codec, level, bss, group_rows, drop_keys in CODEC_SETTINGS:
        data = table.drop_columns(["trading_day", "symbol"]) if drop_keys else table
        keys = [c for c in _PARQUET_KEY_COLUMNS if c in data.column_names]
        cpu, wall = [], []
        for _ in range(repeats):
            cpu_before, started = _cpu_seconds(), time.perf_counter()
            with pq.ParquetWriter(
                dst,
                data.schema,
                compression=codec,
                compression_level=level,
                use_dictionary=keys,
                write_statistics=keys,
                use_byte_stream_split=floats if bss else False,
            ) as writer:
                for start in range(0, data.num_rows, group_rows):
                    writer.write_table(data.slice(start, group_rows), row_group_size=group_rows)
            wall.append(time.perf_counter() - started)
            cpu.append(_cpu_seconds() - cpu_before)
        rows.append(
            {
                "setting": label,
                "cpu_s": sorted(cpu)[repeats // 2],
                "wall_s": sorted(wall)[repeats // 2],
                "mib": dst.stat().st_size / 2**20,
            }
        )
    return rows


def _peak_rss_bytes() -> int:
    """This process's peak RSS. Linux: VmHWM of its own address space. ``ru_maxrss`` would not do: it keeps the
    RSS of the parent at fork time, which would floor every phase at the size of the benchmark driver."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux, bytes on macOS


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _subprocess_phase(phase: str, src: Path, dst: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", phase, "--src", str(src), "--dst", str(dst)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


CHECK_BARS = 30_000  # the pre-flight check file: a week of sessions per instrument, a holiday included
FEATURE_TOLERANCE = 1e-3  # non-EMA features: stage (float64 inside, float32 out) vs pandas (float64)


def compare_features(stage_path: Path, naive_path: Path) -> tuple[float, str]:
    """Same rows in both tables (``check_same_rows``), then the largest |stage − naive| over the non-EMA
    features and its column."""
    import polars as pl

    from marketrl.features import FEATURE_NAMES

    a = pl.read_parquet(stage_path).sort("instrument_id", "ts_event")
    b = pl.read_parquet(naive_path).sort("instrument_id", "ts_event")
    check_same_rows(a, b, "feature rows out")
    worst, worst_name = 0.0, ""
    for name in FEATURE_NAMES:
        if name in EMA_FEATURES:
            continue
        diff = float(np.nanmax(np.abs(a[name].to_numpy() - b[name].to_numpy())))
        if diff > worst:
            worst, worst_name = diff, name
    return worst, worst_name


def preflight(src: Path, tmp: Path) -> dict[str, Any]:
    """Both paths on ``src``, untimed: the same bars in (the stage's ``read_bars`` and the naive session bars),
    the same rows out, every non-EMA feature within ``FEATURE_TOLERANCE``; ``UnequalWork`` otherwise."""
    from marketrl.data.reader import read_bars
    from marketrl.features import build_feature_file

    cme, utc = read_bars(src), read_bars(src, session=UTC_SESSION)
    bars_in = check_same_rows(cme.bars, naive_session_bars(src), "bars in (read_bars vs naive session bars)")
    if utc.bars.height != cme.bars.height:
        raise UnequalWork(
            f"read_bars: {cme.bars.height:,} bars with the CME calendar, {utc.bars.height:,} UTC"
        )
    build_feature_file(src, tmp / "check_stage.parquet")
    naive_pandas_features(src, tmp / "check_naive.parquet")
    worst, name = compare_features(tmp / "check_stage.parquet", tmp / "check_naive.parquet")
    if not worst <= FEATURE_TOLERANCE:
        raise UnequalWork(f"feature {name} differs by {worst:.2e} (> {FEATURE_TOLERANCE:g}) on {src.name}")
    holiday_bars = cme.dropped_outside_session  # CME-shaped input: nothing is outside a session
    if holiday_bars:
        raise UnequalWork(f"{src.name}: {holiday_bars} generated bar(s) outside the CME sessions")
    return {"bars_in": bars_in, "max_diff": worst, "max_diff_feature": name}


def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    return {k: statistics.median(run[k] for run in runs) for k in keys} | {"repeats": len(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bars", type=int, default=None, help="bars in the generated file (default 1M)")
    parser.add_argument("--instruments", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="rounds per phase, median (default 3)")
    parser.add_argument("--quick", action="store_true", help="20,000 bars, 1 round: a sanity run")
    parser.add_argument("--skip-naive", action="store_true", help="skip the (slow) pandas path")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--codecs", action="store_true", help="compare Parquet write settings on (a)'s table")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dst", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.src, args.dst)))
        return
    n_bars = args.bars or (20_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 3)

    with tempfile.TemporaryDirectory(prefix="marketrl-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        src = tmp / "bench.ohlcv-1m.dbn.zst"
        size = generate_ohlcv_file(src, n_bars, args.instruments)
        if args.codecs:
            _subprocess_phase("stage", src, tmp / "stage.parquet")
            codecs = _subprocess_phase("codecs", src, tmp / "codecs.parquet")["codecs"]
            print(
                f"Parquet settings on (a)'s table ({n_bars:,} bars), median of 3 writes; cpus={os.cpu_count()}"
            )
            print(f"{'setting':<40}{'cpu s':>8}{'wall s':>8}{'MiB':>8}")
            for row in codecs:
                print(f"{row['setting']:<40}{row['cpu_s']:>8.2f}{row['wall_s']:>8.2f}{row['mib']:>8.0f}")
            return
        check = src
        if n_bars > CHECK_BARS:
            check = tmp / "check.ohlcv-1m.dbn.zst"
            generate_ohlcv_file(check, CHECK_BARS, args.instruments)
        checked = preflight(check, tmp)
        print(
            f"equal work (checked before timing on {CHECK_BARS if check != src else n_bars:,} bars of the same "
            f"shape): {checked['bars_in']:,} bars in on both sides, same rows out, non-EMA features within "
            f"{checked['max_diff']:.1e} ({checked['max_diff_feature']})"
        )
        phases = ["floor", "stage", "bars", "bars_utc", "compute", "write"] + (
            [] if args.skip_naive else ["naive"]
        )
        runs: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
        for _ in range(repeats):  # interleaved, so a load spike hits every phase
            for p in phases:
                runs[p].append(_subprocess_phase(p, src, tmp / f"{p}.parquet"))
        results = {p: _median_runs(r) for p, r in runs.items()}
        if results["bars"]["rows"] != results["bars_utc"]["rows"]:
            raise UnequalWork(
                f"read_bars rows: CME {results['bars']['rows']:,.0f}, UTC {results['bars_utc']['rows']:,.0f}"
            )
        array_bytes = results["floor"]["array_bytes"]
        print(
            f"input: {int(results['floor']['records']):,} ohlcv-1m records (every minute of CME sessions from "
            f"{BENCH_START}), {args.instruments} instruments, {size / 2**20:.1f} MiB .dbn.zst, decoded array "
            f"{array_bytes / 2**20:.1f} MiB; median of {repeats}; cpus={os.cpu_count()}"
        )
        print(f"{'phase':<40}{'wall s':>8}{'cpu s':>8}{'peak RSS Δ MiB':>16}{'× array':>9}{'rows':>11}")
        labels = {
            "stage": "(a) stage: DBN.zst → 51 feats → pq",
            "naive": "(b) naive: to_df + pandas → pq",
            "floor": "(c) floor: to_ndarray only",
            "bars": "    part of (a): read_bars, CME calendar",
            "bars_utc": "    read_bars, UTC calendar",
            "compute": "    part of (a): feature chunks",
            "write": "    part of (a): Parquet write",
        }
        for phase in ("stage", "naive", "floor", "bars", "bars_utc", "compute", "write"):
            if phase in results:
                r = results[phase]
                print(
                    f"{labels[phase]:<40}{r['wall_s']:>8.2f}{r['cpu_s']:>8.2f}"
                    f"{r['peak_rss_delta_bytes'] / 2**20:>16.0f}{r['peak_rss_delta_bytes'] / array_bytes:>9.2f}"
                    f"{r.get('rows', r.get('records', 0)):>11,.0f}"
                )
        stage = results["stage"]
        summary: dict[str, Any] = {
            "bars": n_bars,
            "repeats": repeats,
            "preflight": checked,
            "results": results,
        }
        summary["a_over_c"] = stage["wall_s"] / results["floor"]["wall_s"]
        summary["bars_cme_over_utc_cpu"] = results["bars"]["cpu_s"] / results["bars_utc"]["cpu_s"]
        print(f"(a)/(c) = {summary['a_over_c']:.1f}× the decode floor in wall time (target ≤ 4×)")
        print(
            f"read_bars CME / UTC calendar = {summary['bars_cme_over_utc_cpu']:.2f}× in CPU "
            f"({results['bars']['rows']:,.0f} bars each; target ≤ 1.2×)"
        )
        if "naive" in results:
            if stage["rows"] != results["naive"]["rows"]:
                raise UnequalWork(
                    f"rows out: stage {stage['rows']:,.0f}, naive {results['naive']['rows']:,.0f}"
                )
            worst, name = compare_features(tmp / "stage.parquet", tmp / "naive.parquet")
            summary["b_over_a_cpu"] = results["naive"]["cpu_s"] / stage["cpu_s"]
            summary["b_over_a_wall"] = results["naive"]["wall_s"] / stage["wall_s"]
            print(
                f"(b)/(a) = {summary['b_over_a_cpu']:.1f}× in CPU, {summary['b_over_a_wall']:.1f}× in wall time "
                f"faster than naive on equal rows ({stage['rows']:,.0f} rows out each; target ≥ 5×); "
                f"max |stage − naive| over non-EMA features = {worst:.2e} ({name})"
            )
        rest = stage["cpu_s"] - sum(results[p]["cpu_s"] for p in ("bars", "compute", "write"))
        summary["stage_cpu_split"] = {p: results[p]["cpu_s"] for p in ("bars", "compute", "write")} | {
            "rest": rest
        }
        print(
            f"(a)'s CPU: read_bars {results['bars']['cpu_s']:.2f} s + feature chunks {results['compute']['cpu_s']:.2f}"
            f" s + Parquet write (finite checks, to_arrow, encoding) {results['write']['cpu_s']:.2f} s + the rest "
            f"(context, metadata; < 0 where the parts alone cost more) {rest:+.2f} s = {stage['cpu_s']:.2f} s"
        )
        print(
            f"peak RSS Δ of (a) = {stage['peak_rss_delta_bytes'] / array_bytes:.2f}× the decoded "
            "array (target ≤ 4×)"
        )
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
