r"""Runs a paper comparison (benchmarks/suites.py) over fixed seeds and writes its results page.

  python -m benchmarks.compare --suite=fedcda --tune      # learning-rate grid, one seed
  python -m benchmarks.compare --suite=fedcda             # every run x seeds 0, 1, 2
  python -m benchmarks.compare --suite=fedcda --report    # the page only, from the runs
  python -m benchmarks.compare --suite=fedcda --probes    # runs that test a diagnosis

Every run is an ordinary experiment directory (`benchmarks/<suite>/runs/<run>_s<seed>`,
tuning runs under `tuning/`, probe runs under `probes/<probe>/`). A finished run is skipped and a stopped one resumes exactly,
so the same command continues a suite after a kill or at the next session. After running,
`benchmarks/report.py` rewrites `results.md`, `results.json` and `curves.png` of the suite and
`benchmarks/REPRODUCTION.md` from the committed run directories.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from benchmarks import report
from benchmarks import suites

_SUITE = flags.DEFINE_enum('suite', None, list(suites.SUITES), 'Which comparison to run.')
_SEEDS = flags.DEFINE_list('seeds', [str(s) for s in suites.SEEDS],
                           'Seeds of every run (the pages show every seed run).')
_ONLY = flags.DEFINE_list('only', [], 'Run only these run names (all seeds).')
_TUNE = flags.DEFINE_bool('tune', False, 'Run the suite\'s learning-rate grid and freeze the '
                          'best value per algorithm in tuned.json.')
_REPORT = flags.DEFINE_bool('report', False, 'Write the pages from the runs; train nothing.')
_PROBES = flags.DEFINE_bool('probes', False, 'Run the suite\'s probes (runs at changed '
                            'settings that test a diagnosis, benchmarks/suites.py: Probe) '
                            'instead of its reported runs, over each probe\'s own seeds '
                            '(--only applies, --seeds does not).')
_PROBE = flags.DEFINE_list('probe', [], 'Run only these probes of the suite (implies --probes).')


def _finished(config) -> bool:
  """A run is finished exactly when its page says so (report.load_run)."""
  if not os.path.exists(os.path.join(config.experiment_dir, 'config.json')):
    return False
  r = report.load_run(config.experiment_dir, config.rounds)
  return r['finished'] or r['diverged'] is not None


def _run(config) -> None:
  from programs import experiment  # pylint: disable=g-import-not-at-top
  if _finished(config):
    return
  config.resume = os.path.isdir(os.path.join(config.experiment_dir, 'checkpoints'))
  print(f'== {os.path.relpath(config.experiment_dir)}', file=sys.stderr, flush=True)
  experiment.run_experiment(config)


def _config(suite, fields, seed, directory, name):
  from programs import experiment  # pylint: disable=g-import-not-at-top
  # Relative to the repository root (where `python -m benchmarks.compare` runs), so the
  # committed config.json and summary.json hold no machine-specific paths.
  return experiment.ExperimentConfig(**fields, seed=seed, progress=False,
                                     root_output_dir=os.path.relpath(directory),
                                     experiment_name=name)


def tune(suite: suites.Suite) -> dict:
  """Runs the grid and returns {algorithm: best overrides} (best last-10 mean)."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  tuned = {}
  for run, grid in suite.grid.items():
    algorithm = suite.config_overrides(run)['algorithm']
    best = None
    for values in report.grid_points(grid):
      config = _config(suite, suite.tuning_overrides(run, values), suites.TUNING_SEED,
                       os.path.join(suites.suite_dir(suite.name), 'tuning'),
                       suites.tuning_name(run, values))
      try:
        _run(config)
      except experiment.ExperimentError as e:
        # A grid point that diverges is a result of the grid (shown on the page), not a
        # failure of the suite.
        if not str(e).startswith('training diverged'):
          raise
        report.mark_diverged(config.experiment_dir, str(e))
      r = report.load_run(config.experiment_dir)
      if r['diverged'] is None and (best is None or r['last10_mean_accuracy'] > best[0]):
        best = (r['last10_mean_accuracy'], values)
    if best is None:
      raise experiment.ExperimentError(f'every point of {run}\'s grid diverged; lower the grid')
    tuned[algorithm] = best[1]
  return tuned


def run_probes(suite: suites.Suite, tuned, only=(), probes=()) -> None:
  """Every probe's runs (only the probes named in `probes` and the runs named in `only`, if
  given): the suite's run (tuned) with the probe's changes, over the probe's own seeds."""
  for probe in suite.probes:
    if probes and probe.name not in probes:
      continue
    for run in probe.runs:
      if only and run not in only:
        continue
      for seed in probe.seeds:
        _run(_config(suite, suite.probe_overrides(probe, run, tuned), seed,
                     suites.probe_dir(suite.name, probe.name), suites.run_name(run, seed)))


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
    print('error: choose one of --tune, --probes, --report', file=sys.stderr)
    return 2
  from programs import experiment  # pylint: disable=g-import-not-at-top
  try:
    if _TUNE.value:
      if not suite.needs_tuning():
        print(f'error: suite {suite.name} has no tuning grid', file=sys.stderr)
        return 2
      tuned = tune(suite)
      path = suites.tuned_path(suite.name)
      with open(path + '.tmp', 'w') as f:
        json.dump(tuned, f, indent=1, sort_keys=True)
        f.write('\n')
      os.replace(path + '.tmp', path)
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
      for run in ([] if probes_mode else suite.runs):
        if _ONLY.value and run not in _ONLY.value:
          continue
        for seed in seeds:
          _run(_config(suite, suite.config_overrides(run, tuned), seed,
                       os.path.join(suites.suite_dir(suite.name), 'runs'),
                       suites.run_name(run, seed)))
  except experiment.ExperimentError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  report.write_all()
  print(f'wrote {os.path.relpath(os.path.join(suites.suite_dir(suite.name), "results.md"))} '
        '(and every other page)')
  return 0


if __name__ == '__main__':
  app.run(main)
