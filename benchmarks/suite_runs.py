"""The one layer that reads benchmark run directories (compare, the pages, the diagnoses).

A run directory is an ordinary experiment directory of `programs.train` (config.json,
metrics.csv, summary.json; benchmarks/results/<suite>/runs/<run>_s<seed>, tuning runs under
tuning/, probe runs under probes/<probe>/, shorter makings of a lengthened suite under
earlier_runs/rounds<N>/). One run is read by programs/studies/records.py (`load_run`, and
`at_length` over its first rounds); `collect` reads a suite's runs (its own and those it
borrows from another suite) at the length its pages report. Accuracy of a run = the mean test
accuracy of its last `records.LAST` evaluations (or its best, `records.CRITERION_KEYS`);
across seeds, `programs.studies.paired` reads them (mean ± sample standard deviation, paired
margins).
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Callable, Optional

import numpy as np

from benchmarks import suites
from programs import experiment_config
from programs import generated_files
from programs.studies import declaration
from programs.studies import records


PLATEAU_POINTS = 0.5      # a curve has plateaued when its last window moved less than this


def diagnosis_header(title: str, module) -> list:
  """A diagnosis page's first lines: its title, who writes it, and what it measures (the
  third paragraph of the writing module's docstring)."""
  return [f'# {title}', '',
          # (the spec's name, not __name__, which is '__main__' under `python -m`)
          f'<!-- written by `python -m {module.__spec__.name}`; do not edit by hand -->', '',
          ' '.join(module.__doc__.split('\n\n')[2].split()), '']


def write_diagnosis(out: str, page: Callable[[], str]) -> int:
  """A diagnosis script's main: writes its page to `out` and says so."""
  generated_files.write_text(out, page())
  print(f'wrote {os.path.relpath(out)}')
  return 0


