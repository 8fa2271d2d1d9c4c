"""What FedLEx's guidance G is here, what sets it, and how far it scales the guided steps.

  python -m benchmarks.fedlex_diagnosis     # writes benchmarks/results/fedlex/diagnosis.md
  python -m benchmarks.fedlex_diagnosis --adam_steps   # first measures G under client Adam
      # (~5 min), into benchmarks/results/fedlex_adam_tuned/adam_steps.json

FedLEx explores once, before training: a fifth of the clients train unguided from w_0, and
G is their squared deviations, min-max normalised per tensor and averaged
(docs/algorithms.md#fedlex). Every guided step is then multiplied by G elementwise: with the step rate tuned
per method, G's overall size is made up for by the rate and what can help is its shape, how it
weighs one coordinate against another (under FedAdam's server Adam, which rescales every
coordinate, even less of its size survives). This script reads every FedLEx run that
recorded G (the reported runs, the tuning grid and the superseded first tuning points under
`earlier_runs/tuning`): G's statistics by the explorers' rate, the guided variants' best
tuning points under each exploration rule, the reported runs' steps and margins over rounds,
the probe that floors G, what G does to a client Adam step (TFF's `build_adam`, as those runs
trained; the reference code's is PyTorch's, `--client_optimizer=torch_adam`), and every
superseded point.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs import computations
from programs import experiment
from programs import experiment_config
from programs import fedlex_exploration
from programs import generated_files
from programs.studies import declaration
from programs.studies import paired
from programs.studies import records

SUITE = suites.SUITES['fedlex']
# The explorers' client rate, one for every guided variant (the fedlex study file's).
(EXPLORATION_LR,) = {SUITE.runs[c.method]['fedlex_exploration_lr'] for c in SUITE.comparisons}
OUT = os.path.join(suites.suite_dir('fedlex'), 'diagnosis.md')
GUIDANCE_KEYS = ('guidance_mean', 'guidance_median', 'guidance_below_0_01',
                 'guidance_zero_fraction', 'guidance_max')


def explorer_rate(config: dict) -> float:
  """The rate a recorded run's explorers trained at (config.json as recorded)."""
  return fedlex_exploration.fedlex_explorer_lr(experiment_config.recorded_config(config))


def step_rate(config: dict) -> float:
  """The rate that scales a method's (guided) step: FedSGD's server rate, else the client's."""
  return config['server_lr'] if config['algorithm'] in ('fedsgd', 'fedlex_sgd') else (
      config['client_lr'])


# Settings besides the rate and seed that shape G (the explorers' data, steps and the matrix).
EXPLORER_SETTINGS = ('batch_size', 'client_momentum', 'fedlex_exploration_epochs',
                     'fedlex_explorer_fraction', 'fedlex_exploration_patience', 'fedlex_normalize',
                     'fedlex_guidance_floor', 'num_clients', 'partition', 'classes_per_client')


def explorer_settings(config: dict) -> tuple:
  recorded = experiment_config.recorded_config(config)
  return tuple((k, getattr(recorded, k)) for k in EXPLORER_SETTINGS)


def same_training(recorded: dict, other: dict) -> bool:
  """Whether two runs' config.json describe the same training (up to the settings a resume
  may change), the explorers' rate compared as the rate they trained at."""
  config = experiment_config.recorded_config(other)
  config.fedlex_exploration_lr = fedlex_exploration.fedlex_explorer_lr(config)
  return not experiment_config.settings_changed(
      dict(recorded, fedlex_exploration_lr=explorer_rate(recorded)), config)


def guidance(run: dict) -> dict:
  return run['summary'].get('guidance') or {}


def _dirs(pattern: str) -> list:
  return sorted(p for p in glob.glob(pattern) if os.path.exists(os.path.join(p, 'config.json')))


def recorded_runs() -> list:
  """(source, name, loaded run) for every FedLEx-suite run directory, reported runs first."""
  base = suites.suite_dir('fedlex')
  out = []
  for source, pattern in (('run', os.path.join(base, 'runs', '*')),
                          ('tuning', os.path.join(base, 'tuning', '*')),
                          ('superseded tuning',
                           os.path.join(base, 'earlier_runs', 'tuning', '*'))):
    out += [(source, os.path.basename(p), records.load_run(p)) for p in _dirs(pattern)]
  return out


