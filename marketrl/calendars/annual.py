"""The year in trading sessions: the one convention that turns daily figures into annual ones."""

from __future__ import annotations

import math

SESSIONS_PER_YEAR = 252
# Daily Sharpe × ANNUALIZER = annualised Sharpe (i.i.d. scaling convention); divide to go back to daily units.
ANNUALIZER = math.sqrt(SESSIONS_PER_YEAR)
