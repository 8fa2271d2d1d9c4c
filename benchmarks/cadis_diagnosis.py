"""Why CADIS does or does not beat FedAvg on cluster-MC: its weights, clusters and KD term.

  python -m benchmarks.cadis_diagnosis        # writes benchmarks/results/cadis/diagnosis.md
  python -m benchmarks.cadis_diagnosis --record_similarity DIR...
      # adds the Q and F of CADIS runs' checkpoints (each DIR: <run>_s<seed>/[checkpoints/]
      # program_state_<round>) to benchmarks/results/cadis/similarity/, which the page reads

On the cluster-skewed MC layout every cluster owns the same data (its two classes), split
among its clients, so a client's example count n_i is already about 1/|C_i| of its cluster's
data: FedAvg's n_i-weighting gives every cluster the same expected total weight. CADIS's eq. 1
multiplies by 1/|C_i| again, so a client of a 10-client cluster outweighs one of a 30-client
cluster about 9x, and a round's mean rests on very few clients. This script measures that
over the program's own client sampling (`data.sample_clients`, the same rounds as the runs),
with the true clusters (the best case for CADIS's clustering), for three weightings:
FedAvg (n_i), CADIS eq. 1 (n_i/|C_i|) and the reference code's rule (1/|C_i|); then reads
the suite's committed runs (every seed): the weights each round used, how soon the learned
clusters match the partition's, τ, the KD term beside the cross-entropy, and how much the
test accuracy changes from round to round, for CADIS's variants and the baselines alike.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs.methods import cadis as cadis_method
from programs.studies import paired
from programs.studies import records

OUT = os.path.join(suites.suite_dir('cadis'), 'diagnosis.md')
EARLIER_RUNS = os.path.join(suites.suite_dir('cadis'), 'earlier_runs')
TUNING = os.path.join(suites.suite_dir('cadis'), 'tuning')
SIMILARITY = os.path.join(suites.suite_dir('cadis'), 'similarity')
ROUNDS = 200
NUM_CLIENTS, PER_ROUND = 100, 10
HEAVY = 0.3      # a round "rests on one client" when a normalised weight exceeds this
CHANGE_WINDOW = 50  # rounds at the end over which the round-to-round change is measured


def weight_rules(sizes, clusters):
  cluster_size = np.bincount(clusters)
  return {
      'FedAvg: n_i': lambda ids: sizes[ids].astype(np.float64),
      # '\\|': a bar that stays one markdown table cell (shown as |)
      'CADIS eq. 1: n_i/\\|C_i\\|': lambda ids: sizes[ids] / cluster_size[clusters[ids]],
      'reference code: 1/\\|C_i\\|': lambda ids: 1.0 / cluster_size[clusters[ids]],
  }


def effective_participants(weights) -> float:
  """1/Σp² of the normalised weights: how many equal weights they amount to."""
  p = np.asarray(weights, np.float64)
  p = p / p.sum()
  return float(1.0 / np.sum(p * p))


def concentration(rule, rounds=ROUNDS, seed=0):
  """(mean effective participants, share of rounds whose largest weight > HEAVY)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  eff, top = [], []
  for r in range(1, rounds + 1):
    w = rule(data.sample_clients(NUM_CLIENTS, PER_ROUND, r, seed))
    eff.append(effective_participants(w))
    top.append(w.max() / w.sum() > HEAVY)
  return float(np.mean(eff)), float(np.mean(top))


def weight_effects(rows) -> dict:
  """A run's recorded aggregation weights against the test accuracy that followed."""
  w = [np.asarray(json.loads(r['aggregator/aggregation_weights']), np.float64) for r in rows]
  top = np.array([x.max() / x.sum() for x in w])
  change, evaluated = _accuracy_changes(rows)
  top_before = top[1:][evaluated]   # the weights of the round each change follows
  heavy = top_before > HEAVY
  return dict(
      effective=float(np.mean([effective_participants(x) for x in w])),
      heavy_share=float(np.mean(top > HEAVY)),
      corr=_correlation(top_before, change),
      change_heavy=float(change[heavy].mean()) if heavy.any() else float('nan'),
      change_light=float(change[~heavy].mean()) if (~heavy).any() else float('nan'))