def _g_cells(g: dict) -> list:
  return [f'{g["guidance_mean"]:.2g}', f'{g["guidance_median"]:.2g}',
          f'{g["guidance_below_0_01"]:.3f}', f'{g["guidance_zero_fraction"]:.3f}',
          f'{g["guidance_max"]:.2g}']


def _g_by_rate_lines(runs) -> list:
  groups = {}
  for source, name, r in runs:
    g = guidance(r)
    if g:
      groups.setdefault((explorer_rate(r['config']), r['config']['seed'],
                         explorer_settings(r['config'])), []).append((source, name, g))
  others = sorted({key[2] for key in groups})
  shared = ('the same in every row: ' + ', '.join(f'{k}={v}' for k, v in others[0])
            if len(others) == 1 else 'in the last column where they differ')
  lines = ['## What sets G: the explorers\' rate', '',
           'G as each run recorded it, grouped by the rate its explorers trained at and the seed '
           f'(which picks the explorers). The explorers\' other settings are {shared}. '
           '"Same in all" checks that every run of a row recorded the same G (it is computed '
           'before training, whatever the variant).', '',
           '| explorers\' rate | seed | runs | same in all | G mean | G median | share < 0.01 | '
           'share = 0 | G max |' + (' other settings |' if len(others) > 1 else ''),
           '|---|---|---|---|---|---|---|---|---|' + ('---|' if len(others) > 1 else '')]
  for (rate, seed, other), members in sorted(groups.items()):
    same = all(all(np.isclose(m[2][k], members[0][2][k], rtol=1e-6, atol=0)
                   for k in GUIDANCE_KEYS) for m in members)
    sources = sorted({m[0] for m in members})
    lines.append(f'| {rate:g} | {seed} | {len(members)} ({", ".join(sources)}) | '
                 f'{"yes" if same else "no"} | ' + ' | '.join(_g_cells(members[0][2])) + ' |' +
                 (' ' + ', '.join(f'{k}={v}' for k, v in other) + ' |' if len(others) > 1 else ''))
  return lines + ['']


def _best(runs, algorithm: str) -> dict | None:
  """The finished, not diverged tuning point of `algorithm` with the best last-10 mean."""
  done = [r for r in runs if r['config']['algorithm'] == algorithm and r['finished']
          and r['diverged'] is None]
  return max(done, key=lambda r: r['last10_mean_accuracy']) if done else None


def _point(r: dict | None, runs, algorithm: str) -> list:
  """Best point (marked when on its grid's edge), explorers' rate, last-10, G median, and how
  many of the grid's points finished or diverged."""
  grid = SUITE.grid[algorithm]
  total = len(records.grid_points(grid))
  ended = sum(r2['config']['algorithm'] == algorithm and bool(r2['finished'] or r2['diverged'])
              for r2 in runs)
  if r is None:
    return ['none finished', '', '', '', f'{ended} of {total}']
  g = guidance(r)
  values = ', '.join(f'{k}={r["config"][k]:g}' +
                     (' (grid edge)' if len(v) > 1 and r['config'][k] in (min(v), max(v)) else '')
                     for k, v in grid.items())
  return [values, f'{explorer_rate(r["config"]):g}' if g else 'n/a',
          paired.pct(r['last10_mean_accuracy']), f'{g["guidance_median"]:.2g}' if g else 'n/a',
          f'{ended} of {total}']


