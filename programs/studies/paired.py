"""Paired seeds' statistics and their text: the 95% paired t interval and figures as shown.

Both runs of a seed share its partition, client sampling and initial model, so a margin is
the mean of the per-seed differences and its 95% t half-width is the smallest margin those
seeds tell from 0 at their spread.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def t_half_width(values) -> float:
  """Half-width of the 95% t interval of the mean of `values` (NaN with fewer than two)."""
  v = np.asarray(values, np.float64)
  if v.size < 2:
    return float('nan')
  return float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))


def mean_std(values) -> tuple:
  """(mean, sample std) of `values`; std NaN for one value (no spread), both NaN for none."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return float('nan'), float('nan')
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float('nan')


def pct(x: float) -> str:
  """A fraction as percent with two decimals ('n/a' when not measured)."""
  return 'n/a' if not np.isfinite(x) else f'{100 * x:.2f}'


def mean_and_spread(mean: float, std: float, spec: str = '.2f', mean_spec: str = '') -> str:
  """'mean ± std', or 'mean (one seed)' when there is no spread (mean_std's NaN std)."""
  if not np.isfinite(mean):
    return 'n/a'
  text = format(mean, mean_spec or spec)
  return f'{text} (one seed)' if np.isnan(std) else f'{text} ± {std:{spec}}'
