"""Writes every reproduction page from committed run directories and benchmarks/suites.py.

  python -m benchmarks.report   # every suite's results.md/json/curves.png, REPRODUCTION.md and
                                # README.md's reproduction status (between its markers)

Nothing on a page is typed by hand: settings come from the suite declaration, numbers from
each run's metrics.csv and summary.json, paper figures from paper_numbers.json, verdicts from
`verdict`. A test regenerates the pages and compares them byte for byte with the committed ones.

Accuracy of a run = the mean test accuracy over its last 10 rounds (evaluated every round);
across seeds: mean ± sample standard deviation. Seeds are paired (same partition, sampling
and initial model for both methods of a comparison), so a margin's spread is the standard
deviation of the per-seed differences.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import itertools
import json
import os
import posixpath
import re
import sys
from typing import Callable, Optional

import numpy as np

from benchmarks import suites
from programs import experiment

LAST = 10                 # rounds in the headline mean
# A loaded run's figure for each suites.CRITERIA.
CRITERION_KEYS = dict(last10='last10_mean_accuracy', best='best_accuracy')
PLATEAU_POINTS = 0.5      # a curve has plateaued when its last window moved less than this
REPRODUCTION = os.path.join(suites.HERE, 'REPRODUCTION.md')


# --------------------------------------------------------------------------- #
# Reading runs
# --------------------------------------------------------------------------- #


def grid_points(grid: dict) -> list:
  keys = sorted(grid)
  return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]




@contextlib.contextmanager
def _replacing(path: str):
  """A temporary path (this process's own) that replaces `path` when the block ends: a
  reader, or another `compare` writing the same page, never sees half a file."""
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(path: str, text: str) -> None:
  with _replacing(path) as tmp:
    with open(tmp, 'w') as f:
      f.write(text)


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
  if os.path.exists(os.path.join(exp_dir, experiment.DIVERGED)):
    with open(os.path.join(exp_dir, experiment.DIVERGED)) as f:
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
  write_text(out, page())
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


def seed_dirs(suite: suites.Suite, run: str) -> dict:
  """{seed: directory} of every seed ever run for `run` (none is dropped from a page)."""
  return _seed_paths(os.path.join(suites.suite_dir(suite.name), 'runs'), run)


def _seed_paths(folder: str, run: str) -> dict:
  """{seed: directory} of `run`'s seeds in `folder` (directories <run>_s<seed> that hold a
  config.json)."""
  out = {}
  for path in glob.glob(os.path.join(folder, f'{glob.escape(run)}_s*')):
    m = re.fullmatch(re.escape(run) + r'_s(\d+)', os.path.basename(path))
    if m and os.path.exists(os.path.join(path, 'config.json')):
      out[int(m.group(1))] = path
  return dict(sorted(out.items()))


# --------------------------------------------------------------------------- #
# Statistics and verdicts
# --------------------------------------------------------------------------- #


def mean_std(values) -> tuple:
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return float('nan'), float('nan')
  # One value has no spread: NaN, shown as "(one seed)", never as ± 0.
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float('nan')


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


def plateau_text(runs: list, w: int, moved: float) -> str:
  """'W, points moved' of the runs' mean curve (`plateau_delta`), '(not plateaued)' past the
  criterion, and with two or more runs each one's own move over the same windows."""
  notes = (['not plateaued'] if np.isfinite(moved) and abs(moved) >= PLATEAU_POINTS else []) + (
      ['per seed ' + ', '.join(num(plateau_delta([r])[1], '+.2f') for r in runs)]
      if len(runs) > 1 else [])
  return f'{w}, {num(moved, "+.2f")}' + (f' ({"; ".join(notes)})' if notes else '')


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


def swing_text(runs: list, window: Optional[int] = None) -> str:
  """`run_swing` over the plateau window (`plateau_delta`'s W, unless the caller has it as
  `window`) of finished runs, in points, mean ± std over them; 'n/a' without a window."""
  if window is None:
    window, _ = plateau_delta(runs) if runs else (0, None)
  return over_seeds([run_swing(r, window) for r in runs], scale=100) if window else 'n/a'


def verdict_spread(margins, baseline, method) -> float:
  """The spread a margin must clear to get a verdict: the largest of the stds over seeds of
  the paired margins, the baseline's and the method's values (each a list, one per seed)."""
  return max(mean_std(margins)[1], mean_std(baseline)[1], mean_std(method)[1])


MIN_SEEDS_FOR_VERDICT = 2   # a spread needs two paired seeds; one seed gets no verdict


def verdict(paper_margin: float, margin: float, spread: float, paper_sign: float = 0) -> str:
  """Our margin (points, mean over seeds) against the paper's, given the seeds' spread.

  reproduced: the paper's sign, at least half its size, and larger than the spread;
  smaller: the paper's sign and larger than the spread, but under half the paper's margin;
  within noise: no larger than the spread; opposite: the other sign, larger than the spread.
  A paper whose numbers were lost but whose claim's sign is known (`paper_sign`) is
  'reproduced (sign)' when our margin has that sign beyond the spread.
  """
  if not np.isfinite(margin):
    return 'not run'
  if not np.isfinite(paper_margin) and not paper_sign:
    return 'no paper figure'
  if abs(margin) <= spread:
    return 'within noise'
  sign = np.sign(paper_margin) if np.isfinite(paper_margin) else np.sign(paper_sign)
  if np.sign(margin) != sign:
    return 'opposite'
  if not np.isfinite(paper_margin):
    return 'reproduced (sign)'
  return 'reproduced' if abs(margin) >= 0.5 * abs(paper_margin) else 'smaller'


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


def stuck_text(comparison: dict) -> str:
  """'fedlex_opt seed 0 never left chance' for a comparison's paired runs that did not, and
  'fedlex_prox seed 2 fell to chance at round 355' for those that learned and then lost it."""
  stuck = comparison.get('stuck', [])
  never = ['; '.join(f'{run} seed {seed}' for run, seed in stuck) + ' never left chance']
  fell = [f'{run} seed {seed} fell to chance at round {at}'
          for run, seed, at in comparison.get('collapsed', [])]
  return '; '.join((never if stuck else []) + fell)


def verdict_text(comparison: dict, word: Optional[str] = None) -> str:
  """The verdict in bold (or `word`), and the runs that never left chance or fell back to
  it, if any."""
  stuck = stuck_text(comparison)
  return f'**{word or comparison["verdict"]}**' + (f' ({stuck})' if stuck else '')


def pct(x: float) -> str:
  return 'n/a' if not np.isfinite(x) else f'{100 * x:.2f}'


def _summary_value(run: dict, path: tuple) -> Optional[float]:
  """A run's summary.json value at `path` (None when it has none)."""
  v = run['summary']
  for key in path:
    v = v.get(key) if isinstance(v, dict) else None
  return None if v is None else float(v)


def _summary_column(done: list, path: tuple, spec: str) -> str:
  """Mean ± std over seeds of a summary.json value (e.g. FedLEx guidance statistics)."""
  values = [v for v in (_summary_value(r, path) for r in done) if v is not None]
  return mean_and_spread(*mean_std(values), spec)


def num(x, spec: str = '.2f') -> str:
  return 'n/a' if x is None or not np.isfinite(x) else format(x, spec)


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


def pm(mean: float, std: float) -> str:
  """An accuracy (a fraction) as percent."""
  return mean_and_spread(100 * mean, 100 * std)


# The suite's plot, as a markdown image relative to its page (`_relinked` for REPRODUCTION.md).
CURVES_IMAGE = '![test accuracy over rounds, mean ± std over seeds](curves.png)'


