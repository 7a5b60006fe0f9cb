"""Benchmark (a CPU proxy for GPU kernel launches): torch operations per env step and per update of PPO and DQN.

    .venv/bin/python bench/speed/launches.py            # S in {1, 4}; PPO at 1..8 minibatches an epoch
    .venv/bin/python bench/speed/launches.py --quick    # the smallest cells: a check, seconds

On a GPU every leaf torch operation the Python loop issues is (at least) one kernel launch, and a loop whose
launches grow with the number of minibatches or of seeds is host-bound however large the device (issue 36). This
counts them without a device: the trainers run on the CPU under `torch.profiler`, and the leaf `aten::` operations
(those that call no other `aten::` operation) are counted. Differences isolate each part without touching the
trainers' code:

- DQN per env step: a run that never learns (`learning_starts` past its steps) / its vector steps (acting, the
  env step, the replay insert).
- DQN per gradient step: (a run at `gradient_steps: 2` − the same run at 1) / its learning vector steps.
- PPO per epoch: (`n_epochs: 2` − `n_epochs: 1`) over one rollout; per minibatch: that / minibatches an epoch
  (n_envs x n_steps / batch_size), so a captured update (ops independent of the minibatch count) would show the
  per-epoch count flat while the per-minibatch count falls as 1/minibatches.

Every count is for all S seeds at once (they train as one batched computation): a count that does not grow with S
is what batching seeds buys. Torch at 1 thread; counts, not times, so the machine's load does not matter.

The captured update (issue 36 item 2): a PPO epoch and a DQN gradient step are each one `gpu_utils.CapturedCall`,
which on CUDA is one graph launch. Here (no CUDA: it runs eagerly) each call is marked with
`torch.profiler.record_function`, and the leaf operations are split into those inside the call (what the graph
holds: one launch on CUDA) and those outside it (what the host still issues). "host, captured" = outside + one
launch per call: what the device sees launched per part when the capture is on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from agents import market_data  # bench/speed/agents.py (a sibling: this script runs from bench/speed/)
from torch.profiler import ProfilerActivity, profile, record_function

from gpu_utils import capture
from marketrl.agents import dqn, ppo
from marketrl.env import EnvConfig

N_ENVS = 64
PPO_STEPS = 32  # rollout length per env: one rollout of 64 x 32 = 2,048 env steps a seed
DQN_VECTOR_STEPS = 40
COMMON = {"hidden_dim_base": 64}


CALL_LABEL = "captured_call"


class Counts(dict):
    """Leaf ops of one run: ``all``, ``inside`` the `CapturedCall` calls, the ``calls`` and the dtype ``casts``."""


def leaf_ops(run: Any) -> Counts:
    """Leaf ``aten::`` operations `run()` issues (on the CPU: what a device would launch as kernels), split by
    whether they ran inside a `CapturedCall`."""
    original = capture.CapturedCall.__call__
    calls = 0

    def marked(self: capture.CapturedCall) -> None:
        nonlocal calls
        calls += 1
        with record_function(CALL_LABEL):
            original(self)

    capture.CapturedCall.__call__ = marked  # type: ignore[method-assign]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    finally:
        capture.CapturedCall.__call__ = original  # type: ignore[method-assign]
    total = inside = casts = 0
    for event in prof.events():
        casts += event.name == "aten::_to_copy"  # a dtype cast (autocast's, or the loop's own .float())
        if not event.name.startswith("aten::"):
            continue
        if any(child.name.startswith("aten::") for child in event.cpu_children):
            continue
        total += 1
        parent = event.cpu_parent
        while parent is not None and parent.name != CALL_LABEL:
            parent = parent.cpu_parent
        inside += parent is not None
    return Counts(all=total, inside=inside, calls=calls, casts=casts)


def diff(a: Counts, b: Counts, per: float) -> dict[str, float]:
    """(a − b) / per of every count, and what the host issues when the calls are captured."""
    all_ops, inside, calls, casts = ((a[key] - b[key]) / per for key in ("all", "inside", "calls", "casts"))
    return {"ops": all_ops, "inside": inside, "host_captured": all_ops - inside + calls, "casts": casts}


def env_config() -> EnvConfig:
    return EnvConfig(n_envs=N_ENVS, episode_length=64, max_gap=None)


def ppo_ops(data: Any, seeds: list[int], batch_size: int, n_epochs: int, precision: str = "fp32") -> Counts:
    hparams = {**COMMON, "n_steps": PPO_STEPS, "batch_size": batch_size, "n_epochs": n_epochs}
    config = ppo.PPOConfig(total_steps=PPO_STEPS * N_ENVS, env=env_config())
    return leaf_ops(lambda: ppo.train_seeds(data, config, hparams, precision, "cpu", seeds))


def dqn_ops(
    data: Any, seeds: list[int], learning_starts: int, gradient_steps: int, precision: str = "fp32"
) -> Counts:
    hparams = {
        **COMMON,
        "batch_size": 256,
        "learning_starts": learning_starts,
        "gradient_steps": gradient_steps,
        "target_update": 10_000,  # no target copy inside the counted steps
    }
    config = dqn.DQNConfig(total_steps=DQN_VECTOR_STEPS * N_ENVS, env=env_config(), check_every=10_000)
    return leaf_ops(lambda: dqn.train_seeds(data, config, hparams, precision, "cpu", seeds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4], help="S values (seeds in one batch)")
    parser.add_argument(
        "--minibatches", type=int, nargs="+", default=[1, 2, 4, 8], help="PPO minibatches/epoch"
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "bf16"),
        help="the trainers' precision (bf16: CPU autocast, whose casts a GPU would launch too)",
    )
    parser.add_argument("--json", help="write every count here")
    parser.add_argument("--quick", action="store_true", help="S in {1, 2}, 1 and 2 minibatches: a check")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.minibatches = [1, 2], [1, 2]
    torch.set_num_threads(1)
    data = market_data(4_000, 8)
    rows: list[dict[str, Any]] = []
    print(f"precision {args.precision}")
    print("| agent | S | part | leaf ops | in the captured call | host, captured | dtype casts | per |")
    print("|---|---|---|---|---|---|---|---|")

    def show(agent: str, n_seeds: int, part: str, counts: dict[str, float], per: str) -> None:
        rows.append({"agent": agent, "S": n_seeds, "part": part, "precision": args.precision, **counts})
        print(
            f"| {agent} | {n_seeds} | {part} | {counts['ops']:.1f} | {counts['inside']:.1f} | "
            f"{counts['host_captured']:.1f} | {counts['casts']:.1f} | {per} |",
            flush=True,
        )

    for n_seeds in args.seeds:
        seeds = list(range(n_seeds))
        never = DQN_VECTOR_STEPS * N_ENVS + 1
        nothing = Counts(all=0, inside=0, calls=0, casts=0)
        acting = diff(dqn_ops(data, seeds, never, 1, args.precision), nothing, DQN_VECTOR_STEPS)
        learning_steps = DQN_VECTOR_STEPS - 8  # learning starts after 8 vector steps
        one, two = (dqn_ops(data, seeds, 8 * N_ENVS, g, args.precision) for g in (1, 2))
        show("dqn", n_seeds, "vector step (act, env, replay insert)", acting, "vector step")
        show("dqn", n_seeds, "gradient step", diff(two, one, learning_steps), "gradient step")
        for minibatches in args.minibatches:
            batch_size = PPO_STEPS * N_ENVS // minibatches
            epoch = diff(
                ppo_ops(data, seeds, batch_size, 2, args.precision),
                ppo_ops(data, seeds, batch_size, 1, args.precision),
                1,
            )
            show("ppo", n_seeds, f"epoch of {minibatches} minibatches", epoch, "epoch")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
