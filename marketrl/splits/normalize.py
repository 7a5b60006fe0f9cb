"""Per-feature z-score normalization fitted on training rows only.

Statistics accumulate in float64 and are stored as float32. Missing values (null/NaN) are ignored when fitting and
become 0 (the training mean) when transforming; ±inf is clipped like any other outlier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

DEFAULT_STD_FLOOR = 1e-8
DEFAULT_CLIP = 10.0


class NormalizerError(ValueError):
    """The normalizer was used with data or state it cannot handle."""


class FeatureNormalizer:
    """z = clip((x − mean) / std, ±clip); `std` below `std_floor` (a feature constant in training) becomes 1."""

    def __init__(self, clip: float | None = DEFAULT_CLIP, std_floor: float = DEFAULT_STD_FLOOR) -> None:
        if clip is not None and not clip > 0:
            raise NormalizerError(f"normalizer clip: expected a number > 0 or None, got {clip!r}")
        self.clip = clip
        self.std_floor = std_floor
        self.feature_names: list[str] = []
        self.mean = np.zeros(0, dtype=np.float32)
        self.std = np.ones(0, dtype=np.float32)
        self.n_rows = 0

    @property
    def is_fitted(self) -> bool:
        """True once `fit` (or `from_state_dict`) has set the statistics."""
        return bool(self.feature_names)

    def fit(self, df: pl.DataFrame, feature_names: Sequence[str]) -> FeatureNormalizer:
        """Fit on exactly the rows of `df` (pass the training split only); returns self."""
        names = list(feature_names)
        if not names:
            raise NormalizerError("feature_names: expected at least one feature column")
        _check_columns(df, names)
        if df.height == 0:
            raise NormalizerError("normalizer fit: the training frame has no rows")
        finite = [pl.col(name).cast(pl.Float64).fill_nan(None) for name in names]
        stats = df.select(
            *[expr.mean().alias(f"mean_{i}") for i, expr in enumerate(finite)],
            *[expr.std(ddof=0).alias(f"std_{i}") for i, expr in enumerate(finite)],
        ).row(0)
        count = len(names)
        # A column with no finite training value has no statistics: treat it as centred with unit scale.
        mean = np.array([0.0 if value is None else value for value in stats[:count]], dtype=np.float64)
        std = np.array([0.0 if value is None else value for value in stats[count:]], dtype=np.float64)
        std = np.where(std < self.std_floor, 1.0, std)
        self.feature_names = names
        self.mean = mean.astype(np.float32)
        self.std = std.astype(np.float32)
        self.n_rows = df.height
        return self

    def transform_numpy(self, df: pl.DataFrame) -> np.ndarray:
        """Normalized features as a C-contiguous float32 array [rows, features], columns in `feature_names` order."""
        self._require_fitted()
        _check_columns(df, self.feature_names)
        raw = df.select(pl.col(name).cast(pl.Float32) for name in self.feature_names).to_numpy()
        values = (raw.astype(np.float32, copy=False) - self.mean) / self.std
        values[np.isnan(values)] = 0.0
        if self.clip is not None:
            np.clip(values, -self.clip, self.clip, out=values)
        else:
            # Without a clip, ±inf still cannot enter a network: map it to the float32 range.
            values = np.nan_to_num(values)
        return np.ascontiguousarray(values, dtype=np.float32)

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values, loadable with `torch.load(weights_only=True)` inside a checkpoint."""
        self._require_fitted()
        return {
            "feature_names": list(self.feature_names),
            "mean": [float(v) for v in self.mean],
            "std": [float(v) for v in self.std],
            "clip": self.clip,
            "std_floor": self.std_floor,
            "n_rows": self.n_rows,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FeatureNormalizer:
        """Rebuild a fitted normalizer from `state_dict()` output."""
        missing = [key for key in ("feature_names", "mean", "std", "clip") if key not in state]
        if missing:
            raise NormalizerError(f"normalizer state: missing key {missing[0]!r}")
        names = list(state["feature_names"])
        if not (len(names) == len(state["mean"]) == len(state["std"])) or not names:
            raise NormalizerError(
                "normalizer state: feature_names, mean and std must be non-empty and equally long"
            )
        normalizer = cls(clip=state["clip"], std_floor=state.get("std_floor", DEFAULT_STD_FLOOR))
        normalizer.feature_names = names
        normalizer.mean = np.asarray(state["mean"], dtype=np.float32)
        normalizer.std = np.asarray(state["std"], dtype=np.float32)
        normalizer.n_rows = int(state.get("n_rows", 0))
        return normalizer

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise NormalizerError("normalizer: call fit() on the training rows first")


def _check_columns(df: pl.DataFrame, names: Sequence[str]) -> None:
    missing = [name for name in names if name not in df.columns]
    if missing:
        raise NormalizerError(
            f"feature column {missing[0]!r} is missing from the frame ({len(missing)} missing)"
        )
