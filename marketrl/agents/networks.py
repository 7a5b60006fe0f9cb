"""Network builders shared by training and checkpoint loading.

Widths come from ``hidden_dim_base`` (b) in the hyperparameters, by the agent's `AgentSpec.network_widths`
(docs/AGENTS.md: DQN ``obs → b → b/2 → b/4 → 3``; PPO policy ``obs → b → b/2 → 3`` and value
``obs → 2b → b → b/2 → 1``); each agent's file builds its own modules from them (`AgentSpec.build_networks`).

Hyperparameter files without ``hidden_dim_base`` get ``[128, 64]`` for every network (older files keep working);
``net_arch`` (an explicit list of widths for every network) is used for like-for-like comparisons with
Stable-Baselines3. Everything needed to rebuild a network lives in a plain ``architecture`` dict, which
checkpoints store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from marketrl.agents.spec import AgentSpec, Architecture, ArchitectureError, agent_spec
from marketrl.env import ACTION_POSITIONS, N_ACTIONS
from marketrl.models.base import zero_head

__all__ = [
    "FALLBACK_HIDDEN",
    "ArchitectureError",
    "QNetwork",
    "build_networks",
    "hidden_sizes",
    "make_architecture",
    "minus_cost_of_change",
    "mlp",
    "orthogonal_init",
]

#: Hidden widths for every network when the hyperparameters carry neither hidden_dim_base nor net_arch.
FALLBACK_HIDDEN = (128, 64)
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
# Keys of every architecture dict; the rest are the agent's own options (AgentSpec.architecture_options).
_COMMON_KEYS = ("algo", "obs_dim", "n_actions", "hidden", "activation")


def hidden_sizes(agent: AgentSpec | str, hparams: Mapping[str, Any]) -> dict[str, list[int]]:
    """Hidden widths per network of the agent (``{"q": [...]}`` for DQN, ``{"policy": [...], "value": [...]}``
    for PPO).

    ``net_arch`` wins (same widths for every network), then ``hidden_dim_base``, then the [128, 64] fallback.
    """
    spec = agent_spec(agent)
    net_arch = hparams.get("net_arch")
    base = hparams.get("hidden_dim_base")
    if net_arch is not None and base is not None:
        raise ArchitectureError("hparams: give either hidden_dim_base or net_arch, not both")
    if net_arch is not None:
        widths = list(net_arch)
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
            raise ArchitectureError(
                f"hparams.net_arch: expected a non-empty list of integers >= 1, got {net_arch!r}"
            )
        return {name: list(widths) for name in spec.networks}
    if base is None:
        return {name: list(FALLBACK_HIDDEN) for name in spec.networks}
    if isinstance(base, bool) or not isinstance(base, int) or base < 4:
        raise ArchitectureError(f"hparams.hidden_dim_base: expected an integer >= 4, got {base!r}")
    return spec.network_widths(base)


def make_architecture(agent: AgentSpec | str, obs_dim: int, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The plain-data description `build_networks` rebuilds from (stored in checkpoints)."""
    spec = agent_spec(agent)
    return {
        "algo": spec.name,
        "obs_dim": int(obs_dim),
        "n_actions": N_ACTIONS,
        "hidden": hidden_sizes(spec, hparams),
        "activation": spec.activation,
        **spec.architecture_options(hparams),
    }


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str) -> nn.Sequential:
    """``Linear → act`` for each hidden width, then a final ``Linear`` to ``out_dim``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), _ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    """Q-values for the 3 actions; dueling: ``V(s) + A(s, a) − mean_a A(s, a)`` on a shared body.

    ``cost_prior``: Q(s, a) = f(s, a) − ``trade_cost`` · |position(a) − held|, where ``held`` is the observation's
    last entry (the position held into the bar) and ``trade_cost`` a fixed buffer in Q units (the trainer sets it:
    the training data's typical cost of one contract's position change). The cost of changing position is known
    before the trade, so the network learns only the market's part; its output layer starts at zero (f = 0), so
    at initialization the greedy action keeps the position, and it changes only where the learned part outweighs
    the cost. The TD loss is the usual one on Q, so the values stay exact whatever ``trade_cost`` is: it sets where
    learning starts, not where it ends.
    """

    def __init__(
        self,
        obs_dim: int,
        hidden: list[int],
        n_actions: int,
        activation: str,
        dueling: bool,
        cost_prior: bool = False,
    ) -> None:
        super().__init__()
        self.dueling = dueling
        self.cost_prior = cost_prior
        if cost_prior:
            self.register_buffer("trade_cost", torch.zeros(()))
            self.register_buffer("action_positions", torch.tensor(ACTION_POSITIONS, dtype=torch.float32))
        if not dueling:
            self.net = mlp(obs_dim, hidden, n_actions, activation)
            outputs = [self.net[-1]]
        else:
            body = mlp(obs_dim, hidden[:-1], hidden[-1], activation)
            self.net = nn.Sequential(*body, _ACTIVATIONS[activation]())
            self.value_head = nn.Linear(hidden[-1], 1)
            self.advantage_head = nn.Linear(hidden[-1], n_actions)
            outputs = [self.value_head, self.advantage_head]
        if cost_prior:
            # f = 0 at initialization, so that the prior alone acts first: the default init's output spread
            # (~0.03 and a bias gap up to ~0.4) exceeds a trade's cost in Q units at small reward scales, and an
            # untrained network would churn on it
            for layer in outputs:
                zero_head(layer)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [B, n_actions]."""
        features = self.net(obs)
        if self.dueling:
            advantage = self.advantage_head(features)
            features = self.value_head(features) + advantage - advantage.mean(dim=1, keepdim=True)
        if not self.cost_prior:
            return features
        return minus_cost_of_change(features, obs, self.trade_cost, self.action_positions)


