"""The settings of one experiment: `ExperimentConfig` (every flag of programs/train.py), the
defaults behind them, their validation and which of them a resumed run may change.

Imports neither TensorFlow nor TFF: a flag error costs no TF start-up.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

from programs import lr_schedules
from programs import methods
from programs import user_code
from programs.methods import registry

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
# The test accuracies summary.json's time_to_accuracy reports without --target_accuracy: on
# Fashion-MNIST the lower is reached by every method of the benchmark suites and the higher by
# most (benchmarks/results/*/results.md); the other data sets have no committed runs, so their
# pairs sit below the levels the papers report there (CADIS's Table II: MNIST 80% and 90%,
# CIFAR-10 48%, CIFAR-100 35%; FedCross: FEMNIST 82%, CIFAR-10's CNN 46% to 59%); digits'
# lower one is what the tests' few-round tiny-CNN runs must pass.
DEFAULT_TARGET_ACCURACIES = {
    'digits': (0.6, 0.8), 'fashion_mnist': (0.7, 0.8), 'mnist': (0.8, 0.9),
    'emnist': (0.7, 0.8), 'femnist_tff': (0.7, 0.8), 'femnist_leaf': (0.7, 0.8),
    'cifar10': (0.4, 0.5), 'cifar100': (0.25, 0.35), 'shakespeare_tff': (0.4, 0.5),
    'shakespeare_leaf': (0.4, 0.5), 'sent140_leaf': (0.6, 0.7),
}
# ... and on a data set of the user's (--dataset=package.module:function).
USER_TARGET_ACCURACIES = (0.5, 0.8)
# The server-side flags each algorithm reads (registry.Method.reads); any other one set away
# from its default is refused rather than recorded in config.json and ignored.
SERVER_FLAGS_USED = {name: method.reads for name, method in methods.METHODS.items()}


class ExperimentError(Exception):
  """A problem the user can fix; its message is one line naming the fix."""


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
  # Client faults (tff_algos.data.ClientFaults), drawn per (seed, round, client) alike for
  # every method: the chance a sampled client never reports, the chance a reporting one
  # straggles, and the least share of its local steps a straggler runs.
  client_dropout: float = 0.0
  straggler_fraction: float = 0.0
  straggler_min_work: float = 0.5
  # ... and each of the last this many rounds: summary.json's last-10 mean (and the reports')
  # is then over the run's last rounds, not over its last evaluations wherever they fell.
  eval_last: int = 10
  # Checkpoint every this many rounds (and after the last one, and on SIGTERM/SIGINT); a
  # checkpoint holds the round up while the worker writes the state (RESULTS.md, "A
  # checkpoint every round"), and a crash repeats the rounds since the last one.
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
  # training loss is above stopping.BLOWN_UP_LOSS; 0 goes on (the reproduction suites report
  # such runs).
  blown_up_rounds: int = 5
  # Test accuracies, comma-separated, summary.json's time_to_accuracy reports (the first
  # evaluated round reaching each, and the bytes and training seconds to it); None = the
  # data set's pair in DEFAULT_TARGET_ACCURACIES.
  target_accuracy: Optional[str] = None
  # The extra keyword arguments (a JSON object) of a method of the user's (--algorithm=
  # package.module:builder; programs/user_code.py).
  method_kwargs: str = ''

  @property
  def experiment_dir(self) -> str:
    name = self.experiment_name or f'{self.algorithm}_{self.dataset}_{self.partition}_s{self.seed}'
    return os.path.join(self.root_output_dir, name)


# Every flag of programs/train.py as a field; the methods' own flags (with their defaults) come
# from the registry, programs/methods/, the learning-rate schedules' from
# programs/lr_schedules.py.
ExperimentConfig = dataclasses.make_dataclass(
    'ExperimentConfig', methods.config_fields() + lr_schedules.config_fields(),
    bases=(_GeneralConfig,))
ExperimentConfig.__module__ = __name__
ExperimentConfig.__doc__ = 'The settings of one experiment: every flag of programs/train.py.'


@dataclasses.dataclass(frozen=True)
class FlagRole:
  """What a flag is to a run: whether `--resume` may change it (it does not change what the
  run computes) and whether the run's TFF computations depend on it (a change builds them
  again instead of reusing those of the last run in this process)."""

  resumable: bool
  rebuilds: bool


DEFINES_RUN = FlagRole(resumable=False, rebuilds=True)
# What the clients are handed each round, not the computations: a change is another run, run
# by the same computations.
DEFINES_INPUTS = FlagRole(resumable=False, rebuilds=False)
# Where the run reads its data and executes, not what it computes: the computations are built
# for them.
EXECUTION = FlagRole(resumable=True, rebuilds=True)
# How long the run goes, when it evaluates and checkpoints, where its record and its server
# state between rounds go.
BOOKKEEPING = FlagRole(resumable=True, rebuilds=False)

# Every flag of the run (tests/test_train_program.py checks each ExperimentConfig field has
# one); the flags of the method registry (programs/methods/) define the run.
FLAG_ROLES = {
    'algorithm': DEFINES_RUN, 'dataset': DEFINES_RUN, 'data_dir': EXECUTION,
    'partition': DEFINES_RUN, 'dirichlet_alpha': DEFINES_RUN, 'shards_per_client': DEFINES_RUN,
    'classes_per_client': DEFINES_RUN, 'quantity_alpha': DEFINES_RUN,
    'num_clients': DEFINES_RUN, 'clients_per_round': DEFINES_RUN, 'rounds': BOOKKEEPING,
    'local_epochs': DEFINES_RUN, 'batch_size': DEFINES_RUN, 'client_lr': DEFINES_RUN,
    'client_momentum': DEFINES_RUN, 'client_optimizer': DEFINES_RUN,
    'client_weight_decay': DEFINES_RUN, 'client_lr_decay': DEFINES_RUN,
    'server_optimizer': DEFINES_RUN, 'server_lr': DEFINES_RUN, 'server_momentum': DEFINES_RUN,
    'proximal_strength': DEFINES_RUN, 'model': DEFINES_RUN, 'seed': DEFINES_RUN,
    'eval_every': BOOKKEEPING, 'client_test_fraction': DEFINES_RUN, 'eval_last': BOOKKEEPING,
    'client_dropout': DEFINES_INPUTS, 'straggler_fraction': DEFINES_INPUTS,
    'straggler_min_work': DEFINES_INPUTS,
    'checkpoint_every': BOOKKEEPING, 'root_output_dir': BOOKKEEPING,
    'experiment_name': BOOKKEEPING, 'resume': BOOKKEEPING, 'progress': BOOKKEEPING,
    'workers': EXECUTION, 'local_workers': EXECUTION, 'worker_timeout': EXECUTION,
    'require_isolated_worker': BOOKKEEPING,
    'resident_state': BOOKKEEPING, 'blown_up_rounds': BOOKKEEPING,
    'target_accuracy': BOOKKEEPING,   # what is reported, not what is computed
    'method_kwargs': DEFINES_RUN,
    **{flag.name: DEFINES_RUN for flag in methods.registry_flags()},
    **{name: DEFINES_RUN for name in lr_schedules.FLAG_NAMES},
}
# Flags that do not change what a run computes: a resumed run may change them.
RESUMABLE_CHANGES = tuple(name for name, role in FLAG_ROLES.items() if role.resumable)
# Flags the run's computations do not depend on (left out of their cache key).
NOT_BUILD_INPUTS = tuple(name for name, role in FLAG_ROLES.items() if not role.rebuilds)


def _default(name: str):
  return ExperimentConfig.__dataclass_fields__[name].default


def _check_flags_used(config: ExperimentConfig) -> None:
  """Refuses flags set away from their default that `c.algorithm` would ignore."""
  method = user_code.method(config.algorithm)
  used = method.reads
  for name in registry.SERVER_FLAGS:
    if getattr(config, name) != _default(name) and name not in used:
      uses = ', '.join(f'--{f}' for f in used) or 'no server-optimizer flag'
      raise ExperimentError(
          f'--{name} is not used by --algorithm={config.algorithm} (it reads {uses}); drop it')
  if ('server_optimizer' in used and config.server_momentum != _default('server_momentum')
      and config.server_optimizer != 'sgdm'):
    raise ExperimentError('--server_momentum is used only with --server_optimizer=sgdm; '
                          'add that or drop --server_momentum')
  for flag in methods.all_flags():
    if flag not in method.flags and getattr(config, flag.name) != flag.default:
      raise ExperimentError(f'--{flag.name} is not used by --algorithm={config.algorithm}; drop it')


def validate(config: ExperimentConfig) -> None:
  """Raises ExperimentError with one line for the first bad setting.

  Imports neither TensorFlow nor TFF (a flag error costs no TF start-up).
  """
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos.data import partitioners  # pylint: disable=g-import-not-at-top
  from tff_algos.models import catalog  # pylint: disable=g-import-not-at-top
  c = config
  user_code.check(c)   # import paths (programs/user_code.py)
  if c.algorithm not in methods.ALGORITHMS and not user_code.is_path(c.algorithm):
    raise ExperimentError(f'--algorithm={c.algorithm!r} is unknown; choose one of {", ".join(methods.ALGORITHMS)} or a builder of your own, package.module:function')
  if c.dataset not in data.DATASETS and not user_code.is_path(c.dataset):
    raise ExperimentError(f'--dataset={c.dataset!r} is unknown; choose one of {", ".join(data.DATASETS)} or package.module:function')
  if c.dataset not in data.NATURALLY_FEDERATED and c.partition not in partitioners.PARTITIONERS:
    raise ExperimentError(f'--partition={c.partition!r} is unknown; choose one of {", ".join(partitioners.PARTITIONERS)}')
  if c.dataset == 'digits' and c.data_dir:
    raise ExperimentError('--dataset=digits is bundled with scikit-learn and reads no files; '
                          'drop --data_dir')
  if c.model and c.model not in catalog.MODEL_NAMES and not user_code.is_path(c.model):
    raise ExperimentError(f'--model={c.model!r} is unknown; choose one of {", ".join(catalog.MODEL_NAMES)} or package.module:function')
  wanted = catalog.MODEL_INPUTS.get(DEFAULT_MODELS.get(c.dataset))
  if wanted and c.model in catalog.MODEL_NAMES and catalog.MODEL_INPUTS[c.model] != wanted:
    raise ExperimentError(
        f'--model={c.model} does not take {c.dataset}\'s {catalog.INPUT_DESCRIPTIONS[wanted]}; '
        f'choose one of {", ".join(catalog.models_for(wanted))}')
  name = c.experiment_name
  if name in ('.', '..') or any(sep and sep in name for sep in (os.sep, os.altsep)):
    raise ExperimentError(f'--experiment_name={name!r} would leave --root_output_dir; give a '
                          'name without a path separator, other than . and ..')
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
  if c.client_lr_decay != 1 and not user_code.method(c.algorithm).local_steps:
    raise ExperimentError(
        f'--client_lr_decay: {c.algorithm} takes no local step (one full-batch gradient per '
        'client), so it has no client learning rate to decay; drop the flag or decay '
        '--server_lr instead')
  error = lr_schedules.problem(c)
  if error:
    raise ExperimentError(error)
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
  client_faults(c)
  target_accuracies(c)
  error = user_code.method(c.algorithm).validate(c)
  if error:
    raise ExperimentError(error)


def client_faults(config: ExperimentConfig):
  """The run's `data.ClientFaults` (--client_dropout, --straggler_fraction,
  --straggler_min_work), or ExperimentError naming the flag to fix."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top  (no TF import)
  if config.straggler_fraction == 0 and config.straggler_min_work != _default('straggler_min_work'):
    raise ExperimentError(_STRAGGLER_MIN_WORK_UNUSED)
  try:
    return data.ClientFaults(config.client_dropout, config.straggler_fraction, config.straggler_min_work)
  except ValueError as e:   # its message starts with the argument's name, the flag's
    raise ExperimentError(f'--{e}') from None


