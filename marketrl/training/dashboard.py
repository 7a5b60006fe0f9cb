"""`make dashboard`: optuna-dashboard on a run's hyperopt study storage, served on loopback until Ctrl-C.

    python -m marketrl.training.dashboard [--model MODEL] [--config config.yaml] [--results results] [--port 8080]

The storage is the one the hyperopt workers use (`marketrl.training.study_storage.open_storage`): with
PostgreSQL ($MARKETRL_OPTUNA_STORAGE or hyperopt.storage) every model's study lives in the one database and the
dashboard lists them all; with journal files each model has its own (results/hyperopt/{model}/journal.log), and
``--model`` picks it: by default the first model of training.models that has a journal, else the first journal
found. optuna-dashboard (the ``[monitor]`` extra) is imported only here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from marketrl.settings.config import ConfigError, load_config
from marketrl.training.study_storage import (
    HyperoptError,
    open_storage,
    storage_label,
    storage_url,
    study_dir,
)

__all__ = ["DashboardError", "main", "pick_model"]

JOURNAL = "journal.log"


class DashboardError(ValueError):
    """No study to show: a missing journal, or an unknown model."""


class _QuietHandler(WSGIRequestHandler):
    """No line per request: the dashboard's page polls the API every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def pick_model(config: Mapping[str, Any], results_dir: str | Path, model: str | None = None) -> str:
    """The model whose journal the dashboard opens: ``model`` if given (its journal must exist), else the first
    model of training.models with a journal, else the first journal under ``results_dir``/hyperopt."""
    if model is not None:
        journal = study_dir(model, results_dir) / JOURNAL
        if not journal.is_file():
            raise DashboardError(
                f"{journal}: no hyperopt study journal for model {model!r} (has hyperopt run?)"
            )
        return model
    found = sorted(path.parent.name for path in study_dir("*", results_dir).parent.glob(f"*/{JOURNAL}"))
    for name in config["training"]["models"]:
        if name in found:
            return name
    if found:
        return found[0]
    pattern = study_dir("*", results_dir) / JOURNAL
    raise DashboardError(
        f"{pattern}: no hyperopt study journal yet; run the pipeline's hyperopt first (make run)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve optuna-dashboard on the study storage until interrupted; one line and status 1 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m marketrl.training.dashboard", description=__doc__)
    parser.add_argument(
        "--model", default=None, help="the model whose journal to open (journal storage only)"
    )
    parser.add_argument("--config", default="config.yaml", help="the run's config (hyperopt.storage)")
    parser.add_argument("--results", default="results", help="the run's results directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        # an RDB holds every model's study; a journal is one model's
        if storage_url(config):
            model = args.model or ""
        else:
            model = pick_model(config, args.results, args.model)
        storage = open_storage(config, model, args.results)
    except (ConfigError, DashboardError, HyperoptError) as exc:
        print(f"marketrl dashboard: {exc}", file=sys.stderr)
        return 1
    import optuna_dashboard  # lazy: the [monitor] extra

    # wsgiref as optuna_dashboard.run_server uses it, but the line below is printed once the port listens (an
    # event a caller can wait for), with the actual port (--port 0 picks a free one)
    server = make_server(args.host, args.port, optuna_dashboard.wsgi(storage), handler_class=_QuietHandler)
    label = storage_label(config, model, args.results)  # without a password
    print(
        f"optuna-dashboard on http://{args.host}:{server.server_port}/ for {label} (Ctrl-C stops it)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
