"""Paired statistics over seeds, and how the pages write them.

The two runs of a comparison share each seed's partition, client sampling and initial model,
so a margin is read seed by seed (method − baseline, over the seeds both runs finished) and
its mean carries a 95% paired t interval. Across seeds a level is mean ± sample standard
deviation; one value has no spread (NaN, written "(one seed)", never "± 0").
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from scipy import stats

# The t quantile of a two-sided 95% interval.
QUANTILE = 0.975

# What a table row says when its runs share no finished seed, by how many runs it sets side
# by side.
NO_SEED = {1: 'none finished', 2: 'no paired seed finished', 3: 'no seed finished in all three'}


def paired_seeds(*sides: dict) -> list:
  """The seeds, in order, that every one of `sides` ({seed: run}) holds."""
  if not sides:
    return []
  return sorted(set(sides[0]).intersection(*sides[1:]))


def margins(method: Sequence[float], baseline: Sequence[float], scale: float = 1.0) -> list:
  """Per-seed margins: `scale` × (method − baseline), the two sequences over the same paired
  seeds in the same order."""
  return [scale * (m - b) for m, b in zip(method, baseline)]


def t_half_width(values) -> float:
  """Half-width of the 95% t interval of the mean of `values` (NaN with fewer than two)."""
  v = np.asarray(values, np.float64)
  if v.size < 2:
    return float('nan')
  return float(stats.t.ppf(QUANTILE, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))


def paired_margin(method: Sequence[float], baseline: Sequence[float],
                  scale: float = 1.0) -> dict:
  """{'margins': per seed (`margins`), 'margin': their mean (NaN with none), 'half_width':
  its 95% t half-width}: what `margin_text` writes."""
  per_seed = margins(method, baseline, scale)
  return dict(margins=per_seed, margin=float(np.mean(per_seed)) if per_seed else float('nan'),
              half_width=t_half_width(per_seed))


def resolution(n: int, std: float = 1.0) -> float:
  """The margin `n` paired seeds can just tell from none: the 95% t half-width of a mean of
  n per-seed margins whose std over seeds is `std` (the default gives the factor on that
  std); NaN with fewer than two seeds."""
  if n < 2:
    return float('nan')
  return float(stats.t.ppf(QUANTILE, n - 1) / np.sqrt(n) * std)


def mean_std(values) -> tuple:
  """(mean, sample std) of `values`; NaN for both with none."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return float('nan'), float('nan')
  # One value has no spread: NaN, shown as "(one seed)", never as ± 0.
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float('nan')


def pct(x: float) -> str:
  """A fraction as percent, two decimals ('n/a' where not measured)."""
  return 'n/a' if not np.isfinite(x) else f'{100 * x:.2f}'


def mean_and_spread(mean: float, std: float, spec: str = '.2f', mean_spec: str = '') -> str:
  """'mean ± std', or 'mean (one seed)' when there is no spread (mean_std's NaN std)."""
  if not np.isfinite(mean):
    return 'n/a'
  text = format(mean, mean_spec or spec)
  return f'{text} (one seed)' if np.isnan(std) else f'{text} ± {std:{spec}}'


def over_seeds(values, spec: str = '.2f', scale: float = 1.0, signed: bool = False) -> str:
  """`mean ± std` of the finite `values` (times `scale`), 'n/a' when there are none."""
  values = [scale * v for v in values if v is not None and np.isfinite(v)]
  if not values:
    return 'n/a'
  return mean_and_spread(*mean_std(values), spec, '+' + spec if signed else '')


def margin_text(figure: dict, per_seed: bool = True) -> str:
  """A `paired_margin` as '+m ± h' (95% half-width), then each seed's margin."""
  if not np.isfinite(figure['margin']):
    return 'n/a'
  text = f'{figure["margin"]:+.2f}'
  text += (f' ± {figure["half_width"]:.2f}' if np.isfinite(figure['half_width'])
           else ' (one seed)')
  if per_seed and len(figure['margins']) > 1:
    text += ' (' + ', '.join(f'{m:+.2f}' for m in figure['margins']) + ')'
  return text


def no_seed_text(sides: int) -> str:
  """What a row of `sides` runs says when they share no finished seed."""
  return NO_SEED.get(sides, f'no seed finished in all {sides}')


def paired_row(label: str, sides: Sequence[dict], cells: Callable[[list], list],
               width: int) -> str:
  """A markdown table row over the seeds every one of `sides` ({seed: finished run}) holds:
  '| label | s1, s2 | ' then `cells(seeds)` (the row's other cells); when they share none,
  `no_seed_text` in the seeds' cell and the table's other cells (`width` columns in all)
  left empty."""
  seeds = paired_seeds(*sides)
  if not seeds:
    return f'| {label} | {no_seed_text(len(sides))} |' + ' |' * (width - 2)
  return f'| {label} | {", ".join(map(str, seeds))} | ' + ' | '.join(cells(seeds)) + ' |'