def paper_text(comparison: dict) -> str:
  """The paper's baseline → method (margin, data set), or its margin text alone when its
  figures were lost."""
  base, method = comparison.get('paper_baseline'), comparison.get('paper_method')
  figures = (f'{base:.2f} → {method:.2f} ' if base is not None and method is not None
             and np.isfinite(base) and np.isfinite(method) else '')
  dataset = comparison.get('paper_dataset', '')
  if not figures:
    return paper_margin_text(comparison) + (f'; {dataset}' if dataset else '')
  return f'{figures}({paper_margin_text(comparison)}' + (f', {dataset}' if dataset else '') + ')'


def paper_margin_text(comparison: dict) -> str:
  """The paper's margin in points; where its figures were lost but the sign of its claim is
  known, that claim ('a gain (sign only)'); 'n/a' when neither is known."""
  if np.isfinite(comparison['paper_margin']):
    return f'{comparison["paper_margin"]:+.2f}'
  sign = comparison.get('paper_sign', 0)
  return 'a gain (sign only)' if sign > 0 else 'a loss (sign only)' if sign < 0 else 'n/a'


def dropped_lines(runs: dict) -> list:
  """A paragraph naming every run ({run: {seed: loaded run}}) that left clients out of a
  round's aggregate because their update was not finite; [] when none did. A round that
  drops a client trains on less data than its settings say, and a page must say so."""
  found = []
  for run, seeds in runs.items():
    for seed, r in sorted(seeds.items()):
      if r.get('dropped_clients'):
        rounds = ', '.join(f'{n} in round {k}' for k, n in r['dropped_clients'][:5])
        more = len(r['dropped_clients']) - 5
        found.append(f'`{run}` seed {seed} ({rounds}' +
                     (f' and {more} more rounds' if more > 0 else '') + ')')
  if not found:
    return []
  return ['', 'Clients left out of a round because their update was not finite (the round '
          'aggregates the others; metrics.csv `dropped_clients`): ' + '; '.join(found) + '.']


# The verdict rule in words, for every page that shows verdicts (`verdict`, `compare_runs`).
VERDICTS = ('Verdict: `reproduced` = the paper\'s sign, at least half its margin and larger '
            'than the seeds\' spread; `smaller` = the paper\'s sign and larger than the '
            'spread, but under half its margin; `opposite` = the other sign, larger than the '
            'spread; `within noise` = no larger than the spread, a fourth word beside the '
            'issue\'s three because such a margin\'s sign is not known (`benchmarks/report.py: '
            'verdict`). The spread is the largest of three stds over '
            'seeds: the margin\'s, the baseline\'s and the method\'s, so a margin must clear '
            'each run\'s own seed-to-seed scatter, not only the paired difference\'s. '
            'Each comparison\'s margin note says since which round its verdict, '
            'read the same way at every round, has been the one at the end')


def margin_text(comparison: dict, per_seed: bool = True) -> str:
  """Our margin in points: mean ± std over paired seeds, then (`per_seed`, with two or more)
  each seed's, in seed order: a mean over a seed far from the others reads differently."""
  text = mean_and_spread(comparison['margin'], comparison['margin_std'], mean_spec='+.2f')
  seeds = comparison.get('seed_margins', [])
  if per_seed and len(seeds) > 1:
    text += ' (per seed ' + ', '.join(f'{m:+.2f}' for m in seeds) + ')'
  return text


# --------------------------------------------------------------------------- #
# Pages
# --------------------------------------------------------------------------- #


def settings_differences(run: dict, fields: dict) -> list:
  """'key=recorded (declared: value)' for every declared field that the run's config.json
  records otherwise: a run made before its declaration or tuned rate changed is not shown as
  a run of the new settings. Fields that do not change what a run computes (the program's
  RESUMABLE_CHANGES: its length, which `finished` judges, its evaluation schedule, ...) are
  not compared."""
  return [f'{k}={run["config"].get(k)} (declared: {v})' for k, v in sorted(fields.items())
          if k not in experiment.RESUMABLE_CHANGES and run['config'].get(k) != v]


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
  base = suites.suite_dir(suite.name)
  out = {}
  for run in suite.runs:
    fields = dict(suite.config_overrides(run, tuned), rounds=rounds)
    seeds = {}
    for n in kept_lengths(base, at_least=rounds) + [None]:
      paths = seed_dirs(suite, run) if n is None else _seed_paths(kept_dir(base, n), run)
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


def unchanged_text(suite: suites.Suite, probe: suites.Probe) -> str:
  """'; compared with ...': which makings of the probe's `unchanged` runs it is compared with,
  as `collect_probe` reads them: at the probe's length, from the shortest making of at least
  that length kept in earlier_runs/ where there is one (`kept_lengths`), else from the
  reported runs (over their first rounds when they are longer)."""
  if not probe.unchanged:
    return ''
  rounds = suite.probe_overrides(probe, probe.unchanged[0], suites.load_tuned(suite.name))[
      'rounds']
  over = lambda n: f' over their first {rounds} rounds' if n != rounds else ''  # noqa: E731
  by_source, rest = {}, list(probe.unchanged)
  base = suites.suite_dir(suite.name)
  for n in kept_lengths(base, at_least=rounds):
    made = [run for run in rest if set(_seed_paths(kept_dir(base, n), run)) & set(probe.seeds)]
    if made:
      by_source[n] = made
      rest = [run for run in rest if run not in made]
  parts = [f'the unchanged {", ".join(made)} as made at {n} rounds before the suite was '
           f'lengthened (`earlier_runs/rounds{n}/`){over(n)}' for n, made in by_source.items()]
  if rest:
    parts.append(f'the unchanged reported runs of {", ".join(rest)}'
                 + over(declared_rounds(suite)))
  return '; compared with ' + ' and '.join(parts)


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
              all(any(experiment.is_cost_column(k, 'client_epochs') and v
                      for k, v in r.items()) for r in kept))
  return dict(
      client_epochs_training=experiment.round_costs(kept, 'client_epochs') if recorded else None,
      exploration_client_epochs=float(kept[-1].get('exploration_client_epochs') or 0.0)
      if kept else 0.0)


def usable(run: dict) -> bool:
  """Finished, and made at the settings declared now."""
  return run['finished'] and not run.get('stale')


