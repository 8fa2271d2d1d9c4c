r"""Runs a paper comparison (benchmarks/suites.py) over fixed seeds and writes its results page.

  python -m benchmarks.compare --suite=fedcda --tune      # learning-rate grid, one seed
  python -m benchmarks.compare --suite=fedcda             # every run x seeds 0, 1, 2
  python -m benchmarks.compare --suite=fedcda --report    # the page only, from the runs
  python -m benchmarks.compare --suite=fedcda --probes    # runs that test a diagnosis
  python -m benchmarks.compare --suite=fedcda --plan      # what it would run, and how long

Every run is an ordinary experiment directory (`benchmarks/<suite>/runs/<run>_s<seed>`,
tuning runs under `tuning/`, probe runs under `probes/<probe>/`). A finished run is skipped
and a stopped one resumes exactly, so the same command continues a suite after a kill or at
the next session. Two copies of one command share its runs: a run the other holds is
skipped, then waited for at the end (`bash benchmarks/reproduce.sh` with JOBS=2). After running,
`benchmarks/report.py` rewrites `results.md`, `results.json` and `curves.png` of the suite and
`benchmarks/results/REPRODUCTION.md` from the committed run directories.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from typing import Callable, Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np

from benchmarks import report
from benchmarks import runs as rd
from benchmarks import suites
from programs import pages

_SUITE = flags.DEFINE_enum('suite', None, list(suites.SUITES), 'Which comparison to run.')
_SEEDS = flags.DEFINE_list('seeds', [str(s) for s in suites.SEEDS],
                           'Seeds of every run (the pages show every seed run).')
_ONLY = flags.DEFINE_list('only', [], 'Run only these run names (all seeds).')
_TUNE = flags.DEFINE_bool('tune', False, 'Run the suite\'s learning-rate grid and freeze the '
                          'best value per algorithm in tuned.json.')
REPORT = _REPORT = flags.DEFINE_bool('report', False, 'Write the pages from the runs; train nothing.')
_PROBES = flags.DEFINE_bool('probes', False, 'Run the suite\'s probes (runs at changed '
                            'settings that test a diagnosis, benchmarks/suites.py: Probe) '
                            'instead of its reported runs, over each probe\'s own seeds '
                            '(--only applies, --seeds does not).')
_PROBE = flags.DEFINE_list('probe', [], 'Run only these probes of the suite (implies --probes).')
PLAN = _PLAN = flags.DEFINE_bool('plan', False, 'List the runs the command would make (with the other '
                          'flags), the rounds each has left and their time estimated from the '
                          'suite\'s recorded rounds (whole rounds where recorded; a stopped '
                          'run also at its own rounds\' median pace); train nothing.')


def _refuse_other_settings(r: dict, config, what: str) -> None:
  """ExperimentError if the loaded run `r` was recorded with other settings than `config`:
  `what` it is (e.g. 'a finished run') is never taken for, nor replaced by, this one."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  changed = experiment_config.settings_changed(r['config'], config)
  if changed:
    raise experiment.ExperimentError(
        f'{os.path.relpath(config.experiment_dir)} holds {what} of other settings ({changed}); '
        'move it away (e.g. under the suite\'s earlier_runs/) and run again')


def _finished(config) -> bool:
  """A run is finished exactly when its page says so: finished (or diverged) at its length,
  or made longer and read over its first `config.rounds` (rd.at_length); a finished run
  of other settings (the declaration changed since) is an error, never taken for this one."""
  try:
    r = rd.at_length(rd.load_run(config.experiment_dir), config.rounds)
  except FileNotFoundError:   # not made yet, or moved away by the other compare process
    return False
  if not (r['finished'] or r['diverged'] is not None):
    return False
  _refuse_other_settings(r, config, 'a finished run')
  return True


# main's stopping.StopRequests: SIGTERM/SIGINT stop the current run at its next round
# boundary, checkpointed (stopping.Interrupted ends the command), as in programs/train.py.
_STOP = None


@contextlib.contextmanager
def stop_requests():
  """SIGTERM/SIGINT stop `run_all`'s current run at its next round boundary, checkpointed
  (stopping.Interrupted then ends the command)."""
  from programs import stopping  # pylint: disable=g-import-not-at-top
  global _STOP
  with stopping.StopRequests() as _STOP:
    yield _STOP
  _STOP = None


