r"""Runs several programs/train.py configurations and compares them in one PNG and table.

  python -m benchmarks.compare --suite=fedcross --rounds=30 --local_epochs=2 \
      --output_dir=benchmarks/fedcross

Each run is an ordinary experiment directory under --output_dir/runs (resumable); the suite
writes curves.png (test accuracy per round, one line per run), results.md (final, best and
last-10-round mean accuracy, seconds per round, client-epochs spent) and results.json.
"""

import dataclasses
import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from programs import experiment

SUITES = {
    # FedCross vs FedAvg, Fashion-MNIST, Dirichlet 0.1 / 0.5, 50 clients, 5 per round (issue 3).
    'fedcross': dict(
        common=dict(dataset='fashion_mnist', partition='dirichlet', num_clients=50,
                    clients_per_round=5, batch_size=50, client_lr=0.01, client_momentum=0.5),
        runs={f'{alg}_beta{beta}': dict(algorithm=alg, dirichlet_alpha=beta)
              for beta in (0.1, 0.5) for alg in ('fedavg', 'fedcross')}),
    # FedCDA vs FedAvg, the paper's layout (20 clients, 4 per round, simple CNN, batch 64),
    # Dirichlet 0.1 and 2 shards per client (issue 6). FedCDA's warmup = a quarter of the
    # rounds, as the paper's 50 of 200 (--fedcda_warmup_fraction).
    'fedcda': dict(
        common=dict(dataset='fashion_mnist', model='simple_cnn', num_clients=20,
                    clients_per_round=4, batch_size=64, client_lr=0.01, client_momentum=0.5),
        runs={f'{alg}_{name}': dict(algorithm=alg, **part)
              for name, part in (('dir0.1', dict(partition='dirichlet', dirichlet_alpha=0.1)),
                                 ('shards2', dict(partition='shards', shards_per_client=2)))
              for alg in ('fedavg', 'fedcda')}),
    # CADIS vs FedAvg vs FedProx on the cluster-skewed MC partition, 100 clients, 10 per round
    # (issue 4); CADIS without its KD term for the cost of KD, and with transitive learning
    # (most client pairs are never sampled together in a short run).
    'cadis': dict(
        common=dict(dataset='fashion_mnist', model='simple_cnn', partition='cluster_mc',
                    num_clients=100, clients_per_round=10, batch_size=32, client_lr=0.01,
                    client_momentum=0.5),
        runs={'fedavg': dict(algorithm='fedavg'),
              'fedprox': dict(algorithm='fedprox', proximal_strength=0.01),
              'cadis': dict(algorithm='cadis'),
              'cadis_no_kd': dict(algorithm='cadis', cadis_kd_weight=0.0),
              'cadis_transitive': dict(algorithm='cadis', cadis_transitive=True)}),
    # Each FedLEx base vs its guided variant, 2 classes per client, 20 clients, 5 per round.
    'fedlex': dict(
        common=dict(dataset='fashion_mnist', partition='classes', classes_per_client=2,
                    num_clients=20, clients_per_round=5, batch_size=50, client_lr=0.01,
                    client_momentum=0.0),
        runs={name: dict(algorithm=alg) for name, alg in (
            ('fedavgm', 'fedavgm'), ('fedlex_avgm', 'fedlex_avgm'),
            ('fedsgd', 'fedsgd'), ('fedlex_sgd', 'fedlex_sgd'),
            ('fedadam', 'fedadam'), ('fedlex_opt', 'fedlex_opt'),
            ('fedprox', 'fedprox'), ('fedlex_prox', 'fedlex_prox'))}),
}

_SUITE = flags.DEFINE_enum('suite', 'fedcross', list(SUITES), 'Which comparison to run.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Rounds of every run.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs of every run.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed shared by every run.')
_ONLY = flags.DEFINE_list('only', [], 'Run only these run names.')
_WARMUP_FRACTION = flags.DEFINE_float(
    'fedcda_warmup_fraction', 0.25, 'FedCDA runs: warmup rounds = this fraction of --rounds.')
_OUTPUT = flags.DEFINE_string('output_dir', '', 'Default: benchmarks/<suite>.')


def plot(results, path, title):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, result in results.items():
    ax.plot(result['curve_rounds'], result['curve_accuracy'], label=name)
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  suite = SUITES[_SUITE.value]
  out = _OUTPUT.value or os.path.join('benchmarks', _SUITE.value)
  results_path = os.path.join(out, 'results.json')
  results = {}
  if os.path.exists(results_path):  # runs of earlier invocations (e.g. --only) stay in
    with open(results_path) as f:
      results = json.load(f)
  for name, overrides in suite['runs'].items():
    if _ONLY.value and name not in _ONLY.value:
      continue
    config = experiment.ExperimentConfig(
        rounds=_ROUNDS.value, local_epochs=_EPOCHS.value, seed=_SEED.value,
        root_output_dir=os.path.join(out, 'runs'), experiment_name=name, progress=False,
        **suite['common'], **overrides)
    if config.algorithm == 'fedcda' and 'fedcda_warmup_rounds' not in overrides:
      config.fedcda_warmup_rounds = int(round(_WARMUP_FRACTION.value * config.rounds))
    config.resume = os.path.isdir(os.path.join(config.experiment_dir, 'checkpoints'))
    print(f'== {name}: {overrides}', file=sys.stderr, flush=True)
    try:
      summary = experiment.run_experiment(config)
    except experiment.ExperimentError as e:
      print(f'error: {name}: {e}', file=sys.stderr)
      return 2
    rows = experiment._csv_rows(os.path.join(config.experiment_dir, 'metrics.csv'))  # pylint: disable=protected-access
    summary = dict(summary)
    summary['curve_rounds'] = [int(r['round']) for r in rows if r.get('test_accuracy')]
    summary['curve_accuracy'] = [float(r['test_accuracy']) for r in rows if r.get('test_accuracy')]
    summary['config'] = dataclasses.asdict(config)
    results[name] = summary
  os.makedirs(out, exist_ok=True)
  results = {name: results[name] for name in suite['runs'] if name in results}
  with open(results_path, 'w') as f:
    json.dump(results, f, indent=1)
  common = suite['common']
  title = (f'{_SUITE.value}: {common["dataset"]} {common.get("partition", "partition per run")}, '
           f'{common["num_clients"]} clients, {common["clients_per_round"]}/round, '
           f'E={_EPOCHS.value}')
  plot(results, os.path.join(out, 'curves.png'), title)
  lines = [f'# {title}', '', f'Command: `python -m benchmarks.compare {" ".join(sys.argv[1:])}`',
           '', '| run | final acc | best acc | last-10 mean | s/round | training client-epochs '
           '| exploration client-epochs | server aggregator state |', '|---|---|---|---|---|---|---|---|']
  for name, r in results.items():
    lines.append(f'| {name} | {r["final_accuracy"]:.4f} | {r["best_accuracy"]:.4f} | '
                 f'{r["last10_mean_accuracy"]:.4f} | {r["seconds_per_round"]:.2f} | '
                 f'{r["client_epochs_training"]} | {r["exploration_client_epochs"]:.0f} | '
                 f'{r.get("aggregator_state_bytes", 0) / 2**20:.1f} MiB |')
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print('\n'.join(lines))
  return 0


if __name__ == '__main__':
  app.run(main)
