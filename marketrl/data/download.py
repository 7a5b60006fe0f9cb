"""Optional download with databento.Historical: cost estimate first, refusal above the budget, one file per day.

The API key is read from DATABENTO_API_KEY only; it is passed to the client and never logged or written anywhere.
This boundary is kept thin because it cannot run without the network: the tests cover the request construction,
the cost refusal and the missing-key error with a stand-in client.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from marketrl.runtime.io import atomic_write

log = logging.getLogger(__name__)
API_KEY_ENV = "DATABENTO_API_KEY"
_DAY_IN_NAME = re.compile(r"-(\d{8})\.")


class DownloadError(ValueError):
    """The download was refused or cannot start; the message names the config key or variable."""


def day_of(path: str | Path) -> dt.date:
    """The trading day encoded in a download target's name (dataset-YYYYMMDD.schema.dbn.zst)."""
    match = _DAY_IN_NAME.search(Path(path).name)
    if not match:
        raise DownloadError(f"{path}: expected a file name with -YYYYMMDD. in it")
    return dt.datetime.strptime(match.group(1), "%Y%m%d").date()


def day_requests(request: Mapping[str, Any], outputs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One `timeseries.get_range` request per output file: the file's UTC day, [day, day + 1)."""
    requests = []
    for path in outputs:
        day = day_of(path)
        requests.append(
            {
                "dataset": request["dataset"],
                "symbols": list(request["symbols"]),
                "schema": request["schema"],
                "stype_in": request["stype_in"],
                "start": day.isoformat(),
                "end": (day + dt.timedelta(days=1)).isoformat(),
                "path": str(path),
            }
        )
    return requests


def download_days(
    request: Mapping[str, Any],
    outputs: Sequence[str | Path],
    client_factory: Callable[[str], Any] | None = None,
) -> float:
    """Estimate the cost of all days, refuse above data.databento.max_cost_usd, then fetch each day atomically.

    Returns the estimated cost in USD. `client_factory(key)` defaults to databento.Historical.
    """
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise DownloadError(
            f"data.source=databento needs the {API_KEY_ENV} environment variable (it is unset)"
        )
    if client_factory is None:
        import databento

        client_factory = databento.Historical
    client = client_factory(key)
    days = day_requests(request, outputs)
    if not days:
        raise DownloadError("data.databento: the start..end range holds no weekday to download")
    cost = float(
        client.metadata.get_cost(
            dataset=request["dataset"],
            symbols=list(request["symbols"]),
            schema=request["schema"],
            stype_in=request["stype_in"],
            start=days[0]["start"],
            end=days[-1]["end"],
        )
    )
    limit = float(request["max_cost_usd"])
    log.info("databento cost estimate for %d day(s): %.2f USD (limit %.2f)", len(days), cost, limit)
    print(f"databento cost estimate: {cost:.2f} USD for {len(days)} day(s)")
    if cost > limit:
        raise DownloadError(
            f"data.databento.max_cost_usd: the estimate {cost:.2f} USD exceeds the limit {limit:.2f} USD; "
            "raise the limit or narrow the request"
        )
    for day in days:
        target = day.pop("path")
        with atomic_write(target) as tmp:
            client.timeseries.get_range(**day, path=str(tmp))
        log.info("downloaded %s", Path(target).name)
    return cost
