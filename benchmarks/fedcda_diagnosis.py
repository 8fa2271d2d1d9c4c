"""Where FedCDA's margin over FedAvg comes from: a steady model, window by window.

  python -m benchmarks.fedcda_diagnosis     # writes benchmarks/results/fedcda/diagnosis.md
  python -m benchmarks.fedcda_diagnosis --loss_reading DIR...
      # eq. 8 with F_n read as a mean or a sum, on FedCDA checkpoints (<run>_s<seed>/
      # checkpoints/program_state_<round>), added to benchmarks/results/fedcda_paper/loss_reading.json

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

import functools
import os
import sys

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs import generated_files
from programs.studies import paired
from programs.studies import records

SUITE = suites.SUITES['fedcda']
PAPER_SUITE = suites.SUITES['fedcda_paper']
OUT = os.path.join(suites.suite_dir(SUITE.name), 'diagnosis.md')
LOSS_READING = os.path.join(suites.suite_dir(PAPER_SUITE.name), 'loss_reading.json')


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
  return float(np.nanmax(records.metrics_column(rows, 'test_accuracy')))


def last10(rows) -> float:
  """The last-10 mean of a run's `metrics_rows` (as summary.json's)."""
  return records.last10_of(records.metrics_column(rows, 'test_accuracy'))


def _pair(method: str, baseline: str, runs: dict) -> tuple:
  """({seed: FedCDA rows}, {seed: FedAvg rows}) over the seeds both finished, each seed's two
  runs read at the rounds both evaluated (a probe's runs, evaluated every few rounds, beside
  the reported FedAvg it keeps unchanged, evaluated every round): the last-10 means stay the
  headline's (the program evaluates every run's last 10 rounds)."""
  cda, avg = runs.get(method, {}), runs.get(baseline, {})
  out = {}, {}
  for seed in paired.paired_seeds(cda, avg):
    out[0][seed], out[1][seed] = suite_runs.common_evaluations(cda[seed], avg[seed])
  return out


def _sources() -> list:
  """(label, {seed: FedCDA rows}, {seed: FedAvg rows}, warmup rounds) per comparison: the
  reported runs, the pairs finished at the declared length while the suite is being
  lengthened to it, then each probe's."""
  tuned = suites.load_tuned(SUITE.name)
  rounds, declared = suite_runs.reported_rounds(SUITE), suite_runs.declared_rounds(SUITE)
  reported = suite_runs.suite_metrics(SUITE)
  longer = {} if rounds == declared else {
      run: {seed: records.run_rows(r) for seed, r in seeds.items() if records.usable(r)}
      for run, seeds in suite_runs.collect_at(SUITE, declared).items()}
  out = []
  for c in SUITE.comparisons:
    warmup = SUITE.config_overrides(c.method, tuned)['fedcda_warmup_rounds']
    out.append((f'{c.label}, the reported runs ({rounds} rounds)',
                *_pair(c.method, c.baseline, reported), warmup))
    if longer:
      out.append((f'{c.label} at {declared} rounds (the pairs finished there so far)',
                  *_pair(c.method, c.baseline, longer), warmup))
  for probe in SUITE.probes:
    runs = suite_runs.probe_metrics(SUITE, probe)
    changed = ', '.join(f'{k} = {v}' for k, v in sorted(probe.overrides.items()))
    for c in SUITE.comparisons:
      if {c.method, c.baseline} <= set(probe.runs + probe.unchanged):
        warmup = SUITE.probe_overrides(probe, c.method, tuned)['fedcda_warmup_rounds']
        out.append((f'{c.label}, probe {probe.name} ({changed})',
                    *_pair(c.method, c.baseline, runs), warmup))
  return out


