r"""Trains any method on any dataset and partition.

  python -m programs.train --algorithm=fedavg --dataset=fashion_mnist \
      --partition=dirichlet --dirichlet_alpha=0.5 --num_clients=20 --clients_per_round=4 \
      --rounds=30 --experiment_name=fedavg_fmnist

Writes metrics.csv, TensorBoard events, per-round checkpoints, summary.json and accuracy.png
under --root_output_dir/--experiment_name; `--resume` continues a killed run exactly.
Bad flags, missing data, impossible partitions and diverging training stop with one line.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from programs import experiment

_ALGORITHM = flags.DEFINE_string('algorithm', 'fedavg', f'One of {", ".join(experiment.ALGORITHMS)}.')
_DATASET = flags.DEFINE_string('dataset', 'fashion_mnist', 'Dataset name (see README).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'Directory of local dataset files.')
_PARTITION = flags.DEFINE_string(
    'partition', 'dirichlet',
    'iid, dirichlet, shards, classes, quantity, cluster_mc, cluster_uc, cluster_bc.')
_DIRICHLET_ALPHA = flags.DEFINE_float('dirichlet_alpha', 0.5, 'Dirichlet concentration beta.')
_SHARDS = flags.DEFINE_integer('shards_per_client', 2, 'Shards per client (--partition=shards).')
_CLASSES = flags.DEFINE_integer('classes_per_client', 2, 'Classes per client (--partition=classes).')
_QUANTITY_ALPHA = flags.DEFINE_float('quantity_alpha', 1.0, 'Size skew (--partition=quantity).')
_NUM_CLIENTS = flags.DEFINE_integer('num_clients', 20, 'Clients in the federation.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 4, 'Clients sampled per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Communication rounds.')
_LOCAL_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs per round.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 50, 'Local batch size.')
_CLIENT_LR = flags.DEFINE_float('client_lr', 0.01, 'Client SGD learning rate.')
_CLIENT_MOMENTUM = flags.DEFINE_float('client_momentum', 0.5, 'Client SGD momentum.')
_SERVER_OPTIMIZER = flags.DEFINE_string(
    'server_optimizer', '', 'sgd, sgdm or adam; empty = the algorithm\'s default.')
_SERVER_LR = flags.DEFINE_float('server_lr', -1.0, 'Server learning rate; < 0 = default.')
_SERVER_MOMENTUM = flags.DEFINE_float('server_momentum', 0.9, 'Server momentum (sgdm, fedavgm).')
_PROXIMAL = flags.DEFINE_float('proximal_strength', 0.01, 'FedProx mu.')
_MODEL = flags.DEFINE_string('model', '', 'Model name; empty = the dataset default.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of partition, sampling, batches and init.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 1, 'Evaluate every this many rounds.')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs', 'Where experiment directories go.')
_NAME = flags.DEFINE_string('experiment_name', '', 'Experiment directory name.')
_RESUME = flags.DEFINE_bool('resume', False, 'Continue the run in the experiment directory.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar on stderr.')
# FedCross.
_FC_ALPHA = flags.DEFINE_float('fedcross_alpha', 0.99, 'FedCross alpha in [0.5, 1).')
_FC_SELECTION = flags.DEFINE_string(
    'fedcross_selection', 'lowest_similarity',
    'FedCross collaborator rule: lowest_similarity, highest_similarity, in_order.')
_FC_SCHEDULE = flags.DEFINE_bool(
    'fedcross_alpha_schedule', False, 'FedCross dynamic alpha: 0.5 -> alpha over accel rounds.')
_FC_PROPELLERS = flags.DEFINE_integer(
    'fedcross_num_propellers', 1, 'FedCross propeller models during the accel rounds.')
_FC_ACCEL = flags.DEFINE_integer('fedcross_accel_rounds', 0, 'FedCross acceleration rounds.')
# FedLEx.
_CDA_CACHE = flags.DEFINE_integer('fedcda_cache_size', 3, 'FedCDA: models cached per client (K).')
_CDA_BATCHES = flags.DEFINE_integer('fedcda_batches', 3, 'FedCDA: batches of the greedy selection (B).')
_CDA_WARMUP = flags.DEFINE_integer('fedcda_warmup_rounds', 50, 'FedCDA: FedAvg rounds before selection.')
_CDA_SMOOTHNESS = flags.DEFINE_float('fedcda_smoothness', 1.0, 'FedCDA: L in eq. 8.')
_CDA_WARMUP_WEIGHTING = flags.DEFINE_string(
    'fedcda_warmup_weighting', 'data_size',
    'FedCDA: client weights of the warmup FedAvg: data_size (the paper) or uniform.')
_CDA_SELECTION = flags.DEFINE_string(
    'fedcda_selection', 'batch_greedy', 'FedCDA selection: batch_greedy, exact, newest or random.')
_CDA_MAX_GIB = flags.DEFINE_float(
    'fedcda_max_cache_gib', 4.0, 'FedCDA: refuse a cache (4*N*K*D bytes) above this many GiB.')

_CADIS_TAU = flags.DEFINE_float('cadis_threshold', 0.975, 'CADIS: initial clustering threshold tau_0.')
_CADIS_TAU_MAX = flags.DEFINE_float('cadis_threshold_max', 0.985, 'CADIS: largest threshold.')
_CADIS_KD = flags.DEFINE_float('cadis_kd_weight', 1.0, 'CADIS: lambda of the KD term (0 = off).')
_CADIS_REDUCTION = flags.DEFINE_string('cadis_kd_reduction', 'sum', 'CADIS KD: sum or mean.')
_CADIS_LAYER = flags.DEFINE_string(
    'cadis_similarity_layer', 'bias', 'CADIS: classifier bias or kernel delta for similarity.')
_CADIS_SAMPLE_WEIGHTED = flags.DEFINE_bool(
    'cadis_sample_weighted', True, 'CADIS: weights (1/|C|)(n_i/n); false: 1/|C| only.')
_CADIS_CLOSURE = flags.DEFINE_string('cadis_closure', 'two_hop', 'CADIS: two_hop or components.')
_CADIS_TRANSITIVE = flags.DEFINE_bool(
    'cadis_transitive', False, 'CADIS: transitive learning of never co-sampled pairs.')

_FL_FRACTION = flags.DEFINE_float('fedlex_explorer_fraction', 0.2, 'Fraction of clients exploring.')
_FL_EPOCHS = flags.DEFINE_integer('fedlex_exploration_epochs', 5, 'Exploration epochs.')
_FL_PATIENCE = flags.DEFINE_integer(
    'fedlex_exploration_patience', 0, 'Early-stopping patience of explorers (0 = off).')
_FL_NORMALIZE = flags.DEFINE_string(
    'fedlex_normalize', 'per_client', 'Guidance normalisation: per_client or after_mean.')
_FL_FLOOR = flags.DEFINE_float('fedlex_guidance_floor', 0.0, 'Lower bound of guidance entries.')
_FL_REFRESH = flags.DEFINE_bool(
    'fedlex_refresh', False, 'Explorers taking part in a round refresh the guidance.')


def config_from_flags() -> experiment.ExperimentConfig:
  return experiment.ExperimentConfig(
      algorithm=_ALGORITHM.value, dataset=_DATASET.value, data_dir=_DATA_DIR.value,
      partition=_PARTITION.value, dirichlet_alpha=_DIRICHLET_ALPHA.value,
      shards_per_client=_SHARDS.value, classes_per_client=_CLASSES.value,
      quantity_alpha=_QUANTITY_ALPHA.value, num_clients=_NUM_CLIENTS.value,
      clients_per_round=_CLIENTS_PER_ROUND.value, rounds=_ROUNDS.value,
      local_epochs=_LOCAL_EPOCHS.value, batch_size=_BATCH_SIZE.value,
      client_lr=_CLIENT_LR.value, client_momentum=_CLIENT_MOMENTUM.value,
      server_optimizer=_SERVER_OPTIMIZER.value, server_lr=_SERVER_LR.value,
      server_momentum=_SERVER_MOMENTUM.value, proximal_strength=_PROXIMAL.value,
      model=_MODEL.value, seed=_SEED.value, eval_every=_EVAL_EVERY.value,
      root_output_dir=_ROOT.value, experiment_name=_NAME.value, resume=_RESUME.value,
      progress=_PROGRESS.value,
      fedcross_alpha=_FC_ALPHA.value, fedcross_selection=_FC_SELECTION.value,
      fedcross_alpha_schedule=_FC_SCHEDULE.value, fedcross_num_propellers=_FC_PROPELLERS.value,
      fedcross_accel_rounds=_FC_ACCEL.value,
      fedcda_cache_size=_CDA_CACHE.value, fedcda_batches=_CDA_BATCHES.value,
      fedcda_warmup_rounds=_CDA_WARMUP.value, fedcda_smoothness=_CDA_SMOOTHNESS.value,
      fedcda_selection=_CDA_SELECTION.value, fedcda_max_cache_gib=_CDA_MAX_GIB.value,
      fedcda_warmup_weighting=_CDA_WARMUP_WEIGHTING.value,
      cadis_threshold=_CADIS_TAU.value, cadis_threshold_max=_CADIS_TAU_MAX.value,
      cadis_kd_weight=_CADIS_KD.value, cadis_kd_reduction=_CADIS_REDUCTION.value,
      cadis_similarity_layer=_CADIS_LAYER.value,
      cadis_sample_weighted=_CADIS_SAMPLE_WEIGHTED.value, cadis_closure=_CADIS_CLOSURE.value,
      cadis_transitive=_CADIS_TRANSITIVE.value,
      fedlex_explorer_fraction=_FL_FRACTION.value, fedlex_exploration_epochs=_FL_EPOCHS.value,
      fedlex_exploration_patience=_FL_PATIENCE.value, fedlex_normalize=_FL_NORMALIZE.value,
      fedlex_guidance_floor=_FL_FLOOR.value, fedlex_refresh=_FL_REFRESH.value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.WARNING)  # TFF's per-model INFO lines are noise here
  config = config_from_flags()
  try:
    experiment.validate(config)  # up front, before TF/TFF start
    summary = experiment.run_experiment(config)
  except experiment.ExperimentError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print('interrupted: the last finished round is checkpointed; rerun with --resume',
          file=sys.stderr)
    return 130
  print(f'final accuracy {summary["final_accuracy"]:.4f}  best {summary["best_accuracy"]:.4f}  '
        f'{summary["seconds_per_round"]:.2f} s/round')
  print(f'summary: {os.path.join(summary["experiment_dir"], "summary.json")}')
  print(f'accuracy curve: {summary["accuracy_plot"]}')
  return 0


if __name__ == '__main__':
  app.run(main)
