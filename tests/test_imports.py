"""Module structure: no import cycles among marketrl modules, and the tensor env runs with only torch and numpy."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from marketrl.env import EnvConfig, TradingEnv, evaluate
from tests.conftest import REPO_ROOT
from tests.test_env import market_data, random_frame

PACKAGE = REPO_ROOT / "marketrl"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def marketrl_imports(path: Path, modules: set[str]) -> set[str]:
    """Every marketrl module `path` imports at run time, at any depth (function-level imports included).

    `from a.b import c` counts as importing `a.b.c` where that is a module, else `a.b`; importing a submodule
    is not counted as importing its parent package (Python runs the parent's __init__ first, which is no cycle).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(inner) for node in ast.walk(tree) if _is_type_checking_block(node) for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_among_marketrl_modules() -> None:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: marketrl_imports(path, set(files)) for name, path in files.items()}
    assert "marketrl.zoo" in graph["marketrl.training"]  # the walk does see imports
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"
    assert "marketrl.hyperopt" not in graph["marketrl.training"]


# The GPU machine has torch and numpy only: the blocked packages raise ModuleNotFoundError as if absent.
TORCH_ONLY = textwrap.dedent(
    """
    import json, sys
    BLOCKED = {"polars", "gymnasium", "pyarrow", "pandas", "scipy", "optuna", "yaml", "jsonschema", "databento"}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    for name in ("polars", "gymnasium"):
        try:
            __import__(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"the blocker let {name} through")

    import numpy as np
    import torch
    from marketrl.costs import CostModel
    from marketrl.env.tensor_env import TradingEnv
    from marketrl.env import EnvConfig, MarketData, policy_positions, position_results

    arrays = np.load(sys.argv[1])
    data = MarketData.from_arrays(
        arrays["features"],
        opens=arrays["opens"],
        closes=arrays["closes"],
        instrument_id=arrays["instrument_id"],
        ts_event_ns=arrays["ts_event_ns"],
        cost_model=CostModel(kind="bps", bps=10.0),
    )
    config = EnvConfig(window=2, episode_length=5, n_envs=3)
    env = TradingEnv(data, config, seed=0)
    env.reset(arrays["starts"])
    rewards = [env.step(torch.tensor([2, 0, 1]))[1].tolist() for _ in range(4)]
    positions = policy_positions(lambda obs: (obs[:, 0] > 0).long() * 2, data, config)
    net = position_results(data, positions, config).net_return[data.is_decision]
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    print(json.dumps({"rewards": rewards, "net": net.tolist(), "leaked": leaked}))
    """
)


def test_tensor_env_and_rollout_run_with_only_torch_and_numpy(tmp_path: Path) -> None:
    frame = random_frame(n_instruments=2, days=2, bars_per_day=12)
    data = market_data(frame)
    starts = data.episode_starts(5)[[0, 3, -1]]
    arrays = tmp_path / "arrays.npz"
    np.savez(
        arrays,
        features=data.features.numpy(),
        opens=frame["open"].to_numpy(),
        closes=frame["close"].to_numpy(),
        instrument_id=frame["instrument_id"].to_numpy(),
        ts_event_ns=frame["ts_event"].dt.epoch("ns").to_numpy(),
        starts=starts,
    )
    env_vars = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", TORCH_ONLY, str(arrays)],
        capture_output=True,
        text=True,
        env=env_vars,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["leaked"] == []

    # The same run through the polars path (MarketData.from_frame) gives the same numbers.
    config = EnvConfig(window=2, episode_length=5, n_envs=3)
    env = TradingEnv(data, config, seed=0)
    env.reset(starts)
    expected = [env.step(torch.tensor([2, 0, 1]))[1].tolist() for _ in range(4)]
    np.testing.assert_array_equal(result["rewards"], expected)
    bars = evaluate(lambda obs: (obs[:, 0] > 0).long() * 2, data, config)
    np.testing.assert_allclose(
        result["net"], bars["net_return"].to_numpy(), rtol=1e-6, atol=1e-9
    )  # f32 vs f64 net
    assert (
        np.abs(bars["net_return"].to_numpy()).sum() > 0
    )  # the policy trades: the comparison means something


def test_model_jobs_do_not_load_decoding_or_scipy_stacks() -> None:
    """Training, hyperopt and evaluation jobs (most of the DAG) start without databento, pandas or scipy: each
    costs every job import time (~0.4 s and ~0.6 s here), and only decoding and the report need them."""
    modules = ("marketrl.training", "marketrl.hyperopt", "marketrl.evaluation", "marketrl.zoo")
    probe = (
        f"import sys\nfor name in {modules!r}: __import__(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'databento', 'pandas', 'scipy'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
