"""FeatureNormalizer: training-only statistics, constant features, clipping, missing values, round trips."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
import torch

from marketrl.splits.normalize import FeatureNormalizer, NormalizerError

NAMES = ["a", "b", "const"]


def frame(n: int = 200, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame(
        {
            "a": rng.normal(3.0, 2.0, n).astype(np.float32),
            "b": rng.exponential(5.0, n).astype(np.float32),
            "const": np.full(n, 7.0, dtype=np.float32),
            "other": rng.normal(size=n),
        }
    )


def test_fit_uses_only_the_rows_given() -> None:
    df = frame()
    train = df.head(120)
    normalizer = FeatureNormalizer().fit(train, NAMES)
    raw = train.select(NAMES).to_numpy().astype(np.float64)
    np.testing.assert_allclose(normalizer.mean[:2], raw.mean(axis=0)[:2], rtol=1e-6)
    np.testing.assert_allclose(normalizer.std[:2], raw.std(axis=0)[:2], rtol=1e-6)
    assert normalizer.mean.dtype == np.float32 and normalizer.std.dtype == np.float32
    assert normalizer.n_rows == 120


def test_perturbing_non_training_rows_changes_nothing() -> None:
    df = frame()
    perturbed = pl.concat([df.head(120), df.tail(80).with_columns(pl.col("a") * 1000.0, pl.col("b") - 50.0)])
    original = FeatureNormalizer().fit(df.head(120), NAMES).state_dict()
    again = FeatureNormalizer().fit(perturbed.head(120), NAMES).state_dict()
    assert original == again
    # Sanity: fitting on the perturbed rows would have changed the statistics.
    assert FeatureNormalizer().fit(perturbed, NAMES).state_dict()["mean"] != original["mean"]


def test_constant_feature_gets_unit_std_and_maps_to_zero() -> None:
    df = frame()
    normalizer = FeatureNormalizer().fit(df, NAMES)
    assert normalizer.std[2] == 1.0
    values = normalizer.transform_numpy(df)
    assert np.all(values[:, 2] == 0.0)
    assert abs(values[:, 0].mean()) < 1e-5 and abs(values[:, 0].std() - 1.0) < 1e-4


def test_clip_and_missing_values() -> None:
    train = pl.DataFrame({"x": np.array([-1.0, 1.0] * 50, dtype=np.float32)})  # mean 0, std 1
    normalizer = FeatureNormalizer(clip=3.0).fit(train, ["x"])
    test = pl.DataFrame(
        {"x": pl.Series([0.5, 100.0, -100.0, None, float("nan"), float("inf")], dtype=pl.Float32)}
    )
    np.testing.assert_array_equal(normalizer.transform_numpy(test)[:, 0], [0.5, 3.0, -3.0, 0.0, 0.0, 3.0])
    unclipped = FeatureNormalizer(clip=None).fit(train, ["x"]).transform_numpy(test)[:, 0]
    assert unclipped[1] == 100.0 and np.isfinite(unclipped).all()


def test_nan_in_training_rows_is_ignored() -> None:
    train = pl.DataFrame({"x": pl.Series([1.0, 3.0, float("nan"), None], dtype=pl.Float32)})
    normalizer = FeatureNormalizer().fit(train, ["x"])
    assert normalizer.mean[0] == 2.0 and normalizer.std[0] == 1.0


def test_state_dict_round_trips_through_weights_only_checkpoint() -> None:
    df = frame()
    normalizer = FeatureNormalizer(clip=5.0).fit(df.head(100), NAMES)
    buffer = io.BytesIO()
    torch.save({"normalizer": normalizer.state_dict()}, buffer)
    buffer.seek(0)
    restored = FeatureNormalizer.from_state_dict(torch.load(buffer, weights_only=True)["normalizer"])
    assert restored.feature_names == NAMES and restored.clip == 5.0
    np.testing.assert_array_equal(restored.transform_numpy(df), normalizer.transform_numpy(df))


def test_errors_are_one_line_value_errors() -> None:
    df = frame()
    with pytest.raises(NormalizerError, match="'missing'"):
        FeatureNormalizer().fit(df, ["a", "missing"])
    with pytest.raises(NormalizerError, match="fit"):
        FeatureNormalizer().transform_numpy(df)
    fitted = FeatureNormalizer().fit(df, NAMES)
    with pytest.raises(ValueError, match="'const'"):
        fitted.transform_numpy(df.drop("const"))
    with pytest.raises(NormalizerError, match="no rows"):
        FeatureNormalizer().fit(df.head(0), NAMES)
