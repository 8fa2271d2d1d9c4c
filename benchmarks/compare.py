r"""Runs a paper comparison (benchmarks/suites.py) over fixed seeds and writes its results page.

  python -m benchmarks.compare --suite=fedcda --tune      # learning-rate grid, one seed
  python -m benchmarks.compare --suite=fedcda             # every run x seeds 0, 1, 2
  python -m benchmarks.compare --suite=fedcda --report    # the page only, from the runs
  python -m benchmarks.compare --suite=fedcda --probes    # runs that test a diagnosis
  python -m benchmarks.compare --suite=fedcda --plan      # what it would run, and how long

Every run is an ordinary experiment directory (`benchmarks/results/<suite>/runs/<run>_s<seed>`,
tuning runs under `tuning/`, probe runs under `probes/<probe>/`). A finished run is skipped
and a stopped one resumes exactly, so the same command continues a suite after a kill or at
the next session. Two copies of one command share its runs: a run the other holds is
skipped, then waited for at the end (`bash benchmarks/reproduce.sh` with JOBS=2). After running,
`benchmarks/report.py` rewrites `results.md`, `results.json` and `curves.png` of the suite and
`benchmarks/results/REPRODUCTION.md` from the committed run directories.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


from absl import flags
from absl import logging

from benchmarks import report
from benchmarks import suite_runs
from benchmarks import suites
from programs import experiment_config
from programs import flag_parsing
from programs import generated_files
from programs import run_directory
from programs.studies import command_flags
from programs.studies import declaration
from programs.studies import queue
from programs.studies import records
from programs.studies import study_configs
from programs.studies import tuning

_SUITE = flags.DEFINE_enum('suite', None, list(suites.SUITES), 'Which comparison to run.')
_SEEDS = flags.DEFINE_list('seeds', [str(s) for s in suites.SEEDS],
                           'Seeds of every run (the pages show every seed run).')
_ONLY = command_flags.ONLY
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


def shorter_run_target(config) -> Optional[str]:
  """Where `_keep_shorter_run` would move the run directory of `config` (None: it stays).
  A finished run shorter than `config.rounds` with no checkpoint to continue from would be
  made again from round 1 over its record: a reported run (under the suite's runs/) moves to
  the suite's earlier_runs/rounds<N>/, whose path is returned. ExperimentError when it
  cannot be kept so: recorded with other settings, its name kept there already, or a probe's
  or tuning run (which has no such place)."""
  exp_dir = os.path.abspath(config.experiment_dir)
  try:
    if run_directory.checkpointed_rounds(os.path.join(exp_dir, 'checkpoints')):
      return None
    r = records.load_run(exp_dir)   # at its own length
  except FileNotFoundError:   # not made yet, or moved away by the other compare process
    return None
  if not r['finished'] or r['rounds'] >= config.rounds:
    return None
  where = os.path.relpath(exp_dir)
  queue.refuse_other_settings(r, config, f'a shorter finished run ({r["rounds"]} rounds)')
  suite_dir = os.path.dirname(os.path.dirname(exp_dir))
  reported = os.path.abspath(os.path.join(suites.suite_dir(os.path.basename(suite_dir)), 'runs'))
  if os.path.dirname(exp_dir) != reported:   # a probe's or tuning run (a probe named 'runs' too)
    raise experiment_config.ExperimentError(
        f'{where} holds a finished run of {r["rounds"]} rounds and no checkpoint to continue it '
        f'to {config.rounds}: move it away and run again')
  target = os.path.join(suite_runs.kept_dir(suite_dir, r['rounds']), os.path.basename(exp_dir))
  if os.path.exists(target):
    raise experiment_config.ExperimentError(
        f'{where} is to be made again at {config.rounds} rounds, but {os.path.relpath(target)} '
        'already keeps a run of that name: move one of them away and run again')
  return target


def _keep_shorter_run(config) -> None:
  """Moves a shorter finished run about to be made again (`shorter_run_target`) to the
  suite's earlier_runs/rounds<N>/, where its page compares the two makings
  (suite_runs.remade_runs), instead of letting the new making overwrite its record: the queue's
  `before_run` for the suites."""
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
  except experiment_config.ExperimentError:
    if queue.moved_away(config):
      return   # the other process moved it first: the run is made anew
    raise
  print(f'   its shorter run is kept in {os.path.relpath(target)}; making it again from round 1',
        file=sys.stderr, flush=True)


def _run(config) -> None:
  """Makes one suite run (`queue.run_one`), keeping a shorter making of it first."""
  queue.run_one(config, before_run=_keep_shorter_run)


def run_all(configs, tuning: bool = False) -> None:
  """`queue.run_all` of suite runs (each made by `_run`); in tuning, a grid point that
  diverges is a result of the grid (shown on the page), not a failure of the suite."""
  queue.run_all(configs, diverged_goes_on=tuning,
                run=lambda config: _run(config))  # pylint: disable=unnecessary-lambda  (late-bound)


def tuning_points(suite: suites.Suite) -> list:
  """[(run, grid values, config)] of the suite's learning-rate grid, in grid order
  (study_configs.tuning_points)."""
  return study_configs.tuning_points(suite.declared)


def run_configs(suite: suites.Suite, tuned, only=(), seeds=suites.SEEDS) -> list:
  """The suite's reported runs (those named in `only`, if given) over `seeds`
  (study_configs.run_configs)."""
  return study_configs.run_configs(dataclasses.replace(suite.declared, seeds=tuple(seeds)),
                                 tuned, only)


def probe_configs(suite: suites.Suite, tuned, only=(), probes=()) -> list:
  """Every probe's runs (only the probes named in `probes` and the runs named in `only`, if
  given): the suite's run (tuned) with the probe's changes, over the probe's own seeds, seed
  by seed as in `run_configs`."""
  return [suites.experiment_config(
      suite.probe_overrides(probe, run, tuned), seed, suites.probe_dir(suite.name, probe.name),
      declaration.run_name(run, seed))
          for probe in suite.probes if not probes or probe.name in probes
          for seed in probe.seeds
          for run in probe.runs if not only or run in only]


def recorded_dirs(suite_name: str) -> list:
  """Every run directory the suite has recorded metrics of (reported, tuning, probes,
  superseded; finished or not): what its plans size a round by."""
  return [directory for _, directory in suite_runs.recorded_runs(suite_name)]


def plan(suite: suites.Suite, configs) -> list:
  """`plan_runs` of a suite's `configs`."""
  return plan_runs(suite.name, configs)


