"""A study file (TOML) read into a `study.Study`, every mistake refused before anything trains.

  name = "dir01"               # optional; default: the file's stem
  seeds = [0, 1, 2]
  output_dir = "runs/dir01"    # optional, relative to the file; default: <its folder>/<stem>
  criterion = "last10"         # or "best"
  tuning_seed = 100            # optional; not one of the seeds
  tuning_rounds = 50           # optional; default: the runs' own length
  common_from = "other.toml"   # optional: [common] over that study file's [common]
  [common]                     # trainer flags of every run (programs.train's names)
  [runs.<run>]                 # one table per run: its flags over [common]
  [[compare]]                  # method = "<run>", baseline = "<run>", label = "..."
  [tune.<run>]                 # a grid: trainer flag = [candidate values]
  [tuned_as]                   # <algorithm> = "<algorithm with a grid>"
  report = "pkg.module:function"   # optional: a page writer of your own (docs/studies.md)

docs/studies.md explains each key. A mistake is a `StudyFileError` of one line naming the
file, the table and the key, and the fix (`study.toml [runs.fedavg] clinet_lr: not a trainer
flag (did you mean client_lr?)`); every run's and every grid point's settings pass the
program's own validation (experiment_config.validate) here. Imports neither TensorFlow nor
TFF.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from typing import Optional

from programs import experiment_config
from programs import methods
from programs.studies import declaration
from programs.studies import records

FIELDS = experiment_config.ExperimentConfig.__dataclass_fields__
# Trainer flags the study sets itself for every run, and how.
STUDY_SETS = {
    'seed': 'from seeds and tuning_seed',
    'root_output_dir': 'under output_dir',
    'experiment_name': 'as <run>_s<seed>',
    'resume': 'every stopped run is resumed',
    'progress': 'no progress bar',
}
TOP_KEYS = ('name', 'seeds', 'output_dir', 'criterion', 'tuning_seed', 'tuning_rounds',
            'common_from', 'common', 'runs', 'compare', 'tune', 'tuned_as', 'report')
COMPARE_KEYS = ('method', 'baseline', 'label')
# A run's name is a directory name's start (<run>_s<seed>).
RUN_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.-]*')
# A page writer: an importable module and a function of it.
WRITER = re.compile(r'[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*')


class StudyFileError(ValueError):
  """A mistake in a study file; its message is one line: file [table] key: problem; fix."""


def _error(path: str, table: str, key: str, problem: str) -> StudyFileError:
  where = ' '.join(part for part in (path, table, key and f'{key}:') if part)
  return StudyFileError(f'{where} {problem}')


def _did_you_mean(key: str, choices) -> str:
  close = difflib.get_close_matches(key, list(choices), n=1)
  return f' (did you mean {close[0]}?)' if close else ''


KINDS = {bool: 'a boolean', int: 'an integer', float: 'a number', str: 'a string'}


def _kind(value) -> str:
  if type(value) in KINDS:
    return KINDS[type(value)]
  if isinstance(value, list):
    return 'a list'
  if isinstance(value, dict):
    return 'a table'
  return type(value).__name__


def _toml(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, str):
    return f'"{value}"'
  return repr(value)


def flag_type(name: str) -> type:
  """The type a trainer flag takes (its default's; a flag without a default takes a string)."""
  default = FIELDS[name].default
  return str if default is None else type(default)


def _flag_value(path: str, table: str, key: str, value):
  """`value` as trainer flag `key` takes it (an integer for a float flag becomes a float)."""
  want = flag_type(key)
  if key == 'method_kwargs' and isinstance(value, dict):   # a table: the method's keywords
    return json.dumps(value, sort_keys=True)
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  if want is float and number:
    return float(value)
  if (want is bool and isinstance(value, bool)) or (
      want is int and number and isinstance(value, int)) or (
      want is str and isinstance(value, str)):
    return value
  example = FIELDS[key].default if FIELDS[key].default is not None else '...'
  raise _error(path, table, key, f'{_toml(value)} is {_kind(value)}, but --{key} takes '
               f'{KINDS[want]} (e.g. {key} = {_toml(example)})')


def _flags(path: str, table: str, values, grid: bool = False) -> dict:
  """A table of trainer flags (a grid: of lists of candidate values), checked key by key."""
  if not isinstance(values, dict):
    raise _error(path, table, '', f'is {_kind(values)}; make it a table of trainer flags')
  out = {}
  for key, value in values.items():
    if key in STUDY_SETS:
      raise _error(path, table, key, f'set by the study ({STUDY_SETS[key]}); drop it')
    if key not in FIELDS:
      raise _error(path, table, key, 'not a trainer flag' + (
          _did_you_mean(key, [f for f in FIELDS if f not in STUDY_SETS])
          or ' (python -m programs.train --help lists them)'))
    if not grid:
      out[key] = _flag_value(path, table, key, value)
      continue
    if not isinstance(value, list) or not value:
      raise _error(path, table, key, f'{_toml(value)} is {_kind(value)}; a grid gives a '
                   f'non-empty list of candidate values (e.g. {key} = '
                   f'[{_toml(FIELDS[key].default)}])')
    candidates = [_flag_value(path, table, key, v) for v in value]
    if len(set(candidates)) < len(candidates):
      raise _error(path, table, key, f'{value} repeats a value; give each candidate once')
    out[key] = candidates
  return out


def _integer(path: str, key: str, value, least: int = 0) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < least:
    raise _error(path, '', key, f'{_toml(value)} is not an integer of at least {least}')
  return value


def _string(path: str, table: str, key: str, value) -> str:
  if not isinstance(value, str) or not value:
    raise _error(path, table, key, f'{_toml(value)} is {_kind(value)}; give a non-empty string')
  return value


def load(path: str, output_dir: Optional[str] = None) -> declaration.Study:
  """The `Study` of the file at `path`, checked throughout (StudyFileError, one line).

  `output_dir` (relative to the working directory) replaces the file's own (relative to the
  file's folder; default: <folder of the file>/<its stem>).
  """
  return _load(path, output_dir, ())


def _common_from(path: str, raw: dict, chain: tuple) -> dict:
  """The [common] the file's `common_from` names (a study file, relative to this one's
  folder, itself checked throughout); {} without the key."""
  if 'common_from' not in raw:
    return {}
  other = _string(path, '', 'common_from', raw['common_from'])
  other_path = os.path.normpath(os.path.join(os.path.dirname(path), other))
  if not os.path.isfile(other_path):
    raise _error(path, '', 'common_from', f'"{other}": no such file (relative to this file\'s '
                 'folder); name the study file whose [common] this one starts from')
  if os.path.abspath(other_path) in chain:
    raise _error(path, '', 'common_from', f'"{other}" leads back to this file; a file\'s '
                 '[common] cannot start from itself')
  return _load(other_path, None, chain).common


def _load(path: str, output_dir: Optional[str], chain: tuple) -> declaration.Study:
  chain += (os.path.abspath(os.path.normpath(path)),)
  try:
    with open(path, 'rb') as f:
      raw = tomllib.load(f)
  except FileNotFoundError:
    raise StudyFileError(f'{path}: no such file; give the path of a study file '
                         '(docs/studies.md)') from None
  except OSError as e:
    raise StudyFileError(f'{path}: cannot read it ({e.strerror})') from None
  except tomllib.TOMLDecodeError as e:
    raise StudyFileError(f'{path}: not valid TOML ({e}); fix the line it names') from None
  for key in raw:
    if key not in TOP_KEYS:
      if key in FIELDS and key not in STUDY_SETS:
        problem = 'a trainer flag: put it under [common] (or a [runs.<run>] table)'
      else:
        problem = (f'not a study key{_did_you_mean(key, TOP_KEYS)}; the keys are '
                   f'{", ".join(TOP_KEYS)}')
      raise _error(path, '', key, problem)
  stem = os.path.splitext(os.path.basename(path))[0]
  name = _string(path, '', 'name', raw.get('name', stem))
  if 'seeds' not in raw:
    raise _error(path, '', 'seeds', 'missing; give the reported seeds, e.g. seeds = [0, 1, 2]')
  seeds = raw['seeds']
  if not isinstance(seeds, list) or not seeds:
    raise _error(path, '', 'seeds', f'{_toml(seeds)} is not a list of seeds; give e.g. '
                 'seeds = [0, 1, 2]')
  seeds = tuple(_integer(path, 'seeds', s) for s in seeds)
  if len(set(seeds)) < len(seeds):
    raise _error(path, '', 'seeds', f'{list(seeds)} repeats a seed; give each seed once')
  criterion = raw.get('criterion', 'last10')
  if criterion not in declaration.CRITERIA:
    raise _error(path, '', 'criterion', f'{_toml(criterion)} is not a criterion; choose '
                 + ' or '.join(f'"{c}"' for c in declaration.CRITERIA))
  tuning_seed = _integer(path, 'tuning_seed', raw.get('tuning_seed', declaration.TUNING_SEED))
  if tuning_seed in seeds:
    raise _error(path, '', 'tuning_seed', f'{tuning_seed} is one of the seeds {list(seeds)}: '
                 'tuning on a reported seed would favour it; choose another (default '
                 f'{declaration.TUNING_SEED})')
  tuning_rounds = raw.get('tuning_rounds')
  if tuning_rounds is not None:
    tuning_rounds = _integer(path, 'tuning_rounds', tuning_rounds, least=1)
  own_output_dir = _string(path, '', 'output_dir', raw.get('output_dir', stem))
  if output_dir is None:   # the file's own, relative to the file
    output_dir = os.path.join(os.path.dirname(path), own_output_dir)
  common = dict(_common_from(path, raw, chain),
                **_flags(path, '[common]', raw.get('common', {})))
  runs = raw.get('runs')
  if not isinstance(runs, dict) or not runs:
    raise _error(path, '[runs]', '', 'missing; give each run a table, e.g. [runs.fedavg] with '
                 'algorithm = "fedavg"')
  for run in runs:
    if not RUN_NAME.fullmatch(run):
      raise _error(path, f'[runs.{run}]', '', 'is not a run name: use letters, digits, '
                   '_ . and - (it names the run\'s directories)')
  runs = {run: _flags(path, f'[runs.{run}]', values) for run, values in runs.items()}
  comparisons = _comparisons(path, raw.get('compare', []), runs)
  grid = raw.get('tune', {})
  if not isinstance(grid, dict):
    raise _error(path, '[tune]', '', f'is {_kind(grid)}; give one table per tuned run')
  for run in grid:
    if run not in runs:
      raise _error(path, f'[tune.{run}]', '', f'a grid over no run{_did_you_mean(run, runs)}; '
                   f'the runs are {", ".join(runs)}')
  grid = {run: _flags(path, f'[tune.{run}]', values, grid=True) for run, values in grid.items()}
  tuned_as = raw.get('tuned_as', {})
  if not isinstance(tuned_as, dict):
    raise _error(path, '[tuned_as]', '', f'is {_kind(tuned_as)}; give algorithm = "algorithm"')
  report = raw.get('report', '')
  if report != '' and not WRITER.fullmatch(_string(path, '', 'report', report)):
    raise _error(path, '', 'report', f'{_toml(report)} is not module:function; give e.g. '
                 'report = "my_pages:write"')
  study = declaration.Study(
      name=name, output_dir=output_dir, seeds=seeds, common=common, runs=runs,
      comparisons=comparisons, grid=grid, tuned_as=dict(tuned_as), tuning_seed=tuning_seed,
      tuning_rounds=tuning_rounds, criterion=criterion, report=report, path=path)
  _check_tuning(study)
  _check_settings(study)
  return study


def _comparisons(path: str, entries, runs: dict) -> tuple:
  if not isinstance(entries, list):
    raise _error(path, '[[compare]]', '', 'give each comparison as its own [[compare]] table')
  out = []
  for i, entry in enumerate(entries, 1):
    table = f'[[compare]] #{i}'
    if not isinstance(entry, dict):
      raise _error(path, table, '', 'give each comparison as its own [[compare]] table')
    for key in entry:
      if key not in COMPARE_KEYS:
        raise _error(path, table, key, f'not a comparison key{_did_you_mean(key, COMPARE_KEYS)}; '
                     f'the keys are {", ".join(COMPARE_KEYS)}')
    for key in ('method', 'baseline'):
      if key not in entry:
        raise _error(path, table, key, 'missing; name a run of [runs]')
      run = _string(path, table, key, entry[key])
      if run not in runs:
        raise _error(path, table, key, f'"{run}" is not a run{_did_you_mean(run, runs)}; the '
                     f'runs are {", ".join(runs)}')
    if entry['method'] == entry['baseline']:
      raise _error(path, table, 'baseline', 'the same run as method; compare two runs')
    label = _string(path, table, 'label',
                    entry.get('label', f'{entry["method"]} vs {entry["baseline"]}'))
    out.append(declaration.Comparison(entry['method'], entry['baseline'], label))
  return tuple(out)


def _check_tuning(study: declaration.Study) -> None:
  """One grid per algorithm (tuned values are an algorithm's); tuned_as names algorithms."""
  path = study.path
  tuned = {}
  for run in study.grid:
    algorithm = study.algorithm(run)
    if algorithm in tuned:
      raise _error(path, f'[tune.{run}]', '', f'a second grid for {algorithm} (the first: '
                   f'[tune.{tuned[algorithm]}]); an algorithm is tuned once and its values go '
                   'to all its runs: drop one')
    tuned[algorithm] = run
  for algorithm, source in study.tuned_as.items():
    if algorithm not in methods.ALGORITHMS:
      raise _error(path, '[tuned_as]', algorithm, 'not an algorithm' + (
          _did_you_mean(algorithm, methods.ALGORITHMS)
          or f'; choose one of {", ".join(methods.ALGORITHMS)}'))
    if algorithm in tuned:
      raise _error(path, '[tuned_as]', algorithm,
                   f'has a grid of its own ([tune.{tuned[algorithm]}]); '
                   'drop one of the two')
    if not isinstance(source, str) or source not in tuned:
      raise _error(path, '[tuned_as]', algorithm, f'{_toml(source)} names no algorithm with a '
                   f'grid; the tuned ones are {", ".join(tuned) or "none"}')


def _layers(study: declaration.Study, run: str, point: Optional[tuple] = None) -> list:
  """[(table, flags)] setting a run's flags, the one that wins first."""
  layers = [(f'[tune.{point[0]}]', point[1])] if point else []
  return layers + [(f'[runs.{run}]', study.runs[run]), ('[common]', study.common)]


def _validate(study: declaration.Study, fields: dict, seed: int, layers: list, run: str) -> None:
  """experiment_config.validate of one run's settings, its error read back to the table and
  key that set the flag it names."""
  try:
    experiment_config.validate(experiment_config.ExperimentConfig(**fields, seed=seed))
  except experiment_config.ExperimentError as e:
    named = re.findall(r'--(\w+)', str(e))
    for flag in named:
      for table, values in layers:
        if flag in values:
          raise _error(study.path, table, flag, str(e)) from None
    raise _error(study.path, f'[runs.{run}]', named[0] if named else '', str(e)) from None


def _check_settings(study: declaration.Study) -> None:
  """Every run's settings, and every grid point's: as tuned (the grid's length) and as the
  full-length run of each run that takes its values."""
  sources = {study.algorithm(run): run for run in study.grid}
  for run in study.runs:
    algorithm = study.algorithm(run)
    source = sources.get(study.tuned_as.get(algorithm, algorithm))
    _validate(study, study.run_fields(run), study.seeds[0], _layers(study, run), run)
    for values in (records.grid_points(study.grid[source]) if source else ()):
      layers = _layers(study, run, (source, values))
      _validate(study, dict(study.run_fields(run), **values), study.seeds[0], layers, run)
      if run == source:
        _validate(study, study.tuning_fields(run, values), study.tuning_seed, layers, run)