_STRAGGLER_MIN_WORK_UNUSED = ('--straggler_min_work is used only with --straggler_fraction > 0; '
                              'add that or drop --straggler_min_work')


def check_given_flags(config: ExperimentConfig, given) -> None:
  """Refuses a flag of `given` (the names of the flags given explicitly, which absl knows)
  that the run would ignore whatever its value: `validate` sees values only, so it can
  refuse such a flag only away from its default."""
  if 'straggler_min_work' in given and not config.straggler_fraction > 0:
    raise ExperimentError(_STRAGGLER_MIN_WORK_UNUSED)


def target_accuracies(config: ExperimentConfig) -> tuple:
  """The test accuracies time_to_accuracy reports: --target_accuracy's, else the data set's
  DEFAULT_TARGET_ACCURACIES; ExperimentError for a value that is not a number in (0, 1]."""
  if config.target_accuracy is None:
    return DEFAULT_TARGET_ACCURACIES.get(config.dataset, USER_TARGET_ACCURACIES)
  fix = 'give test accuracies in (0, 1], comma-separated (e.g. 0.6,0.7), or drop the flag'
  texts = [t.strip() for t in config.target_accuracy.split(',')]
  if not any(texts):
    raise ExperimentError(f'--target_accuracy is empty; {fix}')
  targets = []
  for text in texts:
    try:
      value = float(text)
    except ValueError:
      raise ExperimentError(f'--target_accuracy: {text!r} is not a number; {fix}') from None
    if not 0 < value <= 1:   # NaN fails too
      raise ExperimentError(f'--target_accuracy: {text} is outside (0, 1]; {fix}')
    targets.append(value)
  return tuple(targets)


