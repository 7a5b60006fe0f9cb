"""The bar features of the catalog (plus a book group for quote schemas), and the DBN.zst → Parquet stage that caches them.

- ``catalog``: the one catalog of the features (names, lookbacks, definitions);
- ``engine``: the query planner and the chunk engine that computes the table;
- ``build``: the file stage (``build_feature_file``) and its Parquet writing;
- ``user``: features of the user's own file (``features.user``) and their look-ahead audit.

The public names are re-exported here: ``from marketrl.features import X`` is the way to import them.
"""

from __future__ import annotations

from typing import Any

from marketrl.features.catalog import (
    BASE_COLUMNS,
    BOOK_CATALOG,
    BOOK_FEATURE_NAMES,
    CATALOG,
    DAY_CUMULATIVE_FEATURES,
    FEATURE_NAMES,
    FEATURE_SET_VERSION,
    LOOKBACKS,
    MAX_LOOKBACK,
    FeatureSpec,
)
from marketrl.features.engine import CHUNK_BARS, FeatureChunks, feature_chunks, non_finite_columns
from marketrl.features.user import UserFeatureError, UserFeatures, load_user_features
from marketrl.features.user_audit import audit_user_features

#: names of the file stage (``build``: pyarrow and the Parquet writing), loaded on first use (`__getattr__`), so
#: that jobs which only read feature tables (evaluate, baselines) do not import it
_BUILD_NAMES = (
    "PARQUET_ZSTD_LEVEL",
    "FeatureJob",
    "build_feature_batch",
    "build_feature_file",
    "feature_options",
    "resorted_note",
    "skipped_reason",
    "warmup_only_note",
)


def __getattr__(name: str) -> Any:
    if name in _BUILD_NAMES:
        from marketrl.features import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BASE_COLUMNS",
    "BOOK_CATALOG",
    "BOOK_FEATURE_NAMES",
    "CATALOG",
    "CHUNK_BARS",
    "DAY_CUMULATIVE_FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SET_VERSION",
    "LOOKBACKS",
    "MAX_LOOKBACK",
    "PARQUET_ZSTD_LEVEL",
    "FeatureChunks",
    "FeatureJob",
    "FeatureSpec",
    "UserFeatureError",
    "UserFeatures",
    "audit_user_features",
    "build_feature_batch",
    "build_feature_file",
    "feature_chunks",
    "feature_options",
    "load_user_features",
    "non_finite_columns",
    "resorted_note",
    "skipped_reason",
    "warmup_only_note",
]
