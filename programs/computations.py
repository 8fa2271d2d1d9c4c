"""The TFF computations of a run: its LearningProcess (with the clients' and server's
optimizers), the central and per-client evaluations, the checks that they fit the runtime,
and the cache that lets a rerun in the same Python process reuse them."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

import numpy as np

from programs import lr_schedules
from programs import user_code
from programs.methods import registry
from programs.experiment_config import (DEFAULT_MODELS, NOT_BUILD_INPUTS,
                             ExperimentConfig, ExperimentError)


def client_optimizer(config: ExperimentConfig, learning_rate: float):
  """The clients' `tff.learning.optimizers.Optimizer` at `learning_rate`: --client_optimizer
  (sgdm: SGD with --client_momentum; adam: TFF's `build_adam`, whose eps is added to the
  uncorrected sqrt(v); torch_adam: PyTorch's Adam, `tff_algos.optimizers.build_torch_adam`;
  both Adams with PyTorch's betas 0.9, 0.999 and eps 1e-8), with --client_weight_decay added
  to every gradient (L2, coupled)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import optimizers  # pylint: disable=g-import-not-at-top
  if config.client_optimizer == 'adam':
    # TFF's default eps is 1e-7; its eps acts as sqrt(1 / (1 - 0.999^t)) times PyTorch's.
    opt = tff.learning.optimizers.build_adam(learning_rate=learning_rate, epsilon=1e-8)
  elif config.client_optimizer == 'torch_adam':
    opt = optimizers.build_torch_adam(learning_rate=learning_rate)
  else:
    opt = tff.learning.optimizers.build_sgdm(learning_rate=learning_rate,
                                             momentum=config.client_momentum or None)
  return optimizers.with_weight_decay(opt, config.client_weight_decay)


def build_process(config: ExperimentConfig, model_fn, num_clients: Optional[int] = None,
                  true_clusters=None):
  """The LearningProcess of the config (`num_clients`: clients of the loaded data, default
  `c.num_clients`; `true_clusters`: the partition's ground-truth clusters, for CADIS's
  cluster-recovery metrics)."""
  num_clients = num_clients or config.num_clients
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  client_opt = client_optimizer(config, config.client_lr)
  server_opt = None
  # --server_lr alone sets the learning rate of plain server SGD.
  method = user_code.method(config.algorithm)
  kind = config.server_optimizer or (
      'sgd' if config.server_lr >= 0 and 'server_optimizer' in method.reads else '')
  if kind:
    lr = config.server_lr if config.server_lr >= 0 else (1e-2 if kind == 'adam' else 1.0)
    if kind == 'adam':
      server_opt = tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=1e-3)
    else:
      server_opt = tff.learning.optimizers.build_sgdm(
          learning_rate=lr, momentum=config.server_momentum if kind == 'sgdm' else None)
  args, kwargs = method.arguments(config, registry.BuildInputs(
      model_fn=model_fn, client_optimizer=client_opt, server_optimizer=server_opt,
      num_clients=num_clients, true_clusters=true_clusters))
  kwargs.update(method.builder_kwargs(config))
  kwargs.update(method.plugin_kwargs(config))
  try:
    process = method.builder(*args, **kwargs)
  except method.errors as e:
    raise ExperimentError(f'{method.error_prefix}{e}') from None
  user_code.check_process(config, process)
  # The rates' schedules (programs/lr_schedules.py), inside the round.
  client, server = lr_schedules.schedules(config)
  if client.is_constant and server.is_constant:
    return process
  from tff_algos import schedules  # pylint: disable=g-import-not-at-top
  return schedules.with_lr_schedules(process, client, server)


