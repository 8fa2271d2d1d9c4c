"""The training loop behind programs/train.py: data -> process -> rounds -> results.

Kept apart from the absl binary so that tests and notebooks can run an experiment from a
plain `ExperimentConfig`. Per experiment directory it writes `metrics.csv`, TensorBoard
events, `checkpoints/` (TFF's FileProgramStateManager: each version is written to a temp
directory and renamed, so a kill mid-write leaves the previous one intact), `summary.json`,
`accuracy.png` and `partition.npz`.

Resume is exact: client sampling and per-epoch batch orders are functions of
(seed, round, client), model initialisation of the seed, and everything else is in the
saved program state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import csv
import dataclasses
import fcntl
import json
import math
import os
import platform
import re
import shutil
import signal
import sys
import time
from typing import Callable, Optional

import numpy as np

from programs import methods
from tff_algos.constants import CLIENT_ACCURACY_FIGURES  # no TensorFlow: flags come first

ALGORITHMS = methods.ALGORITHMS
BASELINE_ALGORITHMS = methods.BASELINE_ALGORITHMS
FEDLEX_ALGORITHMS = methods.FEDLEX_ALGORITHMS
SERVER_OPTIMIZERS = ('sgd', 'sgdm', 'adam')
CLIENT_OPTIMIZERS = ('sgdm', 'adam', 'torch_adam')
# The model each dataset trains by default (its benchmark's model); a --model must take the
# same kind of input (tff_algos.models.catalog) as this one.
DEFAULT_MODELS = {
    'digits': 'tiny_cnn', 'fashion_mnist': 'fedavg_cnn', 'mnist': 'fedavg_cnn',
    'emnist': 'fedavg_cnn', 'femnist_tff': 'fedavg_cnn', 'femnist_leaf': 'fedavg_cnn',
    'cifar10': 'resnet20', 'cifar100': 'resnet20', 'shakespeare_tff': 'char_lstm',
    'shakespeare_leaf': 'leaf_char_lstm', 'sent140_leaf': 'sent140_lstm',
}
# The server-side flags each algorithm reads (methods.Method.reads); any other one set away
# from its default is refused rather than recorded in config.json and ignored.
SERVER_FLAGS_USED = {name: method.reads for name, method in methods.METHODS.items()}
# Flags that do not change what a run computes: a resumed run may change them.
RESUMABLE_CHANGES = ('rounds', 'eval_every', 'eval_last', 'data_dir', 'root_output_dir',
                     'experiment_name', 'resume', 'progress', 'workers', 'local_workers', 'worker_timeout',
                     'require_isolated_worker', 'resident_state', 'checkpoint_every',
                     'blown_up_rounds')


# A round's mean client training loss above this (cross-entropy starts near ln 10 = 2.3) means
# local training blew up without overflowing. Such a model often stays at chance (a FedLEx-Prox
# suite run lost its seed so: benchmarks/results/fedlex/diagnosis.md), so each such round is
# announced and --blown_up_rounds of them in a row stop the run, checkpointed.
BLOWN_UP_LOSS = 1e4


def blew_up(train_loss: float) -> bool:
  return math.isfinite(train_loss) and train_loss > BLOWN_UP_LOSS


def blown_up_warning(round_num: int, train_loss: float, client_lr: float, in_a_row: int = 1,
                     stop_after: int = 0) -> str | None:
  """The warning for a finite round loss above BLOWN_UP_LOSS, else None; `in_a_row` counts
  this round among the consecutive blown-up ones, `stop_after` is --blown_up_rounds."""
  if not blew_up(train_loss):
    return None
  persists = f' ({in_a_row} rounds in a row)' if in_a_row > 1 else ''
  stops = (f'; the run stops after {stop_after} such rounds in a row (--blown_up_rounds=0 goes '
           'on)' if stop_after else '')
  return (f'warning: round {round_num}: the clients\' training loss is {train_loss:.2g}{persists}: '
          'local training blew up, and the model may not recover (test accuracy at chance); '
          f'consider a lower --client_lr (now {client_lr:g}) or server learning rate{stops}')


def blown_up_rounds_in_a_row(rows: list) -> int:
  """How many of metrics.csv's last rows (dicts) had a blown-up client training loss."""
  count = 0
  for row in reversed(rows):
    loss = float(row.get('client_work/train/loss') or 'nan')
    if not blew_up(loss):
      break
    count += 1
  return count


# metrics.csv's timing columns: the only ones that differ between two makings of a run.
TIMING_COLUMNS = ('seconds', 'round_seconds')

# Written into a run whose training diverged (while the run is still held, so a process
# waiting for it reads it): the error's first clause, one line.
DIVERGED = 'diverged.txt'


class ExperimentError(Exception):
  """A problem the user can fix; its message is one line naming the fix."""


class RunDirectoryBusy(ExperimentError):
  """Another live process is running the same experiment directory."""


class Interrupted(Exception):
  """A stop signal reached the training loop, which stopped at a safe point.

  Attributes: signum (the signal), last_round (the last finished and checkpointed round,
  0 if none), experiment_dir.
  """

  def __init__(self, signum: int, last_round: int, experiment_dir: str):
    self.signum, self.last_round, self.experiment_dir = signum, last_round, experiment_dir
    name = signal.Signals(signum).name
    if last_round:
      message = (f'interrupted by {name}: round {last_round} is the last finished and '
                 f'checkpointed round; rerun with --resume to continue')
    else:
      message = f'interrupted by {name} before any round finished; nothing was checkpointed'
    super().__init__(message)

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


