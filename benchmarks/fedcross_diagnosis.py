"""Why FedCross does or does not pull ahead of FedAvg here: its models' spread and choices.

  python -m benchmarks.fedcross_diagnosis     # writes benchmarks/results/fedcross/diagnosis.md

FedCross keeps K middleware models; each round every one is trained by one client, then
fused with the collaborator least similar to it (cosine of the whole uploaded models),
keeping α = 0.99 of itself. It can only differ from FedAvg as much as its K models differ
from one another: if they stay close, their mean (the global model) moves as FedAvg's
does. This script reads the suite's committed runs and its probes (every finished seed)
round by round: how far apart the K uploaded models are (the cosine distance 1 − cos
between pairs, from the matrix each round logs in `aggregator/similarity`), how many distinct
collaborators the lowest-similarity rule picks among the K, and the test accuracy of
FedCross beside FedAvg's run of the same setting and seed: its level over 50-round windows
and how far it swings about its trend within them (a single model's accuracy can jump by
points from one round to the next on skewed clients; the last-10 mean inherits that).
"""

from __future__ import annotations

import functools
import json
import os
import sys

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs.studies import paired
from programs.studies import records

OUT = os.path.join(suites.suite_dir('fedcross'), 'diagnosis.md')
WINDOW = suite_runs.WINDOW


def round_spread(row) -> dict:
  """One round's models: median and largest pairwise 1 − cos, distinct collaborators, and
  the share of models whose collaborator is the round's most chosen one."""
  sim = np.asarray(json.loads(row['aggregator/similarity']), np.float64)
  distance = 1.0 - sim[np.triu_indices(len(sim), k=1)]
  chosen = np.asarray(json.loads(row['aggregator/collaborators']))
  chosen = chosen[chosen >= 0]
  counts = np.bincount(chosen) if chosen.size else np.zeros(1)
  return dict(median_distance=float(np.median(distance)),
              max_distance=float(np.max(distance)),
              distinct=float(len(np.unique(chosen))),
              top_share=float(counts.max() / chosen.size) if chosen.size else float('nan'))


def spread_over(rows) -> dict:
  """`round_spread` averaged over `rows` (NaNs when there are none)."""
  window = [round_spread(r) for r in rows]
  keys = ('median_distance', 'max_distance', 'distinct', 'top_share')
  return {k: float(np.mean([w[k] for w in window])) if window else float('nan') for k in keys}


def margin_curve(cross_rows, avg_rows) -> np.ndarray:
  """FedCross − FedAvg per round, NaN where either was not evaluated."""
  n = min(len(cross_rows), len(avg_rows))
  return (records.metrics_column(cross_rows[:n], 'test_accuracy') -
          records.metrics_column(avg_rows[:n], 'test_accuracy'))


def peak_margin(curves) -> str:
  """The largest last-10 margin of the seeds' mean margin curve (over its last LAST
  evaluated rounds, as suite_runs.last10_at), and the round that window ends at."""
  n = min(len(c) for c in curves)
  mean = np.mean([c[:n] for c in curves], axis=0)   # NaN where a round was not evaluated
  evaluated = np.flatnonzero(np.isfinite(mean))     # row i holds round i + 1
  windows = [(float(np.mean(mean[evaluated[i - records.LAST + 1:i + 1]])), int(evaluated[i]) + 1)
             for i in range(records.LAST - 1, len(evaluated))]
  if not windows:
    return 'n/a'
  value, end = max(windows, key=lambda w: w[0])   # the first of equal windows
  return f'{100 * value:+.2f} (round {end})'


def _mean_of_evaluated(values: np.ndarray) -> float:
  return float(np.nanmean(values)) if np.isfinite(values).any() else float('nan')


def _sources() -> list:
  """(label, {seed: FedCross rows}, {seed: FedAvg rows}, accel rounds) per FedCross
  comparison of the suite, then per probe that holds one."""
  suite = suites.SUITES['fedcross']
  pairs = [(c.method, c.baseline, c.label) for c in suite.comparisons
           if suite.algorithm(c.method) == 'fedcross']
  out = []
  runs = suite_runs.suite_metrics(suite)
  for method, baseline, label in pairs:
    accel = suite.config_overrides(method).get('fedcross_accel_rounds', 0)
    out.append((f'{label}, E = {suite.common["local_epochs"]} (the reported runs)',
                runs.get(method, {}), runs.get(baseline, {}), accel))
  for probe in suite.probes:
    runs = suite_runs.probe_metrics(suite, probe)
    changed = ', '.join(f'{k} = {v}' for k, v in sorted(probe.overrides.items()) if k != 'rounds')
    for method, baseline, label in pairs:
      if method in probe.runs and baseline in probe.runs:
        accel = suite.probe_overrides(probe, method).get('fedcross_accel_rounds', 0)
        out.append((f'{label}, probe {probe.name} ({changed})', runs.get(method, {}),
                    runs.get(baseline, {}), accel))
  return out