def check_distributable(config: ExperimentConfig, computations) -> None:
  """With worker services, every computation of the run must split across them."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  if not (config.workers or config.local_workers):
    return
  for computation in computations:
    try:
      execution.check_mergeable(computation, f'--algorithm={config.algorithm}')
    except execution.NotMergeableError as e:
      raise ExperimentError(f'{e}; run it without --workers/--local_workers') from None


# How to shrink a server state that cannot cross to the worker, per method.
_SMALLER_STATE = dict(
    fedcda='hold the cache in bfloat16 (--fedcda_cache_dtype=bfloat16, half the bytes), or '
    'lower --fedcda_cache_size or --num_clients',
    scaffold='lower --num_clients (the control variates are N copies of the model)')


def check_state_crosses(config: ExperimentConfig, process, resident: bool) -> None:
  """Without --resident_state the server state crosses to TFF's worker and back every round
  as one gRPC message, so it must fit in one. (A resident state crosses as a file:
  `ResidentProcess`'s transfer='files'.)"""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  if resident:
    return
  try:
    execution.check_value_fits(
        process.initialize.type_signature.result, f'the {config.algorithm} server state',
        _SMALLER_STATE.get(config.algorithm, 'lower --num_clients or use a smaller --model'))
  except execution.ValueTooLargeError as e:
    raise ExperimentError(str(e)) from None


class ClientEvaluator:
  """The four per-client figures (`tff_algos.constants.CLIENT_ACCURACY_FIGURES`) of a
  process's global model on each client's test data.

  `computation` is `evaluation.build_per_client_evaluation(model_fn, len(client_test))`
  (`per_client_evaluation` keeps it with the run's other computations)."""

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


# The computations of the last configuration run in this Python process, keyed by the flags
# they depend on: running it again (a notebook cell re-run, a resume after an interrupt)
# reuses TFF's traced and compiled computations instead of paying for them again. The entry
# is a dict: model_name, model_fn, process, evaluator (build_computations) and, once a run
# has evaluated on its clients' test data, per_client (per_client_evaluation).
_LAST_BUILT: dict = {}


def _build_key(config: ExperimentConfig, fed, num_clients: int) -> str:
  """_LAST_BUILT's key of the config and loaded data."""
  x0, _ = fed.client_arrays(0)
  return json.dumps(
      [{k: v for k, v in dataclasses.asdict(config).items() if k not in NOT_BUILD_INPUTS},
       # a cosine schedule's rounds (--rounds is not otherwise built in)
       [repr(s) for s in lr_schedules.schedules(config)],
       x0.shape[1:], str(x0.dtype), fed.num_classes, fed.info.get('vocab_size'), num_clients],
      sort_keys=True)


def build_computations(config: ExperimentConfig, fed, num_clients: int):
  """(model name, model_fn, LearningProcess, Evaluator) of the config and loaded data, as a
  run builds them (kept for a rerun in this process, which reuses TFF's traced computations;
  benchmarks build their processes with it)."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  key = _build_key(config, fed, num_clients)
  if key in _LAST_BUILT:
    built = _LAST_BUILT[key]
    return (built['model_name'], built['model_fn'], built['process'],
            built['evaluator'].on(fed.x_test, fed.y_test))
  model_name = config.model or DEFAULT_MODELS[config.dataset]
  x0, _ = fed.client_arrays(0)
  try:
    model_fn = (user_code.model_fn(model_name, fed.client_data.element_type_structure['x'],
                                   fed.num_classes, config.seed) if user_code.is_path(model_name)
                else models.make_model_fn(model_name, tuple(x0.shape[1:]), fed.num_classes,
                                          seed=config.seed, vocab_size=fed.info.get('vocab_size')))
  except ValueError as e:
    raise ExperimentError(f'--model={model_name} cannot take {config.dataset}: {e}') from None
  true_clusters = getattr(fed, 'true_clusters', None)
  if true_clusters is not None:
    true_clusters = np.asarray(true_clusters)[:num_clients]
  process = build_process(config, model_fn, num_clients, true_clusters)
  evaluator = Evaluator(model_fn, fed.x_test, fed.y_test)
  _LAST_BUILT.clear()
  _LAST_BUILT[key] = dict(model_name=model_name, model_fn=model_fn, process=process,
                          evaluator=evaluator)
  return model_name, model_fn, process, evaluator


def per_client_evaluation(config: ExperimentConfig, fed, num_clients: int, num_test_clients: int):
  """`evaluation.build_per_client_evaluation` of the run's model_fn for `num_test_clients`
  clients, kept in the run's _LAST_BUILT entry (made by build_computations just before):
  a rerun in this process reuses TFF's traced computation."""
  built = _LAST_BUILT[_build_key(config, fed, num_clients)]
  if built.get('per_client', (None, None))[0] != num_test_clients:
    from tff_algos import evaluation  # pylint: disable=g-import-not-at-top
    built['per_client'] = (num_test_clients, evaluation.build_per_client_evaluation(
        built['model_fn'], num_test_clients))
  return built['per_client'][1]


