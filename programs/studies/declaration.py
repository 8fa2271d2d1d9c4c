"""`Study`: what a study file declares, as the tools read it.

Every run of a study is an ordinary experiment of programs/train.py: its settings are the
study's `common` trainer flags with the run's own overrides on top (and, where the run is
tuned, the tuned values), one directory per seed, `<output_dir>/runs/<run>_s<seed>`. Tuning
runs live in `<output_dir>/tuning/`, their frozen choice in `<output_dir>/tuned.json`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from programs import experiment_config

# What a run's accuracy is in tuning and on the page: the mean of its last 10 evaluations,
# or its best evaluated round.
CRITERIA = ('last10', 'best')
# The tuning seed when a study names none: apart from any reported seed.
TUNING_SEED = 100


def algorithm_of(fields: dict) -> str:
  """The algorithm of a run's trainer flags: its `algorithm`, else the trainer's default."""
  return fields.get('algorithm', experiment_config.ExperimentConfig.algorithm)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """`method` against `baseline` (run names of the study), paired seed by seed."""
  method: str
  baseline: str
  label: str


@dataclasses.dataclass(frozen=True)
class Study:
  """A study: runs x seeds, the comparisons between them, and how their rates are tuned.

  `grid` maps a run name to {trainer flag: candidate values}, tried on `tuning_seed` for
  `tuning_rounds` rounds (None: the full length); the best point by `criterion` is frozen for
  every run of that run's algorithm. `tuned_as` maps an algorithm without a grid to the
  algorithm whose tuned values it takes (FedProx takes FedAvg's).
  """
  name: str
  output_dir: str
  seeds: tuple
  common: dict
  runs: dict                                   # run name -> trainer-flag overrides
  comparisons: tuple = ()
  grid: dict = dataclasses.field(default_factory=dict)
  tuned_as: dict = dataclasses.field(default_factory=dict)
  tuning_seed: int = TUNING_SEED
  tuning_rounds: Optional[int] = None
  criterion: str = 'last10'
  # A paper layer's page writer, 'module:function' called with the Study in place of the
  # generic page (the papers' suites: their own pages); '' for the generic page.
  report: str = ''
  # The file it was read from ('' when built in code); error messages name it.
  path: str = ''

  def run_fields(self, run: str, tuned: Optional[dict] = None) -> dict:
    """Every trainer flag of one run (before seed and directory): common, the run's own,
    then the tuned values of its algorithm (or of the one it takes them from)."""
    fields = dict(self.common, **self.runs[run])
    source = self.tuned_as.get(self.algorithm(run), self.algorithm(run))
    if tuned and source in tuned:
      fields.update(tuned[source])
    return fields

  def algorithm(self, run: str) -> str:
    """The algorithm of one run: set in the run, in common, or the trainer's default."""
    return algorithm_of(dict(self.common, **self.runs[run]))

  def tuning_fields(self, run: str, values: dict) -> dict:
    """The flags of one tuning run: the run's own, the grid point, and the tuning length."""
    fields = dict(self.run_fields(run), **values)
    if self.tuning_rounds:
      fields['rounds'] = self.tuning_rounds
    return fields

  @property
  def runs_dir(self) -> str:
    return os.path.join(self.output_dir, 'runs')

  @property
  def tuning_dir(self) -> str:
    return os.path.join(self.output_dir, 'tuning')

  @property
  def tuned_path(self) -> str:
    return os.path.join(self.output_dir, 'tuned.json')


def run_name(run: str, seed: int) -> str:
  """A reported run's directory name."""
  return f'{run}_s{seed}'


def tuning_name(run: str, values: dict) -> str:
  """A tuning run's directory name: the run and its grid point (numbers as %g)."""
  return run + ''.join(f'_{k}{_point_text(v)}' for k, v in sorted(values.items()))


def _point_text(value) -> str:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return format(value, 'g')
  return str(value)
