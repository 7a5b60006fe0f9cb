"""Evaluation: scoring positions on test days, baselines, metrics, statistics, and the verdict's calibration."""
