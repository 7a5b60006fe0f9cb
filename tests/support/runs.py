"""Inputs of a train/evaluate job on synthetic data: a feature table, its manifest, a one-fold plan and the tiny
config priced with the catch-all contract spec (the synthetic symbols have no contract of their own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from marketrl.features import FEATURE_NAMES
from marketrl.settings.config import load_config
from marketrl.splits.datasets import write_feature_manifest
from marketrl.splits.folds import FoldConfig, make_fold_plan
from tests.conftest import REPO_ROOT
from tests.support.costs import CATCH_ALL_SPEC
from tests.test_env import random_frame

TINY_FOLDS = FoldConfig(
    n=1,
    scheme="expanding",
    train_days=5,
    test_days=2,
    validation_days=1,
    embargo_bars=1,
    tuning_days=4,
    tuning_validation_days=1,
)


#: a DQN small enough to train in a fraction of a second on the tiny inputs (it learns after 32 env steps)
TINY_DQN_HPARAMS = {
    "learning_rate": 1e-3,
    "batch_size": 16,
    "learning_starts": 32,
    "target_update": 20,
    "hidden_dim_base": 8,
}

#: two expanding folds over the same 8 days (days 0-3 then 0-5 train, 2 test days each): folds on the batch axis
TWO_FOLDS = FoldConfig(
    n=2,
    scheme="expanding",
    train_days=4,
    test_days=2,
    validation_days=1,
    embargo_bars=1,
    tuning_days=4,
    tuning_validation_days=1,
)


def synthetic_job_inputs(
    root: Path, n_instruments: int, folds_config: FoldConfig = TINY_FOLDS
) -> tuple[pl.DataFrame, Path, Path, dict[str, Any]]:
    """8 days x 24 bars of random features under ``root``: (frame, manifest path, folds path, config)."""
    names = list(FEATURE_NAMES)
    frame = random_frame(
        n_instruments=n_instruments, days=8, bars_per_day=24, n_features=len(names), drop=0.0
    )
    frame = frame.rename({f"f{j}": name for j, name in enumerate(names)}).with_columns(
        pl.col("bar_return").fill_nan(0.0)  # the first bar has no return; feature tables hold no NaN
    )
    table = root / "features.parquet"
    frame.write_parquet(table)
    manifest = root / "manifest.json"
    write_feature_manifest([table], manifest)
    folds = root / "folds.json"
    make_fold_plan(frame["trading_day"].unique().to_list(), folds_config).save(folds)
    config = load_config(REPO_ROOT / "tests" / "configs" / "tiny.yaml")
    config["costs"].update(instruments={}, **CATCH_ALL_SPEC)
    return frame, manifest, folds, config
