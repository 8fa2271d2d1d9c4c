"""Where FedCDA's margin over FedAvg comes from: a steady model, window by window.

  python -m benchmarks.fedcda_diagnosis     # writes benchmarks/fedcda/diagnosis.md

FedCDA caches each client's last K = 3 uploads and, after a FedAvg warmup, has each round's
participants pick the cached model that keeps the aggregate closest to every cached client's
models (eq. 8); the global model is the mean over all cached clients of their selected
models, so it changes by 4 of 20 clients' choices a round, where FedAvg's is made afresh
from 4 skewed clients. This script reads the suite's committed runs (at the length its pages
report, and the pairs finished at the length it is being lengthened to) and its probes,
seed by seed and round by round: FedCDA's test accuracy beside FedAvg's run of the same
setting and seed, its level over 50-round windows and how far it swings about its trend
within them (the last-10 mean of a run that swings by points inherits that scatter), the
best evaluated round of each, and what the selection did: the share of participants that
picked an older cached model than their newest, and how much that lowered eq. 8's objective.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from benchmarks import runs as rd
from benchmarks import suites

SUITE = suites.SUITES['fedcda']
OUT = os.path.join(suites.suite_dir(SUITE.name), 'diagnosis.md')


def older_model_share(rows) -> float:
  """The share of the uploads of `rows` (after the warmup) whose client picked an older
  cached model than its newest (`aggregator/switched` over `aggregator/uploads`)."""
  after = [r for r in rows if float(r['aggregator/warmup']) == 0.0]
  uploads = sum(float(r['aggregator/uploads']) for r in after)
  return sum(float(r['aggregator/switched']) for r in after) / uploads if uploads else np.nan


def objective_lowered(rows) -> float:
  """How much the selection lowered eq. 8's objective over the rounds of `rows` after the
  warmup: the mean of 1 − after / before (0 when every participant keeps its newest)."""
  after = [r for r in rows if float(r['aggregator/warmup']) == 0.0]
  if not after:
    return np.nan
  return float(np.mean([1.0 - float(r['aggregator/objective_after']) /
                        float(r['aggregator/objective_before']) for r in after]))


def best_round(rows) -> float:
  """The highest test accuracy of any evaluated round."""
  return float(np.nanmax(rd.metrics_column(rows, 'test_accuracy')))


def last10(rows) -> float:
  """The last-10 mean of a run's `metrics_rows` (as summary.json's)."""
  return rd.last10_of(rd.metrics_column(rows, 'test_accuracy'))


def _pair(method: str, baseline: str, runs: dict) -> tuple:
  """({seed: FedCDA rows}, {seed: FedAvg rows}) over the seeds both finished, each seed's two
  runs read at the rounds both evaluated (a probe's runs, evaluated every few rounds, beside
  the reported FedAvg it keeps unchanged, evaluated every round): the last-10 means stay the
  headline's (the program evaluates every run's last 10 rounds)."""
  cda, avg = runs.get(method, {}), runs.get(baseline, {})
  out = {}, {}
  for seed in sorted(set(cda) & set(avg)):
    out[0][seed], out[1][seed] = rd.common_evaluations(cda[seed], avg[seed])
  return out


def _sources() -> list:
  """(label, {seed: FedCDA rows}, {seed: FedAvg rows}, warmup rounds) per comparison: the
  reported runs, the pairs finished at the declared length while the suite is being
  lengthened to it, then each probe's."""
  tuned = suites.load_tuned(SUITE.name)
  rounds, declared = rd.reported_rounds(SUITE), rd.declared_rounds(SUITE)
  reported = rd.suite_metrics(SUITE)
  longer = {} if rounds == declared else {
      run: {seed: rd.run_rows(r) for seed, r in seeds.items() if rd.usable(r)}
      for run, seeds in rd.collect_at(SUITE, declared).items()}
  out = []
  for c in SUITE.comparisons:
    warmup = SUITE.config_overrides(c.method, tuned)['fedcda_warmup_rounds']
    out.append((f'{c.label}, the reported runs ({rounds} rounds)',
                *_pair(c.method, c.baseline, reported), warmup))
    if longer:
      out.append((f'{c.label} at {declared} rounds (the pairs finished there so far)',
                  *_pair(c.method, c.baseline, longer), warmup))
  for probe in SUITE.probes:
    runs = rd.probe_metrics(SUITE, probe)
    changed = ', '.join(f'{k} = {v}' for k, v in sorted(probe.overrides.items()))
    for c in SUITE.comparisons:
      if {c.method, c.baseline} <= set(probe.runs + probe.unchanged):
        warmup = SUITE.probe_overrides(probe, c.method, tuned)['fedcda_warmup_rounds']
        out.append((f'{c.label}, probe {probe.name} ({changed})',
                    *_pair(c.method, c.baseline, runs), warmup))
  return out