def _accuracy_changes(rows) -> tuple:
  """(test accuracy after round t+1 minus after round t, where both were evaluated; the mask
  of those t among all). A run evaluated every k-th round has such pairs only where it
  evaluated every round, e.g. its last rounds."""
  change = np.diff(records.metrics_column(rows, 'test_accuracy'))
  evaluated = np.isfinite(change)
  return change[evaluated], evaluated


def _correlation(x, y) -> float:
  """Pearson's r; NaN (shown n/a) when either side is constant."""
  if np.std(x) == 0 or np.std(y) == 0:
    return float('nan')
  return float(np.corrcoef(x, y)[0, 1])


def round_to_round_change(rows) -> float:
  """Mean |accuracy change| from one round to the next over the last CHANGE_WINDOW rounds
  (over the consecutive rounds both evaluated; NaN when none were)."""
  change, _ = _accuracy_changes(rows[-CHANGE_WINDOW - 1:])
  return float(np.mean(np.abs(change))) if change.size else float('nan')


def kd_to_cross_entropy(rows) -> float:
  """The KD term's mean beside the cross-entropy's (as the program's summary.json)."""
  kd = records.metrics_column(rows, 'client_work/train/extra_loss')
  ce = records.metrics_column(rows, 'client_work/train/loss')
  keep = np.isfinite(kd)
  return float(kd[keep].mean() / ce[keep].mean()) if keep.any() else float('nan')


def _expected_lines() -> list:
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  labels = data.load_fashion_mnist().y_train
  lines = ['## The weights a round would use, with the true clusters', '',
           f'Over rounds 1-{ROUNDS} of seed 0\'s sampling. Effective participants = 1/Σp² of '
           'the round\'s normalised weights (10 = equal weights).', '',
           '| client-size spread (`size_sigma`) | client sizes min / median / max | rule | '
           f'effective participants | rounds with a weight > {HEAVY} |', '|---|---|---|---|---|']
  for sigma in (1.0, 0.5, 0.0):
    part = data.ClusterSkewPartitioner(NUM_CLIENTS, 'mc', seed=0, size_sigma=sigma).partition(
        labels)
    sizes, clusters = np.asarray(part.sizes()), np.asarray(part.true_clusters)
    spread = f'{sizes.min()} / {int(np.median(sizes))} / {sizes.max()}'
    for name, rule in weight_rules(sizes, clusters).items():
      eff, heavy = concentration(rule)
      default = ' (the program\'s partition)' if sigma == 1.0 else ''
      lines.append(f'| {sigma}{default} | {spread} | {name} | {eff:.2f} | {100 * heavy:.0f}% |')
  return lines + ['']


def _filled_text(filled: dict) -> str:
  """Which runs' unevaluated rounds read their kept shorter making's test figures
  (`suite_runs.with_kept_evaluations`)."""
  if not filled:
    return ''
  by_length = {}
  for (run, seed), (n, count) in sorted(filled.items()):
    by_length.setdefault(n, []).append((run, seed, count))
  parts = [f'from their {n}-round makings in `earlier_runs/rounds{n}/` for '
           f'{len(found)} runs ({min(c for *_, c in found)} to {max(c for *_, c in found)} '
           'rounds each)' for n, found in sorted(by_length.items())]
  return (' The test accuracy of rounds a run did not evaluate is read ' + '; '.join(parts)
          + ': those makings were evaluated every round and record every other value of '
          'every round they ran exactly as the reported runs do (the same training, bit for '
          'bit), so the accuracy changes after each round\'s weights are read on every round '
          'either making evaluated.')


