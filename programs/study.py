r"""Runs a study: methods x settings x seeds, tuned, resumed and compared over paired seeds.

  python -m programs.study tune study.toml     # each grid on the tuning seed -> tuned.json
  python -m programs.study run study.toml      # every run x seed, then the page
  python -m programs.study plan study.toml     # what `tune` and `run` would make, how long
  python -m programs.study report study.toml   # the page only, from the run directories

A study file declares the runs, seeds, comparisons and tuning grids (docs/studies.md). The
whole file and every run's settings are checked before anything trains: a mistake is one
`error:` line naming the file, the table and the key (exit 2). Every run is an ordinary run
directory of programs/train.py under the study's output_dir; a finished run is skipped and
a stopped one resumes exactly, so the same command continues after a kill, and two copies of
one command share its runs. SIGTERM/SIGINT stop at the next round boundary, checkpointed
(exit 128 + the signal). The page (results.md, results.json, curves.png in output_dir) is
written from the run directories alone; a file's `report = "module:function"` (a module of
programs/ or your own) writes its pages instead, except under --output_dir. The papers'
suites (benchmarks/studies/) name benchmarks' writers, which programs never import: run
them with `python -m benchmarks.study`, which lends them here (`LENT_WRITERS`).
"""

import dataclasses
import glob
import importlib
import os
import sys
from typing import Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


from absl import flags
from absl import logging

from programs import experiment_config
from programs import flag_parsing
from programs import run_directory
from programs.studies import command_flags
from programs.studies import queue
from programs.studies import study_configs
from programs.studies import study_file
from programs.studies import study_page
from programs.studies import tuning

COMMANDS = ('run', 'tune', 'plan', 'report')
# Page writers a program wrapping this one lends, by the `report` value that names them
# (benchmarks/study.py lends the paper layer's). Any other `report` is imported here, unless
# it names a module of OUT_OF_REACH: programs never import those (tests/test_layers.py).
LENT_WRITERS: dict = {}
OUT_OF_REACH = ('benchmarks', 'tests')
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Where the study\'s runs, tuned.json and page go (relative to the '
    'working directory); default: the file\'s output_dir (relative to the file).')
_ONLY = command_flags.ONLY


def _error(message: str) -> int:
  print(f'error: {message}', file=sys.stderr)
  return 2


def main(argv):
  logging.set_verbosity(logging.WARNING)
  args = argv[1:]
  if len(args) != 2 or args[0] not in COMMANDS:
    return _error(f'give a command and a study file: python -m programs.study '
                  f'{"|".join(COMMANDS)} STUDY.toml (docs/studies.md)')
  command, path = args
  try:
    study = study_file.load(path, _OUTPUT_DIR.value)
  except study_file.StudyFileError as e:
    return _error(str(e))
  unknown = [run for run in _ONLY.value if run not in study.runs]
  if unknown:
    return _error(f'--only names {", ".join(unknown)}, not runs of {path}; its runs are '
                  f'{", ".join(study.runs)}')
  if _ONLY.value and command not in ('run', 'plan'):
    return _error(f'--only chooses runs for `run` and `plan`; `{command}` takes the whole study')
  try:   # (`plan` writes no page)
    write = _writer(study) if command != 'plan' else None
  except study_file.StudyFileError as e:
    return _error(str(e))
  with queue.stop_requests():
    return queue.run_and_write(lambda: _make(command, study),
                               lambda: _write_pages(write, study))


def _make(command: str, study):
  """The command's runs (an exit code ends it before the page is written)."""
  only = tuple(_ONLY.value)
  if command == 'report':
    return None
  if command == 'plan':
    configs = [c for _, _, c in study_configs.tuning_points(study, only)]
    tuned = tuning.tuned_values(study) if tuning.load(study) or not study.grid else None
    configs += study_configs.run_configs(study, tuned, only)
    recorded = [os.path.dirname(p) for kind in ('runs', 'tuning')
                for p in sorted(glob.glob(os.path.join(study.output_dir, kind, '*',
                                                       'metrics.csv')))]
    if study.grid and tuned is None:
      print(f'(the reported runs at their untuned settings: '
            f'`python -m programs.study tune {study.path}` sets their rates first)')
    print('\n'.join(queue.plan_runs(configs, recorded)))
    return 0
  if command == 'tune':
    if not study.grid:
      return _error(f'{study.path} has no [tune.<run>] grid: nothing to tune')
    _check_before_training([c for _, _, c in study_configs.tuning_points(study)])
    tuning.tune(study)
    return None
  configs = study_configs.run_configs(study, tuning.tuned_values(study), only)
  _check_before_training(configs)
  queue.run_all(configs, diverged_goes_on=True)
  return None


def _check_before_training(configs) -> None:
  """ExperimentError, before any run starts, for any run the queue would stop at: settings
  the program refuses, or a directory holding a run of other settings."""
  for config in configs:
    experiment_config.validate(config)
    if not queue.finished(config):
      run_directory.resume_point(
          dataclasses.replace(config, resume=True))


def _writer(study):
  """What writes the study's page: the file's `report` (a module:function lent, or of
  programs/ or the user's, for its own output_dir only), else the generic page (`_write`).
  StudyFileError when `report` names nothing importable, or a module of OUT_OF_REACH."""
  if not study.report or _OUTPUT_DIR.value:
    return _write
  if study.report in LENT_WRITERS:
    return LENT_WRITERS[study.report]
  module, function = study.report.split(':')
  if module.split('.')[0] in OUT_OF_REACH:
    raise study_file.StudyFileError(
        f'{study.path} report: "{study.report}" is a module of {module.split(".")[0]}/, which '
        'programs never import; run a paper suite\'s file with `python -m benchmarks.study`, '
        'or name a module of programs/ or your own')
  try:
    return getattr(importlib.import_module(module), function)
  except (ImportError, AttributeError) as e:
    raise study_file.StudyFileError(f'{study.path} report: "{study.report}" cannot be '
                                    f'imported ({e}); name a module:function, or drop the key '
                                    'for the generic page') from None


def _write_pages(write, study) -> Optional[int]:
  """`write(study)`; a StudyFileError it raises (a paper layer refusing the file) is one
  `error:` line, exit 2."""
  try:
    write(study)
  except study_file.StudyFileError as e:
    return _error(str(e))
  return None


def _write(study) -> None:
  options = f' --output_dir={_OUTPUT_DIR.value}' if _OUTPUT_DIR.value else ''
  study_page.write(study, options)
  print(f'wrote {os.path.relpath(os.path.join(study.output_dir, "results.md"))} '
        '(results.json, curves.png beside it)')


if __name__ == '__main__':
  flag_parsing.run(main)
