"""Toy run directories and suites shared by the tests of benchmarks/ (runs, compare, diagnoses).

tests/benchmarks/ has no __init__.py, and must not get one: as a package it would be found as
`benchmarks` (pytest puts tests/ on sys.path) in place of the benchmarks/ it tests.
"""

import csv
import json
import os

import numpy as np

from benchmarks import suites
from programs import experiment
from programs import experiment_config

# The toy suites' runs and their algorithms (what each run's config.json records).
TOY_ALGORITHMS = {'base': 'fedavg', 'new': 'fedcda'}


def write_run(path, rounds, accuracy, seconds=1.0, summary_rounds=None, config=None,
              round_seconds=None, columns=None):
  """A run directory as the program writes it; config.json records `config`, by default
  the toy run's algorithm (from the directory's name) and `rounds`; metrics.csv has a
  round_seconds column when it is given (runs recorded before 2026-11-25 have none), and any
  further `columns` ({name: a value per round}); `seconds` is one value or one per round."""
  columns = columns or {}
  os.makedirs(path)
  if config is None:
    run = os.path.basename(str(path)).rsplit('_', 1)[0]
    config = dict(algorithm=TOY_ALGORITHMS[run]) if run in TOY_ALGORITHMS else {}
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(dict(config, rounds=rounds), f)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'seconds', 'test_accuracy']
                    + ([] if round_seconds is None else ['round_seconds']) + list(columns))
    for r, a in enumerate(accuracy, 1):
      writer.writerow([r, seconds if np.isscalar(seconds) else seconds[r - 1], a]
                      + ([] if round_seconds is None else [round_seconds])
                      + [v[r - 1] for v in columns.values()])
  with open(os.path.join(path, 'summary.json'), 'w') as f:
    json.dump(dict(rounds=summary_rounds or rounds, client_epochs_training=rounds), f)


def paired_toy_suite(rounds, tmp_path, monkeypatch):
  """A suite of two runs, 'new' compared against 'base', whose runs live under tmp_path."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  return suites.Suite(
      name='toy', title='toy', common=dict(rounds=rounds), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg'), new=dict(algorithm='fedcda')),
      comparisons=(suites.Comparison('new', 'base', 'toy setting', 'toy'),))


def curve_run(rounds, accuracy) -> dict:
  """A loaded run's curve, as load_run gives it."""
  return dict(curve_rounds=list(rounds), curve_accuracy=list(accuracy))


def evaluated(total, every, last=10) -> list:
  """The rounds a run of `total` rounds evaluates at --eval_every=every, --eval_last=last."""
  config = experiment_config.ExperimentConfig(rounds=total, eval_every=every, eval_last=last)
  return [r for r in range(1, total + 1) if experiment.evaluated_round(r, config)]


def every_fifth(acc, last=10):
  """A run's accuracies as a making evaluated every 5th round and each of its last `last`
  records them ('' where not evaluated)."""
  n = len(acc)
  return [a if (r % 5 == 0 or r > n - last) else '' for r, a in enumerate(acc, 1)]