def _validate_workers(config: ExperimentConfig) -> None:
  from tff_algos import execution  # pylint: disable=g-import-not-at-top  (no TF import)
  try:
    execution.parse_worker_addresses(config.workers)
  except ValueError as e:
    raise ExperimentError(f'--workers: {e}; give host:port or unix:/path, comma-separated') from None
  if config.local_workers < 0:
    raise ExperimentError(f'--local_workers must be >= 0, got {config.local_workers}')
  if not config.worker_timeout > 0:
    raise ExperimentError(f'--worker_timeout must be > 0 seconds, got {config.worker_timeout}')
  if config.require_isolated_worker and (config.local_workers or not config.workers):
    reason = execution.isolation_unavailable()
    if reason is not None:
      raise ExperimentError(
          f'--require_isolated_worker: TFF\'s worker cannot run isolated from the network here '
          f'({reason}); run on Linux as root or with unprivileged user namespaces enabled, or '
          'drop the flag to run with the worker exposed')


def recorded_config(saved: dict) -> ExperimentConfig:
  """The configuration a run's config.json records: fields it lacks (added since) at their
  defaults, keys this version does not know dropped."""
  fields = ExperimentConfig.__dataclass_fields__
  return ExperimentConfig(**{k: v for k, v in saved.items() if k in fields})


def settings_changed(saved: dict, config: ExperimentConfig) -> str:
  """'' when a run recorded as `saved` (its config.json) is a run of `c` up to
  RESUMABLE_CHANGES, else 'it was run with --x=old (now --x=new)'."""
  mine = dataclasses.asdict(config)
  # A cosine schedule runs over --rounds: then --rounds defines the run.
  fixed = ('rounds',) if (lr_schedules.uses_rounds(config)
                          or lr_schedules.uses_rounds(recorded_config(saved))) else ()
  differing = [name for name in mine if (name not in RESUMABLE_CHANGES or name in fixed)
               and saved.get(name, _default(name)) != mine[name]]
  if not differing:
    return user_code.changed(saved.get('user_code') or {}, config)
  return ('it was run with ' + ', '.join(f'--{n}={saved.get(n, _default(n))}' for n in differing)
          + ' (now ' + ', '.join(f'--{n}={mine[n]}' for n in differing) + ')')