def _raise_if_stopped(config) -> None:
  """stopping.Interrupted if a stop signal has been recorded (before `config` starts)."""
  from programs import run_directory  # pylint: disable=g-import-not-at-top
  from programs import stopping  # pylint: disable=g-import-not-at-top
  if _STOP is not None and _STOP.signum is not None:
    ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
    raise stopping.Interrupted(_STOP.signum,
                               max(run_directory.checkpointed_rounds(ckpt_dir), default=0),
                               config.experiment_dir)


def shorter_run_target(config) -> Optional[str]:
  """Where `_keep_shorter_run` would move the run directory of `config` (None: it stays).
  A finished run shorter than `config.rounds` with no checkpoint to continue from would be
  made again from round 1 over its record: a reported run (under the suite's runs/) moves to
  the suite's earlier_runs/rounds<N>/, whose path is returned. ExperimentError when it
  cannot be kept so: recorded with other settings, its name kept there already, or a probe's
  or tuning run (which has no such place)."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import run_directory  # pylint: disable=g-import-not-at-top
  exp_dir = os.path.abspath(config.experiment_dir)
  try:
    if run_directory.checkpointed_rounds(os.path.join(exp_dir, 'checkpoints')):
      return None
    r = rd.load_run(exp_dir)   # at its own length
  except FileNotFoundError:   # not made yet, or moved away by the other compare process
    return None
  if not r['finished'] or r['rounds'] >= config.rounds:
    return None
  where = os.path.relpath(exp_dir)
  _refuse_other_settings(r, config, f'a shorter finished run ({r["rounds"]} rounds)')
  suite_dir = os.path.dirname(os.path.dirname(exp_dir))
  reported = os.path.abspath(os.path.join(suites.suite_dir(os.path.basename(suite_dir)), 'runs'))
  if os.path.dirname(exp_dir) != reported:   # a probe's or tuning run (a probe named 'runs' too)
    raise experiment.ExperimentError(
        f'{where} holds a finished run of {r["rounds"]} rounds and no checkpoint to continue it '
        f'to {config.rounds}: move it away and run again')
  target = os.path.join(rd.kept_dir(suite_dir, r['rounds']), os.path.basename(exp_dir))
  if os.path.exists(target):
    raise experiment.ExperimentError(
        f'{where} is to be made again at {config.rounds} rounds, but {os.path.relpath(target)} '
        'already keeps a run of that name: move one of them away and run again')
  return target


def _keep_shorter_run(config) -> None:
  """Moves a shorter finished run about to be made again (`shorter_run_target`) to the
  suite's earlier_runs/rounds<N>/, where its page compares the two makings
  (rd.remade_runs), instead of letting the new making overwrite its record."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import run_directory  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(config.experiment_dir):
    return
  # Every look under the run's lock: the other compare process may be moving the same run.
  try:
    with run_directory.exclusive_run_directory(config.experiment_dir):
      target = shorter_run_target(config)
      if target is None:
        return
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.rename(config.experiment_dir, target)
  except run_directory.RunDirectoryBusy:
    raise
  except experiment.ExperimentError:
    if _moved_away(config):
      return   # the other process moved it first: the run is made anew
    raise
  print(f'   its shorter run is kept in {os.path.relpath(target)}; making it again from round 1',
        file=sys.stderr, flush=True)


def _moved_away(config) -> bool:
  """The run's directory is gone, moved by another compare process (`_keep_shorter_run`)
  between two looks at it: free, since the program makes it anew."""
  return not os.path.isdir(config.experiment_dir)


def _run(config) -> None:
  from programs import experiment  # pylint: disable=g-import-not-at-top
  if _finished(config):
    return
  _raise_if_stopped(config)   # e.g. a signal while it waited for this run
  print(f'== {os.path.relpath(config.experiment_dir)}', file=sys.stderr, flush=True)
  _keep_shorter_run(config)
  config.resume = os.path.isdir(os.path.join(config.experiment_dir, 'checkpoints'))
  experiment.run_experiment(config, stop=_STOP)


