"""Exchange session calendars: trading days, daily halts, DST, and the US exchange holiday rules (stdlib only)."""