class StopRequests:
  """Turns SIGINT/SIGTERM into a request the training loop honours at its next safe point.

  The handler only records the signal: raising from it (as KeyboardInterrupt does) can land
  inside a callback where Python ignores exceptions (TF's garbage-collector callback), and
  the signal is lost. `run_experiment` checks `signum` between rounds, after the checkpoint,
  so a stop never leaves a half-written round. A second signal exits at once (exit code
  128 + signal; the worker dies with the process and the last checkpoint is intact).

  Use as a context manager in the main thread; the previous handlers come back on exit.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      os.write(2, f'\n{signal.Signals(signum).name} again: stopping now\n'.encode())
      os._exit(128 + signum)  # pylint: disable=protected-access
    self.signum = signum
    # os.write: print() is not reentrant and the handler may interrupt a print.
    os.write(2, f'\n{signal.Signals(signum).name}: stopping after the current round '
                '(send it again to stop now)\n'.encode())

  def __enter__(self) -> 'StopRequests':
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


@dataclasses.dataclass
class _GeneralConfig:
  """The flags every method shares (ExperimentConfig adds the methods' own)."""

  algorithm: str = 'fedavg'
  dataset: str = 'fashion_mnist'
  data_dir: Optional[str] = None
  partition: str = 'dirichlet'
  dirichlet_alpha: float = 0.5
  shards_per_client: int = 2
  classes_per_client: int = 2
  quantity_alpha: float = 1.0
  num_clients: int = 20
  clients_per_round: int = 4
  rounds: int = 30
  local_epochs: int = 1
  batch_size: int = 50
  client_lr: float = 0.01
  client_momentum: float = 0.5
  client_optimizer: str = 'sgdm'  # CLIENT_OPTIMIZERS
  client_weight_decay: float = 0.0  # L2, as PyTorch's weight_decay (tff_algos.optimizers)
  client_lr_decay: float = 1.0  # the client rate times this each round (tff_algos.client_lr_decay)
  server_optimizer: str = ''   # '' = the algorithm's own default
  server_lr: float = -1.0      # < 0 = the algorithm's own default
  server_momentum: float = 0.9
  proximal_strength: float = 0.01
  model: str = ''              # '' = the dataset's default model
  seed: int = 0
  eval_every: int = 1
  # Per-client evaluation: this fraction of each client's examples is held out of its
  # training (the users' own test split on naturally federated datasets), and the global
  # model is evaluated on every client's held-out data whenever the test set is.
  client_test_fraction: float = 0.0
  # ... and each of the last this many rounds: summary.json's last-10 mean (and the reports')
  # is then over the run's last rounds, not over its last evaluations wherever they fell.
  eval_last: int = 10
  # Checkpoint every this many rounds (and after the last one, and on SIGTERM/SIGINT): a
  # large state's checkpoint every round costs FedCDA 36% of its round time (RESULTS.md);
  # a crash repeats the rounds since the last checkpoint.
  checkpoint_every: int = 1
  root_output_dir: str = 'runs'
  experiment_name: str = ''
  resume: bool = False
  progress: bool = True
  workers: str = ''            # 'host:port,...' of worker services (scripts/start_worker.py)
  local_workers: int = 0       # worker services to start on this machine
  worker_timeout: float = 60.0  # seconds a worker service may stay unreachable
  # Refuse to run where the workers this run starts cannot be isolated from the network
  # (tff_algos/runtime/workers.py) instead of warning and going on with them exposed.
  require_isolated_worker: bool = False
  # Keep the server state in TFF's local worker between rounds (tff_algos.ResidentProcess):
  # the same results without sending the state to the worker every round (local runtime
  # only; on worker services every round goes through process.next).
  resident_state: bool = True
  # Stop (one error line, exit 2, checkpointed) after this many rounds in a row whose clients'
  # training loss is above BLOWN_UP_LOSS; 0 goes on (the reproduction suites report such runs).
  blown_up_rounds: int = 5

  @property
  def experiment_dir(self) -> str:
    name = self.experiment_name or f'{self.algorithm}_{self.dataset}_{self.partition}_s{self.seed}'
    return os.path.join(self.root_output_dir, name)


# Every flag of programs/train.py as a field; the methods' own flags (with their defaults) come
# from the registry, programs/methods.py.
ExperimentConfig = dataclasses.make_dataclass(
    'ExperimentConfig', methods.config_fields(), bases=(_GeneralConfig,))
ExperimentConfig.__module__ = __name__
ExperimentConfig.__doc__ = 'The settings of one experiment: every flag of programs/train.py.'


def _default(name: str):
  return ExperimentConfig.__dataclass_fields__[name].default


def _check_flags_used(c: ExperimentConfig) -> None:
  """Refuses flags set away from their default that `c.algorithm` would ignore."""
  method = methods.METHODS[c.algorithm]
  used = method.reads
  for name in methods.SERVER_FLAGS:
    if getattr(c, name) != _default(name) and name not in used:
      uses = ', '.join(f'--{f}' for f in used) or 'no server-optimizer flag'
      raise ExperimentError(
          f'--{name} is not used by --algorithm={c.algorithm} (it reads {uses}); drop it')
  if ('server_optimizer' in used and c.server_momentum != _default('server_momentum')
      and c.server_optimizer != 'sgdm'):
    raise ExperimentError('--server_momentum is used only with --server_optimizer=sgdm; '
                          'add that or drop --server_momentum')
  for flag in methods.all_flags():
    if flag not in method.flags and getattr(c, flag.name) != flag.default:
      raise ExperimentError(f'--{flag.name} is not used by --algorithm={c.algorithm}; drop it')


def validate(config: ExperimentConfig) -> None:
  """Raises ExperimentError with one line for the first bad setting.

  Imports neither TensorFlow nor TFF (a flag error costs no TF start-up).
  """
  import data  # pylint: disable=g-import-not-at-top
  from data import partitioners  # pylint: disable=g-import-not-at-top
  from tff_algos.models import catalog  # pylint: disable=g-import-not-at-top
  c = config
  if c.algorithm not in ALGORITHMS:
    raise ExperimentError(f'--algorithm={c.algorithm!r} is unknown; choose one of {", ".join(ALGORITHMS)}')
  if c.dataset not in data.DATASETS:
    raise ExperimentError(f'--dataset={c.dataset!r} is unknown; choose one of {", ".join(data.DATASETS)}')
  if c.dataset not in data.NATURALLY_FEDERATED and c.partition not in partitioners.PARTITIONERS:
    raise ExperimentError(f'--partition={c.partition!r} is unknown; choose one of {", ".join(partitioners.PARTITIONERS)}')
  if c.dataset == 'digits' and c.data_dir:
    raise ExperimentError('--dataset=digits is bundled with scikit-learn and reads no files; '
                          'drop --data_dir')
  if c.model and c.model not in catalog.MODEL_NAMES:
    raise ExperimentError(f'--model={c.model!r} is unknown; choose one of {", ".join(catalog.MODEL_NAMES)}')
  wanted = catalog.MODEL_INPUTS[DEFAULT_MODELS[c.dataset]]
  if c.model and catalog.MODEL_INPUTS[c.model] != wanted:
    raise ExperimentError(
        f'--model={c.model} does not take {c.dataset}\'s {catalog.INPUT_DESCRIPTIONS[wanted]}; '
        f'choose one of {", ".join(catalog.models_for(wanted))}')
  _check_flags_used(c)
  positive_ints = dict(num_clients=c.num_clients, clients_per_round=c.clients_per_round,
                       rounds=c.rounds, local_epochs=c.local_epochs, batch_size=c.batch_size,
                       eval_every=c.eval_every, checkpoint_every=c.checkpoint_every)
  for name, value in positive_ints.items():
    if value < 1:
      raise ExperimentError(f'--{name} must be at least 1, got {value}')
  for name in ('eval_last', 'blown_up_rounds'):
    if getattr(c, name) < 0:
      raise ExperimentError(f'--{name} must be at least 0, got {getattr(c, name)}')
  _validate_workers(c)
  if c.clients_per_round > c.num_clients:
    raise ExperimentError(
        f'--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}; '
        'lower it or add clients')
  if not c.client_lr > 0 or not math.isfinite(c.client_lr):
    raise ExperimentError(f'--client_lr must be a positive number, got {c.client_lr}')
  if not 0 <= c.client_momentum < 1:
    raise ExperimentError(f'--client_momentum must be in [0, 1), got {c.client_momentum}')
  if c.client_optimizer not in CLIENT_OPTIMIZERS:
    raise ExperimentError(f'--client_optimizer={c.client_optimizer!r} is unknown; choose one '
                          f'of {", ".join(CLIENT_OPTIMIZERS)}')
  if c.client_optimizer != 'sgdm' and c.client_momentum != _default('client_momentum'):
    raise ExperimentError('--client_momentum is used only with --client_optimizer=sgdm; '
                          'drop it')
  if not (0 <= c.client_weight_decay < math.inf):
    raise ExperimentError(
        f'--client_weight_decay must be a number >= 0, got {c.client_weight_decay}')
  if not (0 < c.client_lr_decay < math.inf):
    raise ExperimentError(
        f'--client_lr_decay must be a number > 0 (1 = no decay), got {c.client_lr_decay}')
  if c.client_lr_decay != 1 and not methods.METHODS[c.algorithm].local_steps:
    raise ExperimentError(
        f'--client_lr_decay: {c.algorithm} takes no local step (one full-batch gradient per '
        'client), so it has no client learning rate to decay; drop the flag or decay '
        '--server_lr instead')
  if c.partition == 'dirichlet' and not c.dirichlet_alpha > 0:
    raise ExperimentError(f'--dirichlet_alpha must be > 0, got {c.dirichlet_alpha}')
  if c.server_optimizer and c.server_optimizer not in SERVER_OPTIMIZERS:
    raise ExperimentError(
        f'--server_optimizer={c.server_optimizer!r} is unknown; choose one of {", ".join(SERVER_OPTIMIZERS)}')
  if c.proximal_strength < 0:
    raise ExperimentError(f'--proximal_strength must be >= 0, got {c.proximal_strength}')
  if not 0 <= c.client_test_fraction < 1:
    raise ExperimentError(f'--client_test_fraction must be in [0, 1) (0 = off), got '
                          f'{c.client_test_fraction}')
  error = methods.METHODS[c.algorithm].validate(c)
  if error:
    raise ExperimentError(error)


def _validate_workers(c: ExperimentConfig) -> None:
  from tff_algos import execution  # pylint: disable=g-import-not-at-top  (no TF import)
  try:
    execution.parse_worker_addresses(c.workers)
  except ValueError as e:
    raise ExperimentError(f'--workers: {e}; give host:port or unix:/path, comma-separated') from None
  if c.local_workers < 0:
    raise ExperimentError(f'--local_workers must be >= 0, got {c.local_workers}')
  if not c.worker_timeout > 0:
    raise ExperimentError(f'--worker_timeout must be > 0 seconds, got {c.worker_timeout}')
  if c.require_isolated_worker and (c.local_workers or not c.workers):
    reason = execution.isolation_unavailable()
    if reason is not None:
      raise ExperimentError(
          f'--require_isolated_worker: TFF\'s worker cannot run isolated from the network here '
          f'({reason}); run on Linux as root or with unprivileged user namespaces enabled, or '
          'drop the flag to run with the worker exposed')


def _check_distributable(c: ExperimentConfig, computations) -> None:
  """With worker services, every computation of the run must split across them."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  if not (c.workers or c.local_workers):
    return
  for computation in computations:
    try:
      execution.check_mergeable(computation, f'--algorithm={c.algorithm}')
    except execution.NotMergeableError as e:
      raise ExperimentError(f'{e}; run it without --workers/--local_workers') from None


# How to shrink a server state that cannot cross to the worker, per method.
_SMALLER_STATE = dict(
    fedcda='hold the cache in bfloat16 (--fedcda_cache_dtype=bfloat16, half the bytes), or '
    'lower --fedcda_cache_size or --num_clients',
    scaffold='lower --num_clients (the control variates are N copies of the model)')


def _check_state_crosses(c: ExperimentConfig, process, resident: bool) -> None:
  """Without --resident_state the server state crosses to TFF's worker and back every round
  as one gRPC message, so it must fit in one. (A resident state crosses as a file:
  `ResidentProcess`'s transfer='files'.)"""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  if resident:
    return
  try:
    execution.check_value_fits(
        process.initialize.type_signature.result, f'the {c.algorithm} server state',
        _SMALLER_STATE.get(c.algorithm, 'lower --num_clients or use a smaller --model'))
  except execution.ValueTooLargeError as e:
    raise ExperimentError(str(e)) from None


def load_federated_data(c: ExperimentConfig):
  """The FederatedDataset of the config (loaders and partitioners from data/)."""
  import data  # pylint: disable=g-import-not-at-top
  try:
    loaded = data.load_dataset(c.dataset, c.data_dir)
  except (data.DatasetNotFoundError, data.DatasetFormatError) as e:
    raise ExperimentError(str(e)) from None
  except OSError as e:  # unreadable files: permissions, a directory where a file should be
    raise ExperimentError(f'cannot read {c.dataset}: {e.strerror}: {e.filename}') from None
  if isinstance(loaded, data.FederatedDataset):
    if c.num_clients > loaded.num_clients:
      raise ExperimentError(
          f'--num_clients={c.num_clients} but {c.dataset} has {loaded.num_clients} clients')
    return loaded
  params = dict(num_clients=c.num_clients, seed=c.seed)
  if c.partition == 'dirichlet':
    params['alpha'] = c.dirichlet_alpha
  elif c.partition == 'shards':
    params['shards_per_client'] = c.shards_per_client
  elif c.partition == 'classes':
    params['classes_per_client'] = c.classes_per_client
  elif c.partition == 'quantity':
    params['alpha'] = c.quantity_alpha
  try:
    return data.federate(loaded, data.make_partitioner(c.partition, **params))
  except data.PartitionError as e:
    # The partitioners' minimum client size is not a flag of this program: name the flags.
    reason = re.sub(r'(,? or a smaller min_size|lower min_size, )', '', str(e))
    raise ExperimentError(f'impossible partition: {reason}') from None


def build_process(c: ExperimentConfig, model_fn, num_clients: Optional[int] = None,
                  true_clusters=None):
  """The LearningProcess of the config (`num_clients`: clients of the loaded data, default
  `c.num_clients`; `true_clusters`: the partition's ground-truth clusters, for CADIS's
  cluster-recovery metrics)."""
  num_clients = num_clients or c.num_clients
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  client_opt = client_optimizer(c, c.client_lr)
  server_opt = None
  # --server_lr alone sets the learning rate of plain server SGD.
  kind = c.server_optimizer or (
      'sgd' if c.server_lr >= 0 and 'server_optimizer' in SERVER_FLAGS_USED[c.algorithm] else '')
  if kind:
    lr = c.server_lr if c.server_lr >= 0 else (1e-2 if kind == 'adam' else 1.0)
    if kind == 'adam':
      server_opt = tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=1e-3)
    else:
      server_opt = tff.learning.optimizers.build_sgdm(
          learning_rate=lr, momentum=c.server_momentum if kind == 'sgdm' else None)
  method = methods.METHODS[c.algorithm]
  args, kwargs = method.arguments(c, methods.BuildInputs(
      model_fn=model_fn, client_optimizer=client_opt, server_optimizer=server_opt,
      num_clients=num_clients, true_clusters=true_clusters))
  kwargs.update(method.builder_kwargs(c))
  kwargs.update(method.plugin_kwargs(c))
  try:
    process = method.builder_function()(*args, **kwargs)
  except method.errors as e:
    raise ExperimentError(f'{method.error_prefix}{e}') from None
  if c.client_lr_decay != 1:
    from tff_algos import client_lr_decay  # pylint: disable=g-import-not-at-top
    process = client_lr_decay.with_client_lr_decay(process, c.client_lr_decay)
  return process


def with_client_test(c: ExperimentConfig, fed, num_clients: int):
  """(the data the clients train on, each of the first `num_clients` clients' test data or
  None when --client_test_fraction is 0).

  A dataset whose users come with their own test split (LEAF, TFF's SQLite) uses it, and its
  clients train on all their training data; any other holds --client_test_fraction of each
  client's examples out of training (`data.hold_out_client_test`, seeded by --seed).
  """
  import data  # pylint: disable=g-import-not-at-top
  if not c.client_test_fraction:
    return fed, None
  if fed.client_test is None:
    fed = data.hold_out_client_test(fed, c.client_test_fraction, c.seed)
  client_test = fed.client_test[:num_clients]
  if not any(len(y) for _, y in client_test):
    raise ExperimentError(
        f'--client_test_fraction: none of the {num_clients} clients of {c.dataset} has test '
        'data of its own; give the users\' test split in --data_dir or drop the flag')
  return fed, client_test


class ClientEvaluator:
  """The four per-client figures (`tff_algos.constants.CLIENT_ACCURACY_FIGURES`) of a
  process's global model on each client's test data.

  `computation` is `evaluation.build_per_client_evaluation(model_fn, len(client_test))`
  (`_per_client_evaluation` keeps it with the run's other computations)."""

  def __init__(self, computation, client_test: list):
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    self.computation = computation
    # Clients without test data stay out of the call (they would count nothing).
    self._inputs = [i for i in evaluation.client_evaluation_inputs(client_test)
                    if i[0]['y'].shape[0]]

  def __call__(self, model_weights) -> dict:
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    return evaluation.summarize_client_accuracies(self.computation(model_weights, self._inputs))


class Evaluator:
  """Central test-set accuracy and loss of a process's global model."""

  def __init__(self, model_fn, x_test, y_test):
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    self._evaluate = evaluation.build_central_evaluation(model_fn)
    self._x, self._y = x_test, y_test

  def on(self, x_test, y_test) -> 'Evaluator':
    """The same (already built) evaluation on another test set of the same shapes."""
    other = object.__new__(Evaluator)
    other._evaluate, other._x, other._y = self._evaluate, x_test, y_test  # pylint: disable=protected-access
    return other

  def __call__(self, model_weights) -> tuple[float, float]:
    result = self._evaluate(model_weights, self._x, self._y)
    return float(result['accuracy']), float(result['loss'])


def _flatten_metrics(metrics, prefix='') -> dict:
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, collections.abc.Mapping):
      flat.update(_flatten_metrics(value, name + '/'))
    else:
      arr = np.asarray(value)
      if arr.ndim == 0:
        flat[name] = arr.item()
      elif 0 < arr.size <= 400:  # small arrays (e.g. FedCross similarity, collaborators) as JSON
        flat[name] = json.dumps(np.round(arr, 6).tolist())
  return flat


