"""Provenance that travels with every output: config, input hashes, package versions, git commit, device."""

from __future__ import annotations

import copy
import hashlib
import platform
import subprocess
import urllib.parse
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_PACKAGES = (
    "marketrl",
    "torch",
    "polars",
    "databento",
    "databento-dbn",
    "optuna",
    "numpy",
    "snakemake",
)


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of the packages whose behaviour shapes the results."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(repo: Path | None = None) -> str:
    """The checked-out commit (with '+dirty' when tracked files changed), or 'unknown' outside git."""
    cwd = repo or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def config_hash(config: dict[str, Any]) -> str:
    """Stable hash of a config mapping (key order does not matter)."""
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def redact_url(url: str) -> str:
    """A database URL without its password (in the user part or a `password=` query parameter)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    netloc = f"{userinfo.split(':', 1)[0]}@{host}" if at else host
    query = [
        (k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "password"
    ]
    if parts.password is None and len(query) == len(
        urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ):
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=urllib.parse.urlencode(query)))


def public_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config as outputs and the report may show it: hyperopt.storage without a password."""
    storage = (config.get("hyperopt") or {}).get("storage")
    if not storage:
        return config
    public = copy.deepcopy(config)
    public["hyperopt"]["storage"] = redact_url(storage)
    return public


def collect(config: dict[str, Any], inputs: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """One provenance record: config (never a password) and its hash, input file hashes, versions, platform,
    git, plus `extra`."""
    config = public_config(config)
    return {
        "config": config,
        "config_hash": config_hash(config),
        "inputs": inputs or {},
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        **extra,
    }
