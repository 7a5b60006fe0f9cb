"""Helpers for the reliability, fault and security tests: pipeline runs that can be killed, result scans,
size-limited and read-only mounts, and a socket blocker."""
