"""The run queue: makes a list of experiments, each to its end, resumably, shared by processes.

A finished run (or a diverged one: made again, it would diverge again) is skipped and a
stopped one resumes exactly from its last checkpoint, so the same command continues after a
kill. A run recorded with other settings than asked is an error naming its directory, never
taken for, nor replaced by, the run asked for. Two processes given the same list share it:
a run the other holds is skipped, then waited for at the end. SIGTERM/SIGINT (inside
`stop_requests`) stop the current run at its next round boundary, checkpointed.

`plan_runs` says what the queue would make and for how long, from the seconds a round took
in runs already recorded. The studies (programs/study.py) and the papers' suites
(benchmarks/compare.py) run their runs through here. Importing it imports neither
TensorFlow nor TFF.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from typing import Callable, Iterable, Optional

import numpy as np

from programs import experiment_config
from programs import run_directory
from programs import stopping
from programs.studies import records


def refuse_other_settings(r: dict, config, what: str) -> None:
  """ExperimentError if the loaded run `r` was recorded with other settings than `config`:
  `what` it is (e.g. 'a finished run') is never taken for, nor replaced by, this one."""
  changed = experiment_config.settings_changed(r['config'], config)
  if changed:
    raise experiment_config.ExperimentError(
        f'{os.path.relpath(config.experiment_dir)} holds {what} of other settings ({changed}); '
        'move it away and run again')


def finished(config) -> bool:
  """A run is finished exactly when its page says so: finished (or diverged) at its length,
  or made longer and read over its first `config.rounds` (records.at_length); a finished run
  of other settings (the declaration changed since) is an error, never taken for this one."""
  try:
    r = records.at_length(records.load_run(config.experiment_dir), config.rounds)
  except FileNotFoundError:   # not made yet, or moved away by another process
    return False
  if not (r['finished'] or r['diverged'] is not None):
    return False
  refuse_other_settings(r, config, 'a finished run')
  return True


# main's stopping.StopRequests: SIGTERM/SIGINT stop the current run at its next round
# boundary, checkpointed (stopping.Interrupted ends the command), as in programs/train.py.
_STOP = None


@contextlib.contextmanager
def stop_requests():
  """SIGTERM/SIGINT stop `run_all`'s current run at its next round boundary, checkpointed
  (stopping.Interrupted then ends the command)."""
  global _STOP
  with stopping.StopRequests() as _STOP:
    yield _STOP
  _STOP = None


def raise_if_stopped(config) -> None:
  """stopping.Interrupted if a stop signal has been recorded (before `config` starts)."""
  if _STOP is not None and _STOP.signum is not None:
    ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
    raise stopping.Interrupted(_STOP.signum,
                               max(run_directory.checkpointed_rounds(ckpt_dir), default=0),
                               config.experiment_dir)


def moved_away(config) -> bool:
  """The run's directory is gone, moved by another process between two looks at it: free,
  since the program makes it anew."""
  return not os.path.isdir(config.experiment_dir)


def run_one(config, before_run: Optional[Callable] = None) -> None:
  """Makes one run to its end (resumed from its checkpoint), unless it is finished;
  `before_run(config)` is called first (a caller's own care for the directory)."""
  from programs import experiment  # pylint: disable=g-import-not-at-top  (TF on first run)
  if finished(config):
    return
  raise_if_stopped(config)   # e.g. a signal while it waited for this run
  print(f'== {os.path.relpath(config.experiment_dir)}', file=sys.stderr, flush=True)
  if before_run is not None:
    before_run(config)
  config.resume = os.path.isdir(os.path.join(config.experiment_dir, 'checkpoints'))
  # On a terminal, the training program's progress bar (round, loss, accuracy, its ETA);
  # elsewhere run_all's one line per run. Bookkeeping: not part of the run's identity.
  config.progress = sys.stderr.isatty()
  experiment.run_experiment(config, stop=_STOP)


def run_all(configs, diverged_goes_on: bool = False,
            run: Optional[Callable] = None) -> None:
  """Makes every run of `configs` (finished ones are skipped, stopped ones resumed) with
  `run(config)` (default `run_one`).

  A run another process holds (run_directory.RunDirectoryBusy) is left to it and waited for at
  the end, then continued if that process stopped early: two commands on one list share its
  runs, each taking the next free one. With `diverged_goes_on` (a tuning grid, a study), a run
  whose training diverges is a result (recorded in its directory, shown on the page), not
  the end of the command.
  """
  run = run or run_one

  def make(config):
    try:
      run(config)
    except run_directory.RunDirectoryBusy:
      raise
    except experiment_config.ExperimentError as e:
      # The program has recorded it (run_directory.DIVERGED) before letting the run go.
      if not (diverged_goes_on and str(e).startswith('training diverged')):
        raise

  made_seconds = []   # wall seconds of each run this command made, for the ETA

  def make_and_report(config, left):
    if finished(config):
      return
    started = time.time()
    make(config)
    if finished(config):
      made_seconds.append(time.time() - started)
      print(run_line(config, made_seconds[-1], left, float(np.mean(made_seconds))),
            file=sys.stderr, flush=True)

  held_elsewhere = []
  for n, config in enumerate(configs):
    try:
      make_and_report(config, len(configs) - n - 1)
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
        raise_if_stopped(config)
        time.sleep(1.0)
        continue
      except experiment_config.ExperimentError:
        if not moved_away(config):
          raise
      try:
        make_and_report(config, 0)
        break
      except run_directory.RunDirectoryBusy:   # a third process took it first: wait again
        continue


def run_line(config, seconds: float, runs_left: int, mean_seconds: float) -> str:
  """The line a made run ends with: its rounds, final accuracy and wall time (summary.json),
  and the command's ETA: the runs after it in the list (finished ones are skipped) at the
  mean wall time of the runs this command made so far."""
  eta = (f'{runs_left} more {"run" if runs_left == 1 else "runs"} in the list, '
         f'~{_duration(runs_left * mean_seconds)} at this pace' if runs_left else
         'the last in the list')
  path = os.path.join(config.experiment_dir, 'summary.json')
  if not os.path.exists(path):   # diverged: recorded, without a summary
    return f'   diverged, {_duration(seconds)}; {eta}'
  with open(path) as f:
    summary = json.load(f)
  accuracy = summary.get('final_accuracy')
  accuracy = 'n/a' if accuracy is None else f'{accuracy:.4f}'
  return (f'   round {summary["rounds"]}/{config.rounds}, accuracy {accuracy}, '
          f'{_duration(seconds)}; {eta}')


def run_and_write(make: Callable[[], Optional[int]],
                  write: Callable[[], Optional[int]]) -> int:
  """A command's exit code: `make()` (an exit code it returns ends the command, nothing
  written), then `write()` its pages (an exit code it returns is the command's). An
  ExperimentError ends it in one `error:` line (exit 2); a stop signal (stopping.Interrupted)
  writes the pages as far as the runs got and says how to continue."""
  try:
    code = make()
  except experiment_config.ExperimentError as e:
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
  return write() or 0


def best_point(points, criterion: str) -> Optional[tuple]:
  """(accuracy, values) of the best finished point of a tuning grid by `criterion`
  (study.CRITERIA), from `points` [(values, config)] in grid order; the first of equals
  wins and a diverged point never does; None when every point diverged."""
  best = None
  for values, config in points:
    r = records.at_length(records.load_run(config.experiment_dir), config.rounds)
    accuracy = r[records.CRITERION_KEYS[criterion]]
    if r['diverged'] is None and (best is None or accuracy > best[0]):
      best = (accuracy, values)
  return best


# --------------------------------------------------------------------------- #
# What a list of runs would cost
# --------------------------------------------------------------------------- #


# What sets a round's cost: runs agreeing on these share their recorded seconds per round.
COST_FIELDS = ('algorithm', 'dataset', 'model', 'num_clients', 'clients_per_round',
               'local_epochs', 'batch_size', 'partition', 'eval_every')


# Training does not depend on the evaluation schedule: a run's training seconds stand for
# a run that differs only in --eval_every (its evaluation then not counted).
TRAINING_COST_FIELDS = tuple(f for f in COST_FIELDS if f != 'eval_every')


def _recorded_round_seconds(directories: Iterable[str]):
  """(config, whole, training) per recorded run directory (finished or not): its config
  (fields added since at their defaults) and the finite seconds of its rounds after the
  first (which also traces and compiles: left out, as in summary.json) but paused ones
  (PAUSED_ROUND), whole (metrics.csv's round_seconds) and training only (`seconds`)."""
  for directory in directories:
    path = os.path.join(directory, 'config.json')
    if not os.path.exists(path):
      continue
    with open(path) as f:
      config = experiment_config.recorded_config(json.load(f))
    rows = records.metrics_rows(directory)[1:]
    yield config, *(_without_pauses(records.metrics_column(rows, column))
                    for column in ('round_seconds', 'seconds'))


# A round over this many times its run's median round was paused (a process stopped with
# SIGSTOP while CI ran, a machine shared), not slow: it is left out of the recorded cost; the
# bound stays above an evaluated round of a run evaluated every few rounds.
PAUSED_ROUND = 5.0


def _without_pauses(seconds: np.ndarray) -> list:
  """The finite `seconds` of a run's rounds, less the paused ones (PAUSED_ROUND)."""
  seconds = seconds[np.isfinite(seconds)]
  if not seconds.size:
    return []
  return [float(v) for v in seconds if v <= PAUSED_ROUND * np.median(seconds)]


def recorded_seconds_per_round(directories: Iterable[str]) -> dict:
  """{COST_FIELDS values: (mean seconds of a round, whole)} over the recorded run
  `directories`. whole: the rounds as the program ran them, evaluation included
  (metrics.csv's round_seconds; a mean, so that rounds evaluated every --eval_every count as
  often as they come); else only their training (its `seconds`), for runs recorded without
  round_seconds."""
  seconds = {}
  for config, whole, training in _recorded_round_seconds(directories):
    key = tuple(getattr(config, f) for f in COST_FIELDS)
    kept = seconds.setdefault(key, ([], []))
    kept[0].extend(whole)
    kept[1].extend(training)
  return {key: (float(np.mean(whole)), True) if whole else (float(np.mean(training)), False)
          for key, (whole, training) in seconds.items() if whole or training}


def recorded_training_seconds(directories: Iterable[str]) -> dict:
  """{TRAINING_COST_FIELDS values: mean training seconds of a round} over the recorded run
  `directories`, whatever their --eval_every: the cost of a run whose evaluation schedule has
  no round recorded yet (e.g. runs made again every 5th round evaluated)."""
  seconds = {}
  for config, _, training in _recorded_round_seconds(directories):
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
  rows = records.metrics_rows(exp_dir)[1:]
  for column in ('round_seconds', 'seconds'):
    values = records.metrics_column(rows, column)
    values = values[np.isfinite(values)]
    if values.size >= MIN_OWN_ROUNDS:
      return float(np.median(values)), int(values.size), column == 'round_seconds'
  return None


# A run's own pace is shown once it has this many rounds after its first.
MIN_OWN_ROUNDS = 3


def _runs(n: int) -> str:
  return f'{n} run' + ('' if n == 1 else 's')


def _duration(seconds: float) -> str:
  if seconds < 60:
    return f'{seconds:.0f} s'
  return f'{seconds / 60:.0f} min' if seconds < 3600 else f'{seconds / 3600:.1f} h'


# What starting a run costs beside its rounds (summary.json's startup_seconds: the data, the
# computations built, TFF's worker compiling them), until recorded runs measure it: the
# 15-25 s a run took here (2 cores, digits and fashion_mnist).
DEFAULT_STARTUP_SECONDS = 20.0


def recorded_startup_seconds(directories: Iterable[str]) -> Optional[tuple]:
  """(median startup_seconds, runs it rests on) of the recorded run `directories` whose
  summary.json has it (runs finished since it is recorded); None if none has."""
  values = []
  for directory in directories:
    path = os.path.join(directory, 'summary.json')
    if os.path.exists(path):
      with open(path) as f:
        value = json.load(f).get('startup_seconds')
      if value is not None:
        values.append(float(value))
  return (float(np.median(values)), len(values)) if values else None


def plan_runs(configs, recorded: Iterable[str], moves_to: Optional[Callable] = None,
              note: str = '', whole_round_example: Callable[[], str] = lambda: '') -> list:
  """The lines a plan prints: each run of `configs` still to make, the rounds it has left (a
  stopped run resumes from its last checkpoint, a run without one starts over) and their
  time at the seconds per round of the `recorded` run directories of the same cost (whole
  rounds where recorded, else their training), and for a stopped run also at its own pace
  (own_seconds_per_round); a run the command would stop at (recorded with other settings) as
  blocked, with the reason; then the total, closed by `note`.

  `moves_to(config)`: where the caller's `before_run` would move a run's directory before
  making it anew (None: it stays), or ExperimentError when it would stop there.
  `whole_round_example()`: what a whole round costs beside its training, for a total that
  rests on training seconds only.
  """
  recorded = list(recorded)
  startup = recorded_startup_seconds(recorded)
  startup_seconds = DEFAULT_STARTUP_SECONDS if startup is None else startup[0]
  per_round = recorded_seconds_per_round(recorded)
  training_per_round = recorded_training_seconds(recorded)
  lines, total_rounds, total_seconds, untimed, done, blocked = [], 0, 0.0, 0, 0, 0
  training_only = 0
  for config in configs:
    where = os.path.relpath(config.experiment_dir)
    try:   # the command's own checks: other settings, fewer rounds, a lost record, a move
      if finished(config):
        done += 1
        continue
      start = run_directory.resume_point(dataclasses.replace(config, resume=True))
      target = moves_to(config) if moves_to else None
    except experiment_config.ExperimentError as e:
      blocked += 1
      lines.append(f'  {where}: blocked: {e}')
      continue
    left = config.rounds - start
    seconds, whole = per_round.get(tuple(getattr(config, f) for f in COST_FIELDS), (None, None))
    extra = '' if whole else ' (training only)'
    if seconds is None:   # e.g. made again at another --eval_every: its training is known
      seconds = training_per_round.get(tuple(getattr(config, f) for f in TRAINING_COST_FIELDS))
      extra = ' (training only, recorded at another --eval_every)'
    total_rounds += left
    if seconds is None:
      untimed += 1
      estimate = 'no round of this cost recorded yet'
    else:
      total_seconds += startup_seconds + left * seconds   # a resumed run starts up again
      training_only += not whole
      estimate = (f'~{_duration(startup_seconds + left * seconds)} at {seconds:.2f} s/round'
                  f'{extra} and {startup_seconds:.0f} s start-up')
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
  closing = [note] if note else []
  to_make = len(configs) - done - blocked
  if to_make:
    closing.insert(0, f'start-up {startup_seconds:.0f} s a run, ' + (
        f'the median of {_runs(startup[1])} recorded' if startup else
        'a default until runs record it'))
  if training_only:
    example = whole_round_example()
    closing.append(f'{_runs(training_only)} sized by training time only (recorded before '
                   'whole rounds were, or at another --eval_every): evaluation adds to it'
                   + (f' ({example})' if example else ''))
  lines.append(
      f'{to_make} of {len(configs)} runs to make, {total_rounds} rounds: '
      f'~{_duration(total_seconds)} as recorded'
      + (f', plus {_runs(untimed)} of a cost not recorded yet' if untimed else '')
      + (f'; {blocked} blocked (listed above)' if blocked else '')
      + (f' ({"; ".join(closing)})' if closing else ''))
  return lines
