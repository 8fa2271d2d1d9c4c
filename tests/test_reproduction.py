"""Slow reproduction runs (skipped unless RUN_SLOW=1; see README)."""

import pytest

from programs import experiment


@pytest.mark.slow
def test_fedavg_fashion_mnist_dirichlet_reaches_80_percent(tmp_path):
  """Issue 2's evidence run: FedAvg, Fashion-MNIST, Dirichlet 0.5, 20 clients, 4 per round,
  30 rounds (benchmarks/fedavg_fmnist: 85.4% final)."""
  summary = experiment.run_experiment(experiment.ExperimentConfig(
      algorithm='fedavg', dataset='fashion_mnist', partition='dirichlet',
      dirichlet_alpha=0.5, num_clients=20, clients_per_round=4, rounds=30, local_epochs=1,
      batch_size=50, client_lr=0.05, client_momentum=0.5, root_output_dir=str(tmp_path),
      progress=False))
  assert summary['final_accuracy'] > 0.80


@pytest.mark.slow
def test_fedcross_beats_chance_by_far_on_skewed_fashion_mnist(tmp_path):
  """FedCross, Dirichlet 0.1, 50 clients, 5 per round, 30 rounds (benchmarks/fedcross)."""
  summary = experiment.run_experiment(experiment.ExperimentConfig(
      algorithm='fedcross', dataset='fashion_mnist', partition='dirichlet',
      dirichlet_alpha=0.1, num_clients=50, clients_per_round=5, rounds=30, local_epochs=1,
      batch_size=50, client_lr=0.01, client_momentum=0.5, root_output_dir=str(tmp_path),
      progress=False))
  assert summary['best_accuracy'] > 0.5