def compare_runs(suite: suites.Suite, runs: dict, paper: dict, partial: bool = False) -> list:
  """A row per comparison of the suite; with `partial` (a probe's runs, which hold some of
  the suite's), only the comparisons whose two runs are in `runs`."""
  rows = []
  for comp in suite.comparisons:
    if partial and (comp.method not in runs or comp.baseline not in runs):
      continue
    method = {s: r for s, r in runs[comp.method].items() if usable(r)}
    base = {s: r for s, r in runs[comp.baseline].items() if usable(r)}
    paired = sorted(set(method) & set(base))
    diffs = [method[s]['last10_mean_accuracy'] - base[s]['last10_mean_accuracy']
             for s in paired]
    margin, spread = mean_std(diffs)
    # over the paired seeds, so that method - baseline is the margin while a suite is part
    # made (e.g. one seed of the method at a new length against two of the baseline)
    m_mean, m_std = mean_std([method[s]['last10_mean_accuracy'] for s in paired or method])
    b_mean, b_std = mean_std([base[s]['last10_mean_accuracy'] for s in paired or base])
    figures = paper.get(comp.paper, {})
    paper_margin = figures.get('method', np.nan) - figures.get('baseline', np.nan)
    paired_runs = [(name, seed, side[seed])
                   for name, side in ((comp.baseline, base), (comp.method, method))
                   for seed in paired]
    spread_points = (100 * verdict_spread(
        diffs, [base[s]['last10_mean_accuracy'] for s in paired],
        [method[s]['last10_mean_accuracy'] for s in paired]) if paired else np.nan)
    rows.append(dict(
        label=comp.label, method=comp.method, baseline=comp.baseline, seeds=paired,
        seed_margins=[100 * d for d in diffs],
        paper_dataset=figures.get('dataset', ''), paper_baseline=figures.get('baseline'),
        paper_method=figures.get('method'), paper_margin=paper_margin,
        paper_sign=figures.get('sign', 0),
        baseline_mean=b_mean, baseline_std=b_std, method_mean=m_mean, method_std=m_std,
        margin=100 * margin if paired else np.nan, margin_std=100 * spread,
        stuck=[(name, seed) for name, seed, run in paired_runs if never_left_chance(run)],
        collapsed=[(name, seed, at) for name, seed, run in paired_runs
                   if (at := fell_to_chance(run))],
        verdict=(verdict(paper_margin, 100 * margin, spread_points, figures.get('sign', 0))
                 if len(paired) >= MIN_SEEDS_FOR_VERDICT else
                 'one seed' if paired else 'not run')))
  return rows


