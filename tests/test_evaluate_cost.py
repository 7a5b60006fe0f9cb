"""The evaluate job's cheaper paths give the numbers of the paths they replace (docs/PERFORMANCE.md, Evaluation):
reading only the tables that hold a fold's days, the agents' table of greedy actions instead of a forward per
bar, scoring traders in small chunks, forecasting in small chunks. A changed table that is read is still refused."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from torch import nn

from marketrl.env import EnvConfig, MarketData, policies_positions, tabulated_policies_positions
from marketrl.scoring.batched import score_positions
from marketrl.splits.datasets import (
    DatasetError,
    load_features,
    load_features_for_days,
    write_feature_manifest,
)
from marketrl.splits.folds import FoldPlan, select_rows
from tests.support.runs import synthetic_job_inputs
from tests.test_env import market_data, random_frame
from tests.test_evaluation_batched import data as data
from tests.test_evaluation_batched import trader_positions


@pytest.fixture(scope="module")
def per_day_tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FoldPlan]:
    """The synthetic job inputs' feature table cut into one table per trading day, with their manifest."""
    root = tmp_path_factory.mktemp("per_day")
    frame, _, folds, _ = synthetic_job_inputs(root, n_instruments=2)
    tables = []
    for (day,), part in sorted(frame.partition_by("trading_day", as_dict=True).items()):
        tables.append(root / f"features-{day}.parquet")
        part.write_parquet(tables[-1])
    manifest = root / "per_day_manifest.json"
    write_feature_manifest(tables, manifest)
    return manifest, FoldPlan.load(folds)


def test_reading_the_days_tables_gives_the_rows_of_reading_all(per_day_tables: tuple[Path, FoldPlan]) -> None:
    manifest, plan = per_day_tables
    everything = load_features(manifest)
    for fold in plan.folds:
        for split, days in (("test", fold.test_days), ("train", fold.inner_train_days)):
            some = load_features_for_days(manifest, days)
            assert some.height < everything.height  # fewer tables were read
            expected = select_rows(everything, fold, split)
            assert select_rows(some, fold, split).equals(expected), (fold.index, split)
            assert expected.height > 0
    # a training job's read (marketrl.training.train): the window's tables, and of them only the window's rows
    for fold in plan.folds:
        window = load_features_for_days(manifest, fold.train_days, only_days=True)
        assert set(window["trading_day"].unique().to_list()) == set(fold.train_days)
        for split in ("train", "validation", "train_full"):
            assert select_rows(window, fold, split).equals(select_rows(everything, fold, split))


def test_only_days_reads_only_those_rows_of_a_table_holding_more(tmp_path: Path) -> None:
    """One table holding every day: `only_days` still returns the asked days' rows alone (the filter is applied
    while reading), equal to the rows of those days of the whole table."""
    frame, _, folds, _ = synthetic_job_inputs(tmp_path, n_instruments=2)
    table = tmp_path / "all_days.parquet"
    frame.write_parquet(table, row_group_size=500)
    manifest = tmp_path / "one_table_manifest.json"
    write_feature_manifest([table], manifest)
    fold = FoldPlan.load(folds).folds[-1]
    everything = load_features(manifest)
    window = load_features_for_days(manifest, fold.train_days, only_days=True)
    wanted = pl.col("trading_day").is_in(pl.Series(fold.train_days, dtype=pl.Date).implode())
    assert window.equals(everything.filter(wanted))
    assert 0 < window.height < everything.height
    assert load_features_for_days(manifest, fold.train_days).height == everything.height  # the whole table


def test_a_changed_table_is_refused_when_read_and_unread_otherwise(
    per_day_tables: tuple[Path, FoldPlan], tmp_path: Path
) -> None:
    manifest, plan = per_day_tables
    fold = plan.folds[0]
    test_table = next(Path(manifest).parent.glob(f"features-{fold.test_days[0]}.parquet"))
    copy = tmp_path / test_table.name
    copy.write_bytes(test_table.read_bytes())
    try:
        pl.read_parquet(copy).head(3).write_parquet(test_table)  # another table under the manifest's name
        with pytest.raises(DatasetError, match="changed since"):
            load_features_for_days(manifest, fold.test_days)
        # a job that does not read that day's table does not hash it
        other_days = [day for day in fold.inner_train_days if day != fold.test_days[0]]
        assert load_features_for_days(manifest, other_days).height > 0
    finally:
        test_table.write_bytes(copy.read_bytes())
    with pytest.raises(DatasetError, match="no feature table holds a day of 1999-01-04"):
        load_features_for_days(manifest, [date(1999, 1, 4)])


