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
import csv
import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable, Optional

import numpy as np

BASELINE_ALGORITHMS = ('fedavg', 'fedavgm', 'fedadam', 'fedprox', 'fedsgd')
FEDLEX_ALGORITHMS = ('fedlex_avgm', 'fedlex_sgd', 'fedlex_opt', 'fedlex_prox')
ALGORITHMS = BASELINE_ALGORITHMS + ('fedcross', 'fedcda', 'cadis') + FEDLEX_ALGORITHMS
FEDCROSS_SELECTIONS = ('lowest_similarity', 'highest_similarity', 'in_order')
FEDLEX_NORMALIZE = ('per_client', 'after_mean')
FEDCDA_SELECTIONS = ('batch_greedy', 'exact', 'newest', 'random')
FEDCDA_WARMUP_WEIGHTINGS = ('data_size', 'uniform')
CADIS_REDUCTIONS = ('sum', 'mean')
CADIS_SIMILARITY_LAYERS = ('bias', 'kernel')
CADIS_CLOSURES = ('two_hop', 'components')
SERVER_OPTIMIZERS = ('sgd', 'sgdm', 'adam')
DEFAULT_MODELS = {
    'digits': 'tiny_cnn', 'fashion_mnist': 'fedavg_cnn', 'mnist': 'fedavg_cnn',
    'emnist': 'fedavg_cnn', 'femnist_tff': 'fedavg_cnn', 'femnist_leaf': 'fedavg_cnn',
    'cifar10': 'resnet20', 'cifar100': 'resnet20', 'shakespeare_tff': 'char_lstm',
    'shakespeare_leaf': 'char_lstm',
}


class ExperimentError(Exception):
  """A problem the user can fix; its message is one line naming the fix."""


@dataclasses.dataclass
class ExperimentConfig:
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
  server_optimizer: str = ''   # '' = the algorithm's own default
  server_lr: float = -1.0      # < 0 = the algorithm's own default
  server_momentum: float = 0.9
  proximal_strength: float = 0.01
  model: str = ''              # '' = the dataset's default model
  seed: int = 0
  eval_every: int = 1
  root_output_dir: str = 'runs'
  experiment_name: str = ''
  resume: bool = False
  progress: bool = True
  # FedCross (ALGORITHMS.md section 1).
  fedcross_alpha: float = 0.99
  fedcross_selection: str = 'lowest_similarity'
  fedcross_alpha_schedule: bool = False
  fedcross_num_propellers: int = 1
  fedcross_accel_rounds: int = 0
  # FedCDA (ALGORITHMS.md section 2).
  fedcda_cache_size: int = 3
  fedcda_batches: int = 3
  fedcda_warmup_rounds: int = 50
  fedcda_smoothness: float = 1.0
  fedcda_selection: str = 'batch_greedy'
  fedcda_warmup_weighting: str = 'data_size'
  fedcda_max_cache_gib: float = 4.0
  # CADIS (ALGORITHMS.md section 3).
  cadis_threshold: float = 0.975
  cadis_threshold_max: float = 0.985
  cadis_kd_weight: float = 1.0
  cadis_kd_reduction: str = 'sum'
  cadis_similarity_layer: str = 'bias'
  cadis_sample_weighted: bool = True
  cadis_closure: str = 'two_hop'
  cadis_transitive: bool = False
  # FedLEx (ALGORITHMS.md section 4).
  fedlex_explorer_fraction: float = 0.2
  fedlex_exploration_epochs: int = 5
  fedlex_exploration_patience: int = 0   # 0 = no early stopping
  fedlex_normalize: str = 'per_client'
  fedlex_guidance_floor: float = 0.0
  fedlex_refresh: bool = False

  @property
  def experiment_dir(self) -> str:
    name = self.experiment_name or f'{self.algorithm}_{self.dataset}_{self.partition}_s{self.seed}'
    return os.path.join(self.root_output_dir, name)


