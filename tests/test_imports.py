"""Module structure the import-linter contracts (pyproject.toml, `make lint`) cannot see: the tensor env runs with
only torch and numpy, and the model jobs start without the decoding and scipy stacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from marketrl.env import EnvConfig, TradingEnv, evaluate
from tests.conftest import REPO_ROOT
from tests.test_env import market_data, random_frame

# The GPU machine has torch and numpy only: the blocked packages raise ModuleNotFoundError as if absent.
TORCH_ONLY = textwrap.dedent(
    """
    import json, sys
    BLOCKED = {"polars", "gymnasium", "pyarrow", "pandas", "scipy", "optuna", "yaml", "jsonschema", "databento"}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    for name in ("polars", "gymnasium"):
        try:
            __import__(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"the blocker let {name} through")

    import numpy as np
    import torch
    from marketrl.instruments.costs import CostModel
    from marketrl.env.tensor_env import TradingEnv
    from marketrl.env import EnvConfig, MarketData, policy_positions, position_results

    arrays = np.load(sys.argv[1])
    data = MarketData.from_arrays(
        arrays["features"],
        opens=arrays["opens"],
        closes=arrays["closes"],
        instrument_id=arrays["instrument_id"],
        ts_event_ns=arrays["ts_event_ns"],
        cost_model=CostModel(kind="bps", bps=10.0),
    )
    config = EnvConfig(window=2, episode_length=5, n_envs=3)
    env = TradingEnv(data, config, seed=0)
    env.reset(arrays["starts"])
    rewards = [env.step(torch.tensor([2, 0, 1]))[1].tolist() for _ in range(4)]
    positions = policy_positions(lambda obs: (obs[:, 0] > 0).long() * 2, data, config)
    net = position_results(data, positions, config).net_return[data.is_decision]
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    print(json.dumps({"rewards": rewards, "net": net.tolist(), "leaked": leaked}))
    """
)


def test_tensor_env_and_rollout_run_with_only_torch_and_numpy(tmp_path: Path) -> None:
    frame = random_frame(n_instruments=2, days=2, bars_per_day=12)
    data = market_data(frame)
    starts = data.episode_starts(5)[[0, 3, -1]]
    arrays = tmp_path / "arrays.npz"
    np.savez(
        arrays,
        features=data.features.numpy(),
        opens=frame["open"].to_numpy(),
        closes=frame["close"].to_numpy(),
        instrument_id=frame["instrument_id"].to_numpy(),
        ts_event_ns=frame["ts_event"].dt.epoch("ns").to_numpy(),
        starts=starts,
    )
    env_vars = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", TORCH_ONLY, str(arrays)],
        capture_output=True,
        text=True,
        env=env_vars,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["leaked"] == []

    # The same run through the polars path (MarketData.from_frame) gives the same numbers.
    config = EnvConfig(window=2, episode_length=5, n_envs=3)
    env = TradingEnv(data, config, seed=0)
    env.reset(starts)
    expected = [env.step(torch.tensor([2, 0, 1]))[1].tolist() for _ in range(4)]
    np.testing.assert_array_equal(result["rewards"], expected)
    bars = evaluate(lambda obs: (obs[:, 0] > 0).long() * 2, data, config)
    np.testing.assert_allclose(
        result["net"], bars["net_return"].to_numpy(), rtol=1e-6, atol=1e-9
    )  # f32 vs f64 net
    assert (
        np.abs(bars["net_return"].to_numpy()).sum() > 0
    )  # the policy trades: the comparison means something


def test_model_jobs_do_not_load_decoding_or_scipy_stacks() -> None:
    """Training, hyperopt and evaluation jobs (most of the DAG) start without databento, pandas or scipy: each
    costs every job import time (~0.4 s and ~0.6 s here), and only decoding and the report need them."""
    modules = (
        "marketrl.training.train",
        "marketrl.training.hyperopt",
        "marketrl.evaluation.evaluate",
        "marketrl.training.zoo",
    )
    probe = (
        f"import sys\nfor name in {modules!r}: __import__(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'databento', 'pandas', 'scipy'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_evaluation_jobs_load_only_what_they_use() -> None:
    """The evaluate and baselines jobs (and the models they load) read feature tables and score positions: they
    start without pyarrow (the feature stage's Parquet writing), jsonschema and yaml (config validation), optuna,
    scipy, matplotlib or the decoding stack."""
    modules = ("marketrl.runtime.jobs", "marketrl.evaluation.evaluate", "marketrl.agents", "marketrl.models")
    unused = {"pyarrow", "jsonschema", "yaml", "optuna", "scipy", "matplotlib", "databento", "pandas"}
    probe = (
        f"import sys\nfor name in {modules!r}: __import__(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(unused)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_features_job_never_imports_torch(tmp_path: Path) -> None:
    """The features jobs (one per batch of input files, features.batch) decode and write Parquet: neither the job
    script's imports nor building a feature table may load torch (~3 CPU-s of import per job; issue 24)."""
    from marketrl.data.dbn_writer import encode_dbn, write_dbn
    from tests.support.job_scripts import script_imports
    from tests.support.synthetic import ohlcv_messages, random_walk_bars

    bars = random_walk_bars(200, {7: 4000.0}, seed=3)
    start, end = int(bars["ts_event"].min()), int(bars["ts_event"].max()) + 1
    src = write_dbn(
        tmp_path / "es.dbn.zst",
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", start_ns=start, end_ns=end, symbols={"ESH4": 7}),
    )
    imports = script_imports("features")  # what bench/speed/job_imports.py times
    assert any("build_feature_batch" in line for line in imports)  # the probe runs what the job imports
    probe = "\n".join(
        [
            "import sys",
            *imports,
            "after_imports = 'torch' in sys.modules",
            f"build_feature_batch([FeatureJob(Path({str(src)!r}), Path({str(tmp_path / 'es.parquet')!r}))])",
            "print(after_imports, 'torch' in sys.modules)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]
    assert (tmp_path / "es.parquet").exists()