def run_all(configs, tuning: bool = False) -> None:
  """Makes every run of `configs` (finished ones are skipped, stopped ones resumed).

  A run another process holds (run_directory.RunDirectoryBusy) is left to it and waited for at
  the end, then continued if that process stopped early: two `compare` commands on one suite
  share its runs, each taking the next free one. In tuning, a grid point that diverges is a
  result of the grid (shown on the page), not a failure of the suite.
  """
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import run_directory  # pylint: disable=g-import-not-at-top

  def make(config):
    try:
      _run(config)
    except run_directory.RunDirectoryBusy:
      raise
    except experiment.ExperimentError as e:
      # The program has recorded it (run_directory.DIVERGED) before letting the run go.
      if not (tuning and str(e).startswith('training diverged')):
        raise

  held_elsewhere = []
  for config in configs:
    try:
      make(config)
    except run_directory.RunDirectoryBusy:
      print('   another process is running it: left to it, waited for at the end',
            file=sys.stderr, flush=True)
      held_elsewhere.append(config)
  for config in held_elsewhere:
    print(f'== {os.path.relpath(config.experiment_dir)}: waiting for the other process',
          file=sys.stderr, flush=True)
    while True:
      try:   # polled, not a blocking flock: a recorded signal would not interrupt that
        with run_directory.exclusive_run_directory(config.experiment_dir):
          pass
      except run_directory.RunDirectoryBusy:
        _raise_if_stopped(config)
        time.sleep(1.0)
        continue
      except experiment.ExperimentError:
        if not _moved_away(config):
          raise
      try:
        make(config)
        break
      except run_directory.RunDirectoryBusy:   # a third process took it first: wait again
        continue


def tuning_points(suite: suites.Suite) -> list:
  """[(run, grid values, config)] of the suite's learning-rate grid, in grid order."""
  return [(run, values, suites.experiment_config(
      suite.tuning_overrides(run, values), suites.TUNING_SEED,
      os.path.join(suites.suite_dir(suite.name), 'tuning'), suites.tuning_name(run, values)))
          for run, grid in suite.grid.items() for values in rd.grid_points(grid)]


def run_configs(suite: suites.Suite, tuned, only=(), seeds=suites.SEEDS) -> list:
  """The suite's reported runs (those named in `only`, if given) over `seeds`, seed by seed
  (every run's first seed, then the next): a suite cut short holds whole comparisons."""
  return [suites.experiment_config(
      suite.config_overrides(run, tuned), seed, os.path.join(suites.suite_dir(suite.name), 'runs'),
      suites.run_name(run, seed))
          for seed in seeds for run in suite.runs if not only or run in only]


def probe_configs(suite: suites.Suite, tuned, only=(), probes=()) -> list:
  """Every probe's runs (only the probes named in `probes` and the runs named in `only`, if
  given): the suite's run (tuned) with the probe's changes, over the probe's own seeds, seed
  by seed as in `run_configs`."""
  return [suites.experiment_config(
      suite.probe_overrides(probe, run, tuned), seed, suites.probe_dir(suite.name, probe.name),
      suites.run_name(run, seed))
          for probe in suite.probes if not probes or probe.name in probes
          for seed in probe.seeds
          for run in probe.runs if not only or run in only]


# What sets a round's cost: runs agreeing on these share their recorded seconds per round.
COST_FIELDS = ('algorithm', 'dataset', 'model', 'num_clients', 'clients_per_round',
               'local_epochs', 'batch_size', 'partition', 'eval_every')


# Training does not depend on the evaluation schedule: a run's training seconds stand for
# a run that differs only in --eval_every (its evaluation then not counted).
TRAINING_COST_FIELDS = tuple(f for f in COST_FIELDS if f != 'eval_every')


def _recorded_round_seconds(suite_name: str):
  """(config, whole, training) per run the suite has recorded (reported, tuning, probes,
  superseded; finished or not): its config (fields added since at their defaults) and the
  finite seconds of its rounds after the first (which also traces and compiles: left out,
  as in summary.json) but paused ones (PAUSED_ROUND), whole (metrics.csv's round_seconds)
  and training only (`seconds`)."""
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  for _, directory in rd.recorded_runs(suite_name):
    path = os.path.join(directory, 'config.json')
    if not os.path.exists(path):
      continue
    with open(path) as f:
      config = experiment_config.recorded_config(json.load(f))
    rows = rd.metrics_rows(directory)[1:]
    yield config, *(_without_pauses(rd.metrics_column(rows, column))
                    for column in ('round_seconds', 'seconds'))