def _paired(cda: dict, avg: dict) -> list:
  return sorted(s for s in cda if s in avg)


def _summary_lines(sources) -> list:
  lines = ['## Per setting', '',
           'Mean ± std over the seeds where both runs finished. Last-10: the mean test accuracy '
           'of the last 10 rounds (the headline figure); margin: FedCDA − FedAvg of the same '
           'seed; best: the highest accuracy of any round both runs of the seed evaluated; '
           'swing: the std of the accuracies both evaluated over the last '
           f'{rd.WINDOW} rounds (a quarter of a shorter '
           'run: the plateau criterion\'s window, as the suite page\'s) about their '
           'least-squares line (points; the curve\'s scatter with its rise taken out); older '
           'model: the share of participants, after the warmup, whose selection picked an '
           'older cached model than their newest upload; objective lowered: the mean over '
           'those rounds of 1 − J(selected) / J(newest), J eq. 8\'s objective.', '',
           '| setting | seeds | FedAvg last-10 (%) | FedCDA last-10 (%) | margin (points) | '
           'FedAvg best (%) | FedCDA best (%) | FedAvg swing | FedCDA swing | older model | '
           'objective lowered |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for label, cda, avg, _ in sources:
    seeds = _paired(cda, avg)
    if not seeds:
      lines.append(f'| {label} | no paired seed finished | | | | | | | | | |')
      continue
    total = min(len(side[s]) for side in (cda, avg) for s in seeds)
    start = total - rd.plateau_window(total)
    a = [last10(avg[s]) for s in seeds]
    c = [last10(cda[s]) for s in seeds]
    cells = [rd.over_seeds(a, scale=100), rd.over_seeds(c, scale=100),
             rd.over_seeds([x - y for x, y in zip(c, a)], scale=100, signed=True),
             rd.over_seeds([best_round(avg[s]) for s in seeds], scale=100),
             rd.over_seeds([best_round(cda[s]) for s in seeds], scale=100),
             *(rd.over_seeds([rd.window_accuracy(side[s], start, total)[1]
                                  for s in seeds], scale=100) for side in (avg, cda)),
             rd.over_seeds([older_model_share(cda[s]) for s in seeds]),
             rd.over_seeds([objective_lowered(cda[s]) for s in seeds], '.1%')]
    lines.append(f'| {label} | {", ".join(map(str, seeds))} | ' + ' | '.join(cells) + ' |')
  return lines + ['']


def _rounds_lines(sources) -> list:
  lines = ['## Over rounds', '',
           f'Each row averages {rd.WINDOW} rounds (the warmup\'s, FedAvg in both runs, a '
           'row of its own), then the seeds; runs evaluated every few rounds are averaged over '
           'the rounds evaluated, and each seed\'s two runs over the rounds both evaluated. '
           'Margin: FedCDA − FedAvg of the same seed over the window, '
           'mean ± std over the seeds; swing, older model and objective lowered as above, '
           'over the window.', '']
  for label, cda, avg, warmup in sources:
    seeds = _paired(cda, avg)
    if not seeds:
      continue
    total = min(len(side[s]) for side in (cda, avg) for s in seeds)
    lines += [f'{label}, seeds {", ".join(map(str, seeds))}:', '',
              '| rounds | FedAvg (%) | FedCDA (%) | margin (points) | FedAvg swing | '
              'FedCDA swing | older model | objective lowered |',
              '|---|---|---|---|---|---|---|---|']
    start = 0
    for mark in rd.window_marks(total, warmup):
      (a, swing_a), (c, swing_c) = (
          zip(*[rd.window_accuracy(side[s], start, mark) for s in seeds])
          for side in (avg, cda))
      in_warmup = mark <= warmup   # no selection yet: FedAvg in both runs
      cells = [f'{start + 1}-{mark}' + (', warmup' if in_warmup else ''),
               rd.num(100 * np.mean(a)), rd.num(100 * np.mean(c)),
               rd.over_seeds([x - y for x, y in zip(c, a)], scale=100, signed=True),
               rd.num(100 * np.mean(swing_a)), rd.num(100 * np.mean(swing_c)),
               '' if in_warmup else
               rd.num(np.mean([older_model_share(cda[s][start:mark]) for s in seeds])),
               '' if in_warmup else
               rd.num(np.mean([objective_lowered(cda[s][start:mark]) for s in seeds]),
                          '.1%')]
      lines.append('| ' + ' | '.join(cells) + ' |')
      start = mark
    lines.append('')
  return lines


def _selection_lines() -> list:
  """Each probe that changes the selection rule against the reported FedCDA, seed by seed
  at the probe's length: what the rule adds beyond the cache's mean."""
  tuned = suites.load_tuned(SUITE.name)
  lines = []
  for probe in SUITE.probes:
    if 'fedcda_selection' not in probe.overrides:
      continue
    if not lines:
      lines = ['## The selection rule against the cache alone', '',
               'The reported FedCDA (eq. 8\'s batch-greedy selection) minus the probe\'s FedCDA '
               'of the same seed, last-10 means in points, both read at the probe\'s length; '
               'mean ± std over the seeds, then each seed\'s.', '',
               '| probe | run | seeds | reported FedCDA (%) | probe\'s FedCDA (%) | '
               'reported − probe (points) |', '|---|---|---|---|---|---|']
    probed = rd.probe_metrics(SUITE, probe)
    for run in probe.runs:
      rounds = SUITE.probe_overrides(probe, run, tuned)['rounds']
      reported = {seed: rd.run_rows(r)
                  for seed, r in rd.collect_at(SUITE, rounds)[run].items()
                  if rd.usable(r)}
      seeds = sorted(s for s in probed.get(run, {}) if s in reported and s in probe.seeds)
      r = [last10(reported[s]) for s in seeds]
      p = [last10(probed[run][s]) for s in seeds]
      gains = [x - y for x, y in zip(r, p)]
      lines.append(
          f'| {probe.name} ({probe.overrides["fedcda_selection"]}) | {run} | '
          f'{", ".join(map(str, seeds)) or "none finished"} | {rd.over_seeds(r, scale=100)} | '
          f'{rd.over_seeds(p, scale=100)} | '
          f'{rd.over_seeds(gains, scale=100, signed=True)}'
          + (f' (per seed {", ".join(f"{100 * g:+.2f}" for g in gains)})' if gains else '')
          + ' |')
  return lines + [''] if lines else []


def page() -> str:
  sources = _sources()
  lines = rd.diagnosis_header('FedCDA on Fashion-MNIST (20 clients, 4 per round): where '
                                  'its margin over FedAvg comes from', sys.modules[__name__])
  lines += _summary_lines(sources) + _selection_lines() + _rounds_lines(sources)
  return '\n'.join(lines).rstrip('\n') + '\n'


def main() -> int:
  return rd.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
