"""programs/ keeps one concept per module: experiment.py holds the training loop's steps, and
the concepts around it (the flags, the run directory, the computations, FedLEx's exploration,
stopping, the results) have their own modules, where new work on them goes."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT_MAX_LINES = 700


def test_experiment_py_stays_the_loop():
  with open(os.path.join(ROOT, 'programs', 'experiment.py')) as f:
    lines = len(f.read().splitlines())
  assert lines < EXPERIMENT_MAX_LINES, (
      f'programs/experiment.py has {lines} lines: put the new concern in its own module '
      '(docs/architecture.md lists programs/), not in the loop')