# A round over this many times its run's median round was paused (a process stopped with
# SIGSTOP while CI ran, a machine shared), not slow: it is left out of the recorded cost.
# An evaluated round of a run evaluated every few rounds costs about twice a plain one.
PAUSED_ROUND = 5.0


def _without_pauses(seconds: np.ndarray) -> list:
  """The finite `seconds` of a run's rounds, less the paused ones (PAUSED_ROUND)."""
  seconds = seconds[np.isfinite(seconds)]
  if not seconds.size:
    return []
  return [float(v) for v in seconds if v <= PAUSED_ROUND * np.median(seconds)]


def recorded_seconds_per_round(suite_name: str) -> dict:
  """{COST_FIELDS values: (mean seconds of a round, whole)} over every run the suite has
  recorded. whole: the rounds as the program ran them, evaluation included (metrics.csv's
  round_seconds, recorded since 2026-11-25; a mean, so that rounds evaluated every
  --eval_every count as often as they come); else only their training (its `seconds`), for
  costs recorded before."""
  seconds = {}
  for config, whole, training in _recorded_round_seconds(suite_name):
    key = tuple(getattr(config, f) for f in COST_FIELDS)
    kept = seconds.setdefault(key, ([], []))
    kept[0].extend(whole)
    kept[1].extend(training)
  return {key: (float(np.mean(whole)), True) if whole else (float(np.mean(training)), False)
          for key, (whole, training) in seconds.items() if whole or training}


def recorded_training_seconds(suite_name: str) -> dict:
  """{TRAINING_COST_FIELDS values: mean training seconds of a round} over every run the suite
  has recorded, whatever its --eval_every: the cost of a run whose evaluation schedule has
  no round recorded yet (e.g. a suite made again every 5th round evaluated)."""
  seconds = {}
  for config, _, training in _recorded_round_seconds(suite_name):
    seconds.setdefault(tuple(getattr(config, f) for f in TRAINING_COST_FIELDS),
                       []).extend(training)
  return {key: float(np.mean(values)) for key, values in seconds.items() if values}


def own_seconds_per_round(exp_dir: str) -> Optional[tuple]:
  """(median seconds of a round, rounds it rests on, whole) of a stopped or running run's own
  rounds after its first (which traces and compiles): whole rounds where metrics.csv has
  round_seconds, else their training (whole False). The pace of the machine it has run on,
  which may be far from the recorded one (a median: a round the run was paused or resumed
  in is one round among many). None with fewer than MIN_OWN_ROUNDS such rounds."""
  if not os.path.exists(os.path.join(exp_dir, 'metrics.csv')):
    return None
  rows = rd.metrics_rows(exp_dir)[1:]
  for column in ('round_seconds', 'seconds'):
    values = rd.metrics_column(rows, column)
    values = values[np.isfinite(values)]
    if values.size >= MIN_OWN_ROUNDS:
      return float(np.median(values)), int(values.size), column == 'round_seconds'
  return None


# A run's own pace is shown once it has this many rounds after its first.
MIN_OWN_ROUNDS = 3


def _runs(n: int) -> str:
  return f'{n} run' + ('' if n == 1 else 's')


def _duration(seconds: float) -> str:
  return f'{seconds / 60:.0f} min' if seconds < 3600 else f'{seconds / 3600:.1f} h'


def plan(suite: suites.Suite, configs) -> list:
  """`plan_runs` of a suite's `configs`."""
  return plan_runs(suite.name, configs)


