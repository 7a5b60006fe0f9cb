"""PPO trains S seeds as one batched computation (issue 24): every seed learns, the seed axis does not leak, a
killed batch resumes bit for bit, and the batch makes as many host syncs as one seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_utils import NonFiniteError, SyncCounter
from marketrl.agents import common as agents_common
from marketrl.agents import load_policy, ppo, save_checkpoint
from marketrl.env import EnvConfig, evaluate, evaluate_positions, rule_positions
from marketrl.loop.resume import TrainingCheckpoint
from tests.support.one_seed import train_agent
from tests.test_agents import FEATURES, PPO_SMALL, env_config, planted_data
from tests.test_agents_learning import SIGNAL_HPARAMS

SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def data():
    return planted_data(1200)[0]


def weights(result) -> dict[str, torch.Tensor]:
    return {
        f"{net}.{key}": value
        for net, module in result.networks.items()
        for key, value in module.state_dict().items()
    }


def assert_identical(left, right) -> None:
    """Bit-identical weights, statistics and evaluations of one seed's results."""
    left_weights, right_weights = weights(left), weights(right)
    assert left_weights.keys() == right_weights.keys()
    for key, value in left_weights.items():
        assert torch.equal(value, right_weights[key]), key
    assert left.log["history"] == right.log["history"]
    assert left.log["evals"] == right.log["evals"]


def train_batch(data, seeds, total_steps=4 * 64, on_eval=None, checkpoint=None, **hparams):
    config = ppo.PPOConfig(total_steps=total_steps, env=env_config(), eval_every=64)
    return ppo.train_seeds(
        data, config, {**PPO_SMALL, **hparams}, "fp32", "cpu", seeds, on_eval=on_eval, checkpoint=checkpoint
    )


def scores(env_steps: int, policies) -> list[float]:
    """A score per seed that depends on its policy (so a leak into evaluations would show)."""
    obs = torch.linspace(-2, 2, 15).reshape(5, 3)
    return [float(policy(obs).sum()) + env_steps for policy in policies]


def test_every_seed_learns_the_planted_signal_and_the_seeds_differ() -> None:
    train, normalizer = planted_data(4000, seed=0)
    test, _ = planted_data(2000, seed=1, normalizer=normalizer)
    config = ppo.PPOConfig(total_steps=16_000, env=EnvConfig(n_envs=16, episode_length=64, max_gap=None))
    results = ppo.train_seeds(train, config, SIGNAL_HPARAMS["ppo"], "fp32", "cpu", [1, 2, 3])

    random = evaluate_positions(test, rule_positions(test, "random", seed=3))["net_return"].mean()
    assert random < 0.0002
    obs = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    for seed, result in zip([1, 2, 3], results, strict=True):
        earned = evaluate(result.policy, test)["net_return"].mean()
        assert earned > 0.0015, f"seed {seed} earned {earned:.5f} per bar"
        assert result.policy(obs).tolist() == [2, 0]  # long when f0 > 0, short when f0 < 0
        assert result.log["batch_seeds"] == 3 and result.log["env_steps"] == 16 * 1024  # whole rollouts
    first = weights(results[0])
    for other in results[1:]:
        assert not any(
            torch.equal(value, weights(other)[key]) for key, value in first.items() if "weight" in key
        )


