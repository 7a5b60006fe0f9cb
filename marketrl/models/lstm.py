"""LSTM over the lookback window (oldest row first); the hidden state after row t feeds a linear head
that starts at zero (`base.zero_head`: the untrained model predicts the mean and trades nothing).

`RecurrentRegressor` takes the recurrent cell kind as an argument, so gru.py reuses it with a GRU, and alstm.py
uses `Recurrent` directly.

`Recurrent` is the LSTM / GRU with a second way to run: the trainer runs S seeds' weights through one `torch.vmap`,
and the fused ``aten::lstm`` / ``aten::gru`` kernels have no vmap batching rule (vmap raises), so under vmap it
runs as a loop over the window's rows whose matmuls batch into one bmm per row for all seeds; outside vmap (one
seed, predictions) it calls the fused kernel (about twice as fast on the CPU). Parameter names, initialization
and equations are those of `nn.LSTM` / `nn.GRU` (same seed, same initial weights), so checkpoints of either
load into the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from marketrl.loop.hparams import check_ranges
from marketrl.loop.profile import ModelProfile
from marketrl.models.base import NeuralHParams, Trial, sequence_space, zero_head
from marketrl.models.supervised_trainer import SMALL_HPARAMS, torch_model_spec, torch_trial_cost

__all__ = ["PROFILE", "SPEC", "Recurrent", "RecurrentHParams", "RecurrentRegressor", "search_space"]


@dataclass(frozen=True)
class RecurrentHParams(NeuralHParams):
    """Shared neural hyperparameters plus the number of stacked layers (hidden size = hidden_dim_base)."""

    window: int = 16
    num_layers: int = 1

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, at_least_one=("num_layers",))


def search_space(trial: Trial) -> dict[str, Any]:
    """`sequence_space` (bounded window and width) plus 1-2 layers."""
    return {**sequence_space(trial), "num_layers": trial.suggest_int("num_layers", 1, 2)}


class Recurrent(nn.Module):
    """A batch-first multi-layer LSTM or GRU over [B, T, input] -> outputs [B, T, hidden] of the last layer.

    The equations of `nn.LSTM` (gates i, f, g, o) and `nn.GRU` (r, z, n, with r applied to the hidden part of n);
    dropout between layers as theirs. The input projection runs for all rows at once; only the hidden-to-hidden
    product loops over the rows.
    """

    #: activations kept for backward per output element under vmap's row loop (projected and hidden gates, their
    #: activations, c, tanh(c), h: about 19 per hidden unit and row); `bytes_per_sample` counts them
    saved_per_output = 20

    def __init__(
        self,
        kind: Literal["lstm", "gru"],
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"kind: expected 'lstm' or 'gru', got {kind!r}")
        self.kind, self.hidden_size, self.num_layers, self.dropout = kind, hidden_size, num_layers, dropout
        gates = (4 if kind == "lstm" else 3) * hidden_size
        for layer in range(
            num_layers
        ):  # nn.LSTM's registration order, so that its init draws the same numbers
            inputs = input_size if layer == 0 else hidden_size
            self.register_parameter(f"weight_ih_l{layer}", nn.Parameter(torch.empty(gates, inputs)))
            self.register_parameter(f"weight_hh_l{layer}", nn.Parameter(torch.empty(gates, hidden_size)))
            self.register_parameter(f"bias_ih_l{layer}", nn.Parameter(torch.empty(gates)))
            self.register_parameter(f"bias_hh_l{layer}", nn.Parameter(torch.empty(gates)))
        bound = 1.0 / math.sqrt(hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, input] -> [B, T, hidden]: torch's fused kernel, or the loop over rows under vmap."""
        if not _vmapped(x):
            flat = [self.weight(k, kind, what) for k in range(self.num_layers) for what, kind in _FLAT_ORDER]
            h0 = x.new_zeros(self.num_layers, x.shape[0], self.hidden_size)
            args = (flat, True, self.num_layers, self.dropout, self.training, False, True)
            if self.kind == "lstm":
                return torch.lstm(x, (h0, h0), *args)[0]
            return torch.gru(x, h0, *args)[0]
        for layer in range(self.num_layers):
            if layer > 0:
                x = nn.functional.dropout(x, self.dropout, self.training)
            projected = nn.functional.linear(x, self.weight(layer, "ih"), self.weight(layer, "ih", "bias"))
            weight_hh, bias_hh = self.weight(layer, "hh"), self.weight(layer, "hh", "bias")
            h = projected.new_zeros(projected.shape[0], self.hidden_size)
            c = h
            outputs = []
            for t in range(projected.shape[1]):
                row, hidden = projected[:, t], nn.functional.linear(h, weight_hh, bias_hh)
                if self.kind == "lstm":
                    i, f, g, o = (row + hidden).chunk(4, dim=1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                else:
                    r_x, z_x, n_x = row.chunk(3, dim=1)
                    r_h, z_h, n_h = hidden.chunk(3, dim=1)
                    r, z = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
                    h = (1 - z) * torch.tanh(n_x + r * n_h) + z * h
                outputs.append(h)
            x = torch.stack(outputs, dim=1)
        return x

    def weight(self, layer: int, kind: str, what: str = "weight") -> torch.Tensor:
        """``{what}_{kind}_l{layer}`` (an attribute lookup: `functional_call` swaps these for stacked tensors)."""
        return getattr(self, f"{what}_{kind}_l{layer}")


#: the order of one layer's tensors in the flat weight list of torch.lstm / torch.gru (nn.LSTM's own)
_FLAT_ORDER = (("weight", "ih"), ("weight", "hh"), ("bias", "ih"), ("bias", "hh"))


def _vmapped(x: torch.Tensor) -> bool:
    """Whether ``x`` is a tensor inside `torch.vmap` (where the fused kernels have no batching rule)."""
    return torch._C._functorch.is_batchedtensor(x)


class RecurrentRegressor(nn.Module):
    """windows [B, window, F] -> predicted forward return [B], with an LSTM or GRU (``kind``)."""

    def __init__(self, hp: RecurrentHParams, n_features: int, kind: Literal["lstm", "gru"] = "lstm") -> None:
        super().__init__()
        width = hp.hidden_dim_base
        between = hp.dropout if hp.num_layers > 1 else 0.0
        self.rnn = Recurrent(kind, n_features, width, hp.num_layers, dropout=between)
        self.head = nn.Sequential(nn.Dropout(hp.dropout), zero_head(nn.Linear(width, 1)))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Predictions [B] from the output after the window's last row (row t)."""
        return self.head(self.rnn(windows)[:, -1]).squeeze(-1)


def build(hp: RecurrentHParams, n_features: int) -> RecurrentRegressor:
    """The LSTM regressor."""
    return RecurrentRegressor(hp, n_features, "lstm")


def multiply_adds(hp: Mapping[str, Any], n_features: int, gates: int = 4) -> int:
    """One sample's forward pass: ``gates`` gates (LSTM 4, GRU 3) of width b over each row of the window, per
    layer."""
    width = hp["hidden_dim_base"]
    return hp["window"] * gates * width * (n_features + width) * hp["num_layers"]


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={"window": (2, 8), "hidden_dim_base": (16, 32), "batch_size": (128, 1024), "num_layers": (1, 2)},
    trial_cost=torch_trial_cost(multiply_adds, sequence=True),
    small=SMALL_HPARAMS,
    summary="LSTM (hidden `b`), output after row t → dropout → linear",
    own_hyperparameters="`num_layers` 1…2; window 2…8, `b` {16, 32}",
)
SPEC = torch_model_spec("lstm", RecurrentHParams, search_space, build, PROFILE)
