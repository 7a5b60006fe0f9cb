"""Both agents learn a planted signal: out of sample, net of costs, where a random policy loses money.

The series' next return follows sign(f0) 80% of the time (edge 0.4% per bar, noise 0.2%, costs 1 bp per side),
so holding sign(f0) earns about +0.24% per bar before costs; f1 is noise. Training and test series are drawn with
different seeds, and the test split is normalized with the training split's statistics.
"""

from __future__ import annotations

import pytest
import torch

from marketrl.agents import dqn, ppo
from marketrl.env import EnvConfig, evaluate, evaluate_positions, rule_positions
from tests.support.one_seed import train_agent
from tests.test_agents import planted_data

ENV = EnvConfig(n_envs=16, episode_length=64, max_gap=None)
SIGNAL_HPARAMS = {
    "dqn": {
        "learning_rate": 1e-3,
        "gamma": 0.5,
        "batch_size": 128,
        "learning_starts": 500,
        "target_update": 100,
        "exploration_fraction": 0.3,
        "reward_scale": 1.0,  # of the normalized rewards (normalize_rewards)
        "hidden_dim_base": 32,
    },
    "ppo": {
        "learning_rate": 3e-3,
        "gamma": 0.5,
        "n_steps": 64,
        "batch_size": 256,
        "reward_scale": 100.0,
        "hidden_dim_base": 32,
    },
}


@pytest.fixture(scope="module")
def splits():
    train, normalizer = planted_data(4000, seed=0)
    test, _ = planted_data(2000, seed=1, normalizer=normalizer)
    return train, test


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_agent_learns_planted_signal_net_of_costs(algo: str, splits) -> None:
    train, test = splits
    module = dqn if algo == "dqn" else ppo
    config = (dqn.DQNConfig if algo == "dqn" else ppo.PPOConfig)(total_steps=16_000, env=ENV)
    result = train_agent(module, train, config, SIGNAL_HPARAMS[algo], "fp32", "cpu", seed=1)

    agent = evaluate(result.policy, test)
    random = evaluate_positions(test, rule_positions(test, "random", seed=3))
    agent_mean, random_mean = agent["net_return"].mean(), random["net_return"].mean()
    assert agent_mean > 0.0015, f"{algo} earned {agent_mean:.5f} per bar"
    assert random_mean < 0.0002, f"random earned {random_mean:.5f} per bar"
    assert agent["cost"].sum() > 0  # it trades (costs are charged), it does not just sit flat

    # The greedy policy follows the planted feature: long when f0 > 0, short when f0 < 0.
    obs = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    assert result.policy(obs).tolist() == [2, 0]