def _tuning_lines(runs) -> list:
  tuning = [r for source, _, r in runs if source == 'tuning']
  earlier = [r for source, _, r in runs if source == 'superseded tuning']
  lines = ['## The guided variants\' best tuning points under each exploration rule', '',
           f'Tuning at seed {declaration.TUNING_SEED}, {SUITE.tuning_rounds} rounds. First rule '
           '(superseded): the explorers trained at the point\'s client rate, so every client '
           'rate of a guided grid also changed G (FedLEx-SGD, which has no client step, '
           'explored at the default client rate, 0.01, at every point). Now: the explorers '
           f'train at {EXPLORATION_LR:g} at every point of every guided grid, one G per '
           'seed, and the grid changes the steps only. Finished: grid points finished or '
           'diverged of the grid\'s.', '',
           '| variant | rule | best point | explorers\' rate | last-10 (%) | G median | '
           'finished |', '|---|---|---|---|---|---|---|']
  for base, guided in ((c.baseline, c.method) for c in SUITE.comparisons):
    for label, pool, algorithm in ((f'{base} (base)', tuning, base),
                                   (guided, earlier, guided), (guided, tuning, guided)):
      rule = ('no G' if pool is tuning and algorithm == base else
              'first rule (superseded)' if pool is earlier else
              f'explorers at {EXPLORATION_LR:g}')
      lines.append(f'| {label} | {rule} | ' +
                   ' | '.join(_point(_best(pool, algorithm), pool, algorithm)) + ' |')
  tuned = suites.load_tuned(SUITE.name) or {}
  rates = {b: tuned[b]['client_lr'] for b in (c.baseline for c in SUITE.comparisons)
           if 'client_lr' in tuned.get(b, {})}
  if rates:
    differ = {b: r for b, r in rates.items() if r != EXPLORATION_LR}
    lines += ['', 'The bases\' tuned client rates: ' +
              ', '.join(f'{b} {r:g}' for b, r in rates.items()) + '; the explorers\' rate, '
              f'{EXPLORATION_LR:g}, ' + (
                  'is theirs.' if not differ else
                  'differs from ' + ', '.join(differ) + '\'s (fixed before their tuning '
                  'ended; the explorers train unguided, so any base rate is a fair choice, '
                  'but it is not the tuned one).')]
  return lines + ['']


def nearest_point(points: list, rate: float) -> dict | None:
  """The finished point whose step rate is nearest `rate` on a log scale (None if none)."""
  done = [r for r in points if r['finished'] and r['diverged'] is None]
  if not done:
    return None
  return min(done, key=lambda r: (abs(np.log(step_rate(r['config']) / rate)),
                                  step_rate(r['config'])))


def _equal_step_lines(runs) -> list:
  tuning = [r for source, _, r in runs if source == 'tuning']
  lines = ['## The guided variants against their bases at the same mean step', '',
           'G shrinks the step of most coordinates and keeps a few large: at step rate r the '
           'guided variant moves coordinate i by r·G_i times the gradient, on average r·Ḡ, at '
           'most r·G_max. Each row takes the guided variant\'s best tuning point (explorers at '
           f'{EXPLORATION_LR:g}) and sets beside it the base\'s tuning point whose step '
           'rate is nearest r·Ḡ (log scale; the base\'s grid bounds how near), and the base\'s '
           'best. If the guided variant beats the base at the same mean step but not the '
           'base\'s best, G\'s shape helps, but its spread (G_max / Ḡ) forces a compromise: '
           'a rate that gave most coordinates the base\'s step would give the largest ones '
           'hundreds of times more. '
           'FedLEx-Opt is left out: its server Adam rescales each coordinate.', '',
           '| comparison | guided: r, last-10 (%) | r·Ḡ | r·G_max | base at the nearest rate '
           '(%) | base\'s best: rate, last-10 (%) |', '|---|---|---|---|---|---|']
  for c in SUITE.comparisons:
    if c.method == 'fedlex_opt':
      continue
    guided = _best([r for r in tuning if guidance(r)], c.method)
    base_points = [r for r in tuning if r['config']['algorithm'] == c.baseline]
    best = _best(base_points, c.baseline)
    if guided is None or best is None:
      lines.append(f'| {c.label} | not tuned yet | | | | |')
      continue
    g, rate = guidance(guided), step_rate(guided['config'])
    near = nearest_point(base_points, rate * g['guidance_mean'])
    lines.append(f'| {c.label} | {rate:g}, {paired.pct(guided["last10_mean_accuracy"])} | '
                 f'{rate * g["guidance_mean"]:.2g} | {rate * g["guidance_max"]:.2g} | '
                 f'{paired.pct(near["last10_mean_accuracy"])} at {step_rate(near["config"]):g} | '
                 f'{step_rate(best["config"]):g}, {paired.pct(best["last10_mean_accuracy"])} |')
  return lines + ['']


def window_means(curve_rounds, curve_accuracy, width: int, total: int) -> list:
  """Mean test accuracy over each `width`-round window of rounds 1..total (NaN if none)."""
  rounds, acc = np.asarray(curve_rounds), np.asarray(curve_accuracy, np.float64)
  out = []
  for start in range(0, total, width):
    inside = (rounds > start) & (rounds <= start + width)
    out.append(float(acc[inside].mean()) if inside.any() else float('nan'))
  return out


