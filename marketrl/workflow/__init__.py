"""What the DAG imports at parse time: config and its checks, results/ paths, per-stage slices and code
hashes, which files and jobs exist, input file order, contract-spec and calibration plans.

Kept free of torch, polars and numpy (an import-linter contract in pyproject.toml): rules/common.smk imports it
at every DAG parse.
"""