def _suite_lines(runs: dict, filled: dict) -> list:
  """Per run, mean ± std over its seeds; then CADIS's clusters, τ and KD over rounds."""
  lines = ['## The reported runs', '',
           'Every finished seed at the length the suite\'s pages report (from '
           '`benchmarks/results/cadis/runs`, or while the suite is made again longer from its shorter '
           'makings in `earlier_runs/rounds<N>/`; mean ± std over seeds). Round-to-round '
           f'change: the mean |change| of test accuracy from one round to the next over the '
           f'last {CHANGE_WINDOW} rounds, in points. The weights are those each round used, with '
           'the clusters learned so far; FedAvg\'s and FedProx\'s are not recorded.'
           + _filled_text(filled), '',
           '| run | seeds | last-10 mean (%) | round-to-round change (points) | effective '
           'participants | '
           f'rounds with a weight > {HEAVY} (%) | corr(largest weight, next accuracy change) | '
           f'accuracy change after a round with a weight > {HEAVY} (points) | … otherwise '
           '| first round the clusters match | λ·KD / cross-entropy |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for run, seeds in runs.items():
    lines.append(paired.paired_row(run, (seeds,), functools.partial(_run_cells, seeds), 11))
  lines.append('')
  baseline = [r for r in runs.get('fedavg', {}).values()]
  for run, seeds in runs.items():
    rows = list(seeds.values())
    if not rows or 'aggregator/tau' not in rows[0][0]:
      continue
    total = min(len(r) for r in rows)
    marks = [m for m in suite_runs.checkpoint_rounds(total)]
    lines += [f'`{run}` over rounds (mean over its {len(rows)} seeds; τ, clusters and pairs at '
              'the row\'s round, the clusters among the clients seen so far; the other columns '
              'averaged over the rounds since the previous row):', '',
              '| round | τ | clusters learned | pairs clustered right | seeds whose clusters '
              'match the partition\'s | effective participants | λ·KD / cross-entropy | test '
              'accuracy (%) | FedAvg\'s (%) |', '|---|---|---|---|---|---|---|---|---|']
    start = 0
    for mark in marks:
      window = [r[start:mark] for r in rows]
      at = [r[mark - 1] for r in rows]
      eff = np.mean([effective_participants(json.loads(x['aggregator/aggregation_weights']))
                     for w in window for x in w])
      kd = [x for x in (kd_to_cross_entropy(w) for w in window) if np.isfinite(x)]
      kd = float(np.mean(kd)) if kd else float('nan')   # without KD: n/a
      base_acc = [records.metrics_column(r[start:mark], 'test_accuracy') for r in baseline]
      fedavg = (f'{100 * np.nanmean(base_acc):.2f}'
                if baseline and all(len(r) >= mark for r in baseline) else 'n/a')
      lines.append(
          f'| {mark} | {np.mean([float(x["aggregator/tau"]) for x in at]):.3f} | '
          f'{np.mean([float(x["aggregator/num_clusters"]) for x in at]):.1f} | '
          f'{100 * np.mean([float(x["aggregator/cluster_pair_accuracy"]) for x in at]):.1f}% | '
          f'{sum(cadis_method.cadis_clusters_match(x, NUM_CLIENTS) for x in at)} of {len(at)} | '
          f'{eff:.2f} | {suite_runs.num(kd, ".3f")} | '
          f'{100 * np.nanmean([records.metrics_column(w, "test_accuracy") for w in window]):.2f}'
          ' | '
          f'{fedavg} |')
      start = mark
    lines.append('')
  return lines


def _run_cells(by_seed: dict, seeds: list) -> list:
  """A run's cells of the reported-runs table over its finished `seeds` ({seed: metrics
  rows}); the weights' and clusters' cells n/a for a run that records none (FedAvg's)."""
  rows = [by_seed[s] for s in seeds]
  last10 = [records.last10_of(records.metrics_column(r, 'test_accuracy')) for r in rows]
  cadis = all('aggregator/aggregation_weights' in r[0] for r in rows)
  effects = [weight_effects(r) for r in rows] if cadis else []
  matched = [next((int(x['round']) for x in r
                   if cadis_method.cadis_clusters_match(x, NUM_CLIENTS)), np.nan)
             for r in rows] if cadis else []
  cells = [paired.over_seeds(last10, scale=100),
           paired.over_seeds([round_to_round_change(r) for r in rows], scale=100)]
  cells += [paired.over_seeds([e[k] for e in effects], spec, scale, signed)
            for k, spec, scale, signed in (
                ('effective', '.2f', 1, False), ('heavy_share', '.0f', 100, False),
                ('corr', '.2f', 1, True), ('change_heavy', '.2f', 100, True),
                ('change_light', '.2f', 100, True))]
  never = [str(seed) for seed, m in zip(seeds, matched) if np.isnan(m)]
  cells.append(paired.over_seeds(matched, '.0f') + (
      f' (never on seed{"s" * (len(never) > 1)} {", ".join(never)})' if never else '')
               if cadis else 'n/a')
  cells.append(paired.over_seeds([kd_to_cross_entropy(r) for r in rows], '.3f')
               if cadis else 'n/a')
  return cells


def sampled_together(true_clusters, rounds: int, seed: int) -> tuple:
  """(first round by which every client had been sampled in one round with at least one
  other member of its true cluster, or NaN; [share of same-cluster pairs sampled together
  by round r] for r = 1..rounds) under the program's own client sampling. CADIS's Q-matrix
  holds a pair only once the two were sampled together."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  clusters = np.asarray(true_clusters)
  same = (clusters[:, None] == clusters[None, :]) & ~np.eye(clusters.size, dtype=bool)
  met = np.zeros_like(same)
  every, shares = float('nan'), []
  for r in range(1, rounds + 1):
    ids = data.sample_clients(clusters.size, PER_ROUND, r, seed)
    met[np.ix_(ids, ids)] = True
    if np.isnan(every) and (met & same).any(axis=1).all():
      every = float(r)
    shares.append(float((met & same).sum() / same.sum()))
  return every, shares


def _compared_lines(runs: dict) -> list:
  """Per seed: how soon every client was sampled with a cluster-mate and how many
  same-cluster pairs were sampled together, beside the clusters each CADIS variant learned;
  then the tuning runs' clusters per client rate (one seed, the same sampling)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  cadis_runs = [run for run, seeds in runs.items() if seeds and
                all('aggregator/num_clusters' in r[0] for r in seeds.values())]
  seeds = sorted({s for run in cadis_runs for s in runs[run]})
  if not seeds:
    return []
  total = min(len(r) for run in cadis_runs for r in runs[run].values())
  marks = tuple(total * k // 4 for k in (1, 2, 3, 4))
  labels = data.load_fashion_mnist().y_train
  at = ' / '.join(map(str, marks))
  lines = ['## Which clients CADIS could compare', '',
           'CADIS\'s Q-matrix holds a pair only once the two clients were sampled in the same '
           'round, so a client never sampled with a member of its cluster cannot join it. Per '
           'seed, from the program\'s own client sampling (`data.sample_clients`) and the '
           'partition\'s true clusters (5): the first round by which every client had been '
           'sampled with at least one member of its cluster, the share of same-cluster pairs '
           f'sampled together by rounds {at}, and the clusters each CADIS variant had learned '
           'at those rounds (among the clients seen so far).', '',
           '| seed | every client sampled with a cluster-mate by round | same-cluster pairs '
           f'sampled together by {at} | ' +
           ' | '.join(f'`{run}`: clusters at {at}' for run in cadis_runs) + ' |',
           '|---|---|---|' + '---|' * len(cadis_runs)]
  for seed in seeds:
    every, shares = sampled_together(true_clusters(seed, labels), total, seed)
    cells = [suite_runs.num(every, '.0f'),
             ' / '.join(f'{100 * shares[m - 1]:.1f}%' for m in marks)]
    for run in cadis_runs:
      rows = runs[run].get(seed)
      cells.append(' / '.join(str(int(float(rows[m - 1]['aggregator/num_clusters'])))
                              for m in marks) if rows else 'n/a')
    lines.append(f'| {seed} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  return lines + _tuning_cluster_lines()


def _tuning_cluster_lines() -> list:
  """CADIS's tuning runs (one seed, one client sampling) by client rate: how soon and how
  long the learned clusters matched the partition's."""
  found = []
  for name in sorted(os.listdir(TUNING)) if os.path.isdir(TUNING) else []:
    path = os.path.join(TUNING, name)
    if not name.startswith('cadis_') or not os.path.exists(os.path.join(path, 'metrics.csv')):
      continue
    with open(os.path.join(path, 'config.json')) as f:
      config = json.load(f)
    rows = records.metrics_rows(path)
    matched = [int(x['round']) for x in rows if cadis_method.cadis_clusters_match(x, NUM_CLIENTS)]
    accuracy = [float(x['test_accuracy']) for x in rows if x.get('test_accuracy')]
    found.append((config['client_lr'], config['seed'], len(rows), matched,
                  int(float(rows[-1]['aggregator/num_clusters'])),
                  100 * float(np.mean(accuracy[-records.LAST:]))))
  if not found:
    return []
  lines = ['The tuning runs of `cadis` (one seed, so the same clients sampled together in '
           'every run; only the client rate differs). A run at chance (last-10 accuracy near '
           '10%) learned nothing: its clusters say nothing about training.', '',
           '| client rate | seed | rounds | first round the clusters match | rounds they match '
           '| clusters at the end | last-10 accuracy (%) |', '|---|---|---|---|---|---|---|']
  for lr, seed, rounds, matched, clusters, last10 in sorted(found):
    lines.append(f'| {lr:g} | {seed} | {rounds} | {matched[0] if matched else "never"} | '
                 f'{len(matched)} | {clusters} | {last10:.2f} |')
  return lines + ['']


def true_clusters(seed: int, labels) -> np.ndarray:
  """The true clusters of the program's MC partition of `seed` (what every run of it used)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  return np.asarray(data.ClusterSkewPartitioner(NUM_CLIENTS, 'mc', seed=seed)
                    .partition(labels).true_clusters)


def read_similarity(checkpoint: str) -> dict:
  """{round, q, f, tau} of one CADIS run's program-state checkpoint (a
  FileProgramStateManager version: its SavedModel's variables, read by name without building
  the process): the aggregator's cumulative similarity Q and co-participation counts F."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(os.path.join(checkpoint, 'variables', 'variables'))
  get = lambda name: reader.get_tensor(f'_value/{name}/.ATTRIBUTES/VARIABLE_VALUE')  # noqa: E731
  return dict(round=int(get('round')), q=np.asarray(get('state/aggregator/q'), np.float32),
              f=np.asarray(get('state/aggregator/f'), np.float32),
              tau=float(get('state/aggregator/tau')))


def record_similarity(checkpoints, out_dir: str = SIMILARITY) -> list:
  """Adds each checkpoint's Q, F and τ to out_dir/<run>_s<seed>.npz (beside the snapshots
  already there; run and seed from the path <run>_s<seed>/[checkpoints/]program_state_N),
  with the seed's true clusters. Returns the files written."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  snaps = {}
  for path in checkpoints:
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.basename(parent) == 'checkpoints':
      parent = os.path.dirname(parent)
    snaps.setdefault(os.path.basename(parent), []).append(read_similarity(path))
  labels = data.load_fashion_mnist().y_train
  written = []
  for name, found in sorted(snaps.items()):
    seed = int(name.rsplit('_s', 1)[1])
    target = os.path.join(out_dir, f'{name}.npz')
    by_round = {}
    if os.path.exists(target):
      with np.load(target) as z:
        by_round = {int(r): dict(round=int(r), q=q, f=f, tau=float(t))
                    for r, q, f, t in zip(z['rounds'], z['q'], z['f'], z['tau'])}
    by_round.update({s['round']: s for s in found})
    snaps_sorted = [by_round[r] for r in sorted(by_round)]
    os.makedirs(out_dir, exist_ok=True)
    np.savez_compressed(target, rounds=np.array([s['round'] for s in snaps_sorted]),
                        q=np.stack([s['q'] for s in snaps_sorted]),
                        f=np.stack([s['f'] for s in snaps_sorted]),
                        tau=np.array([s['tau'] for s in snaps_sorted]),
                        true_clusters=true_clusters(seed, labels))
    written.append(target)
  return written


def _averaged(q, f) -> tuple:
  """(Q/F, 0 where F = 0; the entries the rescale ranges over: F > 0 and Q/F > 0)."""
  q, f = np.asarray(q, np.float64), np.asarray(f, np.float64)
  avg = np.divide(q, f, out=np.zeros_like(q), where=f > 0)
  return avg, (f > 0) & (avg > 0)


def rescaled_similarity(q, f) -> np.ndarray:
  """CADIS's Q-matrix from Q and F in numpy: Q/F, min-max rescaled over its strictly
  positive entries with F > 0 (others 0; a single value rescales to 1)."""
  avg, positive = _averaged(q, f)
  if not positive.any():
    return np.zeros_like(avg)
  lo, hi = avg[positive].min(), avg[positive].max()
  scaled = (avg - lo) / (hi - lo) if hi > lo else np.ones_like(avg)
  return np.where(positive, scaled, 0.0)


def similarity_statistics(before: dict, after: dict, true_clusters) -> dict:
  """Same-cluster pairs (i != j) between two snapshots of one run: their mean averaged
  similarity over rounds 1..a (`before`) and over a+1..b alone ((Q_b - Q_a) / (F_b - F_a));
  the share of them above τ_b in the Q-matrix at a, over a+1..b alone (rescaled as at b),
  and at b; the share of other-cluster pairs above τ_b at b. Each over the pairs seen in
  that span."""
  clusters = np.asarray(true_clusters)
  same = (clusters[:, None] == clusters[None, :]) & ~np.eye(clusters.size, dtype=bool)
  other = clusters[:, None] != clusters[None, :]
  qa, fa = np.asarray(before['q'], np.float64), np.asarray(before['f'], np.float64)
  qb, fb = np.asarray(after['q'], np.float64), np.asarray(after['f'], np.float64)
  tau = after['tau']
  avg_a, _ = _averaged(qa, fa)
  avg_b, positive = _averaged(qb, fb)
  lo, hi = avg_b[positive].min(), avg_b[positive].max()
  seen_a, seen_b, window = fa > 0, fb > 0, fb > fa
  late = np.divide(qb - qa, fb - fa, out=np.zeros_like(qb), where=window)
  at_b = rescaled_similarity(qb, fb)
  return dict(
      same_before=float(avg_a[same & seen_a].mean()), same_window=float(late[same & window].mean()),
      above_before=float(np.mean(rescaled_similarity(qa, fa)[same & seen_a] > tau)),
      above_window=float(np.mean((late[same & window] - lo) / (hi - lo) > tau)),
      above_after=float(np.mean(at_b[same & seen_b] > tau)),
      other_above_after=float(np.mean(at_b[other & seen_b] > tau)))


def _similarity_lines() -> list:
  """Why the learned clusters split: the same-cluster similarities before and after each
  run's last two recorded snapshots (`record_similarity`)."""
  files = sorted(os.listdir(SIMILARITY)) if os.path.isdir(SIMILARITY) else []
  rows = []
  for name in files:
    run, seed = name[:-len('.npz')].rsplit('_s', 1)
    with np.load(os.path.join(SIMILARITY, name)) as z:
      if len(z['rounds']) < 2:
        continue
      a, b = ({k: z[k][i] for k in ('q', 'f')} | dict(round=int(z['rounds'][i]),
                                                     tau=float(z['tau'][i]))
              for i in (-2, -1))
      stats = similarity_statistics(a, b, z['true_clusters'])
    run_dir = os.path.join(suites.suite_dir('cadis'), 'runs', f'{run}_s{seed}')
    recorded = (records.metrics_rows(run_dir)
                if os.path.exists(os.path.join(run_dir, 'metrics.csv')) else [])
    clusters = (int(float(recorded[b['round'] - 1]['aggregator/num_clusters']))
                if len(recorded) >= b['round'] else None)
    rows.append((run, int(seed), a['round'], b['round'], stats, clusters))
  if not rows:
    return []
  lines = ['## Why the clusters split: the similarities CADIS averages', '',
           'CADIS links two clients when the cosine of their classifier-bias updates, averaged '
           'over every round they shared since round 1 (Q/F) and min-max rescaled, exceeds τ '
           '(0.985 from round 8 on in these runs), and joins clients two hops apart. From Q '
           'and F in the '
           'runs\' checkpoints at two rounds a < b (recorded in `cadis/similarity/` by '
           '`--record_similarity`), over the partition\'s same-cluster pairs: their mean '
           'similarity over rounds 1..a and over a+1..b alone, and the share of them above τ '
           'over 1..a, over a+1..b alone (rescaled as at b), and over 1..b (what round b '
           'clusters by); then the share of other-cluster pairs above τ at b, and the '
           'clusters recorded at b.', '',
           '| run | seed | a → b | same-cluster similarity, rounds 1..a | … rounds a+1..b | '
           'same-cluster pairs above τ, 1..a | … a+1..b alone | … 1..b | other-cluster '
           'pairs above τ, 1..b | clusters at b |', '|---|---|---|---|---|---|---|---|---|---|']
  for run, seed, a, b, st, clusters in sorted(rows):
    lines.append(f'| `{run}` | {seed} | {a} → {b} | {st["same_before"]:.4f} | '
                 f'{st["same_window"]:.4f} | {100 * st["above_before"]:.0f}% | '
                 f'{100 * st["above_window"]:.0f}% | {100 * st["above_after"]:.0f}% | '
                 f'{100 * st["other_above_after"]:.1f}% | {suite_runs.num(clusters, ".0f")} |')
  return lines + ['']


def _earlier_lines() -> list:
  """The single-seed 50-round runs with older code that first showed the concentration."""
  out = []
  for name in ('cadis', 'cadis_no_kd', 'cadis_transitive'):
    path = os.path.join(EARLIER_RUNS, name)
    if os.path.exists(os.path.join(path, 'metrics.csv')):
      out.append((name, weight_effects(records.metrics_rows(path))))
  if not out:
    return []
  lines = ['## The earlier runs', '',
           'The single-seed 50-round runs with older code (`benchmarks/results/cadis/earlier_runs/*`) '
           'that first showed it:', '',
           f'| run | effective participants | rounds with a weight > {HEAVY} | corr(largest '
           f'weight, next accuracy change) | mean accuracy change after a round with a weight '
           f'> {HEAVY} | … otherwise |', '|---|---|---|---|---|---|']
  for name, r in out:
    lines.append(f'| {name} | {r["effective"]:.2f} | {100 * r["heavy_share"]:.0f}% | '
                 f'{r["corr"]:+.2f} | {100 * r["change_heavy"]:+.2f} points | '
                 f'{100 * r["change_light"]:+.2f} points |')
  return lines + ['']


def page() -> str:
  lines = suite_runs.diagnosis_header(
      'CADIS on cluster-MC (100 clients, 10 per round): weights, clusters and KD',
      sys.modules[__name__])
  suite = suites.SUITES['cadis']
  runs, filled = suite_runs.with_kept_evaluations(suite, suite_runs.suite_metrics(suite))
  lines += (_expected_lines() + _suite_lines(runs, filled) + _compared_lines(runs)
            + _similarity_lines() + _earlier_lines())
  return '\n'.join(lines).rstrip('\n') + '\n'


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ['--record_similarity']:
    missing = [d for d in argv[1:] if not os.path.isdir(os.path.join(d, 'variables'))]
    if not argv[1:] or missing:
      print('--record_similarity takes program-state checkpoint directories '
            '(<run>_s<seed>/checkpoints/program_state_<round>); not one: '
            + (', '.join(missing) or 'none given'), file=sys.stderr)
      return 2
    for path in record_similarity(argv[1:], SIMILARITY):
      print(f'wrote {os.path.relpath(path)}')
    return 0
  if argv:
    print(f'unknown arguments {argv}: run it without any, or with --record_similarity DIR...',
          file=sys.stderr)
    return 2
  return suite_runs.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