def _runs_lines() -> list:
  total, runs = suite_runs.collect_reported(SUITE)   # at the length the suite's pages report
  width = max(1, suite_runs.plateau_window(total))   # as the plateau criterion's window
  lines = ['## The reported runs: G, the steps it scales, the margin over rounds', '',
           'Mean ± std over the seeds where both runs finished. The step rate is the rate that '
           'multiplies a method\'s step (the client rate; FedSGD\'s server rate); G mean × '
           'rate is the guided variant\'s average step rate per coordinate, G median × rate '
           'its typical one; not given for FedLEx-Opt, whose server Adam divides each '
           'coordinate\'s update by its running size and so undoes most of G\'s scale. '
           'Margin: guided − base of the same seed, in points.', '']
  header = ['| comparison | seeds | G mean | G median | share < 0.01 | base rate | guided rate | '
            'G mean × rate | G median × rate | base (%) | guided (%) | margin |',
            '|---|---|---|---|---|---|---|---|---|---|---|---|']
  rows, windows = [], []
  for c in SUITE.comparisons:
    base = {s: r for s, r in runs[c.baseline].items() if records.usable(r)}
    guided = {s: r for s, r in runs[c.method].items() if records.usable(r)}
    rows.append(paired.paired_row(c.label, (base, guided),
                                  functools.partial(_guidance_cells, base, guided), 12))
    seeds = paired.paired_seeds(base, guided)
    if not seeds:
      continue
    per_seed = [np.subtract(window_means(guided[s]['curve_rounds'], guided[s]['curve_accuracy'],
                                         width, total),
                            window_means(base[s]['curve_rounds'], base[s]['curve_accuracy'],
                                         width, total)) for s in seeds]
    windows.append((c.label, per_seed))
  lines += header + rows + ['']
  if windows:
    names = [f'{a + 1}-{min(a + width, total)}' for a in range(0, total, width)]
    lines += [f'Margin (points) over {width}-round windows, mean ± std over seeds:', '',
              '| comparison | ' + ' | '.join(names) + ' |',
              '|---|' + '---|' * len(names)]
    for label, per_seed in windows:
      cells = [paired.over_seeds([m[i] for m in per_seed], scale=100, signed=True)
               for i in range(len(names))]
      lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
    lines.append('')
    lines += _seed_window_lines(runs, width, total)
  stuck = stuck_at_chance(runs)
  if stuck:
    lines += ['Stuck at chance (finished, losses finite, test accuracy never above '
              f'{100 * suite_runs.STUCK:.0f}%): ' + ', '.join(stuck) + '. Kept in every mean '
              'above.', '']
  return lines


def _guidance_cells(base: dict, guided: dict, seeds: list) -> list:
  """A comparison's cells of the reported runs' table over its paired seeds: G, the rates
  and the steps they make, both runs' last-10 means and their margin."""
  g = [guidance(guided[s]) for s in seeds]
  b_rate, g_rate = step_rate(base[seeds[0]]['config']), step_rate(guided[seeds[0]]['config'])
  adam = guided[seeds[0]]['config']['algorithm'] == 'fedlex_opt'
  b_acc = [base[s]['last10_mean_accuracy'] for s in seeds]
  g_acc = [guided[s]['last10_mean_accuracy'] for s in seeds]
  steps = (['n/a (server Adam)'] * 2 if adam else
           [paired.over_seeds([x[k] * g_rate for x in g], '.2g')
            for k in ('guidance_mean', 'guidance_median')])
  return [paired.over_seeds([x['guidance_mean'] for x in g], '.2g'),
          paired.over_seeds([x['guidance_median'] for x in g], '.2g'),
          paired.over_seeds([x['guidance_below_0_01'] for x in g], '.3f'),
          f'{b_rate:g}', f'{g_rate:g}', *steps,
          paired.over_seeds(b_acc, scale=100), paired.over_seeds(g_acc, scale=100),
          paired.over_seeds(paired.margins(g_acc, b_acc), scale=100, signed=True)]


