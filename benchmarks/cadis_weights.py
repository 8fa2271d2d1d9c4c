"""Why CADIS trailed FedAvg: how concentrated its aggregation weights are on cluster-MC.

  python -m benchmarks.cadis_weights           # writes benchmarks/cadis/weights.md

On the cluster-skewed MC layout every cluster owns the same data (its two classes), split
among its clients, so a client's example count n_i is already about 1/|C_i| of its cluster's
data: FedAvg's n_i-weighting gives every cluster the same expected total weight. CADIS's eq. 1
multiplies by 1/|C_i| again, so a client of a 10-client cluster outweighs one of a 30-client
cluster about 9x, and a round's mean rests on very few clients. This script measures that
over the program's own client sampling (`data.sample_clients`, the same rounds as the runs),
with the true clusters (the best case for CADIS's clustering), for three weightings:
FedAvg (n_i), CADIS eq. 1 (n_i/|C_i|) and the reference code's rule (1/|C_i|), and reads the
committed 50-round runs' recorded weights against their accuracy changes.
"""

from __future__ import annotations

import csv
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, 'cadis', 'weights.md')
RUNS = os.path.join(HERE, 'cadis', 'earlier_runs')
ROUNDS = 200
NUM_CLIENTS, PER_ROUND = 100, 10


def weight_rules(sizes, clusters):
  cluster_size = np.bincount(clusters)
  return {
      'FedAvg: n_i': lambda ids: sizes[ids].astype(np.float64),
      'CADIS eq. 1: n_i/|C_i|': lambda ids: sizes[ids] / cluster_size[clusters[ids]],
      'reference code: 1/|C_i|': lambda ids: 1.0 / cluster_size[clusters[ids]],
  }


def concentration(rule, rounds=ROUNDS, seed=0):
  """(mean effective participants 1/Σp², share of rounds whose largest weight > 0.3)."""
  import data  # pylint: disable=g-import-not-at-top
  eff, top = [], []
  for r in range(1, rounds + 1):
    w = rule(data.sample_clients(NUM_CLIENTS, PER_ROUND, r, seed))
    w = w / w.sum()
    eff.append(1.0 / np.sum(w * w))
    top.append(w.max() > 0.3)
  return float(np.mean(eff)), float(np.mean(top))


def recorded_runs():
  """Per committed CADIS run: effective participants and accuracy change vs largest weight."""
  out = []
  for name in ('cadis', 'cadis_no_kd', 'cadis_transitive'):
    path = os.path.join(RUNS, name, 'metrics.csv')
    if not os.path.exists(path):
      continue
    with open(path, newline='') as f:
      rows = list(csv.DictReader(f))
    w = [np.array(json.loads(r['aggregator/aggregation_weights'])) for r in rows]
    top = np.array([x.max() for x in w])
    acc = np.array([float(r['test_accuracy']) for r in rows])
    change = np.diff(acc)  # accuracy after round t+1 minus after round t
    heavy = top[1:] > 0.3
    out.append(dict(
        run=name, rounds=len(rows),
        effective=float(np.mean([1.0 / np.sum(x * x) for x in w])),
        heavy_share=float(np.mean(top > 0.3)),
        corr=float(np.corrcoef(top[1:], change)[0, 1]),
        change_heavy=float(change[heavy].mean()) if heavy.any() else float('nan'),
        change_light=float(change[~heavy].mean()) if (~heavy).any() else float('nan')))
  return out


def page() -> str:
  import data  # pylint: disable=g-import-not-at-top
  labels = data.load_fashion_mnist().y_train
  lines = ['# CADIS: how concentrated the aggregation weights are (cluster-MC, 100 clients, '
           '10 per round)', '',
           '<!-- written by `python -m benchmarks.cadis_weights`; do not edit by hand -->', '',
           __doc__.split('\n\n')[2].strip().replace('\n', ' '), '',
           f'Over rounds 1-{ROUNDS} of seed 0\'s sampling, with the true clusters. Effective '
           'participants = 1/Σp² of the round\'s normalised weights (10 = equal weights).', '',
           '| client-size spread (`size_sigma`) | client sizes min / median / max | rule | '
           'effective participants | rounds with a weight > 0.3 |', '|---|---|---|---|---|']
  for sigma in (1.0, 0.5, 0.0):
    part = data.ClusterSkewPartitioner(NUM_CLIENTS, 'mc', seed=0, size_sigma=sigma).partition(
        labels)
    sizes, clusters = np.asarray(part.sizes()), np.asarray(part.true_clusters)
    spread = f'{sizes.min()} / {int(np.median(sizes))} / {sizes.max()}'
    for name, rule in weight_rules(sizes, clusters).items():
      eff, heavy = concentration(rule)
      default = ' (the program\'s partition)' if sigma == 1.0 else ''
      lines.append(f'| {sigma}{default} | {spread} | {name} | {eff:.2f} | {100 * heavy:.0f}% |')
  runs = recorded_runs()
  if runs:
    lines += ['', 'The earlier single-seed 50-round runs (`benchmarks/cadis/earlier_runs/*`, recorded '
              '`aggregator/aggregation_weights`, learned clusters):', '',
              '| run | effective participants | rounds with a weight > 0.3 | corr(largest weight, '
              'next accuracy change) | mean accuracy change after a round with a weight > 0.3 '
              '| … otherwise |', '|---|---|---|---|---|---|']
    for r in runs:
      lines.append(f'| {r["run"]} | {r["effective"]:.2f} | {100 * r["heavy_share"]:.0f}% | '
                   f'{r["corr"]:+.2f} | {100 * r["change_heavy"]:+.2f} points | '
                   f'{100 * r["change_light"]:+.2f} points |')
  return '\n'.join(lines) + '\n'


def main() -> int:
  text = page()
  with open(OUT, 'w') as f:
    f.write(text)
  print(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