def plan_runs(results_name: str, configs) -> list:
  """The lines `--plan` prints for runs under benchmarks/results/<results_name>/: each run still to make, the rounds it has left (a stopped run
  resumes from its last checkpoint, a run without one starts over) and their time at the
  suite's recorded seconds per round (whole rounds where recorded, else their training) for
  runs of the same cost, and for a stopped run also at its own pace (own_seconds_per_round);
  a run the command would stop at (recorded with other settings) as blocked, with the reason;
  then the total."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import run_directory  # pylint: disable=g-import-not-at-top
  per_round = recorded_seconds_per_round(results_name)
  training_per_round = recorded_training_seconds(results_name)
  lines, total_rounds, total_seconds, untimed, done, blocked = [], 0, 0.0, 0, 0, 0
  training_only = 0
  for config in configs:
    where = os.path.relpath(config.experiment_dir)
    try:   # the command's own checks: other settings, fewer rounds, a lost record, a move
      if _finished(config):
        done += 1
        continue
      start = run_directory.resume_point(dataclasses.replace(config, resume=True))
      target = shorter_run_target(config)
    except experiment.ExperimentError as e:
      blocked += 1
      lines.append(f'  {where}: blocked: {e}')
      continue
    left = config.rounds - start
    seconds, whole = per_round.get(tuple(getattr(config, f) for f in COST_FIELDS), (None, None))
    note = '' if whole else ' (training only)'
    if seconds is None:   # e.g. made again at another --eval_every: its training is known
      seconds = training_per_round.get(tuple(getattr(config, f) for f in TRAINING_COST_FIELDS))
      note = ' (training only, recorded at another --eval_every)'
    total_rounds += left
    if seconds is None:
      untimed += 1
      estimate = 'no round of this cost recorded yet'
    else:
      total_seconds += left * seconds
      training_only += not whole
      estimate = f'~{_duration(left * seconds)} at {seconds:.2f} s/round{note}'
    if start:
      start_text = f'resumes after round {start}'
    elif target:
      start_text = f'starts at round 1; its shorter run moves to {os.path.relpath(target)}'
    else:
      start_text = 'starts at round 1'
    own = own_seconds_per_round(config.experiment_dir) if start else None
    if own is not None:   # a stopped run's own rounds say how fast this machine makes them
      estimate += (f'; its own {own[1]} rounds so far: a median {own[0]:.2f} s'
                   + ('' if own[2] else ' of training') +
                   f' (~{_duration(left * own[0])} at that pace)')
    lines.append(f'  {where}: {left} rounds left ({start_text}); {estimate}')
  lines.append(
      f'{len(configs) - done - blocked} of {len(configs)} runs to make, {total_rounds} rounds: '
      f'~{_duration(total_seconds)} as recorded'
      + (f', plus {_runs(untimed)} of a cost not recorded yet' if untimed else '')
      + (f'; {blocked} blocked (listed above)' if blocked else '')
      + ' (recorded mostly two runs side by side, so JOBS=2 takes about half of it in wall '
      'clock; checkpoints add to it'
      + (f'; {_runs(training_only)} sized by training time only (recorded before '
         'whole rounds were, or at another --eval_every): evaluation adds to it '
         f'({rd.whole_round_example()})' if training_only else '')
      + ')')
  return lines


def tune(suite: suites.Suite) -> dict:
  """Runs the grid and returns {algorithm: best overrides} (by the suite's criterion: the
  best last-10 mean, or the best single evaluated round)."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  points = tuning_points(suite)
  run_all([config for _, _, config in points], tuning=True)
  tuned = {}
  for run in suite.grid:
    best = None
    for _, values, config in (p for p in points if p[0] == run):
      r = rd.at_length(rd.load_run(config.experiment_dir), config.rounds)
      accuracy = r[rd.CRITERION_KEYS[suite.criterion]]
      if r['diverged'] is None and (best is None or accuracy > best[0]):
        best = (accuracy, values)
    if best is None:
      raise experiment.ExperimentError(f'every point of {run}\'s grid diverged; lower the grid')
    tuned[suite.config_overrides(run)['algorithm']] = best[1]
  return tuned