def _seed_window_lines(runs: dict, width: int, total: int) -> list:
  """Each finished run's mean test accuracy per seed over the margin table's windows: the
  reported runs, then the runs of each probe made at the same length (a seed's margin in a
  window, or a run's gain from one window to the next, is the difference of two cells)."""
  rows = [(run, '', seeds) for run, seeds in runs.items()]
  for probe in SUITE.probes:
    if SUITE.probe_overrides(probe, probe.runs[0])['rounds'] != total:
      continue   # its windows are not these
    made = suite_runs.collect_probe(SUITE, probe)
    rows += [(run, f' (probe `{probe.name}`)', made[run]) for run in probe.runs if run in made]
  names = [f'{a + 1}-{min(a + width, total)}' for a in range(0, total, width)]
  lines = [f'Mean test accuracy (%) of each run and seed over the same {width}-round windows:',
           '', '| run | seed | ' + ' | '.join(names) + ' |', '|---|---|' + '---|' * len(names)]
  for run, where, seeds in rows:
    for seed, r in sorted(seeds.items()):
      if records.usable(r):
        means = window_means(r['curve_rounds'], r['curve_accuracy'], width, total)
        lines.append(f'| {run}{where} | {seed} | '
                     + ' | '.join(suite_runs.num(100 * m) for m in means) + ' |')
  return lines + ['']


def stuck_at_chance(runs: dict) -> list:
  """'name seed S (round-1 client train loss L)' for every run of `runs` ({run: {seed:
  loaded run}}) that never left chance (`suite_runs.never_left_chance`)."""
  out = []
  for run, seeds in runs.items():
    for seed, r in sorted(seeds.items()):
      if suite_runs.never_left_chance(r):
        rows = records.metrics_rows(r['dir'])
        loss = records.metrics_column(rows[:1], 'client_work/train/loss')
        out.append(f'{run} seed {seed} (round-1 client train loss {loss[0]:.2g})')
  return out


def _floor_probe_lines() -> list:
  """The probe that floors G (suite probe `guidance_floor`): each guided variant with G
  floored against the same variant unfloored and against its base, seed by seed."""
  probe = next((p for p in SUITE.probes if p.overrides.get('fedlex_guidance_floor')), None)
  if probe is None:
    return []
  floor = probe.overrides['fedlex_guidance_floor']
  length = probe.overrides.get('rounds', SUITE.common['rounds'])
  floored, reported = suite_runs.collect_probe(SUITE, probe), suite_runs.collect_at(SUITE, length)
  base_of = {c.method: c.baseline for c in SUITE.comparisons}
  changes = ', '.join(f'`{k}={v}`' for k, v in sorted(probe.overrides.items()))
  lines = [f'## G floored at {floor:g}: probe `{probe.name}`', '',
           f'{probe.question[0].upper()}{probe.question[1:]} The same guided variants at the '
           f'same rates, G floored at {floor:g} ({changes}), '
           'set beside the reported unfloored runs and the bases of the same seeds, all at the '
           f'probe\'s length ({length} rounds; mean ± std of the last-10 mean over the seeds '
           'where all three got there; differences are per seed, in points). '
           'The floor lifts the smallest entries only: the largest steps stay r·G_max.', '',
           '| variant | seeds | floored G mean | floored G mean × rate | base (%) | guided (%) | '
           'floored (%) | floored − guided | floored − base |',
           '|---|---|---|---|---|---|---|---|---|']
  for run in probe.runs:
    f = {s: r for s, r in floored.get(run, {}).items() if records.usable(r)}
    g = {s: r for s, r in reported[run].items() if records.usable(r)}
    b = {s: r for s, r in floored[base_of[run]].items() if records.usable(r)}
    lines.append(paired.paired_row(run, (f, g, b),
                                   functools.partial(_floor_cells, f, g, b, length), 9))
  diverged = sorted(f'{run} seed {s}' for run, seeds_ in floored.items() if run in base_of
                    for s, r in seeds_.items() if r['diverged'] is not None)
  if diverged:
    lines += ['', 'Diverged with G floored: ' + ', '.join(diverged) + '.']
  stuck = stuck_at_chance({run: seeds_ for run, seeds_ in floored.items() if run in base_of})
  if stuck:
    lines += ['', f'Stuck at chance with G floored (test accuracy never above '
              f'{100 * suite_runs.STUCK:.0f}%): ' + ', '.join(stuck) + '.']
  return lines + ['']


