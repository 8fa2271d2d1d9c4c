"""programs/ keeps one concept per module: experiment.py holds the training loop's steps, and
the concepts around it (the flags, the run directory, the computations, FedLEx's exploration,
stopping, the results) have their own modules, where new work on them goes."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT_MAX_LINES = 700


def test_experiment_py_stays_the_loop():
  with open(os.path.join(ROOT, 'programs', 'experiment.py')) as f:
    lines = len(f.read().splitlines())
  assert lines < EXPERIMENT_MAX_LINES, (
      f'programs/experiment.py has {lines} lines: put the new concern in its own module '
      '(docs/architecture.md lists programs/), not in the loop')


# The names programs/experiment.py imports for its own use, which live elsewhere.
_IMPORTED_BY_THE_LOOP = ('ExperimentConfig', 'ExperimentError', 'client_faults', 'validate',
                         'build_process', 'Evaluator', 'CLIENT_ACCURACY_FIGURES')


def test_names_are_imported_from_where_they_live():
  """No Python file reads the loop's imported names through `experiment.` (one path per
  name: `experiment_config.ExperimentConfig`, `computations.build_process`, ...)."""
  pattern = re.compile(r'(?<![\w.])experiment\.(' + '|'.join(_IMPORTED_BY_THE_LOOP) + r')\b')
  found = []
  for top in ('programs', 'benchmarks', 'tests', 'tff_algos', 'data'):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          with open(path) as f:
            found += [f'{os.path.relpath(path, ROOT)}: {m.group(0)}'
                      for m in pattern.finditer(f.read())]
  assert not found, found