def test_results_are_per_seed_like_single_runs(data, tmp_path: Path) -> None:
    results = train_batch(data, SEEDS, on_eval=scores)
    single = train_agent(
        ppo,
        data,
        ppo.PPOConfig(total_steps=4 * 64, env=env_config(), eval_every=64),
        PPO_SMALL,
        "fp32",
        "cpu",
        0,
        on_eval=lambda step, policy: scores(step, [policy])[0],
    )
    assert single.log.keys() == results[0].log.keys()
    assert single.log["batch_seeds"] == 1
    for seed, result in zip(SEEDS, results, strict=True):
        assert set(result.networks) == {"policy", "value"}
        assert all(isinstance(net, torch.nn.Sequential) for net in result.networks.values())
        assert [len(record) for record in result.log["evals"]] == [2] * 4
        path = tmp_path / f"seed_{seed}.pt"
        save_checkpoint(path, result, algo="ppo", normalizer_state={}, feature_names=FEATURES)
        policy, _ = load_policy(path)
        obs = torch.randn(32, 3, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(policy(obs), result.policy(obs))
    assert len({result.log["history"][-1]["policy_loss"] for result in results}) == 3


@pytest.mark.parametrize(
    ("perturb", "hparams"),
    [
        ("parameters", {}),
        ("seed", {}),
        # per-seed KL stops: seed 1 stopping after other epochs must not move seeds 0 and 2 (Adam step counts)
        ("seed", {"target_kl": 0.001, "learning_rate": 0.01, "n_epochs": 4}),
    ],
)
def test_the_seed_axis_does_not_leak(data, monkeypatch: pytest.MonkeyPatch, perturb: str, hparams) -> None:
    """Changing seed 1 (its initial weights, or its seed value) leaves seeds 0 and 2 bit-identical."""
    reference = train_batch(data, SEEDS, on_eval=scores, **hparams)
    seeds = list(SEEDS)
    if perturb == "parameters":
        real_set_up = agents_common.set_up_seeds

        def perturbed(*args, **kwargs):
            setup = real_set_up(*args, **kwargs)
            with torch.no_grad():
                for net in setup.networks[1].values():
                    for param in net.parameters():
                        param.add_(0.1)
            return setup

        monkeypatch.setattr(ppo, "set_up_seeds", perturbed)
    else:
        seeds[1] = 7
    changed = train_batch(data, seeds, on_eval=scores, **hparams)
    assert not torch.equal(weights(changed[1])["policy.0.weight"], weights(reference[1])["policy.0.weight"])
    assert changed[1].log["history"] != reference[1].log["history"]
    for index in (0, 2):
        assert_identical(changed[index], reference[index])
    if "target_kl" in hparams:  # the stops did differ between the two batches
        epochs = [
            [record["epochs"] for record in result.log["history"]] for result in (reference[1], changed[1])
        ]
        assert epochs[0] != epochs[1]


def test_a_nan_in_one_seed_is_reported_with_its_name_and_does_not_leak(
    data, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_loss = ppo.ppo_loss

    def nan_in_seed_1(*args, **kwargs):
        loss, terms = real_loss(*args, **kwargs)
        return loss * torch.tensor([1.0, float("nan"), 1.0]), terms

    monkeypatch.setattr(ppo, "ppo_loss", nan_in_seed_1)
    with pytest.raises(NonFiniteError) as info:
        train_batch(data, [4, 5, 6])
    message = str(info.value)
    assert "seed_5" in message and "seed_4" not in message and "seed_6" not in message


def test_killed_batch_resumes_bit_for_bit(data, tmp_path: Path) -> None:
    class Killed(Exception):
        pass

    def killing(at: int | None):
        def on_eval(env_steps: int, policies) -> list[float]:
            if at is not None and env_steps >= at:
                raise Killed
            return scores(env_steps, policies)

        return on_eval

    fingerprint = {"run": "seeds", "seeds": SEEDS}
    # per-seed KL stops (seeds stop after different epochs of one update) are part of what must resume exactly
    hparams = {"target_kl": 0.001, "learning_rate": 0.01, "n_epochs": 4}
    reference = train_batch(data, SEEDS, total_steps=10 * 64, on_eval=killing(None), **hparams)
    path = tmp_path / "resume.pt"
    with pytest.raises(Killed):
        train_batch(data, SEEDS, 10 * 64, killing(448), TrainingCheckpoint(path, 192, fingerprint), **hparams)
    assert torch.load(path, weights_only=True)["step"] == 384
    checkpoint = TrainingCheckpoint(path, 192, fingerprint)
    resumed = train_batch(data, SEEDS, 10 * 64, killing(None), checkpoint, **hparams)
    assert checkpoint.resumed_from == 384
    for left, right in zip(resumed, reference, strict=True):
        assert_identical(left, right)
        assert left.log["host_syncs"] == right.log["host_syncs"]
    epochs = [[record["epochs"] for record in result.log["history"]] for result in reference]
    assert any(len(set(per_update)) > 1 for per_update in zip(*epochs, strict=True))


@pytest.mark.parametrize("target_kl", [None, 1e-9])
def test_three_seeds_make_as_many_host_syncs_as_one(data, target_kl: float | None) -> None:
    def count(seeds: list[int]) -> int:
        with SyncCounter(count_cpu=True) as counter:
            results = train_batch(data, seeds, total_steps=3 * 64, target_kl=target_kl)
        assert {result.log["host_syncs"] for result in results} == {results[0].log["host_syncs"]}
        return counter.count

    one, three = count([0]), count(SEEDS)
    assert one == three == 3 * 3  # per update: the rollout copy (2 counted calls) and one statistics read