def _summary_lines(sources, num_models: int) -> list:
  lines = ['## Per setting', '',
           'Mean ± std over the seeds where both runs finished; spread and choices averaged over '
           'the rounds after the acceleration (dynamic α and propellers). Distance in units of '
           '1e-4. Margin: FedCross − FedAvg of the same seed, last-10 mean; peak: the largest '
           'margin of the seeds\' mean curves, as last-10 means, and the round that window '
           'ends at.', '',
           '| setting | seeds | median 1 − cos (1e-4) | largest 1 − cos (1e-4) | distinct '
           f'collaborators (of {num_models}) | share picking the most chosen | FedAvg (%) | '
           'FedCross (%) | margin (points) | peak margin (points, round) |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for label, cross, avg, accel in sources:
    lines.append(paired.paired_row(label, (cross, avg),
                                   functools.partial(_setting_cells, cross, avg, accel), 10))
  return lines + ['']


def _setting_cells(cross: dict, avg: dict, accel: int, seeds: list) -> list:
  """A setting's cells of the per-setting table over its paired seeds: spread and choices
  after the acceleration, both runs' last-10 means, their margin and the peak margin."""
  spreads = [spread_over(cross[s][accel:]) for s in seeds]
  last_a = [records.last10_of(records.metrics_column(avg[s], 'test_accuracy')) for s in seeds]
  last_c = [records.last10_of(records.metrics_column(cross[s], 'test_accuracy')) for s in seeds]
  return [paired.over_seeds([s['median_distance'] for s in spreads], '.1f', 1e4),
          paired.over_seeds([s['max_distance'] for s in spreads], '.1f', 1e4),
          paired.over_seeds([s['distinct'] for s in spreads], '.1f'),
          paired.over_seeds([s['top_share'] for s in spreads], '.2f'),
          paired.over_seeds(last_a, scale=100), paired.over_seeds(last_c, scale=100),
          paired.over_seeds(paired.margins(last_c, last_a), scale=100, signed=True),
          peak_margin([margin_curve(cross[s], avg[s]) for s in seeds])]


def _rounds_lines(sources) -> list:
  lines = ['## Over rounds', '',
           f'Each row averages {WINDOW} rounds (the acceleration\'s rounds, when it has them, '
           'a row of their own), then the seeds. In the acceleration the models are fused with '
           'propeller models in a cyclic order, not with the least similar collaborator. '
           'Swing: the std of the test accuracies evaluated in the window about their '
           'least-squares line over rounds (points; the curve\'s scatter with its rise taken '
           'out), mean over the seeds.', '']
  for label, cross, avg, accel in sources:
    seeds = paired.paired_seeds(cross, avg)
    if not seeds:
      continue
    total = min(min(len(cross[s]) for s in seeds), min(len(avg[s]) for s in seeds))
    marks = suite_runs.window_marks(total, accel)
    lines += [f'{label}, seeds {", ".join(map(str, seeds))}:', '',
              '| rounds | α | median 1 − cos (1e-4) | distinct collaborators | FedAvg (%) | '
              'FedCross (%) | margin (points) | FedAvg swing | FedCross swing |',
              '|---|---|---|---|---|---|---|---|---|']
    start = 0
    for mark in marks:
      spread = [spread_over(cross[s][start:mark]) for s in seeds]
      alpha = np.mean([_mean_of_evaluated(records.metrics_column(cross[s][start:mark],
                                                                'aggregator/alpha'))
                       for s in seeds])
      (a, swing_a), (c, swing_c) = (
          zip(*[suite_runs.window_accuracy(runs[s], start, mark) for s in seeds])
          for runs in (avg, cross))
      name = f'{start + 1}-{mark}' + (', acceleration' if mark <= accel else '')
      lines.append(f'| {name} | {alpha:.3f} | '
                   f'{1e4 * np.mean([s["median_distance"] for s in spread]):.1f} | '
                   f'{np.mean([s["distinct"] for s in spread]):.1f} | '
                   f'{suite_runs.num(100 * np.mean(a))} | {suite_runs.num(100 * np.mean(c))} | '
                   f'{paired.over_seeds(paired.margins(c, a), scale=100, signed=True)} | '
                   + ' | '.join(suite_runs.num(100 * np.mean(w)) for w in (swing_a, swing_c))
                   + ' |')
      start = mark
    lines.append('')
  return lines


def page() -> str:
  sources = _sources()
  lines = suite_runs.diagnosis_header('FedCross on Fashion-MNIST Dirichlet (100 clients, 10 per '
                                  'round): how far apart its models are', sys.modules[__name__])
  num_models = suites.SUITES['fedcross'].common['clients_per_round']
  lines += _summary_lines(sources, num_models) + _rounds_lines(sources)
  return '\n'.join(lines).rstrip('\n') + '\n'


def main() -> int:
  return suite_runs.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
