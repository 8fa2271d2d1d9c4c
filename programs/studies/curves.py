"""Test accuracy over rounds, mean ± std over seeds: one panel per baseline, one colour per method.

Written with matplotlib's Agg backend and no software stamp in the PNG, so that the same
runs give the same file byte for byte (a test regenerates the committed pages and compares
them). A study's page (programs/studies/study_page.py) and the papers' pages (benchmarks/report.py)
draw their curves here.
"""

from __future__ import annotations

import os
import re
from typing import Callable

import numpy as np

from programs import generated_files
from programs.studies import records

PALETTE = ('#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2',
           '#17becf', '#bcbd22', '#7f7f7f')


def panels(comparisons) -> list:
  """[(title, [runs])]: one panel per baseline of `comparisons` (each with method, baseline
  and label), with every method compared against it; a label's first word (the method) is
  left out of the title."""
  out = {}
  for comp in comparisons:
    title = re.sub(r'^\S+ ', '', comp.label) if ' ' in comp.label else comp.label
    out.setdefault(comp.baseline, (title, [comp.baseline]))[1].append(comp.method)
  return list(out.values())


def plot(path: str, groups: list, colour_of: Callable[[str], str]) -> None:
  """Writes a figure of panels side by side: groups = [(title, {run: [loaded runs]})], the
  first run of each panel its baseline; `colour_of(run)` is a run's colour."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 3.4),
                           squeeze=False)
  for ax, (title, by_run) in zip(axes[0], groups):
    for i, (run, loaded) in enumerate(by_run.items()):
      done = [r for r in loaded if records.usable(r)]
      if not done:
        continue
      x, mean, std = records.mean_curve(done)
      # the baseline dashed and drawn last, so that a method on top of it does not hide it
      line, = ax.plot(x, 100 * mean, lw=1.6 if i == 0 else 1.1, ls='--' if i == 0 else '-',
                      color=colour_of(run), label=f'{run} ({len(done)})', zorder=3 - (i > 0))
      ax.fill_between(x, 100 * (mean - std), 100 * (mean + std), color=line.get_color(),
                      alpha=0.15, lw=0)
    if finish_panel(ax, title, 'round', 'no finished run yet'):
      low = min(np.percentile(l.get_ydata(), 5) for l in ax.lines)
      ax.set_ylim(max(low - 5, 0), None)
  axes[0][0].set_ylabel('test accuracy (%), mean ± std', fontsize=8)
  save(fig, path)


def finish_panel(ax, title: str, xlabel: str, empty: str) -> bool:
  """Titles, labels and grids a panel as every page's figure does: a legend when it has
  lines (returns True), else `empty` written across it."""
  ax.set_title(title, fontsize=8)
  ax.set_xlabel(xlabel, fontsize=8)
  ax.grid(alpha=0.3)
  ax.tick_params(labelsize=7)
  if ax.lines:
    ax.legend(fontsize=6, loc='lower right')
    return True
  ax.text(0.5, 0.5, empty, ha='center', transform=ax.transAxes)
  return False


def save(fig, path: str) -> None:
  """Lays out `fig` and writes it to `path` as a PNG the same figure always gives byte for
  byte, atomically; closes it."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with generated_files.replacing(path) as tmp:
    fig.savefig(tmp, format='png', dpi=100, metadata={'Software': None})
  plt.close(fig)