class _Dueling(nn.Module):
    """Not a plain MLP: `GreedyPolicies` runs these one policy after another, not as one stacked forward."""

    def __init__(self, body: nn.Sequential, n_in: int) -> None:
        super().__init__()
        self.body, self.value = body, nn.Linear(n_in, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs) + self.value(obs)


@pytest.mark.parametrize(("window", "dueling"), [(1, False), (3, False), (2, True)])
def test_the_action_table_gives_the_lockstep_positions(window: int, dueling: bool) -> None:
    from gpu_utils import resolve_precision
    from marketrl.agents.common import GreedyPolicies, GreedyPolicy
    from marketrl.agents.networks import mlp
    from marketrl.loop.schedule import seeded

    data = market_data(random_frame(n_instruments=2, days=4, skip_days=(date(2024, 1, 3),)))
    config = EnvConfig(window=window, max_gap=data.max_gap)
    plan = resolve_precision("fp32", "cpu")
    n_in = window * data.n_features + 1
    policies = []
    for seed in range(3):
        with seeded(seed):
            net = mlp(n_in, [8], 3, "tanh")
            net[0].weight.data[:, -1] *= 20.0  # the held position steers the next action: the scan matters
            policies.append(GreedyPolicy(_Dueling(net, n_in) if dueling else net, plan))
    stacked = GreedyPolicies(policies)
    assert (stacked.stack is None) == dueling
    lockstep = policies_positions(stacked, len(policies), data, config)
    for chunk in (7, 4096):  # a partial last chunk, and one chunk for everything
        table = tabulated_policies_positions(stacked, len(policies), data, config, chunk=chunk)
        torch.testing.assert_close(table, lockstep, rtol=0, atol=0)
    assert len({tuple(row.tolist()) for row in lockstep}) == 3  # three different policies
    assert bool((lockstep != 0).any())


def test_scores_do_not_depend_on_the_chunk(data: MarketData) -> None:
    positions = trader_positions(data)
    config = EnvConfig(max_gap=data.max_gap)
    one_at_a_time = score_positions(data, positions, config, chunk=1)
    default = score_positions(data, positions, config)
    all_at_once = score_positions(data, positions, config, chunk=positions.shape[0])
    for scores in (default, all_at_once):
        np.testing.assert_array_equal(scores.daily_net_returns, one_at_a_time.daily_net_returns)
        assert scores.summaries is not None and one_at_a_time.summaries is not None
        for got, want in zip(scores.summaries, one_at_a_time.summaries, strict=True):
            assert got.keys() == want.keys()
            for key, value in want.items():
                assert got[key] == value or (value != value and got[key] != got[key]), key  # NaN == NaN


def test_forecaster_predictions_depend_on_the_chunk_only_by_rounding() -> None:
    from marketrl.models.dlinear import DLinear, DLinearHParams
    from marketrl.models.supervised_data import CPU_EVAL_PREDICT_CHUNK, PREDICT_CHUNK, predict_rows

    data = market_data(random_frame(n_instruments=2, days=6, n_features=4))
    torch.manual_seed(0)
    model = DLinear(DLinearHParams(window=3, kernel_size=3, hidden_dim_base=8), data.n_features).eval()
    torch.nn.init.normal_(model.head.weight)  # a trained head: an untrained one predicts 0 everywhere
    with torch.no_grad():
        full = predict_rows(model, data, 3, chunk=PREDICT_CHUNK)
        # rows per forward change a BLAS kernel's blocking, hence at most the float32 rounding of a prediction
        # (the demo run's predictions of all eleven models were bit-identical at 512 and 8192, docs/PERFORMANCE.md)
        for chunk in (CPU_EVAL_PREDICT_CHUNK, 5):
            torch.testing.assert_close(predict_rows(model, data, 3, chunk=chunk), full, rtol=1e-5, atol=1e-7)
    assert bool((full != 0).any())
