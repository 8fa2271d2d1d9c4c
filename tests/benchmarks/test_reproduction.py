"""Slow reproduction checks (skipped unless RUN_SLOW=1; see docs/reproduction.md).

Each suite of benchmarks/suites.py: re-run the first rounds of its first compared method,
seed 0 (or, before its runs are committed, one of its committed tuning points), from its
committed config.json, and require the committed metrics.csv numbers
exactly (runs are deterministic functions of their configuration and seed). FedCDA's runs
start with FedAvg rounds (its warmup), so its check runs past them into FedCDA's own.
"""

import csv
import json
import os

import pytest

from benchmarks import suites
from programs import experiment
from programs import experiment_config
from programs.studies import declaration
from programs.studies import records

ROUNDS = 3
# FedCDA's check runs past its warmup into its own rounds, up to this warmup; past it the
# suite's baseline is checked instead (a paper-protocol round at E = 20 takes about 90 s).
MAX_WARMUP = 25


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_first_rounds_of_a_committed_run_are_reproduced(tmp_path, name):
  suite = suites.SUITES[name]
  run = suite.comparisons[0].method
  if suite.config_overrides(run).get('fedcda_warmup_rounds', 0) > MAX_WARMUP:
    run = suite.comparisons[0].baseline   # the paper protocol's 50 FedAvg rounds at E = 20
  committed = os.path.join(suites.suite_dir(name), 'runs', declaration.run_name(run, 0))
  if not os.path.exists(os.path.join(committed, 'metrics.csv')):
    # Before the suite's runs exist, one of its committed learning-rate grid points.
    points = [os.path.join(suites.suite_dir(name), 'tuning', declaration.tuning_name(run, values))
              for values in records.grid_points(suite.grid.get(run, {}))]
    points = [p for p in points if os.path.exists(os.path.join(p, 'summary.json'))]
    if not points:
      pytest.fail(f'{committed} is not committed yet: run python -m benchmarks.compare '
                  f'--suite={name}')
    committed = points[0]   # a finished point: its first rounds did not diverge
  with open(os.path.join(committed, 'config.json')) as f:
    fields = json.load(f)
  config = experiment_config.recorded_config(fields)
  rounds = ROUNDS + (config.fedcda_warmup_rounds if config.algorithm == 'fedcda' else 0)
  config.rounds, config.resume, config.progress = rounds, False, False
  config.root_output_dir, config.experiment_name = str(tmp_path), 'again'
  experiment.run_experiment(config)
  with open(os.path.join(committed, 'metrics.csv'), newline='') as f:
    want = list(csv.DictReader(f))[:rounds]
  with open(os.path.join(config.experiment_dir, 'metrics.csv'), newline='') as f:
    got = list(csv.DictReader(f))
  assert len(got) == rounds
  for a, b in zip(got, want):
    assert b['client_work/train/loss'], b['round']   # every round records its training
    for key in ('test_accuracy', 'test_loss', 'client_work/train/loss'):
      if not b[key]:   # not evaluated by the committed run (--eval_every); the short one is
        continue
      assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-5, abs=1e-6), (key, a['round'])


@pytest.mark.slow
def test_fedavg_fashion_mnist_dirichlet_reaches_80_percent(tmp_path):
  """Issue 2's evidence run: FedAvg, Fashion-MNIST, Dirichlet 0.5, 20 clients, 4 per round,
  30 rounds (benchmarks/fedavg_fmnist: 85.4% final)."""
  summary = experiment.run_experiment(experiment_config.ExperimentConfig(
      algorithm='fedavg', dataset='fashion_mnist', partition='dirichlet',
      dirichlet_alpha=0.5, num_clients=20, clients_per_round=4, rounds=30, local_epochs=1,
      batch_size=50, client_lr=0.05, client_momentum=0.5, root_output_dir=str(tmp_path),
      progress=False))
  assert summary['final_accuracy'] > 0.80
