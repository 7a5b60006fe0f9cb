"""Put this checkout first on sys.path, so job scripts import its marketrl even inside a `--sdm conda` env.

Snakemake appends the script's own directory to sys.path, which is how job scripts find this module.
"""

import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
