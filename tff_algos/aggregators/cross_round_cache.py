"""FedCDA's per-client cross-round cache and divergence-aware selection.

The server side of FedCDA (docs/algorithms.md#fedcda, steps 1-4, options and cost) as a
weighted `tff.templates.AggregationProcess`. `next(state, value@CLIENTS, weight@CLIENTS)`
takes `client_work.model_upload`'s OrderedDict(client_index, slot, model, last_epoch_loss)
(weight <= 0: an upload that must not enter the cache), gathers the uploads keyed by slot
into P rows, pushes them into their clients' caches, selects, and returns the uniform mean of
every cached client's selected model (FedAvg of the uploads in warmup). Measurements:
`warmup`, `cached_clients`, `uploads`, `switched`, `objective_before`, `objective_after` and
`has_result` (0.0 in a round nobody reported in: the finalizer then keeps the global model).
The state's layout and the round's maths are `cache_selection`'s; this module is the process
around them: its options, their checks and the state's size, the upload accumulator.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.aggregators import accumulate_then_step
from tff_algos.aggregators.cache_selection import (
    batch_sizes, cache_round, cache_size_bytes, chunk_clients, chunk_sizes)
from tff_algos.client_work import model_upload

# The exhaustive search of one batch evaluates K^{batch size} combinations at once.
MAX_COMBINATIONS = 1 << 20


# --------------------------------------------------------------------------- #
# Sizes and validation
# --------------------------------------------------------------------------- #


# D: the number of floats in one model (trainable and non-trainable).
num_weights = accumulate_then_step.num_weights


def state_size_bytes(num_clients: int, cache_size: int, num_params: int,
                     cache_dtype: str = 'float32') -> int:
  """Bytes of the whole aggregator state: the cache, the float64 `selected_sum` (8·D), and
  losses, squared norms, counts, selections, round (4·(3NK + 2N + 1))."""
  n, k = int(num_clients), int(cache_size)
  return (cache_size_bytes(n, k, num_params, cache_dtype) + 8 * int(num_params)
          + 4 * (3 * n * k + 2 * n + 1))


def validate_options(num_clients: int, clients_per_round: int, cache_size: int,
                     num_batches: int, warmup_rounds: int, smoothness: float,
                     selection: str, warmup_weighting: str = 'data_size',
                     cache_dtype: str = 'float32') -> None:
  for name, value, low in (('num_clients', num_clients, 1),
                           ('clients_per_round', clients_per_round, 1),
                           ('cache_size', cache_size, 1), ('num_batches', num_batches, 1),
                           ('warmup_rounds', warmup_rounds, 0)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f'{name} must be an integer >= {low}, got {value!r}')
  if clients_per_round > num_clients:
    raise ValueError(f'clients_per_round ({clients_per_round}) must be <= num_clients '
                     f'({num_clients})')
  if not smoothness >= 0.0:
    raise ValueError(f'smoothness (L) must be >= 0, got {smoothness}')
  if selection not in constants.FEDCDA_SELECTIONS:
    raise ValueError(f'selection must be one of {constants.FEDCDA_SELECTIONS}, got {selection!r}')
  if warmup_weighting not in constants.FEDCDA_WARMUP_WEIGHTINGS:
    raise ValueError(f'warmup_weighting must be one of {constants.FEDCDA_WARMUP_WEIGHTINGS}, '
                     f'got {warmup_weighting!r}')
  if cache_dtype not in constants.FEDCDA_CACHE_DTYPES:
    raise ValueError(f'cache_dtype must be one of {tuple(constants.FEDCDA_CACHE_DTYPES)}, '
                     f'got {cache_dtype!r}')
  largest = max(batch_sizes(clients_per_round, 1 if selection == 'exact' else num_batches))
  if selection in ('batch_greedy', 'exact') and cache_size ** largest > MAX_COMBINATIONS:
    raise ValueError(
        f'{selection} would search K^{largest} = {cache_size}^{largest} combinations per '
        f'batch (limit {MAX_COMBINATIONS}); use more batches or a smaller cache_size')


# --------------------------------------------------------------------------- #
# The AggregationProcess
# --------------------------------------------------------------------------- #


def build_cross_round_cache_process(
    weights_type: tff.Type,
    num_clients: int,
    clients_per_round: int,
    *,
    cache_size: int = 3,
    num_batches: int = 3,
    warmup_rounds: int = 50,
    smoothness: float = 1.0,
    selection: str = 'batch_greedy',
    warmup_weighting: str = 'data_size',
    seed: int = 0,
    max_cache_gib: Optional[float] = 4.0,
    cache_dtype: str = 'float32',
) -> tff.templates.AggregationProcess:
  """FedCDA's cross-round cache and selection as a weighted `tff.templates.AggregationProcess`.

  Args:
    weights_type: the `tff.learning.models.ModelWeights` type of one model.
    num_clients: N (client indices are in [0, N)).
    clients_per_round: P (client slots are in [0, P)).
    cache_size: K, models kept per client (paper: 3).
    num_batches: B for 'batch_greedy' (paper: 3).
    warmup_rounds: rounds of FedAvg behaviour before selection starts (paper: 50 of 200).
    smoothness: L in eq. 8 (paper: 1).
    selection: one of `constants.FEDCDA_SELECTIONS`.
    warmup_weighting: the warmup's FedAvg weights, one of `constants.FEDCDA_WARMUP_WEIGHTINGS`: 'data_size'
      (the upload weights, i.e. example counts; the paper) or 'uniform'.
    seed: seeds the random batch split and 'random' selection (with the round number).
    max_cache_gib: refuse a configuration whose state (`state_size_bytes`) exceeds this
      many GiB (None: no limit).
    cache_dtype: the dtype the cached models are held in, one of `constants.FEDCDA_CACHE_DTYPES`:
      'float32' (default), or 'float16' / 'bfloat16' for half the cache's memory
      (`cache_selection`'s "Precision").

  Returns:
    An AggregationProcess: state as in `cache_selection`'s comment; next(state, upload@CLIENTS,
    float32@CLIENTS) -> result = OrderedDict(model=ModelWeights, has_result=float32) @SERVER.
  """
  validate_options(num_clients, clients_per_round, cache_size, num_batches, warmup_rounds,
                   smoothness, selection, warmup_weighting, cache_dtype)
  n, p, k = int(num_clients), int(clients_per_round), int(cache_size)
  size = state_size_bytes(n, k, num_weights(weights_type), cache_dtype)
  smaller = ('' if cache_dtype != 'float32' else
             ', hold the cache in float16 (--fedcda_cache_dtype=float16, half the memory)')
  accumulate_then_step.check_state_size(
      'the FedCDA cache', size, max_cache_gib,
      f'{constants.FEDCDA_CACHE_DTYPES[cache_dtype]}·N·K·D bytes: N={n} clients, K={k}, '
      f'D={num_weights(weights_type)} weights, {cache_dtype}',
      f'lower the cache size (--fedcda_cache_size) or the number of clients{smaller}, or '
      'raise max_cache_gib (--fedcda_max_cache_gib)')
  d = num_weights(weights_type)
  chunks = chunk_sizes(n, chunk_clients(n, k, d, cache_dtype))
  smoothness = float(smoothness)
  batches_b = 1 if selection == 'exact' else int(num_batches)

  def initial_state():
    return collections.OrderedDict(
        cache=[tf.zeros([size, k, d], cache_dtype) for size in chunks],
        losses=tf.zeros([n, k], tf.float32),
        sq_norms=tf.zeros([n, k], tf.float64),
        count=tf.zeros([n], tf.int32),
        selected=tf.zeros([n], tf.int32),
        selected_sum=tf.nest.map_structure(lambda t: tf.zeros(t.shape, tf.float64),
                                           accumulate_then_step.zero_model_weights(weights_type)),
        round_num=tf.constant(0, tf.int32))

  def zero_accumulator():
    return collections.OrderedDict(
        models=accumulate_then_step.zero_rows(
            accumulate_then_step.zero_model_weights(weights_type), p),
        client_index=tf.zeros([p], tf.int32),
        loss=tf.zeros([p], tf.float32),
        valid=tf.zeros([p], tf.float32),
        weight=tf.zeros([p], tf.float32),
        received=tf.zeros([p], tf.float32))

  def accumulate(acc, value, weight):
    slot = accumulate_then_step.checked_slot(value['slot'], p)
    ok = tf.cast(weight > 0.0, tf.float32)
    return collections.OrderedDict(
        models=accumulate_then_step.put_row(
            acc['models'], slot, tf.nest.map_structure(lambda v: v * ok, value['model'])),
        client_index=accumulate_then_step.scatter_row(acc['client_index'], slot,
                                                      value['client_index']),
        loss=accumulate_then_step.scatter_row(acc['loss'], slot, value['last_epoch_loss'] * ok),
        valid=accumulate_then_step.scatter_row(acc['valid'], slot, ok),
        weight=accumulate_then_step.scatter_row(acc['weight'], slot, weight * ok),
        received=accumulate_then_step.count_slot(acc['received'], slot))

  options = dict(num_clients=n, clients_per_round=p, cache_size=k, num_batches=batches_b,
                 warmup_rounds=warmup_rounds, smoothness=smoothness, selection=selection,
                 seed=seed, warmup_weighting=warmup_weighting)

  def server_step(state, acc):
    acc = accumulate_then_step.assert_distinct_slots(acc, p)
    acc = accumulate_then_step.assert_client_indices(
        acc, acc['client_index'], acc['valid'] > 0.0, n)
    acc['models'] = accumulate_then_step.stack_rows(
        acc['models'], accumulate_then_step.zero_model_weights(weights_type))
    return cache_round(state, acc, **options)

  return accumulate_then_step.build_server_state_aggregation(
      model_upload.model_upload_type(weights_type), tff.TensorType(np.float32),
      initial_state=initial_state, zero_accumulator=zero_accumulator, accumulate=accumulate,
      server_step=server_step)


def build_replace_finalizer(weights_type: tff.Type) -> tff.learning.templates.FinalizerProcess:
  """The finalizer for this stage's result, OrderedDict(model, has_result): the new global
  model is `model` when `has_result` > 0, else the current one (nobody reported).
  Stateless; TFF's `build_apply_optimizer_finalizer` does not fit (it applies a delta), so
  a pipeline composing this stage with `compose_learning_process` pairs it with this."""
  update_type = tff.StructWithPythonType(
      [('model', weights_type), ('has_result', tff.TensorType(tf.float32.as_numpy_dtype))],
      collections.OrderedDict)

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.tensorflow.computation(weights_type, update_type)
  def replace(current, update):
    keep = update['has_result'] > 0.0
    new = tf.nest.map_structure(lambda u, c: tf.where(keep, u, c), update['model'],
                                current)
    return tff.learning.models.ModelWeights(trainable=list(new.trainable),
                                            non_trainable=list(new.non_trainable))

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(update_type, tff.SERVER))
  def next_fn(state, weights, update):
    new_weights = tff.federated_map(replace, (weights, update))
    return tff.templates.MeasuredProcessOutput(
        state, new_weights, tff.federated_value((), tff.SERVER))

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn)