def plan_runs(results_name: str, configs) -> list:
  """`queue.plan_runs` for runs under benchmarks/results/<results_name>/, at the seconds per
  round that results folder has recorded; a shorter run `_keep_shorter_run` would move is
  said so."""
  return queue.plan_runs(
      configs, recorded_dirs(results_name), moves_to=shorter_run_target,
      note='recorded mostly two runs side by side, so JOBS=2 takes about half of it in wall '
      'clock; checkpoints add to it', whole_round_example=suite_runs.whole_round_example)


def tune(suite: suites.Suite) -> dict:
  """Runs the grid, freezes the choice in tuned.json and returns it: {algorithm: best
  overrides} by the suite's criterion (the best last-10 mean, or the best single evaluated
  round). A suite declared by a study file writes the study's record (`tuning.freeze`, as
  `programs.study tune` does); another, the bare choice."""
  points = tuning_points(suite)
  run_all([config for _, _, config in points], tuning=True)
  if suite.study_decl is not None:
    return tuning.freeze(suite.study_decl)['chosen']
  tuned = {}
  for run in suite.grid:
    best = queue.best_point([(values, config) for name, values, config in points if name == run],
                            suite.criterion)
    if best is None:
      raise experiment_config.ExperimentError(
          f'every point of {run}\'s grid diverged; lower the grid')
    tuned[suite.algorithm(run)] = best[1]
  generated_files.write_json(suites.tuned_path(suite.name), tuned)
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
  with queue.stop_requests():
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


def _main(suite: suites.Suite, seeds: list, probes_mode: bool) -> int:
  def make() -> Optional[int]:
    if _PLAN.value:
      return _print_plan(suite, seeds, probes_mode)
    if _TUNE.value:
      if not suite.needs_tuning():
        print(f'error: suite {suite.name} has no tuning grid', file=sys.stderr)
        return 2
      tune(suite)
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

  return queue.run_and_write(make, write)


if __name__ == '__main__':
  flag_parsing.run(main)
