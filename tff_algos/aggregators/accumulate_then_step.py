"""The shape every stateful aggregator of this project shares, in one place.

FedCross's cross-aggregation, FedCDA's cross-round cache and CADIS's clustered aggregation
are weighted `tff.templates.AggregationProcess`es of the same form:

    uploads@CLIENTS --tff.federated_aggregate--> dense accumulator@SERVER   (O(P·D) memory)
    (state, accumulator) --one TF server step--> (new state, result, measurements)

They differ only in the TF functions plugged in, which `build_server_state_aggregation` turns
into TFF computations.

Client-keyed state (FedCDA's cache, CADIS's Q/F matrices, SCAFFOLD's control variates) is
rows of such a state, one per client index: written from uploads keyed by the index that
travels in each client's input, and (SCAFFOLD) read back one row per client with
`federated_select_rows`. Its memory is sized with `num_weights` / `stacked_type` and refused
above a limit by `check_state_size`, in one place for every method.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def num_weights(weights_type) -> int:
  """D: the number of values in a structure of tensor types (e.g. a ModelWeights type: its
  trainable and non-trainable weights; its `.trainable` alone: the trainable ones)."""
  return int(sum(int(np.prod(t.shape)) for t in tff.structure.flatten(weights_type)))


def stacked_type(weights_type: tff.Type, *leading: int, dtype=None) -> tff.Type:
  """`weights_type` (ModelWeights) with leading dimensions on every tensor (and, if given,
  every floating tensor in `dtype`)."""

  def stack(t):
    floating = np.issubdtype(t.dtype, np.floating) or t.dtype == tf.bfloat16.as_numpy_dtype
    return tff.TensorType(dtype if dtype is not None and floating else t.dtype,
                          [*leading, *t.shape])

  return tff.StructWithPythonType(
      [('trainable', tff.StructWithPythonType([stack(t) for t in weights_type.trainable], list)),
       ('non_trainable',
        tff.StructWithPythonType([stack(t) for t in weights_type.non_trainable], list))],
      tff.learning.models.ModelWeights)


def check_state_size(what: str, size_bytes: int, max_gib: Optional[float], formula: str,
                     fixes: str) -> None:
  """One ValueError when a server state of `size_bytes` exceeds `max_gib` GiB (None: no
  limit): '<what> needs X GiB (<formula>), above the L GiB limit; <fixes>'."""
  if max_gib is not None and size_bytes > max_gib * 2**30:
    raise ValueError(f'{what} needs {size_bytes / 2**30:.2f} GiB ({formula}), above the '
                     f'{max_gib} GiB limit; {fixes}')


def scatter_row(tensor, row, value):
  """`tensor` with row `row` (int32 scalar) replaced by `value` (shape tensor.shape[1:])."""
  return tf.tensor_scatter_nd_update(tensor, tf.reshape(row, [1, 1]),
                                     tf.expand_dims(tf.convert_to_tensor(value, tensor.dtype), 0))


def zero_rows(zero_row, num_rows: int) -> list:
  """An accumulator of `num_rows` separate rows of the structure `zero_row` (e.g.
  `zero_model_weights(weights_type)`), written with `put_row` and stacked once with
  `stack_rows(rows, zero_row)`; a row never written stacks as zeros.

  Each row starts empty (every tensor of rank > 0 has size 0 and dimensions of unknown size
  in its type), not as zeros: TFF's runtime serialises every `federated_aggregate`'s zero
  accumulator and parses it again where the clients' values are (TFF 0.87's federating
  executor), so R zero models would cost O(R·D) bytes each way a round for nothing; empty
  rows cost nothing to move (timings: benchmarks/results/RESULTS.md).
  """
  return [tf.nest.map_structure(_empty_like, zero_row)] * int(num_rows)


def _empty_like(t):
  """An empty tensor of `t`'s dtype and rank whose type leaves every dimension unknown (the
  same tensor for a scalar)."""
  t = tf.convert_to_tensor(t)
  if t.shape.rank == 0:
    return t
  return open_shape(tf.zeros([0] * t.shape.rank, t.dtype))


def open_shape(t):
  """`t` with every dimension of its static shape unknown (the type of a `zero_rows` row)."""
  t = tf.convert_to_tensor(t)
  if t.shape.rank == 0:
    return t
  return tf.compat.v1.placeholder_with_default(t, [None] * t.shape.rank)


def put_row(rows: list, slot, value) -> list:
  """`rows` with row `slot` (int32 scalar) replaced by `value` (cast to the rows' dtypes).

  Why not `scatter_row` into a stacked [R, ...] tensor: the runtime still holds the
  accumulator it passes in, so a scatter allocates and copies all R rows for every upload
  (O(R²·D) a round). Here each row is its own tensor and a `tf.cond` passes the R - 1 other
  rows through without touching them: O(D) per upload, and R small ops.
  """
  value = tf.nest.map_structure(lambda r, v: tf.cast(v, r.dtype), rows[0], value)
  return [tf.cond(tf.equal(slot, i), lambda: value, lambda row=row: row)
          for i, row in enumerate(rows)]


def stack_rows(rows: list, zero_row):
  """The rows of a `zero_rows(zero_row, R)` accumulator as one structure of [R, ...] tensors
  (a row never written is zeros)."""

  def full(row, like):
    like = tf.convert_to_tensor(like)
    if like.shape.rank == 0:
      return row
    # Zero-padded to the row's size: a written row is passed through (no padding), an empty
    # one becomes zeros. (A tf.cond choosing between the two returned the empty row under
    # TFF's runtime: observed, cause not found.)
    flat = tf.reshape(row, [-1])
    return tf.reshape(tf.pad(flat, [[0, like.shape.num_elements() - tf.size(flat)]]),
                      like.shape)

  rows = [tf.nest.map_structure(full, row, zero_row) for row in rows]
  return tf.nest.map_structure(lambda *row: tf.stack(row), *rows)


def add_accumulators(a, b):
  """Elementwise a + b of two partial accumulators, an empty `zero_rows` row being zero (so
  a row written in one of them is taken from it)."""

  def add(x, y):
    if x.shape.is_fully_defined() and x.shape == y.shape:
      return x + y
    # Either may be empty: both zero-padded to the larger size (no tf.cond: see stack_rows).
    size = tf.maximum(tf.size(x), tf.size(y))
    shape = tf.where(tf.size(x) > 0, tf.shape(x), tf.shape(y))
    pad = lambda t: tf.pad(tf.reshape(t, [-1]), [[0, size - tf.size(t)]])  # noqa: E731
    return tf.reshape(pad(x) + pad(y), shape)

  return tf.nest.map_structure(add, a, b)


def checked_slot(slot, num_slots: int, name: str = 'clients_per_round'):
  """`slot` behind a check that it is in [0, num_slots): a round given more clients than
  the process was built for fails with this message, not with a gather's index error."""
  check = tf.debugging.assert_equal(
      tf.logical_and(slot >= 0, slot < num_slots), True,
      message=f'a client has slot outside [0, {name}={num_slots}): the process was built for '
      f'{num_slots} clients per round; give each round at most {num_slots} clients '
      f'(slots 0..{num_slots - 1}) or build it with a larger {name}')
  with tf.control_dependencies([check]):
    return tf.identity(slot)


def checked_client_index(index, num_clients: int):
  """`index` behind a check that it is in [0, num_clients) (a client input built for more
  clients than the process fails with this message, not with a gather's index error)."""
  check = tf.debugging.assert_equal(
      tf.logical_and(index >= 0, index < num_clients), True,
      message=f'a client_index is outside [0, num_clients={num_clients}): the process was '
      f'built for {num_clients} clients; build it with num_clients covering every index')
  with tf.control_dependencies([check]):
    return tf.identity(index)


def assert_client_indices(acc, client_index, valid, num_clients: int):
  """`acc` behind a check that every valid upload's `client_index` [P] is in
  [0, num_clients)."""
  check = tf.debugging.assert_equal(
      tf.reduce_all(tf.logical_or(tf.logical_not(valid), tf.logical_and(
          client_index >= 0, client_index < num_clients))), True,
      message=f'a client_index is outside [0, num_clients={num_clients})')
  with tf.control_dependencies([check]):
    return tf.nest.map_structure(tf.identity, acc)


def checked_distinct_clients(writers):
  """`writers` (int32 [W], the client indices of a round's valid uploads) behind a check that
  no index occurs twice: per-client state updated from uploads (a cache row, a control
  variate, a running sum) assumes one upload per client and round."""
  check = tf.debugging.assert_equal(
      tf.size(tf.unique(writers).y), tf.size(writers),
      message='two uploads of one round have the same client_index: a round samples '
      'distinct clients')
  with tf.control_dependencies([check]):
    return tf.identity(writers)


def count_slot(received, slot):
  """`received` (float32 [P], uploads counted per slot) with one more upload at `slot`.

  Counted, not set: two uploads to one slot then show as a count of 2 whether they meet in
  one accumulator (where the second overwrites the first) or in a merge (where they add),
  and `assert_distinct_slots` fails the round instead of silently losing a model.
  """
  return received + tf.one_hot(slot, tf.shape(received)[0], dtype=received.dtype)


def assert_distinct_slots(acc, num_slots: int):
  """`acc` behind a check that no slot of `acc['received']` counted two uploads."""
  check = tf.debugging.assert_less_equal(
      acc['received'], tf.constant(1.0, acc['received'].dtype),
      message=f'two clients uploaded with the same slot: slots must be distinct in '
      f'[0, clients_per_round={num_slots})')
  with tf.control_dependencies([check]):
    return tf.nest.map_structure(tf.identity, acc)


def zero_model_weights(weights_type: tff.Type):
  """Zero `ModelWeights` of a ModelWeights type (e.g. a stacked [K, ...] one)."""
  return tff.learning.models.ModelWeights(
      trainable=[tf.zeros(t.shape, t.dtype) for t in weights_type.trainable],
      non_trainable=[tf.zeros(t.shape, t.dtype) for t in weights_type.non_trainable])


def build_server_state_aggregation(
    value_type: tff.Type,
    weight_type: tff.Type,
    *,
    initial_state: Callable[[], Any],
    zero_accumulator: Callable[[], Any],
    accumulate: Callable[[Any, Any, Any], Any],
    server_step: Callable[[Any, Any], tuple],
    merge: Optional[Callable[[Any, Any], Any]] = None,
) -> tff.templates.AggregationProcess:
  """A weighted AggregationProcess from TF functions (plain Python, traced here).

  Args:
    value_type: the type of one client's upload.
    weight_type: the type of its weight.
    initial_state: () -> the server state.
    zero_accumulator: () -> the empty accumulator.
    accumulate: (accumulator, value, weight) -> accumulator.
    server_step: (state, accumulator) -> (new state, result, measurements).
    merge: (accumulator, accumulator) -> accumulator; default `add_accumulators` (right for
      accumulators that put each upload into its own row).

  Returns:
    `next(state@SERVER, value@CLIENTS, weight@CLIENTS)` -> MeasuredProcessOutput with all of
    state, result and measurements at SERVER.
  """
  state_fn = tff.tensorflow.computation(initial_state)
  zero_fn = tff.tensorflow.computation(zero_accumulator)
  state_type = state_fn.type_signature.result
  acc_type = zero_fn.type_signature.result

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(state_fn, tff.SERVER)

  @tff.tensorflow.computation(acc_type, (value_type, weight_type))
  def accumulate_fn(acc, value_and_weight):
    value, weight = value_and_weight
    return accumulate(acc, value, weight)

  @tff.tensorflow.computation(acc_type, acc_type)
  def merge_fn(a, b):
    return merge(a, b) if merge is not None else add_accumulators(a, b)

  @tff.tensorflow.computation(acc_type)
  def report_fn(acc):
    return acc

  @tff.tensorflow.computation(state_type, acc_type)
  def server_step_fn(state, acc):
    return server_step(state, acc)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS))
  def next_fn(state, value, weight):
    acc = tff.federated_aggregate(tff.federated_zip((value, weight)), zero_fn(),
                                  accumulate_fn, merge_fn, report_fn)
    new_state, result, measurements = tff.federated_map(server_step_fn, (state, acc))
    return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)