def validate(config: ExperimentConfig) -> None:
  """Raises ExperimentError with one line for the first bad setting."""
  import data  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  c = config
  if c.algorithm not in ALGORITHMS:
    raise ExperimentError(f'--algorithm={c.algorithm!r} is unknown; choose one of {", ".join(ALGORITHMS)}')
  if c.dataset not in data.DATASETS:
    raise ExperimentError(f'--dataset={c.dataset!r} is unknown; choose one of {", ".join(data.DATASETS)}')
  if c.dataset not in data.NATURALLY_FEDERATED and c.partition not in data.PARTITIONERS:
    raise ExperimentError(f'--partition={c.partition!r} is unknown; choose one of {", ".join(data.PARTITIONERS)}')
  if c.model and c.model not in models.MODELS:
    raise ExperimentError(f'--model={c.model!r} is unknown; choose one of {", ".join(models.MODELS)}')
  positive_ints = dict(num_clients=c.num_clients, clients_per_round=c.clients_per_round,
                       rounds=c.rounds, local_epochs=c.local_epochs, batch_size=c.batch_size,
                       eval_every=c.eval_every)
  for name, value in positive_ints.items():
    if value < 1:
      raise ExperimentError(f'--{name} must be at least 1, got {value}')
  if c.clients_per_round > c.num_clients:
    raise ExperimentError(
        f'--clients_per_round={c.clients_per_round} exceeds --num_clients={c.num_clients}; '
        'lower it or add clients')
  if not c.client_lr > 0 or not math.isfinite(c.client_lr):
    raise ExperimentError(f'--client_lr must be a positive number, got {c.client_lr}')
  if not 0 <= c.client_momentum < 1:
    raise ExperimentError(f'--client_momentum must be in [0, 1), got {c.client_momentum}')
  if c.partition == 'dirichlet' and not c.dirichlet_alpha > 0:
    raise ExperimentError(f'--dirichlet_alpha must be > 0, got {c.dirichlet_alpha}')
  if c.server_optimizer and c.server_optimizer not in SERVER_OPTIMIZERS:
    raise ExperimentError(
        f'--server_optimizer={c.server_optimizer!r} is unknown; choose one of {", ".join(SERVER_OPTIMIZERS)}')
  if c.proximal_strength < 0:
    raise ExperimentError(f'--proximal_strength must be >= 0, got {c.proximal_strength}')
  if c.algorithm == 'fedcross':
    if not 0.5 <= c.fedcross_alpha < 1:
      raise ExperimentError(f'--fedcross_alpha must be in [0.5, 1), got {c.fedcross_alpha}')
    if c.fedcross_selection not in FEDCROSS_SELECTIONS:
      raise ExperimentError(f'--fedcross_selection={c.fedcross_selection!r} is unknown; choose '
                            f'one of {", ".join(FEDCROSS_SELECTIONS)}')
    if not 1 <= c.fedcross_num_propellers < max(c.clients_per_round, 2):
      raise ExperimentError(
          f'--fedcross_num_propellers must be in [1, clients_per_round - 1], got '
          f'{c.fedcross_num_propellers}')
    if c.fedcross_accel_rounds < 0:
      raise ExperimentError(f'--fedcross_accel_rounds must be >= 0, got {c.fedcross_accel_rounds}')
  if c.algorithm == 'fedcda':
    for name in ('fedcda_cache_size', 'fedcda_batches'):
      if getattr(c, name) < 1:
        raise ExperimentError(f'--{name} must be at least 1, got {getattr(c, name)}')
    if c.fedcda_warmup_rounds < 0:
      raise ExperimentError(f'--fedcda_warmup_rounds must be >= 0, got {c.fedcda_warmup_rounds}')
    if not c.fedcda_smoothness >= 0:
      raise ExperimentError(f'--fedcda_smoothness must be >= 0, got {c.fedcda_smoothness}')
    if c.fedcda_selection not in FEDCDA_SELECTIONS:
      raise ExperimentError(f'--fedcda_selection={c.fedcda_selection!r} is unknown; choose one '
                            f'of {", ".join(FEDCDA_SELECTIONS)}')
    if c.fedcda_warmup_weighting not in FEDCDA_WARMUP_WEIGHTINGS:
      raise ExperimentError(f'--fedcda_warmup_weighting={c.fedcda_warmup_weighting!r} is '
                            f'unknown; choose one of {", ".join(FEDCDA_WARMUP_WEIGHTINGS)}')
    if not c.fedcda_max_cache_gib > 0:
      raise ExperimentError(f'--fedcda_max_cache_gib must be > 0, got {c.fedcda_max_cache_gib}')
    size = max(1, -(-c.clients_per_round // (1 if c.fedcda_selection == 'exact' else c.fedcda_batches)))
    if c.fedcda_selection in ('batch_greedy', 'exact') and c.fedcda_cache_size ** size > 1 << 20:
      raise ExperimentError(
          f'--fedcda_selection={c.fedcda_selection} would search {c.fedcda_cache_size}^{size} '
          'combinations per batch; raise --fedcda_batches or lower --fedcda_cache_size')
  if c.algorithm == 'cadis':
    if not 0 <= c.cadis_threshold <= c.cadis_threshold_max <= 1:
      raise ExperimentError(
          f'CADIS needs 0 <= --cadis_threshold <= --cadis_threshold_max <= 1, got '
          f'{c.cadis_threshold} and {c.cadis_threshold_max}')
    if not (c.cadis_kd_weight >= 0 and math.isfinite(c.cadis_kd_weight)):
      raise ExperimentError(f'--cadis_kd_weight must be >= 0, got {c.cadis_kd_weight}')
    for flag, value, choices in (
        ('cadis_kd_reduction', c.cadis_kd_reduction, CADIS_REDUCTIONS),
        ('cadis_similarity_layer', c.cadis_similarity_layer, CADIS_SIMILARITY_LAYERS),
        ('cadis_closure', c.cadis_closure, CADIS_CLOSURES)):
      if value not in choices:
        raise ExperimentError(f'--{flag}={value!r} is unknown; choose one of {", ".join(choices)}')
  if c.algorithm in FEDLEX_ALGORITHMS:
    if not 0 < c.fedlex_explorer_fraction <= 1:
      raise ExperimentError(
          f'--fedlex_explorer_fraction must be in (0, 1], got {c.fedlex_explorer_fraction}')
    if c.fedlex_exploration_epochs < 1:
      raise ExperimentError(
          f'--fedlex_exploration_epochs must be at least 1, got {c.fedlex_exploration_epochs}')
    if c.fedlex_exploration_patience < 0:
      raise ExperimentError('--fedlex_exploration_patience must be >= 0 (0 = off)')
    if c.fedlex_normalize not in FEDLEX_NORMALIZE:
      raise ExperimentError(f'--fedlex_normalize must be one of {", ".join(FEDLEX_NORMALIZE)}')
    if not 0 <= c.fedlex_guidance_floor <= 1:
      raise ExperimentError(f'--fedlex_guidance_floor must be in [0, 1], got {c.fedlex_guidance_floor}')


def load_federated_data(c: ExperimentConfig):
  """The FederatedDataset of the config (loaders and partitioners from data/)."""
  import data  # pylint: disable=g-import-not-at-top
  try:
    loaded = data.load_dataset(c.dataset, c.data_dir)
  except data.DatasetNotFoundError as e:
    raise ExperimentError(str(e)) from None
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
    raise ExperimentError(f'impossible partition: {e}') from None


def build_process(c: ExperimentConfig, model_fn, num_clients: Optional[int] = None,
                  true_clusters=None):
  """The LearningProcess of the config (`num_clients`: clients of the loaded data, default
  `c.num_clients`; `true_clusters`: the partition's ground-truth clusters, for CADIS's
  cluster-recovery metrics)."""
  num_clients = num_clients or c.num_clients
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  client_opt = tff.learning.optimizers.build_sgdm(
      learning_rate=c.client_lr, momentum=c.client_momentum or None)
  server_opt = None
  if c.server_optimizer:
    lr = c.server_lr if c.server_lr >= 0 else (1e-2 if c.server_optimizer == 'adam' else 1.0)
    if c.server_optimizer == 'adam':
      server_opt = tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=1e-3)
    else:
      server_opt = tff.learning.optimizers.build_sgdm(
          learning_rate=lr, momentum=c.server_momentum if c.server_optimizer == 'sgdm' else None)
  if c.algorithm == 'fedcross':
    from tff_algos import fedcross  # pylint: disable=g-import-not-at-top
    return fedcross.build_fedcross(
        model_fn, client_opt, c.batch_size, c.clients_per_round, alpha=c.fedcross_alpha,
        selection=c.fedcross_selection, alpha_schedule=c.fedcross_alpha_schedule,
        num_propellers=c.fedcross_num_propellers, accel_rounds=c.fedcross_accel_rounds)
  if c.algorithm == 'fedcda':
    from tff_algos import fedcda  # pylint: disable=g-import-not-at-top
    try:
      return fedcda.build_fedcda(
          model_fn, client_opt, c.batch_size, num_clients, c.clients_per_round,
          cache_size=c.fedcda_cache_size, num_batches=c.fedcda_batches,
          warmup_rounds=c.fedcda_warmup_rounds, smoothness=c.fedcda_smoothness,
          selection=c.fedcda_selection, warmup_weighting=c.fedcda_warmup_weighting,
          seed=c.seed, max_cache_gib=c.fedcda_max_cache_gib)
    except ValueError as e:
      raise ExperimentError(str(e)) from None
  if c.algorithm == 'cadis':
    from tff_algos import cadis  # pylint: disable=g-import-not-at-top
    try:
      return cadis.build_cadis(
          model_fn, client_opt, c.batch_size, num_clients,
          clients_per_round=c.clients_per_round, kd_weight=c.cadis_kd_weight,
          kd_reduction=c.cadis_kd_reduction, threshold=c.cadis_threshold,
          threshold_max=c.cadis_threshold_max, similarity_layer=c.cadis_similarity_layer,
          sample_weighted=c.cadis_sample_weighted, closure=c.cadis_closure,
          transitive=c.cadis_transitive, true_clusters=true_clusters,
          server_optimizer_fn=server_opt)
    except (ValueError, TypeError) as e:
      raise ExperimentError(f'--algorithm=cadis: {e}') from None
  if c.algorithm in FEDLEX_ALGORITHMS:
    from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
    base = c.algorithm.split('_', 1)[1]
    kwargs = {}
    if base == 'prox':
      kwargs['proximal_strength'] = c.proximal_strength
    if base == 'avgm':
      kwargs.update(server_learning_rate=c.server_lr if c.server_lr >= 0 else 1.0,
                    server_momentum=c.server_momentum)
    if base == 'opt':
      kwargs['server_learning_rate'] = c.server_lr if c.server_lr >= 0 else 1e-2
    if base == 'sgd':
      kwargs['server_optimizer_fn'] = server_opt
      return fedlex.build_fedlex(model_fn, None, max(c.batch_size, 256), base, **kwargs)
    if base == 'prox' and server_opt is not None:
      kwargs['server_optimizer_fn'] = server_opt
    return fedlex.build_fedlex(model_fn, client_opt, c.batch_size, base, **kwargs)
  if c.algorithm == 'fedavg':
    return baselines.build_fedavg(model_fn, client_opt, c.batch_size, server_opt)
  if c.algorithm == 'fedavgm':
    return baselines.build_fedavgm(model_fn, client_opt, c.batch_size,
                                   server_learning_rate=c.server_lr if c.server_lr >= 0 else 1.0,
                                   server_momentum=c.server_momentum)
  if c.algorithm == 'fedadam':
    return baselines.build_fedadam(model_fn, client_opt, c.batch_size,
                                   server_learning_rate=c.server_lr if c.server_lr >= 0 else 1e-2)
  if c.algorithm == 'fedprox':
    return baselines.build_fedprox(model_fn, client_opt, c.batch_size, c.proximal_strength,
                                   server_opt)
  if c.algorithm == 'fedsgd':
    return baselines.build_fedsgd(model_fn, server_opt, client_batch_size=max(c.batch_size, 256))
  raise ExperimentError(f'--algorithm={c.algorithm!r} is unknown')


class Evaluator:
  """Central test-set accuracy and loss of a process's global model."""

  def __init__(self, model_fn, x_test, y_test):
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    self._evaluate = evaluation.build_central_evaluation(model_fn)
    self._x, self._y = x_test, y_test

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


def plot_accuracy(rows: list[dict], path: str, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  points = [(int(r['round']), float(r['test_accuracy'])) for r in rows
            if r.get('test_accuracy') not in (None, '')]
  fig, ax = plt.subplots(figsize=(6, 4))
  if points:
    ax.plot(*zip(*points), marker='.')
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path + '.tmp.png', dpi=100)
  plt.close(fig)
  os.replace(path + '.tmp.png', path)


def run_experiment(c: ExperimentConfig, log: Callable[[str], None] = None) -> dict:
  """Runs (or resumes) an experiment; returns the summary dict written to summary.json."""
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  validate(c)
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import data  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top

  exp_dir = c.experiment_dir
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  csv_path = os.path.join(exp_dir, 'metrics.csv')
  if os.path.exists(ckpt_dir) and os.listdir(ckpt_dir) and not c.resume:
    raise ExperimentError(
        f'{exp_dir} already holds a run; pass --resume to continue it or choose another '
        '--experiment_name')
  os.makedirs(exp_dir, exist_ok=True)
  _write_json(os.path.join(exp_dir, 'config.json'), dataclasses.asdict(c))

  fed = load_federated_data(c)
  if fed.partition is not None:
    fed.partition.save(os.path.join(exp_dir, 'partition.npz'))
  x0, _ = fed.client_arrays(0)
  input_shape = tuple(x0.shape[1:])
  model_name = c.model or DEFAULT_MODELS.get(c.dataset, 'fedavg_cnn')
  model_fn = models.make_model_fn(model_name, input_shape, fed.num_classes, seed=c.seed)
  num_clients = min(c.num_clients, fed.num_clients)

  true_clusters = getattr(fed, 'true_clusters', None)
  if true_clusters is not None:
    true_clusters = np.asarray(true_clusters)[:num_clients]
  process = build_process(c, model_fn, num_clients, true_clusters)
  if c.algorithm == 'fedcda' and c.fedcda_warmup_rounds >= c.rounds:
    log(f'note: --fedcda_warmup_rounds={c.fedcda_warmup_rounds} >= --rounds={c.rounds}: this '
        'run is its warmup FedAvg throughout')
  evaluator = Evaluator(model_fn, fed.x_test, fed.y_test)

  loop = asyncio.new_event_loop()
  manager = tff.program.FileProgramStateManager(ckpt_dir, keep_total=2)
  state = process.initialize()
  program_state = collections.OrderedDict(state=state, round=0, best_accuracy=-1.0,
                                          exploration_client_epochs=0.0)
  start_round = 0
  if c.resume:
    restored, version = loop.run_until_complete(manager.load_latest(program_state))
    if restored is not None:
      program_state = restored
      state = restored['state']
      start_round = int(restored['round'])
      log(f'resuming {exp_dir} after round {start_round}')
  exploration = None
  explorers = np.zeros([0], np.int64)
  if c.algorithm in FEDLEX_ALGORITHMS:
    exploration, explorers = _fedlex_exploration(c, model_fn, num_clients)
    if start_round == 0:
      state, explore_metrics = _explore(c, fed, process, exploration, explorers, state, 0)
      program_state['exploration_client_epochs'] = explore_metrics['exploration_client_epochs']
      log(f'FedLEx exploration: {len(explorers)} explorers, '
          f'{explore_metrics["exploration_client_epochs"]:.0f} client-epochs')
  rows = [r for r in _csv_rows(csv_path) if int(r['round']) <= start_round]
  best = float(program_state['best_accuracy'])
  writer = tf.summary.create_file_writer(os.path.join(exp_dir, 'tensorboard'))

  progress = None
  if c.progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    progress = tqdm(total=c.rounds, initial=start_round, unit='round', file=sys.stderr,
                    dynamic_ncols=True)
  round_times = []
  frozen = frozen_after_eval = False
  accuracy = float(rows[-1]['test_accuracy']) if rows and rows[-1].get('test_accuracy') else float('nan')
  for round_num in range(start_round + 1, c.rounds + 1):
    t0 = time.time()
    sampled = data.sample_clients(num_clients, c.clients_per_round, round_num, c.seed)
    _, inputs = data.round_inputs(fed, round_num, c.clients_per_round, c.local_epochs, c.seed,
                                  client_ids=sampled)
    with execution.collector_paused():
      output = process.next(state, [[element] for element in inputs])
      state = output.state
      if exploration is not None and c.fedlex_refresh:
        state, refresh_metrics = _explore(c, fed, process, exploration,
                                          np.intersect1d(sampled, explorers), state, round_num)
        program_state['exploration_client_epochs'] = (
            float(program_state['exploration_client_epochs']) +
            refresh_metrics['exploration_client_epochs'])
    seconds = time.time() - t0
    round_times.append(seconds)
    metrics = _flatten_metrics(output.metrics)
    train_loss = metrics.get('client_work/train/loss', float('nan'))
    if not math.isfinite(train_loss) or (
        metrics.get('client_work/train/non_finite_clients', 0) >= c.clients_per_round):
      raise ExperimentError(
          f'training diverged at round {round_num} (train loss {train_loss}); lower '
          f'--client_lr (now {c.client_lr}) or the server learning rate. The last good '
          f'checkpoint is in {ckpt_dir} (round {round_num - 1}).')
    row = collections.OrderedDict(round=round_num, seconds=round(seconds, 4))
    row.update(metrics)
    if exploration is not None:
      row['exploration_client_epochs'] = float(program_state['exploration_client_epochs'])
    evaluated = round_num % c.eval_every == 0 or round_num == c.rounds
    if evaluated:
      with execution.collector_paused():
        accuracy, test_loss = evaluator(process.get_model_weights(state))
      best = max(best, accuracy)
      row['test_accuracy'] = accuracy
      row['test_loss'] = test_loss
    rows.append(row)
    _write_csv(csv_path, rows)
    with writer.as_default(step=round_num):
      for key, value in row.items():
        if key != 'round' and isinstance(value, (int, float)) and math.isfinite(value):
          tf.summary.scalar(key, value)
    program_state = collections.OrderedDict(
        state=state, round=round_num, best_accuracy=best,
        exploration_client_epochs=float(program_state['exploration_client_epochs']))
    loop.run_until_complete(manager.save(program_state, round_num))
    if not frozen or (evaluated and not frozen_after_eval):
      # Everything alive now (TFF's compiled computations, ~1M objects) lives as long as
      # the run: keep the garbage collector from re-traversing it every round.
      execution.freeze_long_lived_objects()
      frozen, frozen_after_eval = True, frozen_after_eval or evaluated
    if progress is not None:
      progress.set_postfix(loss=f'{train_loss:.4f}', acc=f'{accuracy:.4f}', refresh=False)
      progress.update(1)
  if progress is not None:
    progress.close()
  writer.flush()

  accuracies = [float(r['test_accuracy']) for r in rows if r.get('test_accuracy') not in (None, '')]
  seconds = [float(r['seconds']) for r in rows[1:]] or [float(r['seconds']) for r in rows]
  summary = collections.OrderedDict(
      algorithm=c.algorithm, dataset=c.dataset, partition=c.partition, model=model_name,
      rounds=len(rows),
      final_accuracy=accuracies[-1] if accuracies else None,
      best_accuracy=max(accuracies) if accuracies else None,
      last10_mean_accuracy=float(np.mean(accuracies[-10:])) if accuracies else None,
      seconds_per_round=float(np.median(seconds)) if seconds else None,
      client_epochs_training=len(rows) * c.clients_per_round * c.local_epochs,
      exploration_client_epochs=float(program_state['exploration_client_epochs']),
      aggregator_state_bytes=int(sum(np.asarray(t).nbytes
                                     for t in tf.nest.flatten(state.aggregator))),
      experiment_dir=os.path.abspath(exp_dir),
      accuracy_plot=os.path.abspath(os.path.join(exp_dir, 'accuracy.png')),
  )
  if c.algorithm == 'cadis':
    matched = [int(r['round']) for r in rows
               if float(r.get('aggregator/clusters_match') or 0) == 1.0
               and int(float(r.get('aggregator/seen_clients') or 0)) == num_clients]
    summary['cadis_first_round_clusters_match'] = matched[0] if matched else None
    summary['cadis_final_num_clusters'] = (
        int(float(rows[-1]['aggregator/num_clusters'])) if rows else None)
  if c.algorithm == 'fedcda':
    from tff_algos.aggregators import cross_round_cache  # pylint: disable=g-import-not-at-top
    d = sum(int(np.asarray(w).size) for w in tf.nest.flatten(process.get_model_weights(state)))
    summary['fedcda_state_formula_bytes'] = cross_round_cache.state_size_bytes(
        num_clients, c.fedcda_cache_size, d)
    summary['fedcda_cache_formula'] = (
        f'4*N*K*D = 4*{num_clients}*{c.fedcda_cache_size}*{d} bytes + 4*(3NK+2N+1) bookkeeping')
  if c.algorithm in FEDLEX_ALGORITHMS:
    from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
    summary['guidance'] = fedlex.guidance_statistics(fedlex.get_guidance(state))
  final_weights = process.get_model_weights(state)
  np.savez(os.path.join(exp_dir, 'final_weights.npz'),
           *[np.asarray(w) for w in list(final_weights.trainable) + list(final_weights.non_trainable)])
  _write_json(os.path.join(exp_dir, 'summary.json'), summary)
  plot_accuracy(rows, os.path.join(exp_dir, 'accuracy.png'),
                f'{c.algorithm} on {c.dataset} ({c.partition})')
  loop.close()
  return summary


def _fedlex_exploration(c: ExperimentConfig, model_fn, num_clients: int):
  """FedLEx's exploration computation and its (seeded, fixed) explorer clients."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  client_opt = tff.learning.optimizers.build_sgdm(
      learning_rate=c.client_lr, momentum=c.client_momentum or None)
  exploration = fedlex.build_fedlex_exploration(
      model_fn, client_opt, c.batch_size, normalize=c.fedlex_normalize,
      guidance_floor=c.fedlex_guidance_floor,
      exploration_patience=c.fedlex_exploration_patience or None)
  count = max(1, int(round(c.fedlex_explorer_fraction * num_clients)))
  explorers = np.sort(np.random.default_rng([c.seed, 7]).choice(num_clients, count, replace=False))
  return exploration, explorers


def _explore(c: ExperimentConfig, fed, process, exploration, explorers, state, round_num):
  """Runs FedLEx exploration on `explorers` from the state's global model."""
  import data  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  if len(explorers) == 0:
    return fedlex.refresh_guidance(process, exploration, state, [])
  _, inputs = data.round_inputs(fed, round_num, len(explorers), c.fedlex_exploration_epochs,
                                c.seed + 1, client_ids=explorers)
  return fedlex.explore_and_initialize(process, exploration, [[x] for x in inputs], state)