def _floor_cells(floored: dict, guided: dict, base: dict, length: int, seeds: list) -> list:
  """A guided variant's cells of the floor probe's table over the seeds where it finished
  floored and unfloored and its base finished, each read at the probe's `length`."""
  f, g, b = ([records.at_length(runs[s], length)['last10_mean_accuracy'] for s in seeds]
             for runs in (floored, guided, base))
  rate = step_rate(floored[seeds[0]]['config'])
  g_mean = [guidance(floored[s])['guidance_mean'] for s in seeds]
  adam = floored[seeds[0]]['config']['algorithm'] == 'fedlex_opt'
  return [paired.over_seeds(g_mean, '.2g'),
          'n/a (server Adam)' if adam else paired.over_seeds([x * rate for x in g_mean], '.2g'),
          paired.over_seeds(b, scale=100), paired.over_seeds(g, scale=100),
          paired.over_seeds(f, scale=100),
          paired.over_seeds(paired.margins(f, g), scale=100, signed=True),
          paired.over_seeds(paired.margins(f, b), scale=100, signed=True)]


def _superseded_lines(runs) -> list:
  earlier = [(name, r) for source, name, r in runs if source == 'superseded tuning']
  now = {name: r for source, name, r in runs if source == 'tuning'}
  lines = ['## Every superseded tuning point (`earlier_runs/tuning`)', '',
           'Made under the first rule: the explorers trained at the point\'s client rate '
           '(FedLEx-SGD\'s at the default 0.01). Kept, not reported; runs stopped unfinished '
           'are listed as such. A point whose explorers already trained at '
           f'{EXPLORATION_LR:g} has the same settings as the new rule\'s point of that '
           'name, so (runs being deterministic) the two must agree: the last column shows the '
           'new one.', '',
           '| point | explorers\' rate | status | last-10 (%) | G median | the new rule\'s '
           'point, same settings (%) |', '|---|---|---|---|---|---|']
  for name, r in earlier:
    status = (r['diverged'] if r['diverged'] else 'finished' if r['finished'] else
              f'stopped unfinished after round {r["rounds_done"]} of {r["rounds"]}')
    g = guidance(r)
    twin = now.get(name)
    same = twin is not None and twin['finished'] and same_training(r['config'], twin['config'])
    lines.append(f'| {name} | {explorer_rate(r["config"]):g} | {status} | '
                 f'{paired.pct(r["last10_mean_accuracy"]) if r["finished"] else ""} | '
                 f'{format(g["guidance_median"], ".2g") if g else ""} | '
                 f'{paired.pct(twin["last10_mean_accuracy"]) if same else ""} |')
  return lines + ['']


# What G does to a client Adam step: Adam divides each coordinate's step by the root of its
# squared-gradient average, so a fixed per-coordinate factor on the gradient largely cancels
# (all but where G*|g| nears the effective eps: TFF's build_adam adds eps to the
# un-corrected sqrt(v), i.e. eps / sqrt(1 - beta_2^t) against the bias-corrected one).
ADAM_SUITE = suites.SUITES['fedlex_adam_tuned']
# The reference code's client Adam rate, at which the Adam suite's explorers train (its study
# file's).
FEDLEX_REFERENCE_ADAM_LR = ADAM_SUITE.runs['fedlex_avgm']['fedlex_exploration_lr']
ADAM_STEPS = os.path.join(suites.suite_dir(ADAM_SUITE.name), 'adam_steps.json')


def _norm(tensors) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in tensors)))


def _cosine(a, b) -> float:
  dot = sum(float(np.sum(np.asarray(x, np.float64) * np.asarray(y, np.float64)))
            for x, y in zip(a, b))
  return dot / (_norm(a) * _norm(b))


