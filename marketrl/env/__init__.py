"""The trading environment over one split of a feature table (semantics: docs/ENV.md).

Modules (each importable with only torch and numpy, except `frames`):
  config       EnvConfig (`env.*`), parse_duration / format_duration, the action set, EnvConfigError / EnvDataError
  market_data  MarketData: one split's returns, cost fractions, segments and observation table as device tensors;
               stack_market_data (several splits as one, folds on the batch axis)
  frames       polars: a feature table's columns for MarketData.from_frame, per-bar result frames
  tensor_env   TradingEnv (N envs in one batched tensor step) and step_rewards, the one reward definition
  rollout      deterministic evaluation: policy_positions / position_results / decision_results (tensors,
               [K, T] positions for K traders at once), evaluate / evaluate_positions / results_frame (per-bar
               polars frames), tabulated_policies_positions (stateless policies' positions from a table of
               their actions: evaluation's fast path)
  baselines    rule_positions: buy-and-hold, short, flat, random, momentum; matched_random_positions (a random
               trader at a given rate of position changes) and position_change_rate

Importing this package imports no polars and no gymnasium; `frames` is loaded when a frame is read or written.
The gymnasium / Stable-Baselines3 adapters and the numpy reference env live in tests/support/adapters.py.
"""

from marketrl.env.baselines import matched_random_positions, position_change_rate, rule_positions
from marketrl.env.config import (
    ACTION_POSITIONS,
    DEFAULT_MAX_GAP,
    N_ACTIONS,
    REQUIRED_COLUMNS,
    EnvConfig,
    EnvConfigError,
    EnvDataError,
    FillMode,
    format_duration,
    parse_duration,
)
from marketrl.env.market_data import MarketData, stack_market_data
from marketrl.env.rollout import (
    Policy,
    PositionResults,
    decision_results,
    evaluate,
    evaluate_positions,
    policies_positions,
    policy_positions,
    position_results,
    results_frame,
    tabulated_policies_positions,
)
from marketrl.env.tensor_env import TradingEnv, check_segmentation, step_rewards

__all__ = [
    "ACTION_POSITIONS",
    "DEFAULT_MAX_GAP",
    "N_ACTIONS",
    "REQUIRED_COLUMNS",
    "EnvConfig",
    "EnvConfigError",
    "EnvDataError",
    "FillMode",
    "MarketData",
    "Policy",
    "PositionResults",
    "TradingEnv",
    "check_segmentation",
    "decision_results",
    "evaluate",
    "evaluate_positions",
    "format_duration",
    "matched_random_positions",
    "parse_duration",
    "policies_positions",
    "policy_positions",
    "position_change_rate",
    "position_results",
    "results_frame",
    "rule_positions",
    "stack_market_data",
    "step_rewards",
    "tabulated_policies_positions",
]