def checkpoint_rounds(rounds: int) -> list:
  """The rounds at which `margins_over_rounds` reads the curves: a round step of 10, 20, 25,
  50 or 100 (the smallest giving at most 10 rows, dividing `rounds` when one does), and
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


def eval_cadences(runs) -> list:
  """The --eval_every values (sorted) that loaded `runs` were made with."""
  return sorted({int(r['config'].get('eval_every', 1)) for r in runs})


def full_window(run: dict, end: int) -> bool:
  """Whether `run` has LAST evaluations up to round `end` (a run evaluated every k rounds
  has them only from round LAST * k): `last10_at` over fewer would be a mean of a few early
  rounds, not comparable with the rows after it."""
  return sum(r <= end for r in run['curve_rounds']) >= LAST


def margins_over_rounds(runs: dict, comparisons: list, every_round: bool = False) -> dict:
  """How each comparison's margin develops: at every checkpoint round (`every_round`: at
  every round), the baseline's and the method's last-10 mean over the comparison's paired
  finished seeds and the paired margin (points, mean and std over seeds), from the first
  round at which every one of those runs has LAST evaluations (`full_window`). Each seed's
  pair is read at the rounds both evaluated (`on_common_rounds`). A method that only
  converges faster shows a margin that shrinks towards the end; the headline table shows
  only the end."""
  out = {}
  for c in comparisons:
    seeds = c['seeds']
    if not seeds:
      continue
    rounds = runs[c['method']][seeds[0]]['rounds']
    pairs = [on_common_rounds(runs[c['baseline']][s], runs[c['method']][s]) for s in seeds]
    last = min((p[0]['curve_rounds'] or [0])[-1] for p in pairs)   # a shorter run's end
    rows = []
    for end in range(1, rounds + 1) if every_round else checkpoint_rounds(rounds):
      if end > last or not all(full_window(r, end) for pair in pairs for r in pair):
        continue
      base = [last10_at(b, end) for b, _ in pairs]
      method = [last10_at(m, end) for _, m in pairs]
      margins = [100 * (m - b) for m, b in zip(method, base)]
      margin, margin_std = mean_std(margins)
      rows.append(dict(round=end, baseline=100 * float(np.mean(base)),
                       method=100 * float(np.mean(method)), margin=margin,
                       margin_std=margin_std,
                       spread=verdict_spread(margins, [100 * b for b in base],
                                             [100 * m for m in method])))
    out[c['label']] = rows
  return out


def _margin_lines(runs: dict, comparisons: list) -> list:
  """The 'margin over rounds' section: one table (a baseline column per baseline run, over
  all its finished seeds as in the headline table; a margin column per comparison, over its
  paired seeds), then `margin_notes`."""
  margins = margins_over_rounds(runs, comparisons)
  shown = [c for c in comparisons if c['label'] in margins]
  if not shown:
    return []
  baselines = list(dict.fromkeys(c['baseline'] for c in shown))
  finished = {b: [r for r in runs[b].values() if usable(r)] for b in baselines}
  every = [k for k in eval_cadences(r for seeds in runs.values() for r in seeds.values())
           if k != 1]
  window = (f'Mean test accuracy (%) over each run\'s last {LAST} evaluations up to each '
            f'round: the last {LAST} rounds of a run evaluated every round, the last '
            + ' or '.join(f'{LAST * k}' for k in every) + ' rounds of one evaluated every '
            + ' or '.join(map(str, every)) + ' rounds (the program evaluates a run\'s last '
            f'{LAST} rounds in a row, so the last row is a last-{LAST}-round mean as in the '
            'headline table), of each baseline ending at each round'
            if every else
            f'Last-{LAST}-round mean test accuracy (%) of each baseline ending at each round')
  lines = ['## The margin over rounds', '',
           window + ' (mean over its finished seeds), and each comparison\'s margin there '
           '(method − baseline per paired seed, mean ± std). The last row is the headline '
           'table\'s.', '',
           '| round | ' + ' | '.join(f'{b} (%)' for b in baselines) + ' | ' +
           ' | '.join(f'{c["label"]}: margin' for c in shown) + ' |',
           '|---|' + '---|' * (len(baselines) + len(shown))]
  by_round = {}
  for c in shown:
    for row in margins[c['label']]:
      by_round.setdefault(row['round'], {})[c['label']] = row
  for end in sorted(by_round):
    cells = by_round[end]
    lines.append(
        f'| {end} | ' + ' | '.join(
            num(100 * float(np.mean([last10_at(r, end) for r in finished[b]])))
            for b in baselines) + ' | ' + ' | '.join(
                mean_and_spread(cells[c['label']]['margin'], cells[c['label']]['margin_std'],
                                mean_spec='+.2f') if c['label'] in cells else 'n/a'
                for c in shown) + ' |')
  return lines + [''] + margin_notes(runs, shown) + ['']


def verdicts_at_lengths(suite: suites.Suite, summary: dict) -> list:
  """[(rounds, comparisons, runs)]: the suite's comparisons at each of its `earlier_lengths`
  below the length its pages report, read from the runs as made at that length
  (`collect_at`), then at the length reported now (`suite_summary`'s)."""
  out = [(n, compare_runs(suite, runs, summary['paper']), runs)
         for n, runs in ((n, collect_at(suite, n)) for n in suite.earlier_lengths
                         if n < summary['rounds'])]
  return out + [(summary['rounds'], summary['comparisons'], summary['runs'])]


def _lengths_lines(suite: suites.Suite, summary: dict) -> list:
  """The section giving each comparison's verdict at each length the suite was reported at
  (`verdicts_at_lengths`), with how far its baseline and method still moved there."""
  if not suite.earlier_lengths:
    return []
  lines = ['## The verdicts at each length', '',
           'Each comparison at each shorter length the suite\'s pages once reported '
           '(`Suite.earlier_lengths`), read from its runs as they were at that length: a run '
           'later made again from round 1 at a longer length from its making of that length, '
           'kept in `earlier_runs/rounds<N>/`; a run continued from its checkpoint (or whose '
           'kept making is not usable) over its first N rounds in `runs/`. The last rows are '
           'the length reported now (the "Against the paper" table). Margins and verdicts by '
           'today\'s rule and paper figures. Moved: the mean curve of the run\'s finished '
           'seeds over its last W rounds against the W before, then each seed\'s own curve over '
           'the same windows (the plateau criterion of "Every run": plateaued when it moved '
           f'less than {PLATEAU_POINTS} points either way).', '',
           '| rounds | setting | paired seeds | our baseline | our method | our margin | '
           'verdict | baseline moved (W, points) | method moved (W, points) |',
           '|---|---|---|---|---|---|---|---|---|']
  for rounds, comparisons, runs in verdicts_at_lengths(suite, summary):
    for c in comparisons:
      moved = []
      for run in (c['baseline'], c['method']):
        done = [r for r in runs[run].values() if usable(r)]
        moved.append(plateau_text(done, *plateau_delta(done)) if done else 'n/a')
      lines.append(f'| {rounds} | {c["label"]} ({c["method"]}) | {len(c["seeds"])} | '
                   f'{pm(c["baseline_mean"], c["baseline_std"])} | '
                   f'{pm(c["method_mean"], c["method_std"])} | {margin_text(c)} | '
                   f'{verdict_text(c)} | {moved[0]} | {moved[1]} |')
  return lines + ['']


def verdict_since(comparison: dict, rows: list) -> Optional[tuple]:
  """(round, verdict before, its round): the first of `rows` (`margins_over_rounds`, in
  round order) from which the verdict read at each row (its margin against its spread, as
  the headline's at the end) is the comparison's at the end at every row after, and the
  verdict at the row before it and that row's round ('', None when it held at every row);
  None without a verdict (too few seeds)."""
  if len(comparison.get('seeds', ())) < MIN_SEEDS_FOR_VERDICT or not rows:
    return None
  read = [verdict(comparison['paper_margin'], row['margin'], row['spread'],
                  comparison['paper_sign']) for row in rows]
  first = len(read)
  while first and read[first - 1] == comparison['verdict']:
    first -= 1
  if first == len(read):   # the last row is the headline's: it cannot differ
    return None
  if not first:
    return rows[0]['round'], '', None
  return rows[first]['round'], read[first - 1], rows[first - 1]['round']


def margin_notes(runs: dict, comparisons: list, verdicts: bool = True) -> list:
  """Per comparison, read at every round (not only the table's checkpoints): where the
  margin peaked, and, when the paper's figure is on our data set, the first round at which
  our baseline's last-10 mean reaches the paper's baseline accuracy and our margin there;
  with `verdicts`, since which round the verdict has been the one at the end (how long it
  has held tells whether more rounds may change it; a probe has no verdict)."""
  margins = margins_over_rounds(runs, comparisons, every_round=True)
  lines = []
  for c in comparisons:
    rows = [r for r in margins.get(c['label'], []) if np.isfinite(r['margin'])]
    if not rows:
      continue
    peak = max(rows, key=lambda r: r['margin'])
    # When the method is behind at every round its "largest" margin is its smallest deficit.
    best = 'largest margin' if peak['margin'] >= 0 else 'behind at every round, closest'
    text = (f'- {c["label"]}: {best} {peak["margin"]:+.2f} at round {peak["round"]} '
            f'(baseline there {peak["baseline"]:.2f}%), {rows[-1]["margin"]:+.2f} at the end')
    if c['paper_dataset'] == suites.OUR_DATASET and c['paper_baseline'] is not None:
      reached = next((r for r in rows if r['baseline'] >= c['paper_baseline']), None)
      text += (f'; our baseline first reaches the paper\'s ({c["paper_baseline"]:.2f}%) at '
               f'round {reached["round"]}, where our margin is {reached["margin"]:+.2f} '
               f'(paper: {c["paper_margin"]:+.2f})' if reached else
               f'; ours never reaches the paper\'s baseline ({c["paper_baseline"]:.2f}%)')
    since = verdict_since(c, rows) if verdicts else None
    if since is not None:
      start, before, at = since
      text += (f'; verdict {c["verdict"]} at every round since round {start} ({before} at '
               f'round {at})' if before else
               f'; verdict {c["verdict"]} at every round read (from round {start})')
    lines.append(text + '.')
  return lines


def paper_context_rows(suite: suites.Suite) -> list:
  """(model, dataset, setting, paper FedAvg, paper method, margin) for each of the suite's
  `paper_context` keys, read from paper_extraction.json (the method as the paper names it,
  `Suite.method`)."""
  if not suite.paper_context:
    return []
  results = suites.load_paper_results(suite.name)
  method = suite.method
  rows = []
  for key in suite.paper_context:
    found = {r['method']: r['accuracy'] for r in results
             if (r.get('model'), r.get('dataset'), r.get('setting')) == tuple(key)}
    if 'FedAvg' not in found or method not in found:
      raise ValueError(f'{suite.name}: paper_extraction.json has no FedAvg and {method} '
                       f'results for {key}')
    rows.append((*key, found['FedAvg'], found[method], found[method] - found['FedAvg']))
  return rows


def _paper_context_lines(suite: suites.Suite) -> list:
  rows = paper_context_rows(suite)
  if not rows:
    return []
  lines = ['## The paper\'s margins by data set', '',
           'The paper\'s own results (accuracy %, from `benchmarks/paper_extraction.json`) '
           'for the settings named in the suite, to hold ours against the paper\'s trend '
           'across data sets.', '',
           f'| model | data set | setting | paper FedAvg | paper {suite.method} | '
           'paper margin |', '|---|---|---|---|---|---|']
  for model, dataset, setting, base, method, margin in rows:
    lines.append(f'| {model} | {dataset} | {setting} | {base:.2f} | {method:.2f} | '
                 f'{margin:+.2f} |')
  return lines + ['']


def _probe_lines(suite: suites.Suite, paper: dict) -> list:
  """The 'Probes' section: per probe, what it tests, what it changes, its comparisons."""
  if not suite.probes:
    return []
  lines = ['## Probes', '',
           'Runs at changed settings that test a diagnosis; not part of the verdicts. Command: '
           f'`python -m benchmarks.compare --suite={suite.name} --probes`.', '']
  for probe in suite.probes:
    runs = collect_probe(suite, probe)
    lines += [f'### {probe.name}: {probe.question}', '',
              'Changed from the reported runs: ' + ', '.join(
                  f'`{k}={v}`' for k, v in sorted(probe.overrides.items())) +
              f'; runs {", ".join(probe.runs)}; seeds {", ".join(map(str, probe.seeds))}'
              + unchanged_text(suite, probe) + '.', '']
    comparisons = compare_runs(suite, runs, paper, partial=True)
    if comparisons:
      lines += ['Moved (the plateau criterion), swing and s/round (the median over seeds of '
                'each run\'s median training seconds a round) as in "Every run" below (swing '
                'over the last W rounds).', '',
                '| comparison | seeds finished | baseline (%) | method (%) | margin | baseline '
                'moved (W, points) | method moved (W, points) | baseline swing (points) | '
                'method swing (points) | baseline s/round | method s/round |',
                '|---|---|---|---|---|---|---|---|---|---|---|']
      for c in comparisons:
        # over the seeds the margin is over: an unchanged baseline is read on every probe seed
        done = [[runs[name][s] for s in c['seeds'] if usable(runs[name].get(s))]
                for name in (c['baseline'], c['method'])]
        lines.append(f'| {c["label"]} | {len(c["seeds"])} | '
                     f'{pm(c["baseline_mean"], c["baseline_std"])} | '
                     f'{pm(c["method_mean"], c["method_std"])} | {margin_text(c)} | '
                     + ' | '.join(plateau_text(d, *plateau_delta(d)) if d else 'n/a'
                                  for d in done) + ' | '
                     + ' | '.join(swing_text(d) for d in done) + ' | '
                     + ' | '.join(num(np.median([r['seconds_per_round'] for r in d]))
                                  if d else 'n/a' for d in done) + ' |')
      lines += [''] + margin_notes(runs, comparisons, verdicts=False)
      cadences = eval_cadences(r for c in comparisons for name in (c['baseline'], c['method'])
                               for r in runs[name].values())
      if len(cadences) > 1:   # on_common_rounds: each last-10 mean then spans more rounds
        lines.append(
            '- Read at the rounds both runs of a seed evaluated (one in '
            f'{max(cadences)}, then the last {LAST}): before the end a mean of the last '
            f'{LAST} of them spans {LAST * max(cadences)} rounds, so it lags the reported '
            'comparison\'s.')
    dropped = dropped_lines({run: runs.get(run, {}) for run in probe.runs})
    lines += dropped
    status = []
    for run in probe.runs:
      made = runs.get(run, {})
      status += [_not_usable_line(run, seed, made[seed]) for seed in probe.seeds
                 if seed in made and not usable(made[seed])]
      missing = [seed for seed in probe.seeds if seed not in made]
      if missing:   # one line a run, as the reported runs' (`_status`)
        status.append(f'- `{run}`: seed{"s" * (len(missing) > 1)} '
                      f'{", ".join(map(str, missing))} not run yet.')
    # A list after the dropped-clients paragraph starts a list of its own.
    lines += [''] * bool(dropped and status) + status
    lines.append('')
  return lines


def probe_summaries(suite: suites.Suite, paper: dict) -> list:
  """One line per probe comparison with a finished pair (for REPRODUCTION.md)."""
  out = []
  for probe in suite.probes:
    for c in compare_runs(suite, collect_probe(suite, probe), paper, partial=True):
      if c['seeds']:
        out.append(f'- Probe {probe.name} ({probe.question}): {c["label"]} at '
                   + ', '.join(f'`{k}={v}`' for k, v in sorted(probe.overrides.items())) +
                   f': {c["baseline"]} {pm(c["baseline_mean"], c["baseline_std"])}, '
                   f'{c["method"]} {pm(c["method_mean"], c["method_std"])}, margin '
                   f'{margin_text(c)}.')
  return out


def _plot(suite: suites.Suite, runs: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(8, 4.8))
  for run, seeds in runs.items():
    finished = [r for r in seeds.values() if usable(r)]
    if not finished:
      continue
    x, mean, std = mean_curve(finished)
    mean, std = 100 * mean, 100 * std
    line, = ax.plot(x, mean, lw=1.2, label=f'{run} ({len(finished)} seeds)')
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(suite.title, fontsize=9)
  ax.grid(alpha=0.3)
  if ax.lines:
    ax.legend(fontsize=7, loc='lower right')
  else:
    ax.text(0.5, 0.5, 'no finished run yet', ha='center', transform=ax.transAxes)
  fig.tight_layout()
  with _replacing(path) as tmp:
    fig.savefig(tmp, format='png', dpi=110, metadata={'Software': None})
  plt.close(fig)


def _settings_lines(suite: suites.Suite, tuned) -> list:
  common = suite.config_overrides(next(iter(suite.runs)), tuned)
  shared = {k: v for k, v in common.items()
            if all(suite.config_overrides(r, tuned).get(k) == v for r in suite.runs)}
  lines = ['Settings shared by every run: ' + ', '.join(
      f'`{k}={v}`' for k, v in sorted(shared.items())) + '.', '', '| run | its own settings |',
      '|---|---|']
  for run in suite.runs:
    own = {k: v for k, v in suite.config_overrides(run, tuned).items() if k not in shared}
    lines.append(f'| {run} | ' + ', '.join(f'`{k}={v}`' for k, v in sorted(own.items())) + ' |')
  return lines + ['', 'What is scaled from the paper, and why: ' + suite.scaled]


def _reported_settings_line(suite: suites.Suite, summary: dict) -> list:
  """While the suite is being lengthened: at which settings its tables are read (the
  declaration above is the longer making's)."""
  if summary['rounds'] == summary['declared']:
    return []
  every = eval_cadences(r for seeds in summary['runs'].values() for r in seeds.values()
                        if usable(r))
  declared_every = int(suite.common.get('eval_every', 1))
  text = (f'Being lengthened: the settings above are the {summary["declared"]}-round making\'s; '
          f'the tables below are read at `rounds={summary["rounds"]}`')
  if every and every != [declared_every]:
    text += (', from runs evaluated every '
             + ' or '.join('round' if k == 1 else f'{k}th round' for k in every)
             + ' (`eval_every=' + '` or `'.join(map(str, every)) + '`)')
  return [text + f' until every run has every seed at {summary["declared"]} rounds (see "At '
          f'{summary["declared"]} rounds so far").', '']


def _tuning_lines(suite: suites.Suite, tuned) -> list:
  if not suite.grid:
    return []
  lines = ['## Learning-rate tuning', '',
           f'One seed ({suites.TUNING_SEED}, apart from the reported seeds), '
           + (f'the first {suite.tuning_rounds} rounds of the schedule' if suite.tuning_rounds
              else 'the full schedule') + '; '
           'the best last-10 mean is frozen in `tuned.json` for every run of that algorithm'
           + ''.join(f'; {a} runs take {b}\'s' for a, b in sorted(suite.tuned_as.items()))
           + '.', '', '| run | values | last-10 mean (%) | '
           + ''.join(f'{label} | ' for label, _, _ in suite.summary_columns) + 'chosen |',
           '|---|---|---|' + '---|' * len(suite.summary_columns) + '---|']
  for run, grid in suite.grid.items():
    algorithm = suite.config_overrides(run)['algorithm']
    for values in grid_points(grid):
      path = os.path.join(suites.suite_dir(suite.name), 'tuning',
                          suites.tuning_name(run, values))
      if os.path.exists(os.path.join(path, 'config.json')):
        r = load_run(path, suite.tuning_overrides(run, values)['rounds'])
        score = (r['diverged'] if r['diverged'] else
                 pct(r['last10_mean_accuracy']) if r['finished'] else
                 f'stopped at round {r["rounds_done"]}/{r["rounds"]}')
        extra = [num(_summary_value(r, path), spec) if r['finished'] else ''
                 for _, path, spec in suite.summary_columns]
      else:
        score, extra = 'not run yet', [''] * len(suite.summary_columns)
      chosen = 'yes' if tuned and tuned.get(algorithm) == values else ''
      lines.append(f'| {run} | ' + ', '.join(f'{k}={v:g}' for k, v in values.items()) +
                   f' | {score} | ' + ''.join(f'{e} | ' for e in extra) + f'{chosen} |')
  edges = grid_edges(suite, tuned)
  if edges:
    lines += [''] + [f'- {e}' for e in edges]
  return lines + ['']


def grid_edges(suite: suites.Suite, tuned) -> list:
  """A chosen value at the end of its grid: the optimum may lie beyond what was tried."""
  out = []
  for run, grid in suite.grid.items():
    algorithm = suite.config_overrides(run)['algorithm']
    chosen = (tuned or {}).get(algorithm) or {}
    for key, values in grid.items():
      if key in chosen and len(values) > 1 and chosen[key] in (min(values), max(values)):
        side = 'largest' if chosen[key] == max(values) else 'smallest'
        out.append(f'{algorithm}: {key}={chosen[key]:g} is the {side} value of its grid, so '
                   f'a better one may lie beyond it (not tried).')
  return out


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
        or experiment.settings_changed(earlier['config'],
                                       experiment.recorded_config(again['config']))):
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


