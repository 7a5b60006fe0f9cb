"""DQN / PPO agents: networks from hidden_dim_base, hyperparameter checks, GAE, checkpoints, determinism,
precision paths, host-sync budgets, the NaN guard and the evaluation callback.

Also holds the planted-signal feature-table builder that tests/test_agents_learning.py imports.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from gpu_utils import BudgetError, HardwareBudget, NonFiniteError, PrecisionPlan, SyncCounter
from gpu_utils.advantages import GAE_DEVICE_MIN_COLUMNS, episode_sums, gae_device, gae_host, gae_place
from gpu_utils.streams import SeedStreams
from marketrl.agents import (
    ArchitectureError,
    CheckpointError,
    HParamError,
    build_networks,
    dqn,
    hidden_sizes,
    load_policy,
    ppo,
    save_checkpoint,
)
from marketrl.agents.memory import batch_size_bounds, footprint
from marketrl.agents.networks import make_architecture
from marketrl.agents.results import TrainResult
from marketrl.env import EnvConfig, MarketData
from marketrl.instruments.costs import CostModel
from marketrl.loop.hparams import AgentConfigError
from marketrl.splits.normalize import FeatureNormalizer
from tests.support.one_seed import train_agent

FEATURES = ["f0", "f1"]
COSTS = CostModel(kind="bps", bps=1.0)


# ------------------------------------------------------------------------------------------------------- builders


def planted_frame(n_bars: int, seed: int = 0, *, edge: float = 0.004, noise: float = 0.002) -> pl.DataFrame:
    """One instrument of minute bars whose next return follows sign(f0) 80% of the time (f1 is pure noise).

    r_{t+1} = edge · sign(f0_t) · (+1 w.p. 0.8, −1 w.p. 0.2) + N(0, noise²): f0 is known at the close of bar t
    and predicts bar t+1, so a policy holding sign(f0_t) earns about 0.6 · edge per bar before costs.
    """
    rng = np.random.default_rng(seed)
    f0 = rng.normal(0.0, 1.0, n_bars).astype(np.float32)
    f1 = rng.normal(0.0, 1.0, n_bars).astype(np.float32)
    agree = np.where(rng.random(n_bars) < 0.8, 1.0, -1.0)
    returns = np.zeros(n_bars)
    returns[1:] = edge * np.sign(f0[:-1]) * agree[:-1] + rng.normal(0.0, noise, n_bars - 1)
    close = 100.0 * np.cumprod(1.0 + returns)
    ts = [datetime(2024, 1, 2, tzinfo=UTC) + timedelta(minutes=i) for i in range(n_bars)]
    return pl.DataFrame(
        {
            "ts_event": pl.Series(ts, dtype=pl.Datetime("ns", "UTC")),
            "trading_day": pl.Series([t.date() for t in ts], dtype=pl.Date),
            "instrument_id": pl.Series([1] * n_bars, dtype=pl.UInt32),
            "symbol": ["X"] * n_bars,
            "open": close,
            "high": close,
            "low": close,
            "close": close,
            "volume": np.ones(n_bars),
            "bar_return": pl.Series(returns, dtype=pl.Float32),
            "f0": f0,
            "f1": f1,
        }
    )


def planted_data(
    n_bars: int = 1500, seed: int = 0, normalizer: FeatureNormalizer | None = None
) -> tuple[MarketData, FeatureNormalizer]:
    """MarketData over a planted frame (no gap splitting) and the normalizer (fitted here unless given)."""
    frame = planted_frame(n_bars, seed)
    normalizer = normalizer or FeatureNormalizer().fit(frame, FEATURES)
    return MarketData.from_frame(frame, FEATURES, normalizer, COSTS, max_gap=None), normalizer


def env_config(n_envs: int = 4, episode_length: int = 32) -> EnvConfig:
    return EnvConfig(n_envs=n_envs, episode_length=episode_length, max_gap=None)


DQN_SMALL = {
    "learning_rate": 1e-3,
    "batch_size": 32,
    "learning_starts": 64,
    "target_update": 50,
    "hidden_dim_base": 16,
}
PPO_SMALL = {"learning_rate": 1e-3, "n_steps": 16, "batch_size": 32, "n_epochs": 2, "hidden_dim_base": 16}


@pytest.fixture(scope="module")
def data() -> MarketData:
    return planted_data()[0]


def train_dqn(
    data: MarketData, total_steps: int = 400, seed: int = 0, precision: object = "fp32", **hparams: object
):
    config = dqn.DQNConfig(total_steps=total_steps, env=env_config())
    return train_agent(dqn, data, config, {**DQN_SMALL, **hparams}, precision, "cpu", seed)


def train_ppo(
    data: MarketData, total_steps: int = 256, seed: int = 0, precision: object = "fp32", **hparams: object
):
    config = ppo.PPOConfig(total_steps=total_steps, env=env_config())
    return train_agent(ppo, data, config, {**PPO_SMALL, **hparams}, precision, "cpu", seed)


def weights(result) -> dict[str, torch.Tensor]:
    return {
        f"{net}.{key}": value
        for net, module in result.networks.items()
        for key, value in module.state_dict().items()
    }


# ------------------------------------------------------------------------------------------------------- networks


def linear_shapes(module: torch.nn.Module) -> list[tuple[int, int]]:
    return [
        (layer.in_features, layer.out_features)
        for layer in module.modules()
        if isinstance(layer, torch.nn.Linear)
    ]


def test_hidden_dim_base_shapes_the_networks() -> None:
    assert hidden_sizes("dqn", {"hidden_dim_base": 64}) == {"q": [64, 32, 16]}
    assert hidden_sizes("ppo", {"hidden_dim_base": 64}) == {"policy": [64, 32], "value": [128, 64, 32]}
    dqn_nets = build_networks(make_architecture("dqn", 7, {"hidden_dim_base": 64}))
    assert linear_shapes(dqn_nets["q"]) == [(7, 64), (64, 32), (32, 16), (16, 3)]
    ppo_nets = build_networks(make_architecture("ppo", 7, {"hidden_dim_base": 64}))
    assert linear_shapes(ppo_nets["policy"]) == [(7, 64), (64, 32), (32, 3)]
    assert linear_shapes(ppo_nets["value"]) == [(7, 128), (128, 64), (64, 32), (32, 1)]
    dueling = build_networks(make_architecture("dqn", 7, {"hidden_dim_base": 64, "dueling": True}))["q"]
    assert linear_shapes(dueling) == [(7, 64), (64, 32), (32, 16), (16, 1), (16, 3)]
    assert dueling(torch.zeros(5, 7)).shape == (5, 3)


def test_missing_hidden_dim_base_falls_back_to_128_64() -> None:
    assert hidden_sizes("dqn", {"learning_rate": 1e-3}) == {"q": [128, 64]}
    assert hidden_sizes("ppo", {}) == {"policy": [128, 64], "value": [128, 64]}
    # checkpoints written before the agents registered specs carry "dueling": False for PPO too
    before = {**make_architecture("ppo", 5, {}), "dueling": False}
    assert set(build_networks(before)) == {"policy", "value"}
    assert linear_shapes(build_networks(make_architecture("ppo", 5, {}))["value"]) == [
        (5, 128),
        (128, 64),
        (64, 1),
    ]


def test_net_arch_and_bad_widths() -> None:
    assert hidden_sizes("ppo", {"net_arch": [64, 64]}) == {"policy": [64, 64], "value": [64, 64]}
    with pytest.raises(ArchitectureError, match="either hidden_dim_base or net_arch"):
        hidden_sizes("dqn", {"hidden_dim_base": 64, "net_arch": [8]})
    with pytest.raises(ArchitectureError, match="hidden_dim_base"):
        hidden_sizes("dqn", {"hidden_dim_base": 2})


def test_ppo_init_is_orthogonal_with_small_policy_head() -> None:
    nets = build_networks(make_architecture("ppo", 6, {"hidden_dim_base": 32}))
    first, head = nets["policy"][0], nets["policy"][-1]
    gram = first.weight.T @ first.weight  # [32, 6]: orthonormal columns scaled by sqrt(2)
    torch.testing.assert_close(gram, 2.0 * torch.eye(6), atol=1e-4, rtol=0)
    assert head.weight.detach().abs().max() < 0.02 and torch.all(first.bias == 0)


def test_memory_footprint_by_hand_and_batch_bounds() -> None:
    # obs_dim 10, b 64. DQN Q-net 10->64->32->16->3 = 3,363 parameters, plus a frozen target copy; replay row
    # 2*10 + 5 floats (action, a reward per action, discount); a sample goes through 7 forward passes of
    # 64+32+16+3 outputs (online(s), then online and target for each action's next state).
    assert footprint("dqn", 10, 64, buffer_rows=1000) == {
        "parameter_count": 3363,
        "frozen_parameter_count": 3363,
        "buffer_bytes": 1000 * 25 * 4,
        "bytes_per_sample": 7 * 115 * 4 * 4 + 25 * 4,
    }
    # PPO policy 10->64->32->3 (2,883) + value 10->128->64->32->1 (11,777); rollout row 10 + 7 floats.
    ppo_footprint = footprint("ppo", 10, 64, buffer_rows=2048, precision="bf16")
    assert ppo_footprint == {
        "parameter_count": 14660,
        "frozen_parameter_count": 0,
        "buffer_bytes": 2048 * 17 * 4,
        "bytes_per_sample": 324 * 2 * 4 + 68,
    }
    # The footprint counts the networks that are really built.
    nets = build_networks(make_architecture("ppo", 10, {"hidden_dim_base": 64}))
    assert sum(p.numel() for net in nets.values() for p in net.parameters()) == 14660
    big = HardwareBudget("cuda", "test", total_memory_bytes=2**37, free_memory_bytes=2**37)
    assert batch_size_bounds(big, "dqn", 10, 64) == dqn.SPEC.batch_limits == (32, 8192)
    tiny = HardwareBudget("cuda", "test", total_memory_bytes=2**20, free_memory_bytes=2**20)
    with pytest.raises(BudgetError, match="dqn with obs_dim=10, hidden_dim_base=64, buffer_rows=100000"):
        batch_size_bounds(tiny, "dqn", 10, 64, buffer_rows=100_000)


# ------------------------------------------------------------------------------------------------ hyperparameters


def test_hparams_unknown_key_is_named() -> None:
    with pytest.raises(HParamError, match=r"hparams\.n_step: unknown ppo hyperparameter"):
        train_agent(ppo, None, ppo.PPOConfig(), {"n_step": 64}, "fp32", "cpu", 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("algo", "key", "value", "message"),
    [
        ("dqn", "batch_size", 32.5, "expected int"),
        ("dqn", "batch_size", True, "expected int"),
        ("dqn", "dueling", 1, "expected bool"),
        ("ppo", "clip_range_vf", "0.2", "expected float or null"),
        ("ppo", "gamma", 1.5, r"in \[0, 1\]"),
        ("dqn", "net_arch", [64, "a"], "expected int"),
    ],
)
def test_hparams_wrong_type_or_range(algo: str, key: str, value: object, message: str) -> None:
    module = dqn if algo == "dqn" else ppo
    config = module.DQNConfig() if algo == "dqn" else module.PPOConfig()
    with pytest.raises(HParamError, match=rf"hparams\.{key}: .*{message}"):
        train_agent(module, None, config, {key: value}, "fp32", "cpu", 0)


def test_int_accepted_for_float_and_defaults_recorded(data: MarketData) -> None:
    result = train_ppo(data, learning_rate=1, ent_coef=0)  # ints where floats are expected
    assert result.hparams["learning_rate"] == 1.0 and result.hparams["gae_lambda"] == 0.95
    assert result.log["hparams"]["n_steps"] == 16


def test_run_settings_are_checked() -> None:
    with pytest.raises(AgentConfigError, match=r"training\.total_steps"):
        dqn.DQNConfig(total_steps=0)
    with pytest.raises(AgentConfigError, match=r"training\.check_every"):
        dqn.DQNConfig(check_every=0)


# ------------------------------------------------------------------------------------------------------------ GAE


def reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Textbook per-env, per-step loop."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for env in range(envs):
        following = 0.0
        for t in reversed(range(steps)):
            if terminated[t, env]:
                delta = rewards[t, env] - values[t, env]
                following = delta
            elif truncated[t, env]:
                delta = rewards[t, env] + gamma * next_values[t, env] - values[t, env]
                following = delta
            else:
                delta = rewards[t, env] + gamma * next_values[t, env] - values[t, env]
                following = delta + gamma * lam * following
            advantages[t, env] = following
    return advantages, advantages + values


def _gae_both_places(*arrays: np.ndarray, gamma: float, lam: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """GAE of the same table on the host (numpy) and through the device scan (torch, on the CPU here)."""
    host = gae_host(*arrays, gamma, lam)
    device = gae_device(*(torch.as_tensor(array) for array in arrays), gamma, lam)
    return [host, (device[0].numpy(), device[1].numpy())]


def test_gae_matches_reference_loop_with_episode_ends() -> None:
    rng = np.random.default_rng(3)
    steps, envs = 40, 5
    rewards, values, next_values = (rng.normal(size=(steps, envs)) for _ in range(3))
    terminated = (rng.random((steps, envs)) < 0.08).astype(np.float64)
    truncated = ((rng.random((steps, envs)) < 0.08) & (terminated == 0)).astype(np.float64)
    assert terminated.sum() >= 3 and truncated.sum() >= 3  # episode ends of both kinds inside the rollout
    expected = reference_gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    host, device = _gae_both_places(rewards, values, next_values, terminated, truncated, gamma=0.97, lam=0.9)
    np.testing.assert_allclose(host[0], expected[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(host[1], expected[1], rtol=1e-12, atol=1e-12)
    # the device scan runs the same float64 operations in the same order: the same bits
    np.testing.assert_array_equal(device[0], host[0])
    np.testing.assert_array_equal(device[1], host[1])


def test_gae_truncation_bootstraps_from_final_value() -> None:
    ones = np.ones((1, 1))
    zeros = np.zeros((1, 1))
    for place in (0, 1):
        truncated_adv = _gae_both_places(ones, zeros, 10 * ones, zeros, ones, gamma=0.5, lam=1.0)[place][0]
        terminated_adv = _gae_both_places(ones, zeros, 10 * ones, ones, zeros, gamma=0.5, lam=1.0)[place][0]
        assert truncated_adv[0, 0] == 6.0 and terminated_adv[0, 0] == 1.0


def test_episode_sums_match_a_loop_over_steps() -> None:
    """The device's vectorized episode returns equal the host's step loop, carried-in returns included."""
    rng = np.random.default_rng(5)
    steps, n_seeds, envs = 30, 2, 4
    rewards = rng.normal(size=(steps, n_seeds * envs))
    done = (rng.random((steps, n_seeds * envs)) < 0.15).astype(np.float64)
    done[:, 0] = 0.0  # a column whose episode never ends inside the table
    done[[3, 4], 1] = 1.0  # back-to-back ends: a one-step episode
    carried = rng.normal(size=n_seeds * envs)
    running_host = carried.copy()
    finished = ppo._finished_episode_returns(running_host, rewards, done, n_seeds)
    running, ended_sum, ended_count = episode_sums(
        torch.as_tensor(carried), torch.as_tensor(rewards), torch.as_tensor(done > 0)
    )
    np.testing.assert_allclose(running.numpy(), running_host, rtol=1e-12, atol=1e-12)
    per_seed_sum = ended_sum.view(n_seeds, envs).sum(dim=1).numpy()
    per_seed_count = ended_count.view(n_seeds, envs).sum(dim=1).numpy()
    assert per_seed_count.tolist() == [len(returns) for returns in finished]
    np.testing.assert_allclose(per_seed_sum, [sum(returns) for returns in finished], rtol=1e-12, atol=1e-12)


def test_gae_place_by_size_and_device() -> None:
    assert gae_place(10**6, "cpu") == "host"  # numpy beats torch's CPU kernels at every size
    assert gae_place(GAE_DEVICE_MIN_COLUMNS - 1, "cuda") == "host"
    assert gae_place(GAE_DEVICE_MIN_COLUMNS, "cuda") == "device"
    assert gae_place(10**6, "cuda", "host") == "host"
    with pytest.raises(ValueError, match="gae place"):
        gae_place(10, "cpu", "gpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("side", ["host", "device"])
def test_rollout_statistics_name_the_seed_with_a_non_finite_value(side: str) -> None:
    steps, n_seeds, envs = 4, 3, 2
    tables = [torch.zeros(steps, n_seeds * envs) for _ in range(3)]
    tables[1][2, envs * 1] = float("nan")  # seed 1's value estimate
    tables[2][3, envs * 2 + 1] = float("inf")  # seed 2's next-state value
    ends = torch.zeros(steps, n_seeds * envs, dtype=torch.bool)
    rollout = ppo.GaeInputs(*tables, ends, ends)
    gae = ppo.gae_on_host if side == "host" else ppo.gae_on_device
    _, stats, _ = gae(rollout, np.zeros(n_seeds * envs), ppo.PPOHyperparams(), n_seeds)
    assert [seed.finite for seed in stats] == [True, False, False]


def test_ppo_trains_the_same_with_gae_on_either_side(data: MarketData) -> None:
    """Two updates of a two-seed batch: the same weights and statistics whichever side ran GAE."""
    hparams = {"hidden_dim_base": 16, "n_steps": 16, "batch_size": 64, "n_epochs": 2}
    results = {}
    for place in ("host", "device"):
        config = ppo.PPOConfig(
            total_steps=2 * 16 * 8, env=EnvConfig(n_envs=8, episode_length=12, max_gap=None), gae=place
        )
        results[place] = ppo.train_seeds(data, config, hparams, "fp32", "cpu", [0, 1])
    for host, device in zip(results["host"], results["device"], strict=True):
        for name, weight in host.networks["policy"].state_dict().items():
            torch.testing.assert_close(device.networks["policy"].state_dict()[name], weight, rtol=0, atol=0)
        host_records, device_records = host.log["history"], device.log["history"]
        assert len(host_records) == len(device_records) == 2
        for before, after in zip(host_records, device_records, strict=True):
            assert before["episodes"] == after["episodes"] > 0
            for key in ("value_mean", "value_min", "value_max", "explained_variance", "episode_return_mean"):
                assert after[key] == pytest.approx(before[key], rel=1e-9, abs=1e-12), key


# ---------------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_checkpoint_rebuilds_the_same_network(algo: str, data: MarketData, tmp_path: Path) -> None:
    result = train_dqn(data, dueling=True) if algo == "dqn" else train_ppo(data)
    normalizer = FeatureNormalizer().fit(planted_frame(1500), FEATURES)
    path = tmp_path / "agent.pt"
    save_checkpoint(
        path,
        result,
        algo=algo,
        normalizer_state=normalizer.state_dict(),
        feature_names=FEATURES,
        precision=result.precision,
        hparams=result.hparams,
        extra={"fold": 2, "seed": 0},
    )
    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["architecture"]["hidden"] == result.log["hidden_sizes"]
    assert raw["env"]["n_envs"] == 4 and raw["extra"] == {"fold": 2, "seed": 0}

    policy, meta = load_policy(path, "cpu")
    obs = torch.randn(64, result.architecture["obs_dim"])
    acting = {"dqn": "q", "ppo": "policy"}[algo]
    assert (dqn if algo == "dqn" else ppo).SPEC.acting_network == acting
    with torch.no_grad():
        torch.testing.assert_close(
            meta["networks"][acting](obs), result.networks[acting](obs), rtol=0, atol=0
        )
    assert torch.equal(policy(obs), result.policy(obs))
    assert meta["feature_names"] == FEATURES and meta["normalizer"]["mean"] == normalizer.state_dict()["mean"]
    assert meta["plan"].mode == "fp32" and meta["hparams"] == result.hparams


def test_checkpoint_refuses_non_plain_extra_and_foreign_files(data: MarketData, tmp_path: Path) -> None:
    result = train_ppo(data)
    path = tmp_path / "agent.pt"
    with pytest.raises(CheckpointError, match=r"extra\.when holds a datetime"):
        save_checkpoint(
            path,
            result,
            algo="ppo",
            normalizer_state={},
            feature_names=FEATURES,
            extra={"when": datetime.now(UTC)},
        )
    assert not path.exists()
    with pytest.raises(CheckpointError, match="does not match"):
        save_checkpoint(path, result, algo="dqn", normalizer_state={}, feature_names=FEATURES)
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="not a marketrl agent checkpoint"):
        load_policy(path)
    save_checkpoint(path, result, algo="ppo", normalizer_state={}, feature_names=FEATURES)
    with pytest.raises(CheckpointError, match="a 'ppo' checkpoint, expected 'dqn'"):
        load_policy(path, spec=dqn.SPEC)  # with a spec, only that agent's checkpoints load
    raw = torch.load(path, weights_only=True)
    torch.save({**raw, "algo": "linear"}, path)  # a registered name, but not an agent
    with pytest.raises(CheckpointError, match=r"algo: expected an agent \('dqn', 'ppo'\), got 'linear'"):
        load_policy(path)


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_spec_save_and_load_path_are_the_agent_checkpoint(
    algo: str, data: MarketData, tmp_path: Path
) -> None:
    # the one save/load pair by path of every spec: an agent's writes the same bytes as save_checkpoint and reads
    # back the one result type, a TrainResult whose positions are the trained policy's
    result = train_dqn(data) if algo == "dqn" else train_ppo(data)
    spec = (dqn if algo == "dqn" else ppo).SPEC
    normalizer = FeatureNormalizer().fit(planted_frame(1500), FEATURES).state_dict()
    hparams = {"hidden_dim_base": 64}  # what the run was asked for (recorded as given)
    spec.save(
        tmp_path / "spec.pt",
        result,
        hparams=hparams,
        precision=result.precision,
        normalizer=normalizer,
        feature_names=FEATURES,
        env={"ignored": "an agent records its result's env settings"},
        extra={"fold": 2, "seed": 0},
    )
    save_checkpoint(
        tmp_path / "direct.pt",
        result,
        algo=algo,
        normalizer_state=normalizer,
        feature_names=FEATURES,
        precision=result.precision.to_dict(),
        hparams=hparams,
        extra={"fold": 2, "seed": 0},
    )
    assert (tmp_path / "spec.pt").read_bytes() == (tmp_path / "direct.pt").read_bytes()
    loaded, meta = spec.load_path(tmp_path / "spec.pt", "cpu")
    assert isinstance(loaded, TrainResult) and loaded.hparams == hparams and loaded.steps_run is None
    assert meta["extra"] == {"fold": 2, "seed": 0} and meta["env"] == result.log["env"]
    assert torch.equal(loaded.run_positions(data, env_config()), result.run_positions(data, env_config()))
    with pytest.raises(CheckpointError, match=f"a {algo!r} checkpoint, expected"):
        (ppo if algo == "dqn" else dqn).SPEC.load_path(tmp_path / "spec.pt", "cpu")


# ----------------------------------------------------------------------------------------- determinism, precision


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_same_seed_gives_identical_weights(algo: str, data: MarketData) -> None:
    run = train_dqn if algo == "dqn" else train_ppo
    first, second, other = run(data, seed=5), run(data, seed=5), run(data, seed=6)
    a, b, c = weights(first), weights(second), weights(other)
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not all(torch.equal(a[key], c[key]) for key in a)
    assert first.log["grad_steps"] > 0


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_precision_paths_train_on_cpu(algo: str, mode: str, data: MarketData) -> None:
    run = train_dqn if algo == "dqn" else train_ppo
    initial = weights(
        run(data, total_steps=4, learning_starts=10_000)
        if algo == "dqn"
        else run(data, n_epochs=1, learning_rate=1e-12)
    )
    result = run(data, precision=mode)
    assert result.log["precision"]["mode"] == mode
    trained = weights(result)
    assert all(torch.isfinite(value).all() for value in trained.values())
    assert any(not torch.equal(trained[key], initial[key]) for key in initial if not key.startswith("target"))
    assert result.log["loss" if algo == "dqn" else "policy_loss"] is not None


def cpu_fp16_plan() -> PrecisionPlan:
    """fp16 autocast + GradScaler on the CPU: select_precision never plans this, tests build it by hand."""
    return PrecisionPlan(
        mode="fp16",
        dtype=torch.float16,
        use_grad_scaler=True,
        reason="test: CPU fp16 + GradScaler",
        device_type="cpu",
    )


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_fp16_grad_scaler_path(algo: str, data: MarketData) -> None:
    run = train_dqn if algo == "dqn" else train_ppo
    result = run(data, precision=cpu_fp16_plan())
    assert result.log["precision"]["use_grad_scaler"] is True
    assert all(torch.isfinite(value).all() for value in weights(result).values())


# ------------------------------------------------------------------------------------------------ host-sync budget


def test_dqn_steady_state_reads_once_per_100_gradient_steps(data: MarketData) -> None:
    def count(total_steps: int) -> tuple[int, int]:
        config = dqn.DQNConfig(total_steps=total_steps, env=env_config(n_envs=8), check_every=100)
        hparams = {**DQN_SMALL, "learning_starts": 0, "gradient_steps": 4}
        with SyncCounter(count_cpu=True) as counter:
            result = train_agent(dqn, data, config, hparams, "fp32", "cpu", 0)
        return counter.count, result.log["grad_steps"]

    short_syncs, short_steps = count(8 * 100)  # 100 vector steps -> 400 gradient steps
    long_syncs, long_steps = count(8 * 300)  # 1200 gradient steps
    assert (short_steps, long_steps) == (400, 1200)
    assert (short_syncs, long_syncs) == (4, 12)  # one read per 100 gradient steps, nothing else


def test_ppo_syncs_per_rollout_do_not_depend_on_rollout_size(data: MarketData) -> None:
    def count(n_envs: int, n_steps: int, updates: int) -> int:
        config = ppo.PPOConfig(total_steps=updates * n_envs * n_steps, env=env_config(n_envs=n_envs))
        hparams = {**PPO_SMALL, "n_steps": n_steps}
        with SyncCounter(count_cpu=True) as counter:
            result = train_agent(ppo, data, config, hparams, "fp32", "cpu", 0)
        assert result.log["updates"] == updates
        return counter.count

    small, large = count(4, 8, 3), count(16, 24, 3)
    assert small == large
    # Per rollout: the rollout's one copy (.cpu(); its .numpy() view is counted too on a CPU-only run, where
    # count_cpu=True) and one read of the loss statistics.
    assert small == 3 * 3
    assert count(4, 8, 5) == 3 * 5


# ---------------------------------------------------------------------------------------- NaN guard, evaluation


def test_dqn_nan_is_reported_within_the_check_window(
    data: MarketData, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_td_loss = dqn.td_loss_all_actions  # the default loss (all_actions)
    calls = []

    def poisoned(*args: object, **kwargs: object):
        loss, q_taken = real_td_loss(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan"), q_taken) if len(calls) == 150 else (loss, q_taken)

    monkeypatch.setattr(dqn, "td_loss_all_actions", poisoned)
    with pytest.raises(NonFiniteError, match=r"non-finite 'loss', 'q_mean' between steps 101 and 200"):
        train_dqn(data, total_steps=4 * 300, learning_starts=0)
    assert len(calls) == 200  # stopped at the read that saw it


def test_ppo_diverging_values_are_reported(data: MarketData) -> None:
    with pytest.raises(NonFiniteError, match="non-finite"):
        train_ppo(data, reward_scale=1e38)  # returns overflow float32: the value loss is inf


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_on_eval_cadence_and_propagation(algo: str, data: MarketData) -> None:
    calls: list[int] = []

    def on_eval(step: int, policy) -> float:
        obs = torch.zeros(3, data.n_features + 1)
        assert policy(obs).dtype == torch.int64
        calls.append(step)
        return float(step)

    if algo == "dqn":
        config = dqn.DQNConfig(total_steps=400, env=env_config(), eval_every=100)
        result = train_agent(dqn, data, config, DQN_SMALL, "fp32", "cpu", 0, on_eval=on_eval)
        assert calls == [100, 200, 300, 400]
    else:
        config = ppo.PPOConfig(total_steps=64 * 5, env=env_config(), eval_every=128)
        result = train_agent(ppo, data, config, PPO_SMALL, "fp32", "cpu", 0, on_eval=on_eval)
        assert calls == [128, 256, 320]
    assert result.log["evals"] == [[step, float(step)] for step in calls]

    class Pruned(Exception):
        pass

    def prune(step: int, policy) -> float:
        raise Pruned

    module = dqn if algo == "dqn" else ppo
    with pytest.raises(Pruned):
        train_agent(
            module, data, config, DQN_SMALL if algo == "dqn" else PPO_SMALL, "fp32", "cpu", 0, on_eval=prune
        )


# ------------------------------------------------------------------------------------------- replay and n-step


def test_replay_add_wraps_around_in_one_write() -> None:
    buffer = dqn.ReplayBuffer(capacity=5, obs_dim=1, device=torch.device("cpu"), n_seeds=2)
    for step in range(3):  # 3 adds of 2 envs per seed: rows 0..5, the 6th overwrites slot 0
        values = torch.tensor([[10.0 * step, 10.0 * step + 1], [-10.0 * step, -10.0 * step - 1]])
        actions = torch.tensor([[0, 2], [1, 1]])
        buffer.add(values[..., None], values[..., None] + 0.5, actions, values, torch.ones(2, 2))
    assert (buffer.size, buffer.cursor) == (5, 1)
    assert buffer.obs[0, :, 0].tolist() == [21.0, 1.0, 10.0, 11.0, 20.0]
    assert buffer.rewards[1].tolist() == [-21.0, -1.0, -10.0, -11.0, -20.0]  # seed 1's own ring
    assert buffer.actions.tolist() == [[2, 2, 0, 2, 0], [1, 1, 1, 1, 1]]
    generators = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    batch = buffer.sample(4, 3, SeedStreams.from_generators(generators, "cpu"))
    assert len(batch) == 3 and batch[0].obs.shape == (2, 4, 1) and batch[0].actions.dtype == torch.int64
    assert batch[0].obs.is_contiguous()
    torch.testing.assert_close(batch[1].next_obs, batch[1].obs + 0.5)
    assert (batch[2].obs[0] >= 0).all() and (batch[2].obs[1] <= 0).all()  # each seed samples its own ring
    # seed 0's indices come from its own generator alone: the same as in a one-seed buffer
    alone = dqn.ReplayBuffer(capacity=5, obs_dim=1, device=torch.device("cpu"))
    alone.load_state_dict(
        {**{k: v[:1] for k, v in buffer.state_dict().items() if torch.is_tensor(v)}, "size": 5, "cursor": 1}
    )
    assert torch.equal(
        alone.sample(4, 3, SeedStreams.from_generators([torch.Generator().manual_seed(0)], "cpu"))[2].obs[0],
        batch[2].obs[0],
    )


def test_n_step_window_stops_at_episode_ends() -> None:
    gamma = 0.5
    window = dqn.NStepWindow(3, gamma, "cpu")
    obs = [torch.full((2, 1), float(t)) for t in range(4)]
    rewards = [torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0]), torch.tensor([4.0, 4.0])]
    # env 0: no episode end; env 1: truncated after step 1 (bootstrap from its final obs 99)
    truncated = [torch.tensor([False, False]), torch.tensor([False, True]), torch.tensor([False, False])]
    final_obs = [obs[1], torch.tensor([[2.0], [99.0]]), obs[3]]
    out = None
    for t in range(3):
        out = window.push(
            obs[t],
            torch.tensor([t, t]),
            rewards[t],
            final_obs[t],
            torch.zeros(2, dtype=torch.bool),
            truncated[t],
        )
        assert (out is None) == (t < 2)
    first_obs, actions, bootstrap_obs, returns, discounts = out
    assert first_obs[:, 0].tolist() == [0.0, 0.0] and actions.tolist() == [0, 0]
    assert returns.tolist() == [1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2]
    assert bootstrap_obs[:, 0].tolist() == [3.0, 99.0]
    assert discounts.tolist() == [gamma**3, gamma**2]


def test_n_step_dqn_and_polyak_train(data: MarketData) -> None:
    result = train_dqn(data, n_step_return=3, all_actions=False, tau=0.05, target_update=1, double_q=False)
    assert result.log["hparams"]["n_step_return"] == 3
    online, target = result.networks["q"].state_dict(), result.networks["target"].state_dict()
    assert all(torch.isfinite(value).all() for value in online.values())
    assert not all(torch.equal(online[key], target[key]) for key in online)  # Polyak lags the online net


def test_ppo_target_kl_stops_epochs_and_reads_once_per_epoch(data: MarketData) -> None:
    config = ppo.PPOConfig(total_steps=2 * 64, env=env_config())
    hparams = {**PPO_SMALL, "n_epochs": 4, "learning_rate": 0.05}
    with SyncCounter(count_cpu=True) as counter:
        result = train_agent(ppo, data, config, {**hparams, "target_kl": 1e-9}, "fp32", "cpu", 0)
    assert [record["epochs"] for record in result.log["history"]] == [1, 1]  # stopped after the first epoch
    assert counter.count == 2 * 3  # per update: rollout copy (2 counted calls) + one read for the one epoch
    free = train_agent(ppo, data, config, {**hparams, "target_kl": 10.0}, "fp32", "cpu", 0)
    assert [record["epochs"] for record in free.log["history"]] == [4, 4]


def test_ppo_lr_annealing_and_value_clipping(data: MarketData) -> None:
    result = train_ppo(data, total_steps=4 * 64, anneal_lr=True, clip_range_vf=0.1)
    rates = [record["learning_rate"] for record in result.log["history"]]
    assert rates == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3])
    assert all(np.isfinite(record["value_loss"]) for record in result.log["history"])


def test_episode_returns_are_counted_once_per_finished_episode(data: MarketData) -> None:
    dqn_result = train_dqn(data, total_steps=400)  # 4 envs × 100 steps, episodes of 32 steps: 3 each
    ppo_result = train_ppo(data, total_steps=256)  # 4 envs × 64 steps: 2 each
    assert sum(record["episodes"] for record in dqn_result.log["history"]) == 12
    assert sum(record["episodes"] for record in ppo_result.log["history"]) == 8
    for result in (dqn_result, ppo_result):
        mean = result.log["episode_return_mean"]  # net return of 32 bars, unscaled
        assert mean is not None and np.isfinite(mean) and abs(mean) < 1.0