def recorded_config(saved: dict) -> ExperimentConfig:
  """The configuration a run's config.json records: fields it lacks (added since) at their
  defaults, keys no longer known dropped."""
  fields = ExperimentConfig.__dataclass_fields__
  return ExperimentConfig(**{k: v for k, v in saved.items() if k in fields})


def evaluated_round(round_num: int, c: ExperimentConfig) -> bool:
  """Whether the run evaluates on the test set after `round_num`: every --eval_every rounds,
  each of the last --eval_last rounds, and always the last."""
  return round_num % c.eval_every == 0 or round_num > c.rounds - max(c.eval_last, 1)


def client_optimizer(c: ExperimentConfig, learning_rate: float):
  """The clients' `tff.learning.optimizers.Optimizer` at `learning_rate`: --client_optimizer
  (sgdm: SGD with --client_momentum; adam: TFF's `build_adam`, whose eps is added to the
  uncorrected sqrt(v); torch_adam: PyTorch's Adam, `tff_algos.optimizers.build_torch_adam`;
  both Adams with PyTorch's betas 0.9, 0.999 and eps 1e-8), with --client_weight_decay added
  to every gradient (L2, coupled)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import optimizers  # pylint: disable=g-import-not-at-top
  if c.client_optimizer == 'adam':
    # TFF's default eps is 1e-7; its eps acts as sqrt(1 / (1 - 0.999^t)) times PyTorch's.
    opt = tff.learning.optimizers.build_adam(learning_rate=learning_rate, epsilon=1e-8)
  elif c.client_optimizer == 'torch_adam':
    opt = optimizers.build_torch_adam(learning_rate=learning_rate)
  else:
    opt = tff.learning.optimizers.build_sgdm(learning_rate=learning_rate,
                                             momentum=c.client_momentum or None)
  return optimizers.with_weight_decay(opt, c.client_weight_decay)


def fedlex_explorer_lr(c: ExperimentConfig) -> float:
  """The rate FedLEx's explorers train at: --fedlex_exploration_lr, or (0) --client_lr."""
  return c.fedlex_exploration_lr or c.client_lr