def _summary_lines(sources) -> list:
  lines = ['## Per setting', '',
           'Mean ± std over the seeds where both runs finished. Last-10: the mean test accuracy '
           'of the last 10 rounds (the headline figure); margin: FedCDA − FedAvg of the same '
           'seed; best: the highest accuracy of any round both runs of the seed evaluated; '
           'swing: the std of the accuracies both evaluated over the last '
           f'{suite_runs.WINDOW} rounds (a quarter of a shorter '
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
    lines.append(paired.paired_row(label, (cda, avg),
                                   functools.partial(_setting_cells, cda, avg), 11))
  return lines + ['']


def _setting_cells(cda: dict, avg: dict, seeds: list) -> list:
  """A setting's cells of the per-setting table over its paired seeds."""
  total = min(len(side[s]) for side in (cda, avg) for s in seeds)
  start = total - suite_runs.plateau_window(total)
  a = [last10(avg[s]) for s in seeds]
  c = [last10(cda[s]) for s in seeds]
  return [paired.over_seeds(a, scale=100), paired.over_seeds(c, scale=100),
          paired.over_seeds(paired.margins(c, a), scale=100, signed=True),
          paired.over_seeds([best_round(avg[s]) for s in seeds], scale=100),
          paired.over_seeds([best_round(cda[s]) for s in seeds], scale=100),
          *(paired.over_seeds([suite_runs.window_accuracy(side[s], start, total)[1] for s in seeds],
                              scale=100) for side in (avg, cda)),
          paired.over_seeds([older_model_share(cda[s]) for s in seeds]),
          paired.over_seeds([objective_lowered(cda[s]) for s in seeds], '.1%')]


def _rounds_lines(sources) -> list:
  lines = ['## Over rounds', '',
           f'Each row averages {suite_runs.WINDOW} rounds (the warmup\'s, FedAvg in both runs, a '
           'row of its own), then the seeds; runs evaluated every few rounds are averaged over '
           'the rounds evaluated, and each seed\'s two runs over the rounds both evaluated. '
           'Margin: FedCDA − FedAvg of the same seed over the window, '
           'mean ± std over the seeds; swing, older model and objective lowered as above, '
           'over the window.', '']
  for label, cda, avg, warmup in sources:
    seeds = paired.paired_seeds(cda, avg)
    if not seeds:
      continue
    total = min(len(side[s]) for side in (cda, avg) for s in seeds)
    lines += [f'{label}, seeds {", ".join(map(str, seeds))}:', '',
              '| rounds | FedAvg (%) | FedCDA (%) | margin (points) | FedAvg swing | '
              'FedCDA swing | older model | objective lowered |',
              '|---|---|---|---|---|---|---|---|']
    start = 0
    for mark in suite_runs.window_marks(total, warmup):
      (a, swing_a), (c, swing_c) = (
          zip(*[suite_runs.window_accuracy(side[s], start, mark) for s in seeds])
          for side in (avg, cda))
      in_warmup = mark <= warmup   # no selection yet: FedAvg in both runs
      cells = [f'{start + 1}-{mark}' + (', warmup' if in_warmup else ''),
               suite_runs.num(100 * np.mean(a)), suite_runs.num(100 * np.mean(c)),
               paired.over_seeds(paired.margins(c, a), scale=100, signed=True),
               suite_runs.num(100 * np.mean(swing_a)), suite_runs.num(100 * np.mean(swing_c)),
               '' if in_warmup else
               suite_runs.num(np.mean([older_model_share(cda[s][start:mark]) for s in seeds])),
               '' if in_warmup else
               suite_runs.num(np.mean([objective_lowered(cda[s][start:mark]) for s in seeds]),
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
    probed = suite_runs.probe_metrics(SUITE, probe)
    for run in probe.runs:
      rounds = SUITE.probe_overrides(probe, run, tuned)['rounds']
      reported = {seed: records.run_rows(r)
                  for seed, r in suite_runs.collect_at(SUITE, rounds)[run].items()
                  if records.usable(r)}
      seeds = [s for s in paired.paired_seeds(probed.get(run, {}), reported) if s in probe.seeds]
      r = [last10(reported[s]) for s in seeds]
      p = [last10(probed[run][s]) for s in seeds]
      gains = paired.margins(r, p)
      lines.append(
          f'| {probe.name} ({probe.overrides["fedcda_selection"]}) | {run} | '
          f'{", ".join(map(str, seeds)) or "none finished"} | {paired.over_seeds(r, scale=100)} | '
          f'{paired.over_seeds(p, scale=100)} | '
          f'{paired.over_seeds(gains, scale=100, signed=True)}'
          + (f' (per seed {", ".join(f"{100 * g:+.2f}" for g in gains)})' if gains else '')
          + ' |')
  return lines + [''] if lines else []


# --------------------------------------------------------------------------- #
# F_n in eq. 8: the per-example mean of the last epoch's loss, or its sum
# --------------------------------------------------------------------------- #
# Algorithm 1 line 7 "accumulates" the local loss over the last epoch; eq. 1 defines F_n as
# the client's expected loss and eqs. 2-8 come from the L-smoothness of that F_n, so the
# project reads F_n as the per-example mean. A PyTorch loop that accumulates `loss.item()`
# over the epoch's batches would use the sum of batch means instead: the mean times the
# client's number of batches, which weighs the loss term of eq. 8 against its divergence
# term by that factor. `loss_reading` runs the method's own selection both ways on the
# state a checkpoint holds.

LOSS_READING_SETS = 200   # participant sets drawn per checkpoint


def read_cache(checkpoint: str) -> dict:
  """{round, models [N, K, D] float64, losses [N, K], count [N], selected [N]} of a FedCDA
  run's program-state checkpoint (its SavedModel's variables, read by name)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(os.path.join(checkpoint, 'variables', 'variables'))
  prefix = '_value/state/aggregator/'
  names = sorted((k for k in reader.get_variable_to_shape_map()
                  if k.startswith(prefix + 'cache/')),
                 key=lambda k: (k.split('/')[4], int(k.split('/')[5])))
  get = lambda name: reader.get_tensor(f'{prefix}{name}/.ATTRIBUTES/VARIABLE_VALUE')  # noqa: E731
  tensors = [reader.get_tensor(k).astype(np.float64) for k in names]
  n, k = tensors[0].shape[:2]
  return dict(round=int(reader.get_tensor('_value/round/.ATTRIBUTES/VARIABLE_VALUE')),
              models=np.concatenate([t.reshape(n, k, -1) for t in tensors], axis=2),
              losses=np.asarray(get('losses'), np.float64), count=np.asarray(get('count')),
              selected=np.asarray(get('selected')))


def batches_per_client(config) -> np.ndarray:
  """Each client's number of local batches a epoch in the run of `config` (its partition)."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  fed = experiment.load_federated_data(config)
  sizes = np.array([len(fed.client_arrays(i)[1]) for i in range(config.num_clients)])
  return np.ceil(sizes / config.batch_size)


def select_both_ways(state: dict, participants, scale, *, cache_size: int,
                     num_batches: int, smoothness: float):
  """The method's batch-greedy selection (`select_models`) for `participants` (their caches
  as they are, each as if its newest model were this round's upload, every other cached
  client at its selection), with F_n the cached losses times `scale` [N]: (choice [P],
  J with every participant at its newest, J with the choice)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cache_selection  # pylint: disable=g-import-not-at-top
  k, models, count = cache_size, state['models'], state['count']
  losses = state['losses'] * np.asarray(scale, np.float64)[:, None]
  ages = np.arange(k)
  slots = (count[participants, None] - 1 - ages[None, :]) % k        # j-th newest's ring slot
  cands = models[np.asarray(participants)[:, None], slots].reshape(len(participants) * k, -1)
  fixed = np.flatnonzero((count > 0) & ~np.isin(np.arange(len(count)), participants))
  fixed_models = models[fixed, state['selected'][fixed]]
  fixed_sum = fixed_models.sum(axis=0)
  f64 = lambda v: tf.constant(float(v), tf.float64)  # noqa: E731
  fixed_stats = dict(loss_sum=f64(losses[fixed, state['selected'][fixed]].sum()),
                     sq_norm_sum=f64(np.sum(fixed_models ** 2)),
                     sum_sq_norm=f64(fixed_sum @ fixed_sum),
                     count=tf.constant(len(fixed), tf.int32))
  gram = tf.constant(cands @ cands.T)
  fixed_dot = tf.constant(cands @ fixed_sum)
  cand_losses = tf.constant(losses[np.asarray(participants)[:, None], slots].reshape(-1))
  valid = tf.ones([len(participants)], tf.bool)
  num_cands = tf.constant(np.minimum(count[participants], k).astype(np.int32))
  split = [tf.constant(b, tf.int32) for b in np.array_split(
      np.random.default_rng(len(participants)).permutation(len(participants)), num_batches)]
  choice = cache_selection.select_models(gram, fixed_dot, fixed_stats, cand_losses, num_cands,
                                         valid, split, smoothness, k)
  newest = tf.zeros([len(participants)], tf.int32)
  objective = lambda c: float(cache_selection.objective_of_choice(  # noqa: E731
      gram, fixed_dot, fixed_stats, cand_losses, c, valid, smoothness, k))
  return choice.numpy(), objective(newest), objective(choice)


def loss_reading(state: dict, batches, config, sets: int = LOSS_READING_SETS) -> dict:
  """What reading F_n as a sum (the per-example mean times the client's batches) instead of a
  mean does to eq. 8's selection on one checkpoint: over `sets` random participant sets of
  the clients with a full cache, the share of participants that pick an older model than
  their newest under each reading, the share whose pick differs between the readings, and
  each reading's relative objective drop 1 - J(choice) / J(newest)."""
  full = np.flatnonzero(state['count'] >= config.fedcda_cache_size)
  rng = np.random.default_rng([state['round'], 17])
  options = dict(cache_size=config.fedcda_cache_size, num_batches=config.fedcda_batches,
                 smoothness=config.fedcda_smoothness)
  switched = {'mean': [], 'sum': []}
  drop = {'mean': [], 'sum': []}
  differ = []
  for _ in range(sets):
    who = np.sort(rng.choice(full, size=min(config.clients_per_round, full.size), replace=False))
    picks = {}
    for reading, scale in (('mean', np.ones_like(batches)), ('sum', batches)):
      choice, before, after = select_both_ways(state, who, scale, **options)
      picks[reading] = choice
      switched[reading].append(np.mean(choice > 0))
      drop[reading].append(1.0 - after / before)
    differ.append(np.mean(picks['mean'] != picks['sum']))
  return dict(round=state['round'], clients=int(full.size), sets=sets,
              switched_mean=float(np.mean(switched['mean'])),
              switched_sum=float(np.mean(switched['sum'])), differ=float(np.mean(differ)),
              drop_mean=float(np.mean(drop['mean'])), drop_sum=float(np.mean(drop['sum'])))


def record_loss_reading(checkpoints, out: str = LOSS_READING) -> dict:
  """Adds `loss_reading` of each checkpoint (<run>_s<seed>/[checkpoints/]program_state_N of a
  FedCDA run; its config.json gives the settings) to `out`, keyed by run and round."""
  import json  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  recorded = {}
  if os.path.exists(out):
    with open(out) as f:
      recorded = json.load(f)
  for path in checkpoints:
    run_dir = os.path.dirname(os.path.abspath(path))
    if os.path.basename(run_dir) == 'checkpoints':
      run_dir = os.path.dirname(run_dir)
    with open(os.path.join(run_dir, 'config.json')) as f:
      config = experiment_config.recorded_config(json.load(f))
    state = read_cache(path)
    figures = loss_reading(state, batches_per_client(config), config)
    recorded.setdefault(os.path.basename(run_dir), {})[str(state['round'])] = figures
    print(f'{os.path.basename(run_dir)} round {state["round"]}: {figures}')
  os.makedirs(os.path.dirname(out), exist_ok=True)
  generated_files.write_json(out, recorded)
  return recorded


def _loss_reading_lines() -> list:
  import json  # pylint: disable=g-import-not-at-top
  if not os.path.exists(LOSS_READING):
    return []
  with open(LOSS_READING) as f:
    recorded = json.load(f)
  lines = ['## F_n in eq. 8: mean or sum', '',
           'Algorithm 1 line 7 "accumulates" the loss of the last local epoch; the paper\'s eq. 1 '
           'defines F_n as the client\'s expected loss, and eqs. 2-8 follow from the '
           'L-smoothness of that F_n, so the project reads F_n as the per-example mean (what the '
           'paper-protocol runs use). A loop that sums the batch losses of the epoch would give '
           'the mean times the client\'s number of batches. On the state of each checkpoint of '
           'the paper-protocol runs (`--loss_reading`), the method\'s own selection for '
           f'{LOSS_READING_SETS} random sets of 4 clients with a full cache, each as if its '
           'newest model were this round\'s upload: the share of them picking an older model '
           'than their newest under each reading, the share whose pick differs between the two '
           'readings, and each reading\'s drop of its own objective, 1 − J(choice) / J(newest).',
           '', '| run | round | older model, mean | older model, sum | picks differ | '
           'objective drop, mean | objective drop, sum |', '|---|---|---|---|---|---|---|']
  for run, by_round in sorted(recorded.items()):
    for r, f in sorted(by_round.items(), key=lambda x: int(x[0])):
      lines.append(f'| {run} | {r} | {f["switched_mean"]:.2f} | {f["switched_sum"]:.2f} | '
                   f'{f["differ"]:.2f} | {f["drop_mean"]:.2%} | {f["drop_sum"]:.2%} |')
  return lines + ['']


def page() -> str:
  sources = _sources()
  lines = suite_runs.diagnosis_header('FedCDA on Fashion-MNIST (20 clients, 4 per round): where '
                                  'its margin over FedAvg comes from', sys.modules[__name__])
  lines += (_summary_lines(sources) + _selection_lines() + _loss_reading_lines()
            + _rounds_lines(sources))
  return '\n'.join(lines).rstrip('\n') + '\n'


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ['--loss_reading']:
    if len(argv) < 2:
      print('--loss_reading takes FedCDA checkpoint directories '
            '(<run>_s<seed>/checkpoints/program_state_<round>)', file=sys.stderr)
      return 2
    record_loss_reading(argv[1:])
    return 0
  if argv:
    print(f'unknown arguments {argv}: run it without any, or with --loss_reading DIR...',
          file=sys.stderr)
    return 2
  return suite_runs.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
