r"""Trains any method on any dataset and partition.

  python -m programs.train --algorithm=fedavg --dataset=fashion_mnist \
      --partition=dirichlet --dirichlet_alpha=0.5 --num_clients=20 --clients_per_round=4 \
      --rounds=30 --experiment_name=fedavg_fmnist

Writes metrics.csv, TensorBoard events, per-round checkpoints, summary.json and accuracy.png
under --root_output_dir/--experiment_name; `--resume` continues a killed run exactly.
Bad flags, missing data, impossible partitions and diverging training stop with one line
(exit code 2). SIGTERM / SIGINT stop the run after the round in progress (exit 143 / 130);
a second one stops it at once.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from programs import experiment
from programs import experiment_config
from programs import flag_parsing
from programs import lr_schedules
from programs import methods
from programs import stopping

_ALGORITHM = flags.DEFINE_string(
    'algorithm', 'fedavg', f'One of {", ".join(methods.ALGORITHMS)}, or a builder '
    'of your own, package.module:function (docs/your_own.md).')
_DATASET = flags.DEFINE_string('dataset', 'fashion_mnist', 'Dataset name (see docs/data.md), '
                               'or package.module:function (docs/your_own.md).')
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
_CLIENT_LR = flags.DEFINE_float('client_lr', 0.01, 'Client learning rate (of --client_optimizer).')
_CLIENT_MOMENTUM = flags.DEFINE_float('client_momentum', 0.5, 'Client SGD momentum.')
_CLIENT_OPTIMIZER = flags.DEFINE_string(
    'client_optimizer', 'sgdm', 'sgdm (SGD with --client_momentum), adam (TFF\'s build_adam, '
    'eps added to the uncorrected sqrt(v)) or torch_adam (PyTorch\'s Adam), at --client_lr; '
    'both Adams with betas 0.9, 0.999, eps 1e-8.')
_CLIENT_WEIGHT_DECAY = flags.DEFINE_float(
    'client_weight_decay', 0.0, 'L2 weight decay of the client optimizer, as PyTorch\'s '
    'weight_decay: adds this times the weights to every gradient.')
_CLIENT_LR_DECAY = flags.DEFINE_float(
    'client_lr_decay', 1.0, 'Multiply the client learning rate by this after every round '
    '(round t trains at --client_lr times this to the power t - 1; 1 = constant); with '
    '--client_lr_schedule=step, every --client_lr_decay_every rounds.')
# The other learning-rate schedule flags, client and server (--client_lr_schedule, ...).
_SCHEDULE_FLAGS = lr_schedules.define_absl_flags()
flags.adopt_module_key_flags(lr_schedules)
_SERVER_OPTIMIZER = flags.DEFINE_string(
    'server_optimizer', '', 'sgd, sgdm or adam; empty = the algorithm\'s default.')
_SERVER_LR = flags.DEFINE_float('server_lr', -1.0, 'Server learning rate; < 0 = default.')
_SERVER_MOMENTUM = flags.DEFINE_float('server_momentum', 0.9, 'Server momentum (sgdm, fedavgm).')
_PROXIMAL = flags.DEFINE_float('proximal_strength', 0.01, 'FedProx mu.')
_MODEL = flags.DEFINE_string('model', '', 'Model name, or package.module:function '
                             '(docs/your_own.md); empty = the dataset default.')
_METHOD_KWARGS = flags.DEFINE_string(
    'method_kwargs', '', 'The extra keyword arguments of a method of your own, a JSON object '
    '(e.g. \'{"clip_norm": 1.0}\'; docs/your_own.md).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of partition, sampling, batches and init.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 1, 'Evaluate every this many rounds.')
_EVAL_LAST = flags.DEFINE_integer(
    'eval_last', 10, 'Also evaluate each of the last this many rounds (the last-10 mean '
    'summary.json reports is then over the last 10 rounds).')
_CLIENT_TEST_FRACTION = flags.DEFINE_float(
    'client_test_fraction', 0.0, 'Per-client evaluation: hold out this fraction of each '
    'client\'s examples (seeded; LEAF and TFF SQLite data: any value > 0 uses the users\' '
    'own test split) and evaluate the global model on every client\'s held-out data '
    'whenever the test set is; 0 = off.')
_CLIENT_DROPOUT = flags.DEFINE_float(
    'client_dropout', 0.0, 'The chance in [0, 1) that a sampled client never reports in a '
    'round (its download happens, its upload does not); drawn per (seed, round, client), '
    'the same for every method.')
_STRAGGLER_FRACTION = flags.DEFINE_float(
    'straggler_fraction', 0.0, 'The chance in [0, 1] that a reporting client straggles: it '
    'runs only a share in [--straggler_min_work, 1] of its local steps (FedSGD: of its '
    'examples); drawn as --client_dropout.')
_STRAGGLER_MIN_WORK = flags.DEFINE_float(
    'straggler_min_work', 0.5, 'The least share in (0, 1] of its local steps a straggler '
    'runs (--straggler_fraction > 0).')
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 1, 'Checkpoint every this many rounds (always after the last round '
    'and on SIGTERM/SIGINT; a crash repeats the rounds since the last checkpoint on --resume).')
_ROOT = flags.DEFINE_string('root_output_dir', 'runs', 'Where experiment directories go.')
_NAME = flags.DEFINE_string('experiment_name', '', 'Experiment directory name.')
_RESUME = flags.DEFINE_bool('resume', False, 'Continue the run in the experiment directory.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar on stderr.')
_WORKERS = flags.DEFINE_string(
    'workers', '', 'host:port or unix:/path, comma-separated, of TFF worker services '
    '(scripts/start_worker.py) to split each round\'s clients across.')
_LOCAL_WORKERS = flags.DEFINE_integer(
    'local_workers', 0, 'Start this many TFF worker services here and split rounds across them.')
_WORKER_TIMEOUT = flags.DEFINE_float(
    'worker_timeout', 60.0, 'Seconds a worker service may stay unreachable before the run stops.')
_REQUIRE_ISOLATED_WORKER = flags.DEFINE_bool(
    'require_isolated_worker', False, 'Refuse to run where TFF\'s worker cannot run isolated '
    'from the network (a private network namespace: Linux, as root or with unprivileged user '
    'namespaces); without it such a run warns and goes on with the worker exposed.')
_RESIDENT_STATE = flags.DEFINE_bool(
    'resident_state', True, 'Keep the server state in TFF\'s local worker between rounds '
    '(same results; the state leaves it only for checkpoints, as a file in the experiment '
    'directory). Local runtime '
    'only: with --workers/--local_workers every round goes through process.next.')
_BLOWN_UP_ROUNDS = flags.DEFINE_integer(
    'blown_up_rounds', 5, 'Stop (exit 2, checkpointed) after this many rounds in a row whose '
    'clients\' training loss is above 1e4 (local training blew up); 0 = go on.')
_TARGET_ACCURACY = flags.DEFINE_string(
    'target_accuracy', None, 'Test accuracies, comma-separated, for summary.json\'s '
    'time_to_accuracy: the first evaluated round reaching each, with the bytes and training '
    'seconds to it; default: the data set\'s pair (docs/training_program.md).')
# Each method's own flags (--fedcross_*, --fedcda_*, --cadis_*, --scaffold_*), the plug-ins'
# (--guided, --kd_weight) and FedLEx's exploration flags (--fedlex_*), from the registry.
_METHOD_FLAGS = methods.define_absl_flags()
flags.adopt_module_key_flags(methods)  # so that --help lists them with this program's flags


def config_from_flags() -> experiment_config.ExperimentConfig:
  return experiment_config.ExperimentConfig(
      algorithm=_ALGORITHM.value, dataset=_DATASET.value, data_dir=_DATA_DIR.value,
      partition=_PARTITION.value, dirichlet_alpha=_DIRICHLET_ALPHA.value,
      shards_per_client=_SHARDS.value, classes_per_client=_CLASSES.value,
      quantity_alpha=_QUANTITY_ALPHA.value, num_clients=_NUM_CLIENTS.value,
      clients_per_round=_CLIENTS_PER_ROUND.value, rounds=_ROUNDS.value,
      local_epochs=_LOCAL_EPOCHS.value, batch_size=_BATCH_SIZE.value,
      client_lr=_CLIENT_LR.value, client_momentum=_CLIENT_MOMENTUM.value,
      client_optimizer=_CLIENT_OPTIMIZER.value, client_weight_decay=_CLIENT_WEIGHT_DECAY.value,
      client_lr_decay=_CLIENT_LR_DECAY.value,
      server_optimizer=_SERVER_OPTIMIZER.value, server_lr=_SERVER_LR.value,
      server_momentum=_SERVER_MOMENTUM.value, proximal_strength=_PROXIMAL.value,
      model=_MODEL.value, seed=_SEED.value, eval_every=_EVAL_EVERY.value,
      eval_last=_EVAL_LAST.value,
      checkpoint_every=_CHECKPOINT_EVERY.value,
      client_test_fraction=_CLIENT_TEST_FRACTION.value,
      client_dropout=_CLIENT_DROPOUT.value, straggler_fraction=_STRAGGLER_FRACTION.value,
      straggler_min_work=_STRAGGLER_MIN_WORK.value,
      root_output_dir=_ROOT.value, experiment_name=_NAME.value, resume=_RESUME.value,
      progress=_PROGRESS.value, workers=_WORKERS.value, local_workers=_LOCAL_WORKERS.value,
      worker_timeout=_WORKER_TIMEOUT.value,
      require_isolated_worker=_REQUIRE_ISOLATED_WORKER.value, resident_state=_RESIDENT_STATE.value,
      blown_up_rounds=_BLOWN_UP_ROUNDS.value, target_accuracy=_TARGET_ACCURACY.value,
      method_kwargs=_METHOD_KWARGS.value,
      **{name: holder.value for name, holder in _METHOD_FLAGS.items()},
      **{name: holder.value for name, holder in _SCHEDULE_FLAGS.items()})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.WARNING)  # TFF's per-model INFO lines are noise here
  config = config_from_flags()
  # Installed before the TFF runtime starts, so SIGINT/SIGTERM only ask the loop to stop at
  # its next round boundary (see stopping.StopRequests); the worker stops at exit.
  with stopping.StopRequests() as stop:
    try:
      experiment_config.check_given_flags(
          config, [name for name in flags.FLAGS if flags.FLAGS[name].present])
      summary = experiment.run_experiment(config, stop=stop)  # validates before TF starts
    except experiment_config.ExperimentError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    except stopping.Interrupted as e:
      print(str(e), file=sys.stderr)
      return e.exit_code
    except Exception as e:  # pylint: disable=broad-except
      from tff_algos import execution  # pylint: disable=g-import-not-at-top
      if not isinstance(e, execution.WorkerUnavailableError):
        raise
      print(f'error: {e}; the last finished round is checkpointed: rerun with --resume',
            file=sys.stderr)
      return 2
  print(f'final accuracy {summary["final_accuracy"]:.4f}  best {summary["best_accuracy"]:.4f}  '
        f'{summary["seconds_per_round"]:.2f} s/round')
  print(f'summary: {os.path.join(summary["experiment_dir"], "summary.json")}')
  print(f'accuracy curve: {summary["accuracy_plot"]}')
  return 0


if __name__ == '__main__':
  flag_parsing.run(main)