def batch_gradient(keras_model, loss_fn, weights, element, idx) -> list:
  """The loss's gradient at `weights` (the trainable ones) on the examples `idx` of
  `element`, through `keras_model` in training mode."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for v, w in zip(keras_model.trainable_variables, weights):
    v.assign(w)
  with tf.GradientTape() as tape:
    loss = loss_fn(element['y'][idx], keras_model(element['x'][idx], training=True))
  return tape.gradient(loss, keras_model.trainable_variables)


def local_epoch(keras_model, loss_fn, optimizer, initial, element, batch_size: int,
                guidance=None) -> tuple:
  """(first step, whole-epoch update) of one client epoch from `initial` (trainable weights),
  in the batch order of `element['order'][0]`, every gradient times `guidance` when given:
  the client work's loop (`local_training`) written out in eager TF."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  weights = [tf.constant(w) for w in initial]
  state = optimizer.initialize([tf.TensorSpec(w.shape, w.dtype) for w in weights])
  order = element['order'][0]
  first = None
  for start in range(0, len(order), batch_size):
    grads = batch_gradient(keras_model, loss_fn, weights, element,
                           order[start:start + batch_size])
    if guidance is not None:
      grads = [g * m for g, m in zip(grads, guidance)]
    state, new = optimizer.next(state, weights, grads)
    if first is None:
      first = [n - w for n, w in zip(new, weights)]
    weights = list(new)
  return first, [w - w0 for w, w0 in zip(weights, initial)]


