"""What every job shares at run time: job logging and one-line errors, atomic writes, provenance, and the
test-only hold points."""