def _remade_lines(remade: list) -> list:
  """The section comparing each run made again longer (`remade_runs`) with its shorter
  making."""
  if not remade:
    return []
  lengths = sorted({r['length'] for r in remade})
  lines = ['## Runs made again at a longer length', '',
           'When the suite\'s rounds grew and a run\'s checkpoints were gone, it was made again '
           'from round 1; the shorter run is kept in '
           + ', '.join(f'`earlier_runs/rounds{n}/`' for n in lengths) + ', and compared here '
           'with the next longer making (the next one kept, else the reported run in '
           '`runs/`; its length: "made again at"). Both makings have '
           'the same configuration and seed. A run is deterministic on one machine and code '
           '(a resumed run continues exactly); with other code, or on another machine and '
           'install, the last bits of a round can differ, and single rounds then drift apart. '
           'First difference: the first round whose training loss, test accuracy or test loss '
           'differs at all (where both makings record it: a making evaluated every k rounds '
           'has no test figures in between). Last-10 means: over the shorter making\'s last '
           '10 rounds that the new one evaluated too (how many: the "rounds in the means" '
           'column; fewer than 10 when the new making was evaluated every k rounds). s/round: '
           'the median training seconds of rounds 2 to N in each making (metrics.csv '
           '`seconds`; where the training is the same bit for bit, a difference is the '
           'machine\'s, the code\'s or other runs sharing the cores).', '',
           '| run | seed | rounds compared | made again at (rounds) | first difference | '
           'largest gap in one round\'s '
           'accuracy (points) | rounds in the means | last-10 mean, earlier (%) | '
           'last-10 mean, again (%) | difference (points) | s/round, earlier | '
           's/round, again |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in remade:
    first = 'none' if r['first_difference'] is None else f'round {r["first_difference"]}'
    lines.append(f'| {r["run"]} | {r["seed"]} | {r["length"]} | {r["again_rounds"]} | {first} | '
                 f'{100 * r["largest_gap"]:.2f} | {r["tail_rounds"]} | {pct(r["earlier"])} | '
                 f'{pct(r["again"])} | '
                 f'{100 * (r["again"] - r["earlier"]):+.2f} | {num(r["earlier_seconds"])} | '
                 f'{num(r["again_seconds"])} |')
  return lines + ['']


def _not_usable_line(run: str, seed: int, r: dict) -> str:
  """Why a run is left out of the numbers: made at other settings, or not finished."""
  if r.get('stale'):
    return (f'- `{run}` seed {seed}: made at other settings than declared now, left out '
            '(rerun it in a fresh directory): ' + ', '.join(r['stale']) + '.')
  if r.get('diverged'):   # deterministic: running it again would diverge again
    return (f'- `{run}` seed {seed}: {r["diverged"]}; left out of the numbers (a lower rate '
            'would be another run).')
  return (f'- `{run}` seed {seed}: stopped after round {r["rounds_done"]} of {r["rounds"]} '
          '(continues with the same command).')


def _status(runs: dict) -> list:
  lines = []
  for run, seeds in runs.items():
    for seed, r in seeds.items():
      if not usable(r):
        lines.append(_not_usable_line(run, seed, r))
    missing = [s for s in suites.SEEDS if s not in seeds]
    if missing:
      lines.append(f'- `{run}`: seeds {", ".join(map(str, missing))} not run yet.')
  return lines


def suite_summary(suite: suites.Suite) -> dict:
  """The suite's runs and comparisons at the length its pages report (`rounds`), and while
  it is being lengthened (`rounds` below `declared`) the same at the declared length so far
  (`longer_runs`, `longer_comparisons`)."""
  paper = suites.load_paper_numbers().get(suite.name, {})
  (rounds, runs), declared = collect_reported(suite), declared_rounds(suite)
  out = dict(runs=runs, comparisons=[dict(c, rounds=rounds)
                                     for c in compare_runs(suite, runs, paper)],
             paper=paper, rounds=rounds, declared=declared)
  if rounds < declared:
    longer = collect_at(suite, declared)
    out.update(longer_runs=longer, longer_comparisons=[
        dict(c, rounds=declared) for c in compare_runs(suite, longer, paper)])
  return out


def finished_count(runs: dict) -> tuple:
  """(usable runs of suites.SEEDS, runs expected) of {run: {seed: loaded run}}."""
  return (sum(usable(r) for seeds in runs.values() for seed, r in seeds.items()
              if seed in suites.SEEDS), len(runs) * len(suites.SEEDS))


def lengthening_text(summary: dict) -> str:
  """'' or, while the suite is being lengthened, a sentence saying at which length its
  figures are and how far the longer making has got."""
  if summary['rounds'] == summary['declared']:
    return ''
  finished, expected = finished_count(summary['longer_runs'])
  return (f'These figures are at {summary["rounds"]} rounds, the longest length at which '
          f'every run has every seed: the suite is being lengthened to {summary["declared"]} '
          f'rounds seed by seed, each run continued from its checkpoint where it has one, '
          f'else made again from round 1 ({finished} of {expected} runs finished there so far).')


def _lengthening_lines(summary: dict) -> list:
  """The section of a suite being lengthened: its comparisons at the declared length over
  the seeds finished there so far, and what is left to run."""
  if summary['rounds'] == summary['declared']:
    return []
  declared = summary['declared']
  finished, expected = finished_count(summary['longer_runs'])
  lines = [f'## At {declared} rounds so far', '',
           f'The suite is being lengthened to {declared} rounds seed by seed (each run '
           'continued from its checkpoint where it has one, else made again from round 1); '
           f'the figures above stay at {summary["rounds"]} rounds until every '
           f'run has every seed at {declared} ({finished} of {expected} runs finished there so '
           'far).']
  if any(c['seeds'] for c in summary['longer_comparisons']):
    lines[-1] += (f' The comparisons at {declared} rounds over the seeds finished there (a '
                  'verdict needs two seeds; the same command continues):')
    lines += ['', '| setting | paired seeds | our baseline | our method | our margin | '
              'verdict |', '|---|---|---|---|---|---|']
    for c in summary['longer_comparisons']:
      lines.append(f'| {c["label"]} ({c["method"]}) | {len(c["seeds"])} | '
                   f'{pm(c["baseline_mean"], c["baseline_std"])} | '
                   f'{pm(c["method_mean"], c["method_std"])} | {margin_text(c)} | '
                   # no paired seed at the new length yet is not "not run": it is on its way
                   f'{verdict_text(c, None if c["seeds"] else "not made yet")} |')
  under_way, waiting, other = [], [], []
  for run, seeds in summary['longer_runs'].items():
    for seed in sorted(set(seeds) | set(suites.SEEDS)):
      r = seeds.get(seed)
      if r is None:
        waiting.append(f'`{run}` seed {seed}')
      elif usable(r):
        continue
      elif r.get('stale') or r['diverged']:
        other.append(_not_usable_line(run, seed, r))
      elif r['config']['rounds'] == declared:
        under_way.append(f'`{run}` seed {seed} (round {r["rounds_done"]})')
      else:
        waiting.append(f'`{run}` seed {seed}')
  lines.append('')
  if under_way:
    lines += [f'Under way at {declared} rounds (stopped ones continue from their last '
              'checkpoint): ' + ', '.join(under_way) + '.', '']
  if waiting:
    lines += [f'Not made at {declared} rounds yet: ' + ', '.join(waiting) + '.', '']
  return lines + other + ([''] if other else [])


def write_suite_page(suite: suites.Suite) -> None:
  """Writes results.md, results.json and curves.png of the suite."""
  out = suites.suite_dir(suite.name)
  page, comparisons, runs = suite_page(suite)
  os.makedirs(out, exist_ok=True)
  write_text(os.path.join(out, 'results.md'), page)
  write_text(os.path.join(out, 'results.json'), comparisons)
  _plot(suite, runs, os.path.join(out, 'curves.png'))


def suite_page(suite: suites.Suite) -> tuple:
  """(results.md text, results.json text, the loaded runs) of a suite."""
  tuned = suites.load_tuned(suite.name)
  summary = suite_summary(suite)
  runs = summary['runs']
  lines = [f'# {suite.title}', '',
           '<!-- written by `python -m benchmarks.report`; do not edit by hand -->', '',
           'Commands (each continues where it stopped; `--report` rewrites this page only):', '']
  if suite.grid:
    lines.append(f'    python -m benchmarks.compare --suite={suite.name} --tune')
  lines += [f'    python -m benchmarks.compare --suite={suite.name}', '']
  lines += _settings_lines(suite, tuned) + [''] + _reported_settings_line(suite, summary)
  if suite.notes:
    lines += [suite.notes, '']
  lines += _tuning_lines(suite, tuned)
  lines += ['## Against the paper', '',
            f'Last-{LAST}-round mean test accuracy (%), mean ± std over seeds; margin = method '
            '− its baseline (FedAvg, or the base a FedLEx variant guides), per seed, then '
            'mean ± std (then each seed\'s margin). ' + VERDICTS + '; '
            '`one seed` while a single seed of both runs has finished (no spread to judge '
            'by).', '',
            '| setting | paper data | paper baseline | paper method | paper margin | seeds | '
            'our baseline | our method | our margin | verdict |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for c in summary['comparisons']:
    lines.append(
        f'| {c["label"]} ({c["method"]}) | {c["paper_dataset"]} | {num(c["paper_baseline"])} | '
        f'{num(c["paper_method"])} | {paper_margin_text(c)} | {len(c["seeds"])} | '
        f'{pm(c["baseline_mean"], c["baseline_std"])} | {pm(c["method_mean"], c["method_std"])} '
        f'| {margin_text(c)} | {verdict_text(c)} |')
  if lengthening_text(summary):
    lines += ['', lengthening_text(summary) + ' See "At '
              f'{summary["declared"]} rounds so far" below.']
  lines += [''] + _margin_lines(runs, summary['comparisons'])
  lines += _lengths_lines(suite, summary)
  lines += _lengthening_lines(summary)
  lines += _paper_context_lines(suite)
  lines += _probe_lines(suite, summary['paper'])
  lines += ['## Every run', '',
            f'Plateau: the mean curve\'s last W rounds (W = min({WINDOW}, rounds/4)) against the W '
            f'before; plateaued when it moved less than {PLATEAU_POINTS} points; per seed: '
            'each seed\'s own curve over the same windows (a move one seed makes alone is '
            'more likely its round-to-round scatter than a trend). Swing: how '
            'far each seed\'s test accuracy scatters about its own trend over those last W '
            'rounds (the std of its residuals from a least-squares line, points; mean ± std '
            'over seeds): a last-10 mean of a run that swings far rests on where its last '
            'rounds happened to land. Client-epochs: the local epochs of optimizer steps the '
            'clients ran, summed over rounds (FedSGD\'s clients compute one gradient and take '
            'no step: 0). Aggregator state: the size of the aggregation stage\'s own state '
            '(FedCDA\'s and FedCross\'s kept models, CADIS\'s similarity records); a '
            'server optimizer\'s state '
            '(FedAvgM\'s momentum, FedAdam\'s moments) is not in it.', '',
            '| run | seeds finished | last-10 mean (%) | best (%) | final (%) | plateau: W, '
            'points moved | swing over the last W rounds (points) | s/round (median) | '
            'client-epochs | aggregator state |' +
            ''.join(f' {h} |' for h, _, _ in suite.summary_columns),
            '|---|---|---|---|---|---|---|---|---|---|' + '---|' * len(suite.summary_columns)]
  for run, seeds in runs.items():
    done = [r for r in seeds.values() if usable(r)]
    if not done:
      lines.append(f'| {run} | 0 |' + ' |' * (8 + len(suite.summary_columns)))
      continue
    w, moved = plateau_delta(done)
    epochs = done[0]['client_epochs_training']   # None: rows that do not record it
    lines.append(
        f'| {run} | {len(done)} | {pm(*mean_std([r["last10_mean_accuracy"] for r in done]))} | '
        f'{pm(*mean_std([r["best_accuracy"] for r in done]))} | '
        f'{pm(*mean_std([r["final_accuracy"] for r in done]))} | '
        f'{plateau_text(done, w, moved)} | '
        f'{swing_text(done, w)} | '
        f'{np.median([r["seconds_per_round"] for r in done]):.2f} | '
        f'{"n/a" if epochs is None else epochs} | '
        f'{done[0]["aggregator_state_bytes"] / 2**20:.1f} MiB |' +
        ''.join(f' {_summary_column(done, path, spec)} |'
                for _, path, spec in suite.summary_columns))
  lines += ['', '| run | seed | last-10 mean (%) | best (%) | final (%) | rounds |',
            '|---|---|---|---|---|---|']
  for run, seeds in runs.items():
    for seed, r in seeds.items():
      lines.append(f'| {run} | {seed} | {pct(r["last10_mean_accuracy"])} | '
                   f'{pct(r["best_accuracy"])} | {pct(r["final_accuracy"])} | '
                   f'{r["rounds_done"]}/{r["rounds"]} |')
  lines += dropped_lines(runs)
  status = _status(runs)
  if status:
    lines += ['', '## Not finished yet', ''] + status
  lines += ['', f'Curves (mean over finished seeds, band = ± one std): {CURVES_IMAGE}', '']
  remade = remade_runs(suite)
  lines += _remade_lines(remade)
  earlier = os.path.join(suites.suite_dir(suite.name), 'earlier_runs')
  kept = []
  if os.path.exists(os.path.join(earlier, 'results.md')):
    kept.append('single-seed runs with older code, '
                '[earlier_runs/results.md](earlier_runs/results.md)')
  if remade:
    kept.append('the shorter runs made again at a longer length (`earlier_runs/rounds*/`), '
                'compared with their new making above')
  if (os.path.isdir(os.path.join(earlier, 'tuning')) and
      os.path.exists(os.path.join(suites.HERE, f'{suite.name}_diagnosis.py'))):
    kept.append('tuning points at superseded settings (`earlier_runs/tuning/`), every one '
                'listed in [diagnosis.md](diagnosis.md)')
  if kept:
    lines += ['Earlier runs (superseded, kept): ' + '; '.join(kept) + '.', '']
  comparisons = json.dumps(_json_ready(summary['comparisons']), indent=1, sort_keys=True)
  return '\n'.join(lines), comparisons + '\n', runs


def _json_ready(value):
  if isinstance(value, dict):
    return {k: _json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_ready(v) for v in value]
  if isinstance(value, float) and not np.isfinite(value):
    return None
  if isinstance(value, (np.floating, np.integer)):
    return _json_ready(value.item())
  return value


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


def evaluation_seconds(suite_name: str) -> tuple:
  """(seconds an evaluation adds to a round, a round's training seconds): medians over the
  rounds but the first of the suite's runs that record whole rounds and leave some rounds
  unevaluated (`--eval_every` > 1), an evaluated round's whole-minus-training seconds less a
  not evaluated one's; NaNs when no run has both kinds of round."""
  evaluated, other, training = [], [], []
  for _, rows in recorded_metrics(suite_name):
    rows = rows[1:]
    seconds = metrics_column(rows, 'seconds')
    extra = metrics_column(rows, 'round_seconds') - seconds
    tested = np.isfinite(metrics_column(rows, 'test_accuracy'))
    timed = np.isfinite(extra)
    if (timed & tested).any() and (timed & ~tested).any():
      evaluated += list(extra[timed & tested])
      other += list(extra[timed & ~tested])
      training += list(seconds[timed])
  if not evaluated:
    return float('nan'), float('nan')
  return float(np.median(evaluated) - np.median(other)), float(np.median(training))


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


def _compute_line(suite_name: str) -> str:
  hours = compute_hours(suite_name)
  spent = [f'{kind} {h:.1f} h' for kind, h in hours.items() if h > 0]
  ratio, kinds, median = whole_round_record(suite_name)
  measured = (f'with it, the rounds that record both, in the suite\'s {" and ".join(kinds)} '
              f'(a median {median:.1f} s of training a round), took {ratio:.1f} times their '
              'training' if np.isfinite(ratio) else
              f'not recorded for this suite\'s runs yet; {whole_round_example(suite_name)}')
  evaluation, training = evaluation_seconds(suite_name)
  if np.isfinite(evaluation):
    measured += (f'; in its runs evaluated every few rounds, an evaluation added {evaluation:.2f} s '
                 f'to a round whose training took {training:.2f} s (medians)')
  return ('Compute recorded (the rounds\' training seconds summed; not counted: each round\'s '
          f'evaluation ({measured}), its checkpoint and FedLEx\'s exploration before round 1; '
          'most runs ran two at a time on the 2 cores): ' + ', '.join(spent or ['none yet'])
          + '.')


def write_reproduction_page() -> None:
  write_text(REPRODUCTION, reproduction_page())


def reproduction_page() -> str:
  lines = ['# Reproducing the papers\' claims', '',
           '<!-- written by `python -m benchmarks.report`; do not edit by hand -->', '',
           'Each paper\'s comparison on Fashion-MNIST (the offline real data set) at the paper\'s '
           'client layout and model family, with its batch size, local epochs and optimizer '
           'where the compute here allows and scaled where it does not (each suite\'s page '
           'says what was scaled and why), over seeds '
           f'{", ".join(map(str, suites.SEEDS))} fixed in advance. Numbers: last-{LAST}-round '
           'mean test accuracy (%), mean ± std over seeds; our margin: the method\'s minus '
           'its baseline\'s seed by seed, as mean ± std, then each seed\'s in seed order. '
           + VERDICTS + '.', '']
  for suite in suites.SUITES.values():
    summary = suite_summary(suite)
    # By its script, not its page: the script may run after this page is written.
    diagnosis = os.path.join(suites.HERE, f'{suite.name}_diagnosis.py')
    lines += [f'## {suite.title}', '',
              f'Page: [{suite.name}/results.md]({suite.name}/results.md)' + (
                  f'; diagnosis: [{suite.name}/diagnosis.md]({suite.name}/diagnosis.md)'
                  if os.path.exists(diagnosis) else ''),
              '', '| setting | paper: baseline → method (margin) | our baseline | our method | '
              'our margin | verdict |',
              '|---|---|---|---|---|---|']
    for c in summary['comparisons']:
      lines.append(
          f'| {c["label"]} | {paper_text(c)} | '
          f'{pm(c["baseline_mean"], c["baseline_std"])} | '
          f'{pm(c["method_mean"], c["method_std"])} | {margin_text(c)} | {verdict_text(c)} |')
    notes = margin_notes(summary['runs'], summary['comparisons']) + probe_summaries(
        suite, summary['paper'])
    if lengthening_text(summary):
      notes.insert(0, '- ' + lengthening_text(summary))
    lines += [''] + notes if notes else []
    lines += ['', _relinked(CURVES_IMAGE, suite.name)]
    if suite.notes:
      lines += ['', _relinked(suite.notes, suite.name)]
    lines += ['', _compute_line(suite.name), '']
  return '\n'.join(lines)


def _relinked(text: str, folder: str) -> str:
  """`text`'s relative markdown links (written for a page in `folder`) made relative to the
  folder above it."""
  return re.sub(r'\]\((?![a-z]+:|/|#)([^)]+)\)',
                lambda m: f']({posixpath.normpath(posixpath.join(folder, m.group(1)))})', text)


README = os.path.join(os.path.dirname(suites.HERE), 'README.md')
STATUS_BEGIN = '<!-- reproduction status: written by `python -m benchmarks.report` -->'
STATUS_END = '<!-- end of reproduction status -->'


def status_lines() -> list:
  """The README's one line per method: each comparison's verdict and margin against the
  paper's, how many runs have finished, and which finished runs have not plateaued."""
  lines = []
  for suite in suites.SUITES.values():
    summary = suite_summary(suite)
    runs = summary['runs']
    finished, expected = finished_count(runs)
    if not finished:
      lines.append(f'- {suite.method}: no run finished yet (of {expected}, '
                   f'[{suite.name}/results.md](benchmarks/{suite.name}/results.md)).')
      continue
    verdicts = '; '.join(
        f'{c["label"]} **{c["verdict"]}** (ours {margin_text(c, per_seed=False)}; paper '
        f'{paper_margin_text(c)}' + (f'; {stuck}' if (stuck := stuck_text(c)) else '') + ')'
        for c in summary['comparisons'])
    moving = []
    for run, seeds in runs.items():
      done = [r for r in seeds.values() if usable(r)]
      if done:
        _, moved = plateau_delta(done)
        if abs(moved) >= PLATEAU_POINTS:
          moving.append(f'{run} {moved:+.1f}')
    longer = ''
    if summary['rounds'] < summary['declared']:
      done_longer, _ = finished_count(summary['longer_runs'])
      longer = (f' at {summary["rounds"]} rounds (being lengthened to {summary["declared"]}: '
                f'{done_longer} of {expected} runs finished there)')
    lines.append(
        f'- {suite.method}: {verdicts}. {finished} of {expected} runs finished{longer}'
        + (f'; not plateaued, so the verdicts are provisional (points moved over the last '
           f'window): {", ".join(moving)}'
           if moving else '') +
        f' ([{suite.name}/results.md](benchmarks/{suite.name}/results.md)).')
  return lines


def readme_with_status(text: str) -> str:
  """`text` (README.md) with the block between the status markers rewritten."""
  begin, end = text.index(STATUS_BEGIN), text.index(STATUS_END)
  # Indented under the README's list item that introduces it.
  return (text[:begin + len(STATUS_BEGIN)] + '\n' +
          ''.join(f'  {line}\n' for line in status_lines()) + '  ' + text[end:])


def write_all() -> None:
  """Every suite's page, REPRODUCTION.md and README.md's status block."""
  for suite in suites.SUITES.values():
    write_suite_page(suite)
  write_reproduction_page()
  with open(README) as f:
    text = f.read()
  write_text(README, readme_with_status(text))


def main() -> int:
  write_all()
  print('wrote', ', '.join(f'{s}/results.md' for s in suites.SUITES), 'and REPRODUCTION.md',
        file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
