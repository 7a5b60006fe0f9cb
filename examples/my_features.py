"""Example `features.user` file: three signals appended after the catalog's features (docs/FEATURES.md,
"Your own features"). Set `features: {user: examples/my_features.py}` in config.yaml to use it.

Each entry of FEATURES is a polars expression over one instrument's bars in time order: the bar columns (open,
high, low, close, volume, ts_event, trading_day), any catalog feature by name, `session_vwap` (the running VWAP
of the trading day) and, with REFERENCE set, `ref_close` (the reference symbol's latest close at or before the
bar). LOOKBACK declares how many bars before t each one reads (catalog features' own lookbacks included); the
pipeline's audit checks it, and that no expression reads a later bar, before any job uses the file.
"""

import polars as pl

from marketrl.features import LOOKBACKS

REFERENCE = "ES.c.0"  # ref_close follows this symbol (the spread of every other instrument against it)

close = pl.col("close")

# 1. Session-VWAP deviation in ATR units: how far the price has run from the day's volume-weighted mean, scaled
#    by the current bar range (atr_14 is a catalog feature, the 14-bar Wilder ATR over the close).
atr_price = pl.col("atr_14") * close
vwap_dev_atr = pl.when(atr_price > 0).then((close - pl.col("session_vwap")) / atr_price).otherwise(0.0)

# 2. Overnight gap: log(first open of the trading day / last close of the previous one), held for the first
#    60 bars of the session (the opening hour, where it matters), 0 afterwards.
new_session = pl.col("trading_day") != pl.col("trading_day").shift(1)
gap_at_open = pl.when(new_session).then((pl.col("open") / close.shift(1)).log())
overnight_gap = gap_at_open.forward_fill(limit=60).fill_null(0.0)

# 3. Cross-instrument spread z-score: the log spread against the reference over its 60-bar mean, in 60-bar
#    standard deviations (0 for the reference itself, whose spread is always 0).
spread = (close / pl.col("ref_close")).log()
spread_sd = spread.rolling_std(60)
spread_z = pl.when(spread_sd > 1e-9).then((spread - spread.rolling_mean(60)) / spread_sd).otherwise(0.0)

FEATURES = {
    "vwap_dev_session_atr": vwap_dev_atr,
    "overnight_gap": overnight_gap,
    "spread_z_60": spread_z,
}

LOOKBACK = {
    "vwap_dev_session_atr": LOOKBACKS[
        "atr_14"
    ],  # plus the session's bars, which session_vwap may always read
    "overnight_gap": 61,  # 60 bars of forward fill, each reading the bar before it
    "spread_z_60": 59
    + 5,  # a 60-bar window; ref_close may come from a few bars earlier when the reference paused
}
