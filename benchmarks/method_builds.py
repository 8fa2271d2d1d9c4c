"""The benchmarks' shared builds: each method's process as the training program builds it, and data.

Kept free of flags so that benchmarks defining their own flags can import it.
"""

from __future__ import annotations


def build_method(name, model_fn, num_clients, batch, lr, seed):
  """A method's process as the training program builds it, on this benchmark's setting."""
  from programs import computations  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  algorithm = 'cadis' if name == 'cadis_nokd' else name
  config = experiment_config.ExperimentConfig(
      algorithm=algorithm, num_clients=num_clients, clients_per_round=num_clients,
      batch_size=batch, client_lr=lr, client_momentum=0.0, seed=seed,
      fedcda_warmup_rounds=0, fedcda_max_cache_gib=64.0,
      cadis_kd_weight=0.0 if name == 'cadis_nokd' else 1.0)
  return computations.build_process(config, model_fn, num_clients)


def load_data(name):
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  if name == 'fashion_mnist':
    try:
      return data.load_fashion_mnist()
    except data.DatasetNotFoundError as e:
      print(f'Fashion-MNIST unavailable ({e}); using digits', flush=True)
  return data.load_digits()
