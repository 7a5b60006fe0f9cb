"""TradingEnv, GymVectorEnv, PlainGymEnv and the SB3 adapter agree step for step (same actions, same starts)."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from marketrl.env import EnvConfig, TradingEnv
from tests.support.adapters import GymVectorEnv, PlainGymEnv, make_sb3_vec_env
from tests.test_env import market_data, random_frame

N_ENVS = 4
EPISODE = 6


@pytest.fixture(scope="module")
def data():
    return market_data(random_frame(n_instruments=2, days=4))


@pytest.mark.parametrize(("fill", "window", "contracts"), [("close", 1, 1), ("next_open", 3, 2)])
def test_tensor_env_gym_adapter_and_plain_env_agree(data, fill: str, window: int, contracts: int) -> None:
    config = EnvConfig(window=window, episode_length=EPISODE, n_envs=N_ENVS, fill=fill, contracts=contracts)
    tensor_env = TradingEnv(data, config, seed=11)
    vector_env = GymVectorEnv(TradingEnv(data, config, seed=11))
    plain_envs = [PlainGymEnv(data, config) for _ in range(N_ENVS)]

    obs = tensor_env.reset().numpy()
    vector_obs, _ = vector_env.reset()
    np.testing.assert_array_equal(obs, vector_obs)
    for i, plain in enumerate(plain_envs):
        plain_obs, _ = plain.reset(options={"start_row": int(tensor_env.row[i])})
        np.testing.assert_array_equal(plain_obs, obs[i])

    rng = np.random.default_rng(0)
    for step in range(1, 2 * EPISODE + 3):
        actions = rng.integers(0, 3, N_ENVS)
        obs, reward, terminated, truncated = (t.numpy() for t in tensor_env.step(torch.as_tensor(actions)))
        v_obs, v_reward, v_terminated, v_truncated, infos = vector_env.step(actions)
        np.testing.assert_array_equal(v_obs, obs)
        np.testing.assert_array_equal(v_reward, reward)
        np.testing.assert_array_equal(v_truncated, truncated)
        assert v_obs.dtype == np.float32 and v_reward.shape == (N_ENVS,) and not v_terminated.any()
        assert truncated.all() == (step % EPISODE == 0)
        for i, plain in enumerate(plain_envs):
            p_obs, p_reward, p_terminated, p_truncated, _ = plain.step(int(actions[i]))
            assert p_reward == pytest.approx(float(reward[i]), rel=1e-6, abs=1e-9)
            assert (p_terminated, p_truncated) == (bool(terminated[i]), bool(truncated[i]))
            if p_truncated:  # SAME_STEP autoreset: the plain env's last obs is the adapter's final_obs
                assert infos["_final_obs"][i]
                np.testing.assert_allclose(infos["final_obs"][i], p_obs, rtol=0, atol=0)
                np.testing.assert_array_equal(tensor_env.final_obs[i].numpy(), p_obs)
                p_obs, _ = plain.reset(options={"start_row": int(tensor_env.row[i])})
            np.testing.assert_array_equal(p_obs, obs[i])
        if not truncated.any():
            assert "final_obs" not in infos


def test_gym_vector_env_spaces_and_metadata(data) -> None:
    config = EnvConfig(window=2, episode_length=EPISODE, n_envs=N_ENVS)
    vector_env = GymVectorEnv(TradingEnv(data, config, seed=0))
    assert vector_env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
    obs_dim = 2 * data.n_features + 1
    assert vector_env.single_observation_space.shape == (obs_dim,)
    assert vector_env.observation_space.shape == (N_ENVS, obs_dim)
    assert vector_env.single_action_space == gymnasium.spaces.Discrete(3)
    assert vector_env.action_space == gymnasium.spaces.MultiDiscrete([3] * N_ENVS)
    obs, _ = vector_env.reset(seed=5)
    assert vector_env.observation_space.contains(obs)
    again, _ = vector_env.reset(seed=5)
    np.testing.assert_array_equal(obs, again)
    vector_env.step(vector_env.action_space.sample())
    with pytest.raises(ValueError, match="actions"):
        vector_env.step(np.array([0, 1, 3, 0]))


def test_plain_env_passes_gymnasium_checker(data) -> None:
    env = PlainGymEnv(data, EnvConfig(window=2, episode_length=EPISODE), seed=0)
    check_env(env, skip_render_check=True)
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(first, again)


def test_sb3_vec_env_matches_tensor_env(data) -> None:
    pytest.importorskip("stable_baselines3")
    config = EnvConfig(episode_length=EPISODE, n_envs=N_ENVS)
    tensor_env = TradingEnv(data, config, seed=2)
    sb3_env = make_sb3_vec_env(TradingEnv(data, config, seed=2))
    np.testing.assert_array_equal(sb3_env.reset(), tensor_env.reset().numpy())
    rng = np.random.default_rng(1)
    for step in range(1, EPISODE + 2):
        actions = rng.integers(0, 3, N_ENVS)
        obs, reward, _, truncated = tensor_env.step(torch.as_tensor(actions))
        s_obs, s_reward, s_dones, s_infos = sb3_env.step(actions)
        np.testing.assert_array_equal(s_obs, obs.numpy())
        np.testing.assert_array_equal(s_reward, reward.numpy())
        np.testing.assert_array_equal(s_dones, truncated.numpy())
        if step == EPISODE:
            for i in range(N_ENVS):
                assert s_infos[i]["TimeLimit.truncated"] is True
                np.testing.assert_array_equal(
                    s_infos[i]["terminal_observation"], tensor_env.final_obs[i].numpy()
                )
    assert sb3_env.get_attr("obs_dim") == [data.n_features + 1] * N_ENVS


def test_sb3_ppo_learns_a_few_steps_through_the_adapter(data) -> None:
    sb3 = pytest.importorskip("stable_baselines3")
    env = make_sb3_vec_env(TradingEnv(data, EnvConfig(episode_length=EPISODE, n_envs=N_ENVS), seed=0))
    model = sb3.PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=2 * 16 * N_ENVS)
    assert model.num_timesteps == 2 * 16 * N_ENVS
