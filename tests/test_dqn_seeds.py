"""DQN trains S seeds as one batch (issue 24): single-seed-shaped results, no leak across the seed axis, resume, syncs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_utils import NonFiniteError, SyncCounter
from marketrl.agents import build_networks, dqn, load_policy, save_checkpoint
from marketrl.agents.memory import footprint
from marketrl.env import EnvConfig, MarketData, TradingEnv, evaluate
from marketrl.loop.resume import TrainingCheckpoint
from tests.support.one_seed import train_agent
from tests.test_agents import DQN_SMALL, FEATURES, env_config, planted_data
from tests.test_agents_learning import SIGNAL_HPARAMS

SEEDS = [3, 11, 5]


@pytest.fixture(scope="module")
def data() -> MarketData:
    return planted_data()[0]


def train_batch(data: MarketData, seeds=SEEDS, total_steps: int = 400, on_eval=None, checkpoint=None, **hp):
    config = dqn.DQNConfig(total_steps=total_steps, env=env_config(), eval_every=100, check_every=20)
    return dqn.train_seeds(
        data, config, {**DQN_SMALL, **hp}, "fp32", "cpu", seeds, on_eval=on_eval, checkpoint=checkpoint
    )


def weights(result) -> dict[str, torch.Tensor]:
    return {
        f"{net}.{k}": v for net, module in result.networks.items() for k, v in module.state_dict().items()
    }


def assert_identical(left, right) -> None:
    a, b = weights(left), weights(right)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert left.log["history"] == right.log["history"]
    assert left.log["evals"] == right.log["evals"]


@pytest.fixture(scope="module")
def reference(data: MarketData):
    return train_batch(data, on_eval=lambda step, policies: [float(step + i) for i in range(len(policies))])


def test_results_are_single_seed_results(reference, data: MarketData, tmp_path: Path) -> None:
    assert len(reference) == 3
    for index, result in enumerate(reference):
        assert set(result.networks) == {"q", "target"}
        plain = build_networks(result.architecture)["q"].state_dict()  # unstacked: shaped as one seed's net
        for name in ("q", "target"):
            state = result.networks[name].state_dict()
            assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in plain.items()}
        assert result.log["batch_seeds"] == 3 and result.log["env_steps"] == 400
        assert result.log["evals"] == [[step, float(step + index)] for step in (100, 200, 300, 400)]
        assert len(result.log["history"]) == result.log["grad_steps"] // 20 + 1
        assert all(set(record) >= {"loss", "q_mean", "episodes"} for record in result.log["history"])
    # the seeds differ: their own init, exploration, sampling and episodes
    assert not torch.equal(reference[0].networks["q"].net[0].weight, reference[1].networks["q"].net[0].weight)
    assert reference[0].log["history"][-1]["loss"] != reference[1].log["history"][-1]["loss"]

    path = tmp_path / "seed_1.pt"  # one seed's checkpoint, as a single-seed run writes it
    result = reference[1]
    save_checkpoint(path, result, algo="dqn", normalizer_state={}, feature_names=FEATURES)
    policy, _ = load_policy(path, "cpu")
    obs = torch.randn(32, data.n_features + 1)
    assert torch.equal(policy(obs), result.policy(obs))


def test_seed_i_trains_as_a_single_seed_run(reference, data: MarketData) -> None:
    """Env block i draws the episode starts of a one-seed env, and seed i of a batch ends with the weights of a
    single-seed run (on the CPU a batched matmul computes each seed's product as its own; window statistics may
    differ in the last bit, as the metrics sum a wider row)."""
    config = EnvConfig(n_envs=4, episode_length=32, max_gap=None)
    batch = TradingEnv(data, config, seed=SEEDS)
    alone = [TradingEnv(data, config, seed=seed) for seed in SEEDS]
    assert batch.n_envs == 12
    for _ in range(3):  # more than one pool of starts
        rows = torch.stack([batch.reset()[:, 0] for _ in range(40)])
        single = torch.cat([torch.stack([env.reset()[:, 0] for _ in range(40)]) for env in alone], dim=1)
        assert torch.equal(rows, single)
    config = dqn.DQNConfig(total_steps=400, env=env_config(), eval_every=100, check_every=20)
    single_run = train_agent(
        dqn, data, config, DQN_SMALL, "fp32", "cpu", SEEDS[1], on_eval=lambda step, policy: 0.0
    )
    for key, value in weights(single_run).items():
        assert torch.equal(value, weights(reference[1])[key]), key
    assert single_run.log["grad_steps"] == reference[1].log["grad_steps"]
    assert single_run.log["batch_seeds"] == 1


def test_seed_axis_cannot_leak(reference, data: MarketData, monkeypatch: pytest.MonkeyPatch) -> None:
    """Perturbing seed 1 (its initial weights, or its seed value) leaves seeds 0 and 2 bit-identical."""
    on_eval = lambda step, policies: [float(step + i) for i in range(len(policies))]  # noqa: E731
    other_seed = train_batch(data, seeds=[SEEDS[0], 99, SEEDS[2]], on_eval=on_eval)

    real_set_up = dqn.set_up_seeds

    def perturbed_set_up(*args, **kwargs):
        setup = real_set_up(*args, **kwargs)
        with torch.no_grad():
            for p in setup.networks[1]["q"].parameters():
                p.mul_(1.5).add_(0.01)
        return setup

    monkeypatch.setattr(dqn, "set_up_seeds", perturbed_set_up)
    other_init = train_batch(data, on_eval=on_eval)
    for changed in (other_seed, other_init):
        assert not torch.equal(
            changed[1].networks["q"].net[0].weight, reference[1].networks["q"].net[0].weight
        )
        assert_identical(changed[0], reference[0])
        assert_identical(changed[2], reference[2])


class Killed(Exception):
    """Stands in for the job dying."""


def test_killed_batch_resumes_bit_for_bit(reference, data: MarketData, tmp_path: Path) -> None:
    path = tmp_path / "resume.pt"

    def dying(step: int, policies) -> list[float]:
        if step >= 300:
            raise Killed(step)
        return [float(step + i) for i in range(len(policies))]

    with pytest.raises(Killed):
        train_batch(data, on_eval=dying, checkpoint=TrainingCheckpoint(path, 160, {"run": "seeds"}))
    assert torch.load(path, weights_only=True)["step"] == 160

    checkpoint = TrainingCheckpoint(path, 160, {"run": "seeds"})
    on_eval = lambda step, policies: [float(step + i) for i in range(len(policies))]  # noqa: E731
    resumed = train_batch(data, on_eval=on_eval, checkpoint=checkpoint)
    assert checkpoint.resumed_from == 160
    for left, right in zip(resumed, reference, strict=True):
        assert_identical(left, right)
        assert left.log["host_syncs"] == right.log["host_syncs"]


def test_host_syncs_per_batch_not_per_seed(data: MarketData) -> None:
    def count(seeds: list[int]) -> tuple[int, int]:
        config = dqn.DQNConfig(total_steps=8 * 100, env=env_config(n_envs=8), check_every=100)
        hparams = {**DQN_SMALL, "learning_starts": 0, "gradient_steps": 4}
        with SyncCounter(count_cpu=True) as counter:
            results = dqn.train_seeds(data, config, hparams, "fp32", "cpu", seeds)
        return counter.count, results[-1].log["grad_steps"]

    assert count([0]) == count([0, 1, 2]) == (4, 400)  # one read per 100 gradient steps, for the whole batch


def test_nan_names_the_seed(data: MarketData, monkeypatch: pytest.MonkeyPatch) -> None:
    real_td_loss = dqn.td_loss_all_actions  # the default loss (all_actions)
    calls = []

    def poisoned(*args, **kwargs):
        loss, q_taken = real_td_loss(*args, **kwargs)
        calls.append(1)
        if len(calls) >= 30:  # seed 11 (batch index 1) only
            loss = loss * torch.tensor([1.0, float("nan"), 1.0])
        return loss, q_taken

    monkeypatch.setattr(dqn, "td_loss_all_actions", poisoned)
    with pytest.raises(
        NonFiniteError,
        match=r"^seed 11 \(batch index 1\): non-finite 'loss', 'q_mean' between steps 21 and 40$",
    ):
        train_batch(data, learning_starts=0)


def test_every_seed_learns_the_planted_signal() -> None:
    train, normalizer = planted_data(4000, seed=0)
    test, _ = planted_data(2000, seed=1, normalizer=normalizer)
    config = dqn.DQNConfig(total_steps=16_000, env=EnvConfig(n_envs=16, episode_length=64, max_gap=None))
    results = dqn.train_seeds(train, config, SIGNAL_HPARAMS["dqn"], "fp32", "cpu", [1, 2, 3])
    obs = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    for result in results:
        earned = evaluate(result.policy, test)["net_return"].mean()
        assert earned > 0.0015, f"seed earned {earned:.5f} per bar"
        assert result.policy(obs).tolist() == [2, 0]  # long when f0 > 0, short when f0 < 0
    first = results[0].networks["q"].net[0].weight
    assert not any(torch.equal(first, other.networks["q"].net[0].weight) for other in results[1:])


def test_footprint_of_a_batch_is_s_times_one_seed() -> None:
    one = footprint("dqn", 10, 64, buffer_rows=1000)
    assert footprint("dqn", 10, 64, buffer_rows=1000, n_seeds=5) == {
        key: 5 * value for key, value in one.items()
    }