def minus_cost_of_change(
    q: torch.Tensor, obs: torch.Tensor, trade_cost: torch.Tensor, action_positions: torch.Tensor
) -> torch.Tensor:
    """The cost prior: ``q − trade_cost · |position(a) − held|``, ``held`` the obs' last entry ([..., B, obs_dim];
    ``trade_cost`` broadcast against [..., B, n_actions])."""
    return q - trade_cost * (action_positions - obs[..., -1:].float()).abs()


def orthogonal_init(net: nn.Sequential, head_gain: float) -> None:
    """Orthogonal weights (hidden layers gain √2, the last layer ``head_gain``) and zero biases."""
    linears = [layer for layer in net if isinstance(layer, nn.Linear)]
    for index, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, gain=head_gain if index == len(linears) - 1 else math.sqrt(2))
        nn.init.zeros_(layer.bias)


def build_networks(architecture: Mapping[str, Any], spec: AgentSpec | None = None) -> dict[str, nn.Module]:
    """Fresh networks (on the CPU, float32) for an architecture dict: ``{"q"}`` or ``{"policy", "value"}``.

    ``spec``: the agent (default: the registered one its ``algo`` names). Initialization draws from torch's
    global RNG: seed it (or fork it) before calling for reproducible weights.
    """
    try:
        algo = architecture["algo"]
        parsed = Architecture(
            obs_dim=int(architecture["obs_dim"]),
            n_actions=int(architecture["n_actions"]),
            hidden={name: [int(w) for w in widths] for name, widths in architecture["hidden"].items()},
            activation=architecture["activation"],
            options={k: v for k, v in architecture.items() if k not in _COMMON_KEYS},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ArchitectureError(f"architecture: malformed or missing entry ({error})") from None
    if parsed.activation not in _ACTIVATIONS:
        raise ArchitectureError(f"architecture.activation: expected relu or tanh, got {parsed.activation!r}")
    spec = agent_spec(algo if spec is None else spec)
    if spec.name != algo:
        raise ArchitectureError(f"architecture.algo: {algo!r}, expected {spec.name!r}")
    missing = [name for name in spec.networks if name not in parsed.hidden]
    if missing:
        raise ArchitectureError(f"architecture.hidden: no widths for {missing[0]!r} of {spec.name}")
    return spec.build_networks(parsed)
