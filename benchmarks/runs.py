"""The one layer that reads benchmark run directories (compare, the pages, the diagnoses).

A run directory is an ordinary experiment directory of `programs.train` (config.json,
metrics.csv, summary.json; benchmarks/<suite>/runs/<run>_s<seed>, tuning runs under
tuning/, probe runs under probes/<probe>/, shorter makings of a lengthened suite under
earlier_runs/rounds<N>/). `load_run` reads one; `collect` reads a suite's runs (its own and
those it borrows from another suite) at the length its pages report; `at_length` reads a run
over its first rounds. Accuracy of a run = the mean test accuracy of its last LAST
evaluations (or its best, `CRITERION_KEYS`); across seeds, `programs.studies.paired` reads
them (mean ± sample standard deviation, paired margins).
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
import os
import re
from typing import Callable, Optional

import numpy as np

from benchmarks import suites
from programs import experiment_config
from programs import pages
from programs import run_directory
from programs import run_results


LAST = 10                 # rounds in the headline mean


# A loaded run's figure for each suites.CRITERIA.
CRITERION_KEYS = dict(last10='last10_mean_accuracy', best='best_accuracy')


PLATEAU_POINTS = 0.5      # a curve has plateaued when its last window moved less than this


def grid_points(grid: dict) -> list:
  keys = sorted(grid)
  return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def load_run(exp_dir: str, rounds: Optional[int] = None) -> dict:
  """One run's curve and headline numbers; `finished` says whether all rounds are in.

  `rounds` is the length the run is meant to reach (default: its config's); a run made
  shorter and since lengthened in its suite is not finished until it is extended.
  """
  with open(os.path.join(exp_dir, 'config.json')) as f:
    config = json.load(f)
  rows = []
  metrics = os.path.join(exp_dir, 'metrics.csv')
  if os.path.exists(metrics):
    with open(metrics, newline='') as f:
      rows = list(csv.DictReader(f))
  curve = [(int(r['round']), float(r['test_accuracy'])) for r in rows if r.get('test_accuracy')]
  summary_path = os.path.join(exp_dir, 'summary.json')
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  diverged = None
  if os.path.exists(os.path.join(exp_dir, run_directory.DIVERGED)):
    with open(os.path.join(exp_dir, run_directory.DIVERGED)) as f:
      diverged = f.read().strip()
  rounds = rounds or config['rounds']
  done = int(rows[-1]['round']) if rows else 0
  # Clients whose update was not finite are left out of their round's aggregate (the program
  # goes on without them): (round, how many) of every such round up to `rounds`.
  dropped = [(int(r['round']), int(float(r['dropped_clients']))) for r in rows
             if r.get('dropped_clients') and float(r['dropped_clients']) > 0
             and int(r['round']) <= rounds]
  return dict(
      dir=exp_dir, config=config, rounds=rounds, rounds_done=done, diverged=diverged, rows=rows,
      dropped_clients=dropped,
      finished=summary.get('rounds') == rounds and done == rounds,
      **_curve_figures(curve, rounds),
      seconds_per_round=_median_seconds(rows),
      client_epochs_training=summary.get('client_epochs_training'),
      exploration_client_epochs=summary.get('exploration_client_epochs', 0.0),
      aggregator_state_bytes=summary.get('aggregator_state_bytes', 0),
      summary=summary)


def _curve_figures(curve: list, rounds: int) -> dict:
  """A run's curve ([(round, accuracy)]) up to `rounds` and its headline figures there."""
  kept = [(r, a) for r, a in curve if r <= rounds]
  acc = np.array([a for _, a in kept])
  tail = [a for _, a in kept[-LAST:]]   # the last LAST evaluations (last_evaluations)
  return dict(curve_rounds=[r for r, _ in kept], curve_accuracy=[a for _, a in kept],
              last10_mean_accuracy=float(np.mean(tail)) if tail else float('nan'),
              final_accuracy=float(acc[-1]) if acc.size else float('nan'),
              best_accuracy=float(acc.max()) if acc.size else float('nan'))


def diagnosis_header(title: str, module) -> list:
  """A diagnosis page's first lines: its title, who writes it, and what it measures (the
  third paragraph of the writing module's docstring)."""
  return [f'# {title}', '',
          # (the spec's name, not __name__, which is '__main__' under `python -m`)
          f'<!-- written by `python -m {module.__spec__.name}`; do not edit by hand -->', '',
          ' '.join(module.__doc__.split('\n\n')[2].split()), '']


def write_diagnosis(out: str, page: Callable[[], str]) -> int:
  """A diagnosis script's main: writes its page to `out` and says so."""
  pages.write_text(out, page())
  print(f'wrote {os.path.relpath(out)}')
  return 0


def metrics_rows(exp_dir: str) -> list:
  """A run's metrics.csv, one dict per round (the diagnosis scripts read its columns)."""
  with open(os.path.join(exp_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def metrics_column(rows, key) -> np.ndarray:
  """One column of `metrics_rows` as floats (NaN where a round has no value)."""
  return np.array([float(r[key]) if r.get(key) not in (None, '') else np.nan for r in rows])


def last10_of(acc: np.ndarray) -> float:
  """The mean of a per-round accuracy column's last LAST evaluated values (NaN: not
  evaluated), as summary.json's last-10 mean; NaN when none was evaluated."""
  evaluated = np.asarray(acc, np.float64)
  evaluated = evaluated[np.isfinite(evaluated)]
  return float(np.mean(evaluated[-LAST:])) if evaluated.size else float('nan')


def run_rows(run: dict) -> list:
  """A loaded run's metrics rows over the length it is read at (a run lengthened past the
  length a page reports is read over its first rounds)."""
  return [r for r in run['rows'] if int(r['round']) <= run['rounds']]


def suite_metrics(suite: suites.Suite) -> dict:
  """{run: {seed: metrics rows}} of the suite's usable runs (finished, at today's settings)
  at the length its pages report (`reported_rounds`)."""
  return {run: {seed: run_rows(r) for seed, r in seeds.items() if usable(r)}
          for run, seeds in collect(suite).items()}


# Columns two makings of one run may record differently though they train alike.
TIMING_COLUMNS = ('seconds', 'round_seconds')


EVALUATION_COLUMNS = ('test_accuracy', 'test_loss')


def with_kept_evaluations(suite: suites.Suite, metrics: dict) -> tuple:
  """({run: {seed: rows}}, {(run, seed): (kept length, rounds filled)}): `suite_metrics`
  rows with the test figures of rounds they did not evaluate taken from a kept shorter
  making of the same run and seed (earlier_runs/rounds<N>/, longest first) that evaluated
  them, when that making records every other value alike on every round both ran (the same
  training, bit for bit; `TIMING_COLUMNS` aside). A making that differs anywhere lends
  nothing. A run made again longer, evaluated every few rounds, is so read every round
  where its shorter making was."""
  base = suites.suite_dir(suite.name)
  out, filled = {}, {}
  for run, seeds in metrics.items():
    out[run] = {}
    for seed, rows in seeds.items():
      rows = [dict(r) for r in rows]
      for n in reversed(kept_lengths(base)):
        path = os.path.join(kept_dir(base, n), suites.run_name(run, seed))
        if not os.path.exists(os.path.join(path, 'metrics.csv')):
          continue
        kept = metrics_rows(path)
        if len(kept) > len(rows) or any(
            a.get(k) != b[k] for a, b in zip(rows, kept) for k in b
            if k not in TIMING_COLUMNS and a.get(k) not in (None, '') and b[k] not in (None, '')):
          continue
        count = 0
        for a, b in zip(rows, kept):
          if a.get('test_accuracy') in (None, '') and b.get('test_accuracy') not in (None, ''):
            a.update({k: b[k] for k in EVALUATION_COLUMNS if k in b})
            count += 1
        if count:
          filled[(run, seed)] = (n, filled.get((run, seed), (n, 0))[1] + count)
      out[run][seed] = rows
  return out, filled


def probe_metrics(suite: suites.Suite, probe: suites.Probe) -> dict:
  """{run: {seed: metrics rows}} of a probe's usable runs, and of the reported runs it keeps
  `unchanged` (`collect_probe`: read from their own directories at the probe's length)."""
  return {run: {seed: run_rows(r) for seed, r in seeds.items() if usable(r)}
          for run, seeds in collect_probe(suite, probe).items()}


def source(suite: suites.Suite, run: str) -> tuple:
  """(suite, run name there) that makes `run`: the suite itself, or the one it borrows the
  run from (Suite.borrowed)."""
  if run in suite.borrowed:
    name, made_as = suite.borrowed[run]
    return suites.SUITES[name], made_as
  return suite, run


def seed_dirs(suite: suites.Suite, run: str) -> dict:
  """{seed: directory} of every seed ever run for `run` (none is dropped from a page); a
  borrowed run's in the suite that makes it."""
  maker, made_as = source(suite, run)
  return _seed_paths(os.path.join(suites.suite_dir(maker.name), 'runs'), made_as)


def _seed_paths(folder: str, run: str) -> dict:
  """{seed: directory} of `run`'s seeds in `folder` (directories <run>_s<seed> that hold a
  config.json)."""
  out = {}
  for path in glob.glob(os.path.join(folder, f'{glob.escape(run)}_s*')):
    m = re.fullmatch(re.escape(run) + r'_s(\d+)', os.path.basename(path))
    if m and os.path.exists(os.path.join(path, 'config.json')):
      out[int(m.group(1))] = path
  return dict(sorted(out.items()))


def mean_curve(runs: list) -> tuple:
  """(rounds, mean, std) of the runs' test accuracy over seeds, at the rounds every one of
  them evaluated (std 0 for one run)."""
  common = sorted(set.intersection(*(set(r['curve_rounds']) for r in runs))) if runs else []
  acc = np.array([[dict(zip(r['curve_rounds'], r['curve_accuracy']))[x] for x in common]
                  for r in runs], np.float64).reshape(len(runs), len(common))
  std = acc.std(0, ddof=1) if len(runs) > 1 else np.zeros(len(common))
  return np.array(common, np.int64), acc.mean(0), std


WINDOW = 50   # rounds of the plateau criterion's window, and per row of the diagnoses' tables


def _median_seconds(rows: list, rounds: Optional[int] = None) -> float:
  """The median training seconds of a run's rounds after the first (which traces and
  compiles), up to round `rounds` if given; NaN with none."""
  seconds = [float(r['seconds']) for r in rows
             if 1 < int(r['round']) <= (rounds or int(r['round']))]
  return float(np.median(seconds)) if seconds else float('nan')


def plateau_window(rounds: int) -> int:
  """The plateau criterion's window for a run of `rounds` rounds: WINDOW, or a quarter of a
  shorter run."""
  return min(WINDOW, rounds // 4)


def plateau_delta(runs: list) -> tuple:
  """(window W, points moved by the runs' mean curve (`mean_curve`) between its last two
  W-round windows, each the mean over the rounds evaluated in it)."""
  rounds, mean, _ = mean_curve(runs)
  w = plateau_window(int(rounds[-1])) if rounds.size else 0
  if w < 1:
    return 0, float('nan')
  end = rounds[-1]
  last = mean[rounds > end - w]
  before = mean[(rounds > end - 2 * w) & (rounds <= end - w)]
  if not before.size:
    return w, float('nan')
  return w, float(100 * last.mean() - 100 * before.mean())


def swing(acc) -> float:
  """How far a stretch of evaluated accuracies scatters about its trend: the std of their
  residuals from the least-squares line over its rounds (entry i: the stretch's round i + 1;
  NaN entries are rounds not evaluated); NaN with fewer than 3 evaluated rounds. Unlike
  round-to-round changes, it reads runs evaluated every round and every few rounds alike."""
  acc = np.asarray(acc, np.float64)
  rounds = np.flatnonzero(np.isfinite(acc)).astype(np.float64)
  if rounds.size < 3:
    return float('nan')
  values = acc[np.isfinite(acc)]
  slope, intercept = np.polyfit(rounds, values, 1)
  return float(np.std(values - (slope * rounds + intercept)))


def run_swing(run: dict, window: int) -> float:
  """`swing` of a loaded run's evaluated accuracies over its last `window` rounds."""
  end = run['rounds']
  acc = np.full(window, np.nan)
  for r, a in zip(run['curve_rounds'], run['curve_accuracy']):
    if end - window < r <= end:
      acc[r - (end - window) - 1] = a
  return swing(acc)


def window_marks(total: int, first: int = 0, width: int = WINDOW) -> list:
  """The last round of each row of an over-rounds table of rounds 1..total: `first` (a
  warmup's or acceleration's rounds, a row of their own when 0 < first < total), then every
  `width`-th round after it, and `total`."""
  return sorted(({first} if 0 < first < total else set()) |
                {m for m in range(width, total + 1, width) if m > first} | {total})


def window_accuracy(rows: list, start: int, stop: int) -> tuple:
  """(mean, swing) of the test accuracies evaluated in rounds start + 1..stop of a run's
  `metrics_rows` (row i: round i + 1); mean NaN when none was evaluated there."""
  acc = metrics_column(rows[start:stop], 'test_accuracy')
  return (float(np.nanmean(acc)) if np.isfinite(acc).any() else float('nan')), swing(acc)


CHANCE = 0.1   # every suite's data set, Fashion-MNIST, has ten classes


STUCK = 1.1 * CHANCE   # a run whose best test accuracy never passes this learned nothing


LEARNED = 2 * CHANCE   # one that passed this had learned something (`fell_to_chance`)


def never_left_chance(run: dict) -> bool:
  """Finished (losses finite), yet its test accuracy never rose above STUCK: e.g. a first
  step so large that the network's units died. It counts in every mean (no seed is
  dropped); the verdicts name it, since one such seed sets a margin's spread."""
  return usable(run) and run['best_accuracy'] <= STUCK


def fell_to_chance(run: dict) -> Optional[int]:
  """The first evaluated round of the stretch at chance (test accuracy at most STUCK) that a
  finished run ends in after it had learned (best accuracy above LEARNED; e.g. a late step
  so large that it wiped the model out), else None. Like a run that never left chance, it
  counts in every mean and the verdicts name it."""
  if not usable(run) or run['best_accuracy'] <= LEARNED:
    return None
  last_above = max((r for r, a in zip(run['curve_rounds'], run['curve_accuracy']) if a > STUCK),
                   default=None)
  return next((r for r in run['curve_rounds'] if r > last_above), None) if last_above else None


def pct(x: float) -> str:
  return 'n/a' if not np.isfinite(x) else f'{100 * x:.2f}'


def summary_value(run: dict, path: tuple) -> Optional[float]:
  """A run's summary.json value at `path` (None when it has none)."""
  v = run['summary']
  for key in path:
    v = v.get(key) if isinstance(v, dict) else None
  return None if v is None else float(v)


def num(x, spec: str = '.2f') -> str:
  return 'n/a' if x is None or not np.isfinite(x) else format(x, spec)


def settings_differences(run: dict, fields: dict) -> list:
  """'key=recorded (declared: value)' for every declared field that the run's config.json
  records otherwise: a run made before its declaration or tuned rate changed is not shown as
  a run of the new settings. Fields that do not change what a run computes (the program's
  RESUMABLE_CHANGES: its length, which `finished` judges, its evaluation schedule, ...) are
  not compared."""
  return [f'{k}={run["config"].get(k)} (declared: {v})' for k, v in sorted(fields.items())
          if k not in experiment_config.RESUMABLE_CHANGES and run['config'].get(k) != v]


def _declared_run(path: str, fields: dict) -> dict:
  run = load_run(path, fields['rounds'])
  run['stale'] = settings_differences(run, fields)
  return run


def collect(suite: suites.Suite) -> dict:
  """{run: {seed: loaded run}} of the suite at the length its pages report
  (`reported_rounds`: the declared one, or while the suite is being lengthened the longest
  length at which every run has every seed)."""
  return collect_reported(suite)[1]


def declared_rounds(suite: suites.Suite) -> int:
  return suite.common['rounds']


def collect_at(suite: suites.Suite, rounds: Optional[int] = None) -> dict:
  """{run: {seed: loaded run}} of every seed ever run, read at `rounds` rounds (default: the
  declared length). A seed made at a length of at least `rounds` and since made again longer
  (a lengthened suite makes its runs again from round 1, seed by seed) is read from the
  shortest such making, kept in earlier_runs/rounds<N>/ (`kept_lengths`); any other from
  runs/. A run longer than `rounds` is read over its first `rounds` (at_length): the run of
  that length, as the pages reported it then (e.g. evaluated every round where the longer
  making evaluates every few)."""
  rounds = rounds or declared_rounds(suite)
  tuned = suites.load_tuned(suite.name)
  out = {}
  for run in suite.run_names:
    fields = dict(suite.config_overrides(run, tuned), rounds=rounds)
    maker, made_as = source(suite, run)
    base = suites.suite_dir(maker.name)
    seeds = {}
    for n in kept_lengths(base, at_least=rounds) + [None]:
      paths = (seed_dirs(suite, run) if n is None else
               _seed_paths(kept_dir(base, n), made_as))
      for seed, path in paths.items():
        if seed not in seeds or not settled(seeds[seed]):
          seeds[seed] = _run_at(path, fields, n == rounds)
    out[run] = dict(sorted(seeds.items()))
  return out


def _run_at(path: str, fields: dict, kept_at_length: bool) -> dict:
  """A run's directory read at the declared fields' length: a making kept at that length as
  it is, any other over its first rounds (`at_length`)."""
  if kept_at_length:
    return _declared_run(path, fields)
  r = load_run(path)
  return dict(at_length(r, fields['rounds']), stale=settings_differences(r, fields))


def settled(run: dict) -> bool:
  """Usable, or diverged (deterministic: made again, it would diverge again)."""
  return usable(run) or bool(run['diverged'] and not run.get('stale'))


def reported_rounds(suite: suites.Suite) -> int:
  """The length the suite's pages report (`collect_reported`)."""
  return collect_reported(suite)[0]


def collect_reported(suite: suites.Suite) -> tuple:
  """(rounds, collect_at(suite, rounds)) at the length the suite's pages report: the
  declared rounds once every run is settled there for every seed of suites.SEEDS; while a
  lengthened suite is being made again seed by seed, the longest shorter length at which
  they all are (its runs made again read over their first rounds, the rest from
  earlier_runs/rounds<N>/ or not yet made again); the declared rounds when no length has
  them all."""
  declared = declared_rounds(suite)
  lengths = {declared, *kept_lengths(suites.suite_dir(suite.name))}
  for run in suite.runs:
    for path in seed_dirs(suite, run).values():
      with open(os.path.join(path, 'config.json')) as f:
        lengths.add(json.load(f)['rounds'])
  at_declared = None
  for n in sorted((n for n in lengths if n <= declared), reverse=True):
    runs = collect_at(suite, n)
    if at_declared is None:   # the first length tried is the declared one
      at_declared = runs
    if all(s in seeds and settled(seeds[s]) for seeds in runs.values() for s in suites.SEEDS):
      return n, runs
  return declared, at_declared


def collect_probe(suite: suites.Suite, probe: suites.Probe) -> dict:
  """{run: {seed: loaded run}} of a probe (its runs' directories that exist), and the
  suite's reported runs (the probe's seeds) of the runs it keeps `unchanged`."""
  tuned = suites.load_tuned(suite.name)
  out = {}
  for run in probe.runs:
    fields = suite.probe_overrides(probe, run, tuned)
    for seed in probe.seeds:
      path = os.path.join(suites.probe_dir(suite.name, probe.name), suites.run_name(run, seed))
      if os.path.exists(os.path.join(path, 'config.json')):
        out.setdefault(run, {})[seed] = _declared_run(path, fields)
  if probe.unchanged:   # read at the probe's length, whatever length the pages report
    reported = collect_at(suite,
                          suite.probe_overrides(probe, probe.unchanged[0], tuned)['rounds'])
    for run in probe.unchanged:
      out[run] = {s: r for s, r in reported[run].items() if s in probe.seeds}
  return out


def at_length(run: dict, rounds: int) -> dict:
  """A loaded run read as a run of `rounds` rounds: a reported run lengthened past a probe's
  pinned length is compared over its first `rounds` (the run of that length, since client
  sampling, batches and rates are functions of seed and round, not of the total). It is
  finished once it got there (a divergence later on, which records no round, is past it); its
  training seconds a round are those of its first `rounds`."""
  if run['rounds'] == rounds:
    return run
  reached = run['rounds_done'] >= rounds
  out = dict(run, rounds=rounds, rounds_done=min(run['rounds_done'], rounds), finished=reached,
             diverged=None if reached else run['diverged'],
             seconds_per_round=_median_seconds(run.get('rows', []), rounds),
             **_curve_figures(list(zip(run['curve_rounds'], run['curve_accuracy'])), rounds))
  if run['summary'].get('rounds') != rounds:   # a summary of another length is not this one's
    out.update(summary={}, **_costs_from_rows(run.get('rows', []), rounds))
  return out


def _costs_from_rows(rows: list, rounds: int) -> dict:
  """A run's costs over its first `rounds` rounds, read from its metrics rows as the program
  sums them into summary.json (client-epochs: None where the rows do not record every round's,
  e.g. a making that predates the column)."""
  kept = [r for r in rows if int(r['round']) <= rounds]
  recorded = (len(kept) == rounds and
              all(any(run_results.is_cost_column(k, 'client_epochs') and v
                      for k, v in r.items()) for r in kept))
  return dict(
      client_epochs_training=run_results.round_costs(kept, 'client_epochs') if recorded else None,
      exploration_client_epochs=float(kept[-1].get('exploration_client_epochs') or 0.0)
      if kept else 0.0)


def usable(run: dict) -> bool:
  """Finished, and made at the settings declared now."""
  return run['finished'] and not run.get('stale')


def checkpoint_rounds(rounds: int) -> list:
  """The rounds at which a table over rounds reads the curves (cadis_diagnosis): a round step
  of 10, 20, 25, 50 or 100 (the smallest giving at most 10 rows, dividing `rounds` when one does), and
  always the last round."""
  steps = [s for s in (10, 20, 25, 50, 100) if rounds / s <= 10] or [rounds]
  step = next((s for s in steps if rounds % s == 0), steps[0])
  marks = list(range(step, rounds + 1, step))
  return marks if marks and marks[-1] == rounds else marks + [rounds]


def last10_at(run: dict, end: int) -> float:
  """A run's mean test accuracy over its last LAST evaluations up to round `end` (NaN when
  none is in): rounds end - 9 .. end for a run evaluated every round, and at a run's end,
  which the program always evaluates LAST rounds in a row (--eval_last); a run evaluated
  every k rounds is read there over its last LAST * k rounds."""
  tail = [a for r, a in zip(run['curve_rounds'], run['curve_accuracy']) if r <= end][-LAST:]
  return float(np.mean(tail)) if tail else float('nan')


def on_common_rounds(*runs: dict) -> list:
  """Copies of loaded runs read only at the rounds every one of them evaluated: a run
  evaluated every round set beside one evaluated every k rounds (a probe against a reported
  run it keeps unchanged) would otherwise be read over different rounds (`last10_at`)."""
  common = set.intersection(*(set(r['curve_rounds']) for r in runs))
  return [{**r, **_curve_figures([(x, a) for x, a in zip(r['curve_rounds'], r['curve_accuracy'])
                                  if x in common], r['rounds'])} for r in runs]


def common_evaluations(*runs: list) -> list:
  """`on_common_rounds` for `metrics_rows` of the same rounds: copies whose test accuracy
  is blank at every round some other run did not evaluate (a recorded NaN counts as
  evaluated, as `load_run` reads it)."""
  if len({tuple(r['round'] for r in rows) for rows in runs}) > 1:
    raise ValueError('common_evaluations: the runs must record the same rounds')
  both = np.logical_and.reduce(
      [[row.get('test_accuracy') not in (None, '') for row in rows] for rows in runs])
  return [[{**row, 'test_accuracy': row['test_accuracy'] if keep else ''}
           for row, keep in zip(rows, both)] for rows in runs]


# The per-round values two makings of a run are compared on.
REMADE_COLUMNS = ('client_work/train/loss', 'test_accuracy', 'test_loss')


def kept_dir(suite_dir: str, rounds: int) -> str:
  """Where a suite keeps its reported runs of `rounds` rounds that it made again from round 1
  at a longer length (their checkpoints gone, e.g. on a new machine):
  earlier_runs/rounds<N>/, holding <run>_s<seed> directories."""
  return os.path.join(suite_dir, 'earlier_runs', f'rounds{rounds}')


def kept_lengths(suite_dir: str, at_least: int = 0) -> list:
  """The lengths N >= `at_least` of the suite's earlier_runs/rounds<N>/ (`kept_dir`),
  shortest first: at `rounds` rounds a suite's runs are read from the kept makings of
  kept_lengths(suite_dir, at_least=rounds), in that order, before runs/."""
  folder = os.path.join(suite_dir, 'earlier_runs')
  names = os.listdir(folder) if os.path.isdir(folder) else []
  lengths = (int(m.group(1)) for m in (re.fullmatch(r'rounds(\d+)', name) for name in names)
             if m)
  return sorted(n for n in lengths if n >= at_least and os.path.isdir(kept_dir(suite_dir, n)))


def remade_runs(suite: suites.Suite) -> list:
  """[{run, seed, length, first_difference, largest_gap, tail_rounds, earlier, again}] for every
  superseded shorter run whose run was made again longer at its settings (the next longer
  making: the next kept one, else runs/; at least as many rounds done), matched round by
  round: the first round where any of REMADE_COLUMNS
  that both record differs (None: none does; a making evaluated every k rounds records no
  test figures in between), the largest single-round test-accuracy gap, and both makings'
  means over the shorter run's last LAST evaluated rounds that the new making evaluated too
  (all of them when it evaluated every round)."""
  out = []
  base = suites.suite_dir(suite.name)
  lengths = kept_lengths(base)
  for kept_at, name in [(n, name) for n in lengths
                        for name in sorted(os.listdir(kept_dir(base, n)))]:
    path = os.path.join(kept_dir(base, kept_at), name)
    again_dir = next((os.path.join(kept_dir(base, n), name) for n in lengths
                      if n > kept_at
                      and os.path.exists(os.path.join(kept_dir(base, n), name, 'config.json'))),
                     os.path.join(base, 'runs', name))
    if not os.path.exists(os.path.join(path, 'config.json')):
      continue
    if not os.path.exists(os.path.join(again_dir, 'metrics.csv')):
      continue
    earlier, again = load_run(path), load_run(again_dir)
    length = earlier['rounds_done']
    if (not earlier['finished'] or again['rounds'] <= length or again['rounds_done'] < length
        or experiment_config.settings_changed(
            earlier['config'], experiment_config.recorded_config(again['config']))):
      continue   # not made again longer at its settings, or not yet as far as it went
    again_rows = {int(r['round']): r for r in again['rows']}
    first = None
    for a in earlier['rows']:
      b = again_rows.get(int(a['round']), {})
      if any(a[k] != b.get(k) for k in REMADE_COLUMNS
             if a.get(k) not in (None, '') and b.get(k) not in (None, '')):
        first = int(a['round'])
        break
    again_at = dict(zip(again['curve_rounds'], again['curve_accuracy']))
    evaluated = list(zip(earlier['curve_rounds'], earlier['curve_accuracy']))
    gaps = [abs(acc - again_at[r]) for r, acc in evaluated if r in again_at]
    tail = [(acc, again_at[r]) for r, acc in evaluated[-LAST:] if r in again_at]
    run, seed = name.rsplit('_s', 1)
    # The same rounds' training time in each making: with the training bit for bit the
    # same, a change is the machine's or the code's.
    out.append(dict(run=run, seed=int(seed), length=length, again_rounds=again['rounds'],
                    first_difference=first,
                    earlier_seconds=_median_seconds(earlier['rows'], length),
                    again_seconds=_median_seconds(again['rows'], length),
                    largest_gap=float(max(gaps, default=np.nan)), tail_rounds=len(tail),
                    earlier=float(np.mean([e for e, _ in tail])) if tail else np.nan,
                    again=float(np.mean([a for _, a in tail])) if tail else np.nan))
  return out


# Where a suite's runs of each kind live (under its directory), as compute_hours counts them.
RUN_KINDS = (('reported runs', 'runs/*'), ('tuning', 'tuning/*'), ('probes', 'probes/*/*'),
             ('superseded runs', 'earlier_runs/**'))


def recorded_runs(suite_name: str):
  """(kind, directory) of every run the suite has recorded metrics of (RUN_KINDS: reported,
  tuning, probes, superseded; finished or not)."""
  for kind, pattern in RUN_KINDS:
    for path in glob.glob(os.path.join(suites.suite_dir(suite_name), pattern, 'metrics.csv'),
                          recursive=True):
      yield kind, os.path.dirname(path)


def recorded_metrics(suite_name: str):
  """(kind, metrics rows) of every run of `recorded_runs`."""
  for kind, directory in recorded_runs(suite_name):
    yield kind, metrics_rows(directory)


def compute_hours(suite_name: str) -> dict:
  """{kind: hours} the suite's recorded rounds took (metrics.csv's `seconds`, summed over
  every run directory of that kind, finished or not)."""
  out = {kind: 0.0 for kind, _ in RUN_KINDS}
  for kind, rows in recorded_metrics(suite_name):
    out[kind] += float(np.nansum(metrics_column(rows, 'seconds'))) / 3600
  return out


def whole_round_record(suite_name: str) -> tuple:
  """(ratio, kinds, median training seconds) of the rounds, but each run's first, of the
  suite's runs that record both whole rounds' seconds (metrics.csv's round_seconds: training,
  evaluation and the rest of the round but its checkpoint, since 2026-11-25) and their
  training seconds: the ratio of the two sums, the run kinds they come from (in RUN_KINDS
  order) and the median round's training seconds, which say how far the ratio carries
  (evaluation weighs little beside a long round); (NaN, (), NaN) when no run records both."""
  whole = training = 0.0
  kinds, seconds = [], []
  for kind, rows in recorded_metrics(suite_name):
    rows = rows[1:]
    both = np.isfinite(metrics_column(rows, 'round_seconds')) & np.isfinite(
        metrics_column(rows, 'seconds'))
    if not both.any():
      continue
    whole += float(metrics_column(rows, 'round_seconds')[both].sum())
    training += float(metrics_column(rows, 'seconds')[both].sum())
    seconds += list(metrics_column(rows, 'seconds')[both])
    kinds += [kind] if kind not in kinds else []
  if not training:
    return float('nan'), (), float('nan')
  return whole / training, tuple(kinds), float(np.median(seconds))


def whole_round_ratio(suite_name: str) -> float:
  """Whole rounds' seconds over their training seconds (`whole_round_record`'s ratio)."""
  return whole_round_record(suite_name)[0]


def whole_round_example(besides: str = '') -> str:
  """What a whole round costs beside its training, measured on a suite (other than
  `besides`) whose runs record both, for a suite or plan that has no such rounds yet: the
  first evaluated every round if one is (as the suites without the record are), else the
  first; the text says how often its runs evaluate, which sets most of the cost."""
  found = []
  for name, suite in suites.SUITES.items():
    ratio = whole_round_ratio(name) if name != besides else float('nan')
    if np.isfinite(ratio):
      found.append((suite.common.get('eval_every', 1) != 1, name, ratio,
                    suite.common.get('eval_every', 1)))
  if not found:
    return 'no suite records it yet'
  _, name, ratio, every = min(found)
  how = 'every round' if every == 1 else f'every {every} rounds'
  return (f'e.g. the {name} suite\'s recorded rounds, evaluated {how}, took {ratio:.1f} times '
          'their training')
