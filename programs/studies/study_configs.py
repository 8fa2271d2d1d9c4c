"""A study's runs as experiments: the `ExperimentConfig` of each reported and tuning run.

A study run is an ordinary run of programs/train.py: its flags (Study.run_fields or
tuning_fields), its seed, its directory `<output_dir>/runs/<run>_s<seed>` (tuning runs:
`<output_dir>/tuning/<run>_<flag><value>...`), no progress bar, and --blown_up_rounds=0
unless the study sets it (a run whose training blows up is recorded and the study goes on).
"""

from __future__ import annotations

import os

from programs import experiment_config
from programs.studies import declaration
from programs.studies import records


def output_path(path: str) -> str:
  """`path` relative to the working directory (so that config.json records no machine's
  absolute paths), or absolute where the relative path would climb out of it."""
  relative = os.path.relpath(path)
  return os.path.abspath(path) if relative.split(os.sep)[0] == '..' else relative


def config(fields: dict, seed: int, directory: str, name: str):
  """The ExperimentConfig of one study run."""
  fields = dict(fields)
  fields.setdefault('blown_up_rounds', 0)
  return experiment_config.ExperimentConfig(
      **fields, seed=seed, progress=False, root_output_dir=output_path(directory),
      experiment_name=name)


def run_configs(study: declaration.Study, tuned=None, only=()) -> list:
  """The study's reported runs (those named in `only`, if given) over its seeds, seed by
  seed (every run's first seed, then the next): a study cut short holds whole comparisons.
  `tuned`: {algorithm: values} of tuned.json."""
  return [config(study.run_fields(run, tuned), seed, study.runs_dir,
                 declaration.run_name(run, seed))
          for seed in study.seeds for run in study.runs if not only or run in only]


def tuning_points(study: declaration.Study, only=()) -> list:
  """[(run, grid values, config)] of the study's grids (runs named in `only`, if given), in
  grid order, on the tuning seed."""
  return [(run, values, config(study.tuning_fields(run, values), study.tuning_seed,
                               study.tuning_dir, declaration.tuning_name(run, values)))
          for run, grid in study.grid.items() if not only or run in only
          for values in records.grid_points(grid)]
