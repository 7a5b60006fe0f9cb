"""DQN's cost prior (issue 35): Q(s, a) = f(s, a) − trade_cost · |position(a) − held|, the known cost of changing
position taken out of what the network must learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_utils import resolve_precision
from marketrl.agents import HParamError, build_networks, dqn
from marketrl.agents.common import GreedyPolicies, GreedyPolicy
from marketrl.agents.networks import QNetwork, make_architecture
from marketrl.env import ACTION_POSITIONS, MarketData, TradingEnv
from tests.test_agents import DQN_SMALL, env_config, planted_data, train_dqn

HELD = torch.tensor(ACTION_POSITIONS)


@pytest.fixture(scope="module")
def data() -> MarketData:
    return planted_data()[0]


def observations(n: int, obs_dim: int, seed: int = 0) -> torch.Tensor:
    """Random feature columns; the last column (the position held) cycles through -1, 0, 1."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, obs_dim, generator=generator)
    obs[:, -1] = HELD.repeat(n // 3 + 1)[:n]
    return obs


def prior_net(cost: float, *, dueling: bool = False, seed: int = 0, learned: bool = True) -> QNetwork:
    """A cost-prior network; ``learned``: its output layers drawn at random (it starts at zero), as if trained."""
    torch.manual_seed(seed)
    net = QNetwork(5, [8, 4], 3, "relu", dueling, cost_prior=True)
    net.trade_cost.fill_(cost)
    if learned:
        heads = [net.value_head, net.advantage_head] if dueling else [net.net[-1]]
        with torch.no_grad():
            for head in heads:
                head.weight.normal_(0.0, 0.5)
                head.bias.normal_(0.0, 0.5)
    return net


@pytest.mark.parametrize("dueling", [False, True])
def test_q_is_the_learned_part_minus_the_cost_of_the_change(dueling: bool) -> None:
    net = prior_net(0.5, dueling=dueling)
    obs = observations(30, 5)
    with torch.no_grad():
        learned = net.net(obs)
        if dueling:
            advantage = net.advantage_head(learned)
            learned = net.value_head(learned) + advantage - advantage.mean(dim=1, keepdim=True)
        expected = learned - 0.5 * (HELD[None, :] - obs[:, -1:]).abs()
        torch.testing.assert_close(net(obs), expected, rtol=0, atol=0)
    # a change from short to long costs twice a change to flat; keeping the position costs nothing
    held_short = obs[:, -1] == -1
    with torch.no_grad():
        gap = learned[held_short] - net(obs)[held_short]
    torch.testing.assert_close(gap, torch.tensor([0.0, 0.5, 1.0]).expand_as(gap))


@pytest.mark.parametrize("dueling", [False, True])
def test_untrained_network_keeps_the_position(dueling: bool) -> None:
    """A fresh network's learned part is zero (its output layers start at zero), so even at a tiny trade cost the
    greedy action keeps the position held: a position changes only where the learned market part outweighs the
    cost. (PyTorch's default init gave output gaps between actions of ~0.03-0.4, above a trade's cost in Q units at
    small reward scales: an untrained network churned.)"""
    for seed in range(5):
        net = prior_net(1e-6, dueling=dueling, seed=seed, learned=False)
        obs = observations(60, 5, seed=seed) * 10.0
        obs[:, -1] /= 10.0
        with torch.no_grad():
            assert torch.equal(net(obs) + 1e-6 * (HELD[None, :] - obs[:, -1:]).abs(), torch.zeros(60, 3))
        actions = GreedyPolicy(net, resolve_precision("fp32", "cpu"))(obs)
        assert torch.equal(HELD[actions], obs[:, -1])


def test_stacked_network_matches_each_seed_and_copies_the_cost_back() -> None:
    nets = [prior_net(0.1, seed=0), prior_net(0.3, seed=1)]
    stacked = dqn.StackedQNetwork(nets)
    obs = torch.stack([observations(12, 5, seed=2), observations(12, 5, seed=3)])
    with torch.no_grad():
        together = stacked(obs)
        for index, net in enumerate(nets):
            torch.testing.assert_close(together[index], net(obs[index]), rtol=1e-6, atol=1e-6)
    fresh = QNetwork(5, [8, 4], 3, "relu", False, cost_prior=True)
    stacked.copy_to(1, fresh)
    assert float(fresh.trade_cost) == pytest.approx(0.3)


def test_greedy_policies_act_with_the_prior() -> None:
    """The batched act function must not run the bodies alone (`SeedStack`): the prior acts after them."""
    nets = [prior_net(0.2, seed=0), prior_net(0.4, seed=1)]
    plan = resolve_precision("fp32", "cpu")
    policies = GreedyPolicies([GreedyPolicy(net, plan) for net in nets])
    assert policies.stack is None
    obs = torch.stack([observations(30, 5, seed=4)] * 2)
    together = policies(obs)
    for index, net in enumerate(nets):
        assert torch.equal(together[index], GreedyPolicy(net, plan)(obs[index]))


@pytest.mark.parametrize("reward_scale", [0.3, 1.0])
@pytest.mark.parametrize("normalize", [True, False])
def test_trainer_sets_the_training_data_cost(data: MarketData, reward_scale: float, normalize: bool) -> None:
    """κ = the scale rewards are learnt at (reward_scale, over the per-bar return spread when normalized) x the
    median cost of a one-contract position change."""
    result = train_dqn(data, total_steps=128, reward_scale=reward_scale, normalize_rewards=normalize)
    trade = data.step_parameters("close")[2].numpy()
    holding = data.step_parameters("close")[1].numpy().astype(np.float64)
    scale = reward_scale / (holding.std(ddof=1) * env_config().contracts) if normalize else reward_scale
    expected = scale * env_config().contracts * float(np.median(trade[trade > 0]))
    assert expected > 0
    for name in ("q", "target"):
        assert float(result.networks[name].trade_cost) == pytest.approx(expected, rel=1e-5)
    assert result.architecture["cost_prior"] is True


def test_all_action_rewards_hold_the_env_reward_of_the_taken_action(data: MarketData) -> None:
    """One step's market move prices every target position: the taken action's column is what the env paid."""
    env = TradingEnv(data, env_config(n_envs=16), seed=3)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        held = env.position.clone()
        actions = torch.randint(0, 3, (env.n_envs,), generator=generator)
        _, rewards, _, _ = env.step(actions)
        every = dqn.all_action_rewards(env.last_params, held, HELD)
        torch.testing.assert_close(every.gather(1, actions[:, None]).squeeze(1), rewards, rtol=0, atol=0)
        assert every.shape == (env.n_envs, 3)


@pytest.mark.parametrize("double_q", [True, False])
def test_all_actions_loss_matches_one_target_per_action(double_q: bool) -> None:
    """Each action's target: its own reward plus the discounted value of the next state holding its position."""
    nets = [prior_net(0.1, seed=0), prior_net(0.2, seed=1)]
    online = dqn.StackedQNetwork(nets)
    target_net = dqn.StackedQNetwork([prior_net(0.1, seed=5), prior_net(0.2, seed=6)])
    generator = torch.Generator().manual_seed(1)
    n_seeds, batch_size = 2, 6
    obs = torch.stack([observations(batch_size, 5, seed=s) for s in (7, 8)])
    next_obs = torch.stack([observations(batch_size, 5, seed=s) for s in (9, 10)])
    batch = dqn.Batch(
        obs=obs,
        actions=torch.randint(0, 3, (n_seeds, batch_size), generator=generator),
        rewards=torch.randn(n_seeds, batch_size, 3, generator=generator),
        discounts=torch.rand(n_seeds, batch_size, generator=generator),
        next_obs=next_obs,
    )
    plan = resolve_precision("fp32", "cpu")
    loss, q_taken = dqn.td_loss_all_actions(online, target_net, batch, plan, HELD, double_q=double_q)
    with torch.no_grad():
        q = online(obs)
        targets = torch.empty(n_seeds, batch_size, 3)
        for a in range(3):
            moved = next_obs.clone()
            moved[..., -1] = HELD[a]
            values = target_net(moved)
            pick = online(moved).argmax(dim=2) if double_q else values.argmax(dim=2)
            targets[..., a] = (
                batch.rewards[..., a] + batch.discounts * values.gather(2, pick[..., None])[..., 0]
            )
        expected = torch.nn.functional.smooth_l1_loss(q, targets, reduction="none").mean(dim=(1, 2))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(q_taken, q.gather(2, batch.actions[..., None])[..., 0])


def test_all_actions_needs_one_step_returns() -> None:
    with pytest.raises(HParamError, match="n_step_return"):
        train_dqn(planted_data(200)[0], total_steps=64, n_step_return=3)


def test_prior_off_and_older_architectures_build_plain_networks(data: MarketData) -> None:
    result = train_dqn(data, total_steps=128, cost_prior=False)
    assert result.architecture["cost_prior"] is False
    assert not hasattr(result.networks["q"], "trade_cost")
    older = make_architecture("dqn", data.n_features + 1, DQN_SMALL)
    del older["cost_prior"]  # checkpoints written before the prior existed
    assert build_networks(older)["q"].cost_prior is False