def adam_steps(seed: int) -> dict:
  """FedLEx-AvgM's G at the fedlex_adam_tuned suite's settings (the exploration its run
  makes before round 1, recomputed) and what it does to round 1's client steps from w_0:
  each participant's first step and one-epoch update under client Adam at the suite's
  rates, guided over unguided (norm ratio, cosine), beside the SGD step's ratio |G*g|/|g|."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import execution, fedlex  # pylint: disable=g-import-not-at-top
  from tff_algos.models import model_fns, zoo  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  tuned = suites.load_tuned(ADAM_SUITE.name) or {}
  c = suites.experiment_config(ADAM_SUITE.config_overrides('fedlex_avgm', tuned), seed,
                               '/nonexistent', 'adam_steps')
  fed = experiment.load_federated_data(c)
  model_name, model_fn, process, _ = computations.build_computations(c, fed, c.num_clients)
  state, stats = fedlex_exploration.explored_initial_state(c, fed, process, model_fn, c.num_clients)
  g = [np.asarray(t) for t in fedlex.get_guidance(state)]
  w0 = [np.asarray(t) for t in process.get_model_weights(state).trainable]
  x0, _ = fed.client_arrays(0)
  keras_model = zoo.build_keras_model(model_name, tuple(x0.shape[1:]), fed.num_classes,
                                      seed=c.seed)
  loss_fn = model_fns.model_loss(model_name)
  _, inputs = data.round_inputs(fed, 1, c.clients_per_round, 1, c.seed)
  rates = sorted({c.client_lr, FEDLEX_REFERENCE_ADAM_LR})
  by_rate = {}
  for rate in rates:
    rows = []
    for element in inputs:
      opt = computations.client_optimizer(c, rate)
      first_u, epoch_u = local_epoch(keras_model, loss_fn, opt, w0, element, c.batch_size)
      first_g, epoch_g = local_epoch(keras_model, loss_fn, opt, w0, element, c.batch_size, g)
      rows.append(dict(first_step=_norm(first_g) / _norm(first_u),
                       epoch=_norm(epoch_g) / _norm(epoch_u),
                       epoch_cosine=_cosine(epoch_g, epoch_u)))
    by_rate[f'{rate:g}'] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
  # Under SGD the step is the rate times the (guided) gradient: the first batch's ratio.
  element = inputs[0]
  grads = [np.asarray(t) for t in batch_gradient(keras_model, loss_fn, w0, element,
                                                 element['order'][0][:c.batch_size])]
  return dict(guidance={k: v for k, v in stats.items() if k.startswith('guidance_')},
              adam=by_rate, sgd_first_step=_norm([a * b for a, b in zip(grads, g)]) / _norm(grads),
              participants=len(inputs))


def record_adam_steps(out: str = ADAM_STEPS) -> dict:
  recorded = {str(seed): adam_steps(seed) for seed in suites.SEEDS}
  os.makedirs(os.path.dirname(out), exist_ok=True)
  generated_files.write_json(out, recorded)
  return recorded


def _adam_step_lines() -> list:
  if not os.path.exists(ADAM_STEPS):
    return []
  with open(ADAM_STEPS) as f:
    recorded = json.load(f)
  dirs = {seed: os.path.join(suites.suite_dir(ADAM_SUITE.name), 'runs',
                             declaration.run_name('fedlex_avgm', int(seed))) for seed in recorded}
  runs = {seed: records.load_run(d) if os.path.exists(os.path.join(d, 'config.json')) else None
          for seed, d in dirs.items()}
  rates = sorted({r for m in recorded.values() for r in m['adam']}, key=float)
  lines = ['## Under client Adam (TFF\'s, as these runs trained)', '',
           'The fedlex_adam_tuned suite\'s FedLEx-AvgM (explorers on Adam at '
           f'{FEDLEX_REFERENCE_ADAM_LR:g}): its G, recomputed as the run computes it before round '
           '1 (`python -m benchmarks.fedlex_diagnosis --adam_steps`), and what G does to round '
           '1\'s client steps from w_0, averaged over its participants: the guided over the '
           'unguided norm of the first Adam step and of the one-epoch update, and their cosine. '
           'Adam divides each coordinate by its own gradient scale, so a fixed factor per '
           'coordinate cancels except where G·|g| nears eps; these runs used TFF\'s '
           '`build_adam` (eps 1e-8 added to the un-corrected √v, i.e. 1e-8 / √(1 − β₂ᵗ) '
           'against the bias-corrected √v̂: 3.2e-7 at step 1), not PyTorch\'s Adam of the '
           'reference code (`--client_optimizer=torch_adam`). Under SGD the step is scaled by '
           'G itself (last column, first batch).', '',
           '| seed | G as its run recorded | G mean | G median | share < 0.01 | '
           + ' | '.join(f'Adam {r}: first step | epoch | cosine' for r in rates)
           + ' | SGD step |', '|---|---|---|---|---|' + '---|---|---|' * len(rates) + '---|']
  for seed, m in sorted(recorded.items()):
    g = m['guidance']
    run_g = guidance(runs[seed]) if runs[seed] else {}
    same = ('not run yet' if not run_g else 'same' if all(
        np.isclose(run_g.get(k, np.nan), v, rtol=1e-5) for k, v in g.items()) else 'differs')
    cells = ''.join(f' {m["adam"][r]["first_step"]:.3f} | {m["adam"][r]["epoch"]:.3f} | '
                    f'{m["adam"][r]["epoch_cosine"]:.3f} |' for r in rates)
    lines.append(f'| {seed} | {same} | {g["guidance_mean"]:.2g} | {g["guidance_median"]:.2g} | '
                 f'{g["guidance_below_0_01"]:.3f} |{cells} {m["sgd_first_step"]:.3g} |')

  def span(values, spec='.2f') -> str:
    return f'{min(values):{spec}} to {max(values):{spec}}'
  adam = [a for m in recorded.values() for a in m['adam'].values()]
  zero = [m['guidance']['guidance_zero_fraction'] for m in recorded.values()]
  lines += ['', 'So under Adam G leaves a step nearly as it is: the guided first step has '
            f'{span([a["first_step"] for a in adam])} of the unguided one\'s norm and the epoch\'s '
            f'update {span([a["epoch"] for a in adam])}, pointing the same way (cosine '
            f'{span([a["epoch_cosine"] for a in adam])}); what it removes are the coordinates '
            f'where G is 0 ({span(zero, ".1%")} of them) or G·|g| is as small as eps. Under SGD '
            f'the same G shrinks the step to {span([m["sgd_first_step"] for m in recorded.values()])}'
            ' of its norm: the "G freezes coordinates" reading of the SGD runs does not carry '
            'over to Adam, where G is close to no guidance at all.']
  return lines + ['']


def page() -> str:
  runs = recorded_runs()
  lines = suite_runs.diagnosis_header(f'{SUITE.title}: what the guidance G is',
                                  sys.modules[__name__])
  lines += (_g_by_rate_lines(runs) + _tuning_lines(runs) + _equal_step_lines(runs) +
            _runs_lines() + _floor_probe_lines() + _adam_step_lines() +
            _superseded_lines(runs))
  return '\n'.join(lines).rstrip('\n') + '\n'


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv == ['--adam_steps']:
    record_adam_steps()
  elif argv:
    print(f'unknown arguments {argv}: run it without any, or with --adam_steps',
          file=sys.stderr)
    return 2
  return suite_runs.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