def settings_changed(saved: dict, c: ExperimentConfig) -> str:
  """'' when a run recorded as `saved` (its config.json) is a run of `c` up to
  RESUMABLE_CHANGES, else 'it was run with --x=old (now --x=new)'."""
  mine = dataclasses.asdict(c)
  differing = [name for name in mine if name not in RESUMABLE_CHANGES
               and saved.get(name, _default(name)) != mine[name]]
  if not differing:
    return ''
  return ('it was run with ' + ', '.join(f'--{n}={saved.get(n, _default(n))}' for n in differing)
          + ' (now ' + ', '.join(f'--{n}={mine[n]}' for n in differing) + ')')


def _csv_rows(path) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _write_csv(path, rows: list[dict]) -> None:
  """Rewrites the CSV atomically (the column set may grow between rounds)."""
  columns = []
  for row in rows:
    columns += [k for k in row if k not in columns]
  tmp = path + '.tmp'
  with open(tmp, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(tmp, path)


def _write_json(path, value) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def host_description(cpuinfo: str = '/proc/cpuinfo') -> dict:
  """Where the program runs (the driver; remote workers' own devices are in
  `compute_devices`): {'cpu': the processor's model name, 'cores': the cores this process
  may use} and, where /proc/cpuinfo gives them, 'cpu_id' ('family F model M stepping S')
  and 'vector_extensions' (its AVX/AMX/FMA flags, sorted).

  The model name alone does not tell two machines apart whose float results differ: two
  "AMD EPYC" machines here made the same FedAvgM round 1 end at training losses 0.7370 and
  0.7030 (our reading: TensorFlow's CPU kernels choose their code path by the vector
  extensions); with these fields a run's record says which it ran on.
  """
  fields = {}
  try:
    with open(cpuinfo) as f:
      for line in f:   # the first value of each key: the first processor's
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  except OSError:   # not Linux
    pass
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:   # not Linux
    cores = os.cpu_count()
  host = {'cpu': fields.get('model name') or platform.processor() or platform.machine(),
          'cores': cores}
  if all(k in fields for k in ('cpu family', 'model', 'stepping')):
    host['cpu_id'] = 'family {} model {} stepping {}'.format(
        fields['cpu family'], fields['model'], fields['stepping'])
  if 'flags' in fields:
    host['vector_extensions'] = ' '.join(sorted(
        flag for flag in fields['flags'].split() if flag.startswith(('avx', 'amx', 'fma'))))
  return host


def plot_accuracy(rows: list[dict], path: str, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  points = [(int(r['round']), float(r['test_accuracy'])) for r in rows
            if r.get('test_accuracy') not in (None, '')]
  fig, ax = plt.subplots(figsize=(6, 4))
  if points:
    ax.plot(*zip(*points), marker='.', label='central test set')
  spread = [(int(r['round']), *(float(r[k]) for k in CLIENT_ACCURACY_FIGURES))
            for r in rows if r.get('client_accuracy_mean') not in (None, '')]
  if spread:   # per-client evaluation: the mean over clients, the band down to p10, the min
    rounds, mean, _, p10, lowest = zip(*spread)
    ax.plot(rounds, mean, color='tab:orange', label='clients: mean')
    ax.fill_between(rounds, p10, mean, color='tab:orange', alpha=0.25,
                    label='clients: 10th percentile to mean')
    ax.plot(rounds, lowest, color='tab:orange', linestyle=':', label='clients: min')
    ax.legend(loc='lower right', fontsize='small')
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path + '.tmp.png', dpi=100)
  plt.close(fig)
  os.replace(path + '.tmp.png', path)


_VERSION_DIR = re.compile(r'^program_state_(\d+)$')
_TEMP_VERSION_DIR = re.compile(r'^program_state_\d+_temp\d+$')  # TFF's file_utils naming


def checkpointed_rounds(ckpt_dir: str) -> list[int]:
  """Versions FileProgramStateManager has finished writing (renamed from their temp dir)."""
  if not os.path.isdir(ckpt_dir):
    return []
  return sorted(int(m.group(1)) for m in map(_VERSION_DIR.match, os.listdir(ckpt_dir)) if m)


def _remove_unfinished_checkpoints(ckpt_dir: str) -> None:
  """Deletes the temp directories of checkpoint writes that a kill interrupted."""
  if os.path.isdir(ckpt_dir):
    for entry in os.listdir(ckpt_dir):
      if _TEMP_VERSION_DIR.match(entry):
        shutil.rmtree(os.path.join(ckpt_dir, entry), ignore_errors=True)


def _make_output_dir(exp_dir: str) -> list[str]:
  """Makes `exp_dir`; returns the directories it created, deepest first."""
  made, path = [], os.path.abspath(exp_dir)
  while not os.path.exists(path):
    made.append(path)
    path = os.path.dirname(path)
  try:
    os.makedirs(exp_dir, exist_ok=True)
  except OSError as e:
    raise ExperimentError(f'cannot create the experiment directory {exp_dir}: {e.strerror}; '
                          'choose a writable --root_output_dir') from None
  if not os.access(exp_dir, os.W_OK | os.X_OK):
    raise ExperimentError(f'{exp_dir} is not writable; choose a writable --root_output_dir')
  return made


def _remove_empty(directories: list[str]) -> None:
  """Removes those of `directories` (deepest first) that are still empty: a run stopped by a
  check (bad data, impossible partition) leaves no trace of its own."""
  for path in directories:
    try:
      os.rmdir(path)
    except OSError:   # not empty (or gone): it and its parents stay
      return


@contextlib.contextmanager
def exclusive_run_directory(exp_dir: str, wait: bool = False):
  """Holds `exp_dir` for this process alone (RunDirectoryBusy if another holds it).

  Two processes on one run would interleave their checkpoints and metrics.csv. The lock is
  an flock on the directory itself: nothing is written, and it is released when the
  process ends however it ends. With `wait`, blocks until the other process lets go. An
  flock keeps apart the processes of one machine (on a network file system, not those of
  two machines sharing the directory). A second lock on the same directory by the same
  process is refused too (flock belongs to the open file).
  """
  while True:
    try:
      fd = os.open(exp_dir, os.O_RDONLY)
    except OSError as e:
      raise ExperimentError(f'cannot open the experiment directory {exp_dir}: {e.strerror}; '
                            'choose a writable --root_output_dir') from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
      os.close(fd)
      raise RunDirectoryBusy(
          f'{exp_dir} is being run by another process; wait for it to end (--resume then '
          'continues it if it stopped early) or choose another --experiment_name') from None
    except OSError as e:   # e.g. ENOLCK: a file system without locks
      os.close(fd)
      raise ExperimentError(f'cannot lock the experiment directory {exp_dir}: {e.strerror}; '
                            'choose a --root_output_dir on a local disk') from None
    # The directory may have been replaced (removed and made again) while this process
    # opened or waited for it: the lock would then hold a directory no longer at the path.
    try:
      current = os.stat(exp_dir)
    except OSError:
      current = None
    held = os.fstat(fd)
    if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
      break
    os.close(fd)
  try:
    yield
  finally:
    os.close(fd)


def resume_point(c: ExperimentConfig, log: Callable[[str], None] = lambda _: None) -> int:
  """Checks the experiment directory before anything is loaded or written (it reads only).

  Returns the round to resume after (0 = a fresh run). Refuses to start over an existing
  run without --resume, and to resume a run recorded with different run-defining flags
  (everything but RESUMABLE_CHANGES) or fewer --rounds than it already finished.
  """
  exp_dir = c.experiment_dir
  last = max(checkpointed_rounds(os.path.join(exp_dir, 'checkpoints')), default=0)
  if not c.resume:
    if last:
      raise ExperimentError(
          f'{exp_dir} already holds a run; pass --resume to continue it or choose another '
          '--experiment_name')
    return 0
  if not last:
    log(f'note: nothing to resume in {exp_dir} (no finished round checkpointed): starting '
        'a fresh run')
    return 0
  if os.path.exists(os.path.join(exp_dir, DIVERGED)):
    with open(os.path.join(exp_dir, DIVERGED)) as f:
      what = f.read().strip()
    raise ExperimentError(f'cannot resume {exp_dir}: its {what} and would again (runs are '
                          'deterministic); start a new run (another --experiment_name) with a '
                          'lower --client_lr or server learning rate')
  config_path = os.path.join(exp_dir, 'config.json')
  try:
    with open(config_path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ExperimentError(f'cannot resume {exp_dir}: its config.json is unreadable ({e}); '
                          'choose another --experiment_name') from None
  differing = settings_changed(saved, c)
  if differing:
    raise ExperimentError(f'cannot resume {exp_dir}: {differing}; pass the same values or '
                          'choose another --experiment_name')
  if c.rounds < last:
    raise ExperimentError(f'cannot resume {exp_dir} with --rounds={c.rounds}: it already '
                          f'finished round {last}; pass --rounds={last} or more')
  # The checkpoint and metrics.csv must tell the same story: a record replaced by an older
  # copy (e.g. a checkout) would lose the rounds in between from every page built on it.
  logged = {int(r['round']) for r in _csv_rows(os.path.join(exp_dir, 'metrics.csv'))}
  missing = sorted(set(range(1, last + 1)) - logged)
  if missing:
    raise ExperimentError(
        f'cannot resume {exp_dir}: it is checkpointed after round {last} but its metrics.csv '
        f'lacks {len(missing)} of those rounds (from round {missing[0]}): the record was '
        'replaced or truncated; restore metrics.csv or choose another --experiment_name')
  return last


def _truncate_tensorboard(directory: str, last_round: int) -> None:
  """Drops the scalars of rounds after `last_round` from the event files in `directory`.

  A run killed after logging rounds it had not checkpointed (up to --checkpoint_every - 1
  of them) repeats those rounds when resumed; without this TensorBoard would show them
  twice.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(directory):
    return
  for name in sorted(os.listdir(directory)):
    if 'tfevents' not in name:
      continue
    path = os.path.join(directory, name)
    kept, dropped = [], False
    try:
      for record in tf.data.TFRecordDataset(path):
        raw = record.numpy()
        event = tf.compat.v1.Event.FromString(raw)
        if event.HasField('summary') and event.step > last_round:
          dropped = True
        else:
          kept.append(raw)
    except tf.errors.DataLossError:  # the last record of a killed write: drop it
      dropped = True
    if dropped:
      with tf.io.TFRecordWriter(path + '.tmp') as writer:
        for raw in kept:
          writer.write(raw)
      os.replace(path + '.tmp', path)


def _dropped_clients(metrics: dict) -> int:
  """Clients whose non-finite update the round left out (client work's non_finite_clients)."""
  return int(round(sum(v for k, v in metrics.items()
                       if k.endswith('non_finite_clients') and isinstance(v, (int, float)))))


def is_cost_column(key: str, name: str) -> bool:
  """Whether metrics.csv column `key` holds the client-work cost metric `name`."""
  return key.startswith('client_work/') and key.split('/')[-1] == name


def round_costs(rows: list[dict], name: str) -> int:
  """The sum over rounds of the client-work cost metric `name` (client_work/.../name)."""
  return int(round(sum(float(value) for row in rows for key, value in row.items()
                   if is_cost_column(key, name) and value not in (None, ''))))


# The computations of the last configuration run in this Python process, keyed by the flags
# they depend on: running it again (a notebook cell re-run, a resume after an interrupt)
# reuses TFF's traced and compiled computations instead of paying for them again. The entry
# is a dict: model_name, model_fn, process, evaluator (build_computations) and, once a run
# has evaluated on its clients' test data, per_client (_per_client_evaluation).
_LAST_BUILT: dict = {}
_NOT_BUILD_INPUTS = ('rounds', 'eval_every', 'eval_last', 'root_output_dir', 'experiment_name', 'resume',
                     'progress', 'resident_state', 'checkpoint_every', 'blown_up_rounds',
                     'require_isolated_worker')


def _load_checkpoint(loop, manager, program_state, method: methods.Method, log):
  """The latest checkpoint, loaded as `program_state`'s structure or, failing that, in one
  of the method's older layouts (`Method.legacy_state`, newest first) and upgraded; raises
  the first error if none matches."""
  try:
    restored, _ = loop.run_until_complete(manager.load_latest(program_state))
    return restored
  except Exception as error:  # pylint: disable=broad-except
    first = error
  for to_legacy, upgrade in ((methods.named_function(a), methods.named_function(b))
                             for a, b in method.legacy_state):
    legacy = collections.OrderedDict(program_state, state=to_legacy(program_state['state']))
    try:
      restored, _ = loop.run_until_complete(manager.load_latest(legacy))
    except Exception:  # pylint: disable=broad-except
      continue
    log(f'the checkpoint holds an earlier {method.name} version\'s state layout; upgraded it '
        f'({upgrade.__module__}.{upgrade.__name__})')
    return collections.OrderedDict(restored, state=upgrade(restored['state']))
  raise first


def _build_key(c: ExperimentConfig, fed, num_clients: int) -> str:
  """_LAST_BUILT's key of the config and loaded data."""
  x0, _ = fed.client_arrays(0)
  return json.dumps(
      [{k: v for k, v in dataclasses.asdict(c).items() if k not in _NOT_BUILD_INPUTS},
       x0.shape[1:], str(x0.dtype), fed.num_classes, fed.info.get('vocab_size'), num_clients],
      sort_keys=True)


def build_computations(c: ExperimentConfig, fed, num_clients: int):
  """(model name, model_fn, LearningProcess, Evaluator) of the config and loaded data, as a
  run builds them (kept for a rerun in this process, which reuses TFF's traced computations;
  benchmarks build their processes with it)."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  key = _build_key(c, fed, num_clients)
  if key in _LAST_BUILT:
    built = _LAST_BUILT[key]
    return (built['model_name'], built['model_fn'], built['process'],
            built['evaluator'].on(fed.x_test, fed.y_test))
  model_name = c.model or DEFAULT_MODELS[c.dataset]
  x0, _ = fed.client_arrays(0)
  try:
    model_fn = models.make_model_fn(model_name, tuple(x0.shape[1:]), fed.num_classes,
                                    seed=c.seed, vocab_size=fed.info.get('vocab_size'))
  except ValueError as e:
    raise ExperimentError(f'--model={model_name} cannot take {c.dataset}: {e}') from None
  true_clusters = getattr(fed, 'true_clusters', None)
  if true_clusters is not None:
    true_clusters = np.asarray(true_clusters)[:num_clients]
  process = build_process(c, model_fn, num_clients, true_clusters)
  evaluator = Evaluator(model_fn, fed.x_test, fed.y_test)
  _LAST_BUILT.clear()
  _LAST_BUILT[key] = dict(model_name=model_name, model_fn=model_fn, process=process,
                          evaluator=evaluator)
  return model_name, model_fn, process, evaluator


def _per_client_evaluation(c: ExperimentConfig, fed, num_clients: int, num_test_clients: int):
  """`evaluation.build_per_client_evaluation` of the run's model_fn for `num_test_clients`
  clients, kept in the run's _LAST_BUILT entry (made by build_computations just before):
  a rerun in this process reuses TFF's traced computation."""
  built = _LAST_BUILT[_build_key(c, fed, num_clients)]
  if built.get('per_client', (None, None))[0] != num_test_clients:
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    built['per_client'] = (num_test_clients, evaluation.build_per_client_evaluation(
        built['model_fn'], num_test_clients))
  return built['per_client'][1]


def run_experiment(c: ExperimentConfig, log: Callable[[str], None] = None,
                   stop: Optional[StopRequests] = None) -> dict:
  """Runs (or resumes) an experiment; returns the summary dict written to summary.json.

  Nothing in the experiment directory is written before the flags, the data, the model and,
  on --resume, the saved run have been checked. With `stop` (a StopRequests), a signal ends
  the run at the next round boundary by raising `Interrupted`. A directory another live
  process is running is refused (RunDirectoryBusy).
  """
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  validate(c)
  made = _make_output_dir(c.experiment_dir)
  try:
    with exclusive_run_directory(c.experiment_dir), contextlib.ExitStack() as closing:
      return _run_experiment(c, log, stop, closing)
  except RunDirectoryBusy:
    # The directory is the other process's, made by it between our look and our makedirs
    # (empty while that process checks its data): removing it would leave that process
    # writing into a path a third one then makes anew.
    raise
  except BaseException:
    _remove_empty(made)
    raise


def _run_experiment(c: ExperimentConfig, log: Callable[[str], None],
                    stop: Optional[StopRequests], closing: contextlib.ExitStack) -> dict:
  """run_experiment, with the experiment directory made and held; `closing` releases what
  the run holds (the resident state's scratch directory) however it ends."""
  start_round = resume_point(c, log)
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  try:
    execution.initialize_runtime(workers=execution.parse_worker_addresses(c.workers),
                                 local_workers=c.local_workers,
                                 worker_timeout_seconds=c.worker_timeout,
                                 require_isolated_worker=c.require_isolated_worker)
  except (execution.WorkerUnavailableError, execution.WorkerNotIsolatedError) as e:
    raise ExperimentError(str(e)) from None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import data  # pylint: disable=g-import-not-at-top

  exp_dir = c.experiment_dir
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  csv_path = os.path.join(exp_dir, 'metrics.csv')

  fed = load_federated_data(c)
  if len(fed.y_test) == 0:
    raise ExperimentError(
        f'{c.dataset} has no central test examples (no accuracy can be measured); give its '
        'test split data (LEAF: test/*.json) in --data_dir')
  num_clients = min(c.num_clients, fed.num_clients)
  fed, client_test = with_client_test(c, fed, num_clients)
  model_name, model_fn, process, evaluator = build_computations(c, fed, num_clients)
  client_evaluator = ClientEvaluator(
      _per_client_evaluation(c, fed, num_clients, len(client_test)),
      client_test) if client_test else None
  _check_distributable(c, [process.next] + (
      [client_evaluator.computation] if client_evaluator else []))
  resident = c.resident_state and not (c.workers or c.local_workers)
  _check_state_crosses(c, process, resident)
  note = methods.METHODS[c.algorithm].note(c)
  if note:
    log(note)

  # With --resident_state (local runtime) the server state stays in TFF's worker between
  # rounds (`held`); `state` is its copy in Python, brought back for each checkpoint. On
  # worker services both are the same Python value.
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  # Its files go in the experiment's directory (the checkpoints' file system); a killed run
  # leaves its scratch directory behind, removed here.
  resident_state.remove_scratch_directories(exp_dir)
  runner = (resident_state.ResidentProcess(process, c.clients_per_round, scratch_dir=exp_dir)
            if resident else resident_state.DirectProcess(process))
  closing.callback(runner.close)
  loop = asyncio.new_event_loop()
  manager = tff.program.FileProgramStateManager(ckpt_dir, keep_total=2)
  held, state = runner.initial_state()   # (a resume or FedLEx's exploration replaces both)
  program_state = collections.OrderedDict(state=state, round=0, best_accuracy=-1.0,
                                          exploration_client_epochs=0.0)
  _remove_unfinished_checkpoints(ckpt_dir)
  if start_round:
    try:
      restored = _load_checkpoint(loop, manager, program_state, methods.METHODS[c.algorithm],
                                  log)
    except Exception as e:  # pylint: disable=broad-except
      raise ExperimentError(
          f'cannot resume {exp_dir}: its checkpoint does not match this program\'s state '
          f'({type(e).__name__}); choose another --experiment_name') from None
    program_state = restored
    state, held = restored['state'], None
    start_round = int(restored['round'])
    log(f'resuming {exp_dir} after round {start_round}')
  # The run is known valid from here on: only now is its record (re)written.
  _write_json(os.path.join(exp_dir, 'config.json'), dataclasses.asdict(c))
  if not start_round and os.path.exists(os.path.join(exp_dir, DIVERGED)):
    os.remove(os.path.join(exp_dir, DIVERGED))   # an earlier start diverged in round 1
  partition_path = os.path.join(exp_dir, 'partition.npz')
  if fed.partition is not None and not (start_round and os.path.exists(partition_path)):
    fed.partition.save(partition_path)
  _truncate_tensorboard(os.path.join(exp_dir, 'tensorboard'), start_round)

  exploration = None
  explorers = np.zeros([0], np.int64)
  if methods.METHODS[c.algorithm].is_guided(c):
    exploration, explorers = _fedlex_exploration(c, model_fn, num_clients)
    _check_distributable(c, [exploration])
    if start_round == 0:
      state, explore_metrics = _explore(c, fed, process, exploration, explorers, state, 0)
      held = None
      program_state['exploration_client_epochs'] = explore_metrics['exploration_client_epochs']
      log(f'FedLEx exploration: {len(explorers)} explorers, '
          f'{explore_metrics["exploration_client_epochs"]:.0f} client-epochs')
  if held is None:
    held = runner.adopt(state)
  rows = [r for r in _csv_rows(csv_path) if int(r['round']) <= start_round]
  best = float(program_state['best_accuracy'])
  writer = tf.summary.create_file_writer(os.path.join(exp_dir, 'tensorboard'))

  progress = None
  if c.progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    progress = tqdm(total=c.rounds, initial=start_round, unit='round', file=sys.stderr,
                    dynamic_ncols=True)
  last_round = checkpointed = start_round

  def checkpoint():
    """Saves the state after `last_round` (what a resume continues from)."""
    nonlocal state, program_state, checkpointed
    state = runner.materialize(held)
    program_state = collections.OrderedDict(
        state=state, round=last_round, best_accuracy=best,
        exploration_client_epochs=float(program_state['exploration_client_epochs']))
    loop.run_until_complete(manager.save(program_state, last_round))
    checkpointed = last_round

  def check_stop():
    if stop is not None and stop.signum is not None:
      if progress is not None:
        progress.close()  # the message below goes on its own line
      if checkpointed < last_round:   # rounds since the last --checkpoint_every
        checkpoint()
      writer.flush()
      raise Interrupted(stop.signum, last_round, exp_dir)

  frozen = frozen_after_eval = False
  in_a_row = blown_up_rounds_in_a_row(rows)   # blown-up rounds just before this one
  accuracy = float(rows[-1]['test_accuracy']) if rows and rows[-1].get('test_accuracy') else float('nan')
  try:
    for round_num in range(start_round + 1, c.rounds + 1):
      check_stop()
      t0 = time.time()
      sampled = data.sample_clients(num_clients, c.clients_per_round, round_num, c.seed)
      _, inputs = data.round_inputs(fed, round_num, c.clients_per_round, c.local_epochs, c.seed,
                                    client_ids=sampled)
      # The runner's calls (and evaluations below) run with the collector paused.
      held, round_metrics = runner.next(held, [[element] for element in inputs])
      if exploration is not None and c.fedlex_refresh:
        with execution.collector_paused():
          state, refresh_metrics = _explore(c, fed, process, exploration,
                                            np.intersect1d(sampled, explorers),
                                            runner.materialize(held), round_num)
          held = runner.adopt(state)
          program_state['exploration_client_epochs'] = (
              float(program_state['exploration_client_epochs']) +
              refresh_metrics['exploration_client_epochs'])
      seconds = time.time() - t0
      metrics = _flatten_metrics(round_metrics)
      train_loss = metrics.get('client_work/train/loss', float('nan'))
      dropped = _dropped_clients(metrics)
      if dropped >= c.clients_per_round or not math.isfinite(train_loss):
        why = (f'all {dropped} sampled clients\' updates were non-finite'
               if dropped >= c.clients_per_round else f'train loss {train_loss}')
        again = ('start a new run (another --experiment_name: rounds up to '
                 f'{checkpointed} are checkpointed in {ckpt_dir})' if checkpointed
                 else 'start again')
        diverged = f'training diverged at round {round_num} ({why})'
        tmp = os.path.join(exp_dir, DIVERGED + '.tmp')
        with open(tmp, 'w') as f:
          f.write(diverged + '\n')
        os.replace(tmp, os.path.join(exp_dir, DIVERGED))
        raise ExperimentError(
            f'{diverged}; {again} with a lower --client_lr (now {c.client_lr}) or server '
            'learning rate')
      warnings = [f'warning: round {round_num}: {dropped} of {c.clients_per_round} clients '
                  'had non-finite updates and were left out; consider a lower --client_lr'
                  ] if dropped else []
      in_a_row = in_a_row + 1 if blew_up(train_loss) else 0
      if in_a_row:
        warnings.append(blown_up_warning(round_num, train_loss, c.client_lr, in_a_row,
                                         c.blown_up_rounds))
      for message in warnings:
        if progress is not None:
          progress.write(message, file=sys.stderr)
        else:
          log(message)
      # seconds: the round's training (and FedLEx's exploration); round_seconds, filled in
      # after the evaluation: the whole round as the program runs it (what --plan sizes by).
      row = collections.OrderedDict(round=round_num, seconds=round(seconds, 4),
                                    round_seconds=None, dropped_clients=dropped)
      row.update(metrics)
      if exploration is not None:
        row['exploration_client_epochs'] = float(program_state['exploration_client_epochs'])
      evaluated = evaluated_round(round_num, c)
      if evaluated:
        weights = runner.get_model_weights(held)
        with execution.collector_paused():
          accuracy, test_loss = evaluator(weights)
          client_figures = client_evaluator(weights) if client_evaluator else {}
        best = max(best, accuracy)
        row['test_accuracy'] = accuracy
        row['test_loss'] = test_loss
        row.update((k, client_figures[k]) for k in CLIENT_ACCURACY_FIGURES if client_figures)
      row['round_seconds'] = round(time.time() - t0, 4)
      rows.append(row)
      _write_csv(csv_path, rows)
      with writer.as_default(step=round_num):
        for key, value in row.items():
          if key != 'round' and isinstance(value, (int, float)) and math.isfinite(value):
            tf.summary.scalar(key, value)
      last_round = round_num
      if round_num % c.checkpoint_every == 0 or round_num == c.rounds:
        checkpoint()
      if c.blown_up_rounds and in_a_row >= c.blown_up_rounds:
        if checkpointed < last_round:
          checkpoint()
        raise ExperimentError(
            f'the clients\' training loss stayed above {BLOWN_UP_LOSS:g} for {in_a_row} rounds '
            f'in a row (rounds {round_num - in_a_row + 1}-{round_num}): local training blew up; '
            f'start a new run with a lower --client_lr (now {c.client_lr:g}) or server learning '
            f'rate, or go on with --resume --blown_up_rounds=0 (rounds up to {last_round} are '
            f'checkpointed in {ckpt_dir})')
      if not frozen or (evaluated and not frozen_after_eval):
        # Everything alive now (TFF's compiled computations, ~1M objects) lives as long as
        # the run: keep the garbage collector from re-traversing it every round.
        execution.freeze_long_lived_objects()
        frozen, frozen_after_eval = True, frozen_after_eval or evaluated
      if progress is not None:
        progress.set_postfix(loss=f'{train_loss:.4f}', acc=f'{accuracy:.4f}', refresh=False)
        progress.update(1)
    check_stop()
  finally:
    if progress is not None:
      progress.close()
    writer.flush()
    loop.close()

  accuracies = [float(r['test_accuracy']) for r in rows if r.get('test_accuracy') not in (None, '')]
  seconds = [float(r['seconds']) for r in rows[1:]] or [float(r['seconds']) for r in rows]
  summary = collections.OrderedDict(
      algorithm=c.algorithm, dataset=c.dataset, partition=c.partition, model=model_name,
      rounds=len(rows),
      final_accuracy=accuracies[-1] if accuracies else None,
      best_accuracy=max(accuracies) if accuracies else None,
      last10_mean_accuracy=float(np.mean(accuracies[-10:])) if accuracies else None,
      seconds_per_round=float(np.median(seconds)) if seconds else None,
      # Counted by the clients (their client_epochs / examples_trained metrics), not
      # rounds x clients x epochs: FedSGD takes no local epoch.
      client_epochs_training=round_costs(rows, 'client_epochs'),
      examples_trained=round_costs(rows, 'examples_trained'),
      exploration_client_epochs=float(program_state['exploration_client_epochs']),
      dropped_clients=int(sum(int(float(r.get('dropped_clients') or 0)) for r in rows)),
      aggregator_state_bytes=int(sum(np.asarray(t).nbytes
                                     for t in tf.nest.flatten(state.aggregator))),
      # Measured inside the worker services, not this process's tf.config (docs/distributed.md, "Accelerators").
      compute_devices=execution.worker_devices(),
      # Where the program ran: seconds_per_round compares across runs only on one machine.
      host=host_description(),
      # As given (relative to where the program ran): committed run records hold no
      # machine-specific absolute paths.
      experiment_dir=exp_dir,
      accuracy_plot=os.path.join(exp_dir, 'accuracy.png'),
  )
  if client_evaluator:   # the last evaluation's, as final_accuracy
    last = [r for r in rows if r.get('client_accuracy_mean') not in (None, '')]
    summary.update((k, float(last[-1][k]) if last else None) for k in CLIENT_ACCURACY_FIGURES)
    summary['clients_evaluated'] = sum(1 for _, y in client_test if len(y))
  final_weights = runner.get_model_weights(held)   # (only the weights leave the worker)
  record = methods.RunRecord(c, rows, state, final_weights, num_clients)
  summary.update(methods.METHODS[c.algorithm].summary(record))
  summary.update(methods.plugin_summary(methods.METHODS[c.algorithm], record))
  np.savez(os.path.join(exp_dir, 'final_weights.npz'),
           *[np.asarray(w) for w in list(final_weights.trainable) + list(final_weights.non_trainable)])
  _write_json(os.path.join(exp_dir, 'summary.json'), summary)
  plot_accuracy(rows, os.path.join(exp_dir, 'accuracy.png'),
                f'{c.algorithm} on {c.dataset} ({c.partition})')
  return summary


def _fedlex_exploration(c: ExperimentConfig, model_fn, num_clients: int):
  """FedLEx's exploration computation and its (seeded, fixed) explorer clients."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  # Explorers train unguided: their rate is the base's, not a guided variant's raised one.
  client_opt = client_optimizer(c, fedlex_explorer_lr(c))
  exploration = fedlex.build_fedlex_exploration(
      model_fn, client_opt, c.batch_size, **methods.exploration_kwargs(c))
  return exploration, fedlex_explorers(c, num_clients)


def explored_initial_state(c: ExperimentConfig, fed, process, model_fn, num_clients: int):
  """(state, exploration metrics): `process.initialize()` with FedLEx's guidance explored as
  a run does before its first round (process and model_fn from `build_computations`)."""
  exploration, explorers = _fedlex_exploration(c, model_fn, num_clients)
  return _explore(c, fed, process, exploration, explorers, process.initialize(), 0)


def fedlex_explorers(c: ExperimentConfig, num_clients: int) -> np.ndarray:
  """FedLEx's explorer clients: --fedlex_explorer_fraction of them, fixed by the seed."""
  count = max(1, int(round(c.fedlex_explorer_fraction * num_clients)))
  return np.sort(np.random.default_rng([c.seed, 7]).choice(num_clients, count, replace=False))


def _explore(c: ExperimentConfig, fed, process, exploration, explorers, state, round_num):
  """Runs FedLEx exploration on `explorers` from the state's global model."""
  import data  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  if len(explorers) == 0:
    return fedlex.refresh_guidance(process, exploration, state, [])
  _, inputs = data.round_inputs(fed, round_num, len(explorers), c.fedlex_exploration_epochs,
                                c.seed + 1, client_ids=explorers)
  return fedlex.explore_and_initialize(process, exploration, [[x] for x in inputs], state)
