"""programs/ keeps one concept per module: experiment.py holds the training loop's steps, and
the concepts around it (the flags, the run directory, the computations, FedLEx's exploration,
stopping, the results) have their own modules, where new work on them goes."""

import json
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


# Names the loop uses that live in other modules (programs/experiment_config.py,
# programs/computations.py, tff_algos/constants.py).
_NAMES_LIVING_ELSEWHERE = ('ExperimentConfig', 'ExperimentError', 'client_faults', 'validate',
                           'build_process', 'Evaluator', 'CLIENT_ACCURACY_FIGURES')


def _python_sources():
  """(path, text) of every Python file under the packages and of every notebook's code."""
  for top in ('programs', 'benchmarks', 'tests', 'tff_algos', 'data', 'notebooks'):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        path = os.path.join(folder, name)
        if name.endswith('.py'):
          with open(path) as f:
            yield path, f.read()
        elif name.endswith('.ipynb'):
          with open(path) as f:
            cells = json.load(f)['cells']
          yield path, '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code')


def _read_through_experiment(text):
  pattern = r'(?<![\w.])experiment\.(' + '|'.join(_NAMES_LIVING_ELSEWHERE) + r')\b'
  return [m.group(0) for m in re.finditer(pattern, text)]


def test_names_are_imported_from_where_they_live():
  """No Python file or notebook code cell reads those names through `experiment.` (one path
  per name: `experiment_config.ExperimentConfig`, `computations.build_process`, ...)."""
  found = [f'{os.path.relpath(path, ROOT)}: {hit}' for path, text in _python_sources()
           for hit in _read_through_experiment(text)]
  assert not found, found


def test_the_layout_check_reads_notebook_code():
  quickstart = dict(_python_sources())[os.path.join(ROOT, 'notebooks', '1_quickstart.ipynb')]
  assert 'experiment_config.ExperimentConfig(' in quickstart  # its code cells, read
  through = '{}.ExperimentConfig'.format('experiment')  # spelt so that this file passes the scan
  assert _read_through_experiment(f'config = {through}(rounds=1)') == [through]
  assert not _read_through_experiment('config = experiment_config.ExperimentConfig(rounds=1)')