def suite_metrics(suite: suites.Suite) -> dict:
  """{run: {seed: metrics rows}} of the suite's usable runs (finished, at today's settings)
  at the length its pages report (`reported_rounds`)."""
  return {run: {seed: records.run_rows(r) for seed, r in seeds.items() if records.usable(r)}
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
        path = os.path.join(kept_dir(base, n), declaration.run_name(run, seed))
        if not os.path.exists(os.path.join(path, 'metrics.csv')):
          continue
        kept = records.metrics_rows(path)
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
  return {run: {seed: records.run_rows(r) for seed, r in seeds.items() if records.usable(r)}
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
  return records.seed_paths(os.path.join(suites.suite_dir(maker.name), 'runs'), made_as)


WINDOW = 50   # rounds of the plateau criterion's window, and per row of the diagnoses' tables


def plateau_window(rounds: int) -> int:
  """The plateau criterion's window for a run of `rounds` rounds: WINDOW, or a quarter of a
  shorter run."""
  return min(WINDOW, rounds // 4)


def plateau_delta(runs: list) -> tuple:
  """(window W, points moved by the runs' mean curve (`mean_curve`) between its last two
  W-round windows, each the mean over the rounds evaluated in it)."""
  rounds, mean, _ = records.mean_curve(runs)
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
  acc = records.metrics_column(rows[start:stop], 'test_accuracy')
  return (float(np.nanmean(acc)) if np.isfinite(acc).any() else float('nan')), swing(acc)


CHANCE = 0.1   # every suite's data set, Fashion-MNIST, has ten classes


STUCK = 1.1 * CHANCE   # a run whose best test accuracy never passes this learned nothing


LEARNED = 2 * CHANCE   # one that passed this had learned something (`fell_to_chance`)


def never_left_chance(run: dict) -> bool:
  """Finished (losses finite), yet its test accuracy never rose above STUCK: e.g. a first
  step so large that the network's units died. It counts in every mean (no seed is
  dropped); the verdicts name it, since one such seed sets a margin's spread."""
  return records.usable(run) and run['best_accuracy'] <= STUCK


def fell_to_chance(run: dict) -> Optional[int]:
  """The first evaluated round of the stretch at chance (test accuracy at most STUCK) that a
  finished run ends in after it had learned (best accuracy above LEARNED; e.g. a late step
  so large that it wiped the model out), else None. Like a run that never left chance, it
  counts in every mean and the verdicts name it."""
  if not records.usable(run) or run['best_accuracy'] <= LEARNED:
    return None
  last_above = max((r for r, a in zip(run['curve_rounds'], run['curve_accuracy']) if a > STUCK),
                   default=None)
  return next((r for r in run['curve_rounds'] if r > last_above), None) if last_above else None


def summary_value(run: dict, path: tuple) -> Optional[float]:
  """A run's summary.json value at `path` (None when it has none)."""
  v = run['summary']
  for key in path:
    v = v.get(key) if isinstance(v, dict) else None
  return None if v is None else float(v)


def num(x, spec: str = '.2f') -> str:
  return 'n/a' if x is None or not np.isfinite(x) else format(x, spec)


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
               records.seed_paths(kept_dir(base, n), made_as))
      for seed, path in paths.items():
        if seed not in seeds or not settled(seeds[seed]):
          seeds[seed] = _run_at(path, fields, n == rounds)
    out[run] = dict(sorted(seeds.items()))
  return out


def _run_at(path: str, fields: dict, kept_at_length: bool) -> dict:
  """A run's directory read at the declared fields' length: a making kept at that length as
  it is, any other over its first rounds (`at_length`)."""
  if kept_at_length:
    return records.declared_run(path, fields)
  r = records.load_run(path)
  return dict(records.at_length(r, fields['rounds']), stale=records.settings_differences(r, fields))


def settled(run: dict) -> bool:
  """Usable, or diverged (deterministic: made again, it would diverge again)."""
  return records.usable(run) or bool(run['diverged'] and not run.get('stale'))


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
      path = os.path.join(suites.probe_dir(suite.name, probe.name), declaration.run_name(run, seed))
      if os.path.exists(os.path.join(path, 'config.json')):
        out.setdefault(run, {})[seed] = records.declared_run(path, fields)
  if probe.unchanged:   # read at the probe's length, whatever length the pages report
    reported = collect_at(suite,
                          suite.probe_overrides(probe, probe.unchanged[0], tuned)['rounds'])
    for run in probe.unchanged:
      out[run] = {s: r for s, r in reported[run].items() if s in probe.seeds}
  return out


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
  tail = [a for r, a in zip(run['curve_rounds'], run['curve_accuracy']) if r <= end][-records.LAST:]
  return float(np.mean(tail)) if tail else float('nan')


def on_common_rounds(*runs: dict) -> list:
  """Copies of loaded runs read only at the rounds every one of them evaluated: a run
  evaluated every round set beside one evaluated every k rounds (a probe against a reported
  run it keeps unchanged) would otherwise be read over different rounds (`last10_at`)."""
  common = set.intersection(*(set(r['curve_rounds']) for r in runs))
  return [{**r, **records.curve_figures(
      [(x, a) for x, a in zip(r['curve_rounds'], r['curve_accuracy']) if x in common],
      r['rounds'])} for r in runs]


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
    earlier, again = records.load_run(path), records.load_run(again_dir)
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
    tail = [(acc, again_at[r]) for r, acc in evaluated[-records.LAST:] if r in again_at]
    run, seed = name.rsplit('_s', 1)
    # The same rounds' training time in each making: with the training bit for bit the
    # same, a change is the machine's or the code's.
    out.append(dict(run=run, seed=int(seed), length=length, again_rounds=again['rounds'],
                    first_difference=first,
                    earlier_seconds=records.median_seconds(earlier['rows'], length),
                    again_seconds=records.median_seconds(again['rows'], length),
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
    yield kind, records.metrics_rows(directory)


def compute_hours(suite_name: str) -> dict:
  """{kind: hours} the suite's recorded rounds took (metrics.csv's `seconds`, summed over
  every run directory of that kind, finished or not)."""
  out = {kind: 0.0 for kind, _ in RUN_KINDS}
  for kind, rows in recorded_metrics(suite_name):
    out[kind] += float(np.nansum(records.metrics_column(rows, 'seconds'))) / 3600
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
    both = np.isfinite(records.metrics_column(rows, 'round_seconds')) & np.isfinite(
        records.metrics_column(rows, 'seconds'))
    if not both.any():
      continue
    whole += float(records.metrics_column(rows, 'round_seconds')[both].sum())
    training += float(records.metrics_column(rows, 'seconds')[both].sum())
    seconds += list(records.metrics_column(rows, 'seconds')[both])
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
