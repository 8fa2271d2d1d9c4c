"""Why FedCross does or does not pull ahead of FedAvg here: its models' spread and choices.

  python -m benchmarks.fedcross_diagnosis     # writes benchmarks/fedcross/diagnosis.md

FedCross keeps K middleware models; each round every one is trained by one client, then
fused with the collaborator least similar to it (cosine of the whole uploaded models),
keeping α = 0.99 of itself. It can only differ from FedAvg as much as its K models differ
from one another: if they stay close, their mean (the global model) moves as FedAvg's
does. This script reads the suite's committed runs and its probes (every finished seed)
round by round: how far apart the K uploaded models are (the cosine distance 1 − cos
between pairs, from the matrix each round logs in `aggregator/similarity`), how many distinct
collaborators the lowest-similarity rule picks among the K, and the test accuracy of
FedCross beside FedAvg's run of the same setting and seed.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from benchmarks import report
from benchmarks import suites

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'fedcross', 'diagnosis.md')
AFTER_ACCELERATION = 50   # rounds of dynamic α and propellers (the suite's accel_rounds)


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
              top_share=float(counts.max() / max(chosen.size, 1)))


def spread_over(rows, start: int = 0, end: int = None) -> dict:
  """`round_spread` averaged over rows[start:end]."""
  window = [round_spread(r) for r in rows[start:end]]
  return {k: float(np.mean([w[k] for w in window])) for k in window[0]}


def _sources() -> list:
  """(label, {seed: FedCross rows}, {seed: FedAvg rows}) per setting with finished runs."""
  suite = suites.SUITES['fedcross']
  out = []
  runs = report.suite_metrics(suite)
  for beta in ('0.1', '0.5'):
    out.append((f'β = {beta}, E = 1 (the reported runs)', runs.get(f'fedcross_beta{beta}', {}),
                runs.get(f'fedavg_beta{beta}', {})))
  for probe in suite.probes:
    runs = report.probe_metrics(suite, probe)
    for beta in ('0.1', '0.5'):
      if f'fedcross_beta{beta}' in probe.runs:
        changed = ', '.join(f'{k} = {v}' for k, v in sorted(probe.overrides.items())
                            if k != 'rounds')
        out.append((f'β = {beta}, probe {probe.name} ({changed})',
                    runs.get(f'fedcross_beta{beta}', {}), runs.get(f'fedavg_beta{beta}', {})))
  return out


def _summary_lines(sources) -> list:
  lines = ['## Per setting', '',
           f'Mean ± std over the finished seeds; spread and choices averaged over the rounds '
           f'after the first {AFTER_ACCELERATION} (dynamic α and propellers end there). '
           'Distance in units of 1e-4. Margin: FedCross − FedAvg of the same seed, last-10 '
           'mean; peak: the largest margin of the seeds\' mean curves, as last-10 means, and '
           'the round that window ends at.', '',
           '| setting | seeds | median 1 − cos (1e-4) | largest 1 − cos (1e-4) | distinct '
           'collaborators (of 10) | share picking the most chosen | FedAvg (%) | FedCross (%) '
           '| margin (points) | peak margin (points, round) |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for label, cross, avg in sources:
    seeds = sorted(s for s in cross if s in avg)
    if not seeds:
      lines.append(f'| {label} | none finished | | | | | | | | |')
      continue
    spreads = [spread_over(cross[s], AFTER_ACCELERATION) for s in seeds]
    acc_c = [report.metrics_column(cross[s], 'test_accuracy') for s in seeds]
    acc_a = [report.metrics_column(avg[s], 'test_accuracy') for s in seeds]
    last = lambda a: float(np.mean(a[-report.LAST:]))
    n = min(min(len(a) for a in acc_c), min(len(a) for a in acc_a))
    window = np.ones(report.LAST) / report.LAST
    curve = np.mean([np.convolve(c[:n] - a[:n], window, 'valid') for c, a in zip(acc_c, acc_a)],
                    axis=0)
    peak = int(np.argmax(curve))
    cells = [report.over_seeds([s['median_distance'] for s in spreads], '.1f', 1e4),
             report.over_seeds([s['max_distance'] for s in spreads], '.1f', 1e4),
             report.over_seeds([s['distinct'] for s in spreads], '.1f'),
             report.over_seeds([s['top_share'] for s in spreads], '.2f'),
             report.over_seeds([last(a) for a in acc_a], scale=100),
             report.over_seeds([last(c) for c in acc_c], scale=100),
             report.over_seeds([last(c) - last(a) for c, a in zip(acc_c, acc_a)], scale=100,
                               signed=True),
             f'{100 * curve[peak]:+.2f} (round {peak + report.LAST})']
    lines.append(f'| {label} | {", ".join(map(str, seeds))} | ' + ' | '.join(cells) + ' |')
  return lines + ['']


def _rounds_lines(sources) -> list:
  lines = ['## Over rounds', '',
           'Each row averages the rounds since the previous row, then the seeds.', '']
  for label, cross, avg in sources:
    seeds = sorted(s for s in cross if s in avg)
    if not seeds:
      continue
    total = min(min(len(cross[s]) for s in seeds), min(len(avg[s]) for s in seeds))
    lines += [f'{label}, seeds {", ".join(map(str, seeds))}:', '',
              '| rounds | α | median 1 − cos (1e-4) | distinct collaborators | FedAvg (%) | '
              'FedCross (%) | margin (points) |', '|---|---|---|---|---|---|---|']
    start = 0
    for mark in report.checkpoint_rounds(total):
      spread = [spread_over(cross[s], start, mark) for s in seeds]
      alpha = np.mean([report.metrics_column(cross[s][start:mark], 'aggregator/alpha')
                       for s in seeds])
      c = [np.mean(report.metrics_column(cross[s][start:mark], 'test_accuracy')) for s in seeds]
      a = [np.mean(report.metrics_column(avg[s][start:mark], 'test_accuracy')) for s in seeds]
      lines.append(f'| {start + 1}-{mark} | {alpha:.3f} | '
                   f'{1e4 * np.mean([s["median_distance"] for s in spread]):.1f} | '
                   f'{np.mean([s["distinct"] for s in spread]):.1f} | {100 * np.mean(a):.2f} | '
                   f'{100 * np.mean(c):.2f} | '
                   f'{report.over_seeds([x - y for x, y in zip(c, a)], scale=100, signed=True)} |')
      start = mark
    lines.append('')
  return lines


def page() -> str:
  sources = _sources()
  lines = ['# FedCross on Fashion-MNIST Dirichlet (100 clients, 10 per round): how far apart '
           'its models are', '',
           '<!-- written by `python -m benchmarks.fedcross_diagnosis`; do not edit by hand -->',
           '', ' '.join(__doc__.split('\n\n')[2].split()), '']
  lines += _summary_lines(sources) + _rounds_lines(sources)
  return '\n'.join(lines).rstrip('\n') + '\n'


def main() -> int:
  report.write_text(OUT, page())
  print(f'wrote {os.path.relpath(OUT)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
