"""Tuning a study fairly: each grid on one seed apart from the reported ones, its choice frozen.

`tune` makes every point of every grid (`[tune.<run>]`) on the tuning seed, for
`tuning_rounds` rounds (default the runs' own length), and picks each grid's best point by
the study's criterion (a diverged point never wins; the first of equals does). tuned.json
records the choice with the grids, the settings they were tried at and every point's
accuracy; the reported runs start only once it exists, and only while the file still
declares what it was tuned for (`tuned_values`).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from programs import experiment_config
from programs import generated_files
from programs.studies import declaration
from programs.studies import queue
from programs.studies import records
from programs.studies import study_configs


def fingerprint(study: declaration.Study) -> dict:
  """What a tuning choice holds for: the grids, how they are tried, and the settings of the
  runs they tune."""
  return dict(grids=study.grid, tuning_seed=study.tuning_seed,
              tuning_rounds=study.tuning_rounds, criterion=study.criterion,
              settings={run: study.run_fields(run) for run in study.grid})


def point_result(config) -> dict:
  """A tuning run read at its length (records.load_run), or None before it is made."""
  try:
    r = records.at_length(records.load_run(config.experiment_dir), config.rounds)
  except FileNotFoundError:
    return None
  return r


def tune(study: declaration.Study) -> dict:
  """Makes the study's grids, freezes each one's best point in tuned.json and returns the
  record written. ExperimentError when every point of a grid diverged."""
  queue.run_all([config for _, _, config in study_configs.tuning_points(study)],
                diverged_goes_on=True)
  return freeze(study)


def freeze(study: declaration.Study) -> dict:
  """Picks each grid's best point from its made tuning runs and writes tuned.json: the
  choice, what it holds for (`fingerprint`) and every point's accuracy; returns the record.
  ExperimentError when every point of a grid diverged."""
  points = study_configs.tuning_points(study)
  chosen, accuracies = {}, {}
  key = records.CRITERION_KEYS[study.criterion]
  for run in study.grid:
    own = [(values, config) for name, values, config in points if name == run]
    best = queue.best_point(own, study.criterion)
    if best is None:
      raise experiment_config.ExperimentError(
          f'{study.path} [tune.{run}]: every point of the grid diverged; lower its values')
    chosen[study.algorithm(run)] = best[1]
    accuracies[run] = []
    for values, config in own:
      r = point_result(config)
      accuracies[run].append(dict(values=values, diverged=r['diverged'],
                                  accuracy=None if r['diverged'] else r[key]))
  record = dict(fingerprint(study), chosen=chosen, points=accuracies)
  os.makedirs(study.output_dir, exist_ok=True)
  generated_files.write_json(study.tuned_path, record)
  return record


def read(path: str) -> Optional[dict]:
  """The tuned.json record at `path`, or None before it is written. A bare choice, the
  {algorithm: values} map `benchmarks.compare --tune` writes for a suite without a study
  file (the committed suites' tuned.json files hold one too), is read as a record of that
  choice alone ({'chosen': map}: no fingerprint to check it against)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    record = json.load(f)
  return record if 'chosen' in record else dict(chosen=record)


def load(study: declaration.Study) -> Optional[dict]:
  """The study's tuned.json record (`read`), or None before `tune` wrote it."""
  return read(study.tuned_path)


def changed(study: declaration.Study, record: dict) -> str:
  """'' when `record` was tuned for what the study declares now, else where it differs:
  '[tune.<run>]' (a grid, or the settings of its run) or a top-level key."""
  now = json.loads(json.dumps(fingerprint(study)))   # as the record holds it
  for run in sorted(set(now['grids']) | set(record.get('grids', {}))):
    if (now['grids'].get(run) != record['grids'].get(run)
        or now['settings'].get(run) != record.get('settings', {}).get(run)):
      return f'[tune.{run}]' if run in now['grids'] else f'[tune.{run}] (gone since)'
  for key in ('tuning_seed', 'tuning_rounds', 'criterion'):
    if now[key] != record.get(key):
      return key
  return ''


def tuned_values(study: declaration.Study) -> Optional[dict]:
  """{algorithm: values} of tuned.json for the reported runs (None: the study has no grid).
  ExperimentError when the grids have not been tuned yet, or the file changed what they were
  tuned for since."""
  if not study.grid:
    return None
  command = f'python -m programs.study tune {study.path}'
  record = load(study)
  if record is None:
    raise experiment_config.ExperimentError(
        f'{study.path} [tune]: the grids are not tuned yet (no {os.path.relpath(study.tuned_path)}'
        f'); run `{command}` first')
  # A bare choice records only which algorithms it tuned: it holds while they are the grids'.
  tuned = {study.algorithm(run) for run in study.grid}
  where = (changed(study, record) if 'grids' in record else
           '' if set(record['chosen']) == tuned else '[tune]')
  if where:
    raise experiment_config.ExperimentError(
        f'{study.path} {where}: changed since {os.path.relpath(study.tuned_path)} was written; '
        f'run `{command}` again')
  return record['chosen']