def federated_select_rows(keys, stacked, checked_key: Callable[[Any], Any]):
  """Row `keys[i]` of every tensor of `stacked` sent to client i (`tff.federated_select`).

  Call inside a `tff.federated_computation`. Each client gets only its own row: one model
  down per client for FedCross (keyed by slot), one control variate for SCAFFOLD (keyed by
  client index), whatever the number of rows.

  Args:
    keys: int32 scalar @CLIENTS, the row each client receives.
    stacked: a structure of [R, ...] tensors @SERVER (R static).
    checked_key: (int32 key) -> the key behind a check that it is in [0, R) with a message
      naming the fix (`checked_slot`, `checked_client_index`).

  Returns:
    The selected rows @CLIENTS (the structure of `stacked` without its leading dimension).
  """
  stacked_type = stacked.type_signature.member
  num_rows = tff.structure.flatten(stacked_type)[0].shape[0]

  @tff.tensorflow.computation(tff.TensorType(np.int32))
  def as_key(key):
    return tf.reshape(key, [1])

  @tff.tensorflow.computation(stacked_type, tff.TensorType(np.int32))
  def select_row(stack, key):
    key = checked_key(key)
    return tf.nest.map_structure(lambda t: tf.gather(t, key), stack)

  selected = tff.federated_select(tff.federated_map(as_key, keys),
                                  tff.federated_value(np.int32(num_rows - 1), tff.SERVER),
                                  stacked, select_row)

  @tff.tensorflow.computation(selected.type_signature.member)
  def only_row(rows):
    return rows.get_single_element()

  return tff.federated_map(only_row, selected)