def run_probes(suite: suites.Suite, tuned, only=(), probes=()) -> None:
  """Makes `probe_configs(suite, tuned, only, probes)`."""
  run_all(probe_configs(suite, tuned, only, probes))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _SUITE.value is None:
    print('error: choose a suite with --suite=' + '|'.join(suites.SUITES), file=sys.stderr)
    return 2
  suite = suites.SUITES[_SUITE.value]
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError:
    print(f'error: --seeds must be integers, got {",".join(_SEEDS.value)}', file=sys.stderr)
    return 2
  unknown = sorted(set(_ONLY.value) - set(suite.runs))
  if unknown:
    print(f'error: --only names unknown runs {unknown}; the suite has {sorted(suite.runs)}',
          file=sys.stderr)
    return 2
  probes_mode = _PROBES.value or bool(_PROBE.value)
  unknown = sorted(set(_PROBE.value) - {p.name for p in suite.probes})
  if unknown:
    print(f'error: --probe names unknown probes {unknown}; the suite has '
          f'{sorted(p.name for p in suite.probes)}', file=sys.stderr)
    return 2
  if _TUNE.value + probes_mode + _REPORT.value > 1:
    print('error: choose one of --tune, --probes (or --probe), --report', file=sys.stderr)
    return 2
  if probes_mode and _ONLY.value and not any(
      set(p.runs) & set(_ONLY.value) for p in suite.probes
      if not _PROBE.value or p.name in _PROBE.value):
    print(f'error: no probe run is named in --only={",".join(_ONLY.value)}; the probes\' runs '
          f'are {sorted({r for p in suite.probes for r in p.runs})}', file=sys.stderr)
    return 2
  with stop_requests():
    return _main(suite, seeds, probes_mode)


def _print_plan(suite: suites.Suite, seeds: list, probes_mode: bool) -> int:
  """--plan: what the same command without it would make, and for how long."""
  if _REPORT.value:
    print('error: --plan lists runs to make; --report makes none', file=sys.stderr)
    return 2
  if _TUNE.value and not suite.needs_tuning():
    print(f'error: suite {suite.name} has no tuning grid', file=sys.stderr)
    return 2
  if probes_mode and not suite.probes:
    print(f'error: suite {suite.name} has no probes', file=sys.stderr)
    return 2
  if _TUNE.value:
    configs = [config for _, _, config in tuning_points(suite)]
  else:
    tuned = suites.load_tuned(suite.name)
    if suite.needs_tuning() and tuned is None:
      print(f'error: suite {suite.name} tunes its learning rates first: plan that with '
            f'python -m benchmarks.compare --suite={suite.name} --tune --plan', file=sys.stderr)
      return 2
    configs = (probe_configs(suite, tuned, _ONLY.value, _PROBE.value) if probes_mode
               else run_configs(suite, tuned, _ONLY.value, seeds))
  print('\n'.join(plan(suite, configs)))
  return 0


def run_and_write(make: Callable[[], Optional[int]], write: Callable[[], None]) -> int:
  """A command's exit code: `make()` (an exit code it returns ends the command, nothing
  written), then `write()` its pages. An ExperimentError ends it in one `error:` line (exit
  2); a stop signal (stopping.Interrupted) writes the pages as far as the runs got and says
  how to continue."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import stopping  # pylint: disable=g-import-not-at-top
  try:
    code = make()
  except experiment.ExperimentError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except stopping.Interrupted as e:
    print(f'stopped by {signal.Signals(e.signum).name} at {os.path.relpath(e.experiment_dir)} '
          f'(checkpointed after round {e.last_round}); the same command continues',
          file=sys.stderr)
    write()   # the pages as far as the runs got
    return e.exit_code
  if code is not None:
    return code
  write()
  return 0


def _main(suite: suites.Suite, seeds: list, probes_mode: bool) -> int:
  def make() -> Optional[int]:
    if _PLAN.value:
      return _print_plan(suite, seeds, probes_mode)
    if _TUNE.value:
      if not suite.needs_tuning():
        print(f'error: suite {suite.name} has no tuning grid', file=sys.stderr)
        return 2
      tuned = tune(suite)
      pages.write_json(suites.tuned_path(suite.name), tuned)
    elif not _REPORT.value:
      tuned = suites.load_tuned(suite.name)
      if suite.needs_tuning() and tuned is None:
        print(f'error: suite {suite.name} tunes its learning rates first: run '
              f'python -m benchmarks.compare --suite={suite.name} --tune', file=sys.stderr)
        return 2
      if probes_mode:
        if not suite.probes:
          print(f'error: suite {suite.name} has no probes', file=sys.stderr)
          return 2
        run_probes(suite, tuned, _ONLY.value, _PROBE.value)
      else:
        run_all(run_configs(suite, tuned, _ONLY.value, seeds))
    return None

  def write() -> None:
    report.write_all()
    print(f'wrote {os.path.relpath(os.path.join(suites.suite_dir(suite.name), "results.md"))} '
          '(and every other page)')

  return run_and_write(make, write)


if __name__ == '__main__':
  app.run(main)
