"""SCAFFOLD's server side: every client's control variate, keyed by client index, and the
mean model delta (Karimireddy et al. 2020, Algorithm 1, lines 13-17;
docs/algorithms.md#scaffold, step 3).

State, dense so `tff.program` checkpoints it: `server_control` c (shaped like the trainable
weights), `client_controls` c_i ([N, ...] each) and `client_updates` (int32 [N]); 4·N·D bytes
of c_i plus 4·D + 4·N (`state_size_bytes`), refused above `max_control_gib`. The scatter into
the participants' rows may hold the old and new [N, ...] tensors at once: budget up to twice
the control variates. Uploads are `client_work.corrected_training`'s; the result is the mean
model delta in TFF's `initial - final` convention. Measurements: uploads,
controlled_clients, server_control_norm, control_delta_norm.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.aggregators import accumulate_then_step
from tff_algos.client_work import corrected_training


def state_size_bytes(num_clients: int, num_params: int) -> int:
  """Bytes of the whole state: 4·N·D client control variates, 4·D for c, 4·N counts."""
  n, d = int(num_clients), int(num_params)
  return 4 * n * d + 4 * d + 4 * n


def _norm(tensors):
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t)) for t in tensors]))


def control_round(state, acc, num_clients: int):
  """One server step on the state and the round's accumulator (pure TF; module doc).

  `acc` = OrderedDict(model_delta_sum, weight_sum, control_deltas [P, ...], client_index
  int32 [P], valid float32 [P]); returns (new state, mean model delta, measurements).
  """
  n = num_clients
  valid = acc['valid'] > 0.0
  writers = accumulate_then_step.checked_distinct_clients(
      tf.boolean_mask(acc['client_index'], valid))
  rows = tf.expand_dims(writers, 1)
  deltas = [tf.boolean_mask(d, valid) for d in acc['control_deltas']]
  client_controls = [tf.tensor_scatter_nd_add(c, rows, d)
                     for c, d in zip(state['client_controls'], deltas)]
  server_control = [c + tf.reduce_sum(d, axis=0) / float(n)
                    for c, d in zip(state['server_control'], deltas)]
  client_updates = tf.tensor_scatter_nd_add(state['client_updates'], rows,
                                            tf.ones_like(writers))
  mean_delta = tf.nest.map_structure(lambda t: tf.math.divide_no_nan(t, acc['weight_sum']),
                                     acc['model_delta_sum'])
  uploads = tf.reduce_sum(acc['valid'])
  p = tf.shape(acc['valid'])[0]
  delta_norms = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.reshape(d, [p, -1])), axis=1)
                                  for d in acc['control_deltas']]))
  new_state = collections.OrderedDict(server_control=server_control,
                                      client_controls=client_controls,
                                      client_updates=client_updates)
  measurements = collections.OrderedDict(
      uploads=uploads,
      controlled_clients=tf.reduce_sum(tf.cast(client_updates > 0, tf.float32)),
      server_control_norm=_norm(server_control),
      control_delta_norm=tf.math.divide_no_nan(tf.reduce_sum(delta_norms * acc['valid']),
                                               uploads))
  return new_state, mean_delta, measurements


def build_control_variate_aggregation(
    weights_type: tff.Type,
    num_clients: int,
    clients_per_round: int,
    *,
    max_control_gib: Optional[float] = 4.0,
) -> tff.templates.AggregationProcess:
  """SCAFFOLD's control variates and model-delta mean as a weighted AggregationProcess.

  Args:
    weights_type: the `tff.learning.models.ModelWeights` type of the model.
    num_clients: N (client indices are in [0, N)).
    clients_per_round: P, the most uploads of one round (slots are in [0, P)).
    max_control_gib: refuse a state (`state_size_bytes`) above this many GiB (None: no
      limit).

  Returns:
    An AggregationProcess: state as in the module doc; next(state, upload@CLIENTS,
    float32@CLIENTS) -> result = the mean `model_delta.update_type(weights_type)` @SERVER.
  """
  for name, value in (('num_clients', num_clients), ('clients_per_round', clients_per_round)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
  if clients_per_round > num_clients:
    raise ValueError(f'clients_per_round ({clients_per_round}) must be <= num_clients '
                     f'({num_clients})')
  n, p = int(num_clients), int(clients_per_round)
  d = accumulate_then_step.num_weights(weights_type.trainable)
  accumulate_then_step.check_state_size(
      'the SCAFFOLD control-variate state', state_size_bytes(n, d), max_control_gib,
      f'4·N·D bytes: N={n} clients, D={d} trainable weights',
      'lower the number of clients, or raise max_control_gib (--scaffold_max_control_gib)')
  trainable = list(weights_type.trainable)

  def zeros(leading=(), types=trainable):
    return [tf.zeros([*leading, *t.shape], t.dtype) for t in types]

  def zero_update():  # model_delta.update_type(weights_type)
    if not weights_type.non_trainable:
      return zeros()
    return collections.OrderedDict(trainable=zeros(),
                                   non_trainable=zeros(types=list(weights_type.non_trainable)))

  def initial_state():
    return collections.OrderedDict(server_control=zeros(), client_controls=zeros([n]),
                                   client_updates=tf.zeros([n], tf.int32))

  def zero_accumulator():
    return collections.OrderedDict(
        model_delta_sum=zero_update(),
        weight_sum=tf.constant(0.0),
        control_deltas=accumulate_then_step.zero_rows(zeros(), p),
        client_index=tf.zeros([p], tf.int32),
        valid=tf.zeros([p], tf.float32),
        received=tf.zeros([p], tf.float32))

  def accumulate(acc, value, weight):
    slot = accumulate_then_step.checked_slot(value['slot'], p)
    ok = tf.cast(weight > 0.0, tf.float32)
    kept = weight * ok
    return collections.OrderedDict(
        model_delta_sum=tf.nest.map_structure(lambda s, v: s + kept * v,
                                              acc['model_delta_sum'], value['model_delta']),
        weight_sum=acc['weight_sum'] + kept,
        control_deltas=accumulate_then_step.put_row(acc['control_deltas'], slot,
                                                    [v * ok for v in value['control_delta']]),
        client_index=accumulate_then_step.scatter_row(acc['client_index'], slot,
                                                      value['client_index']),
        valid=accumulate_then_step.scatter_row(acc['valid'], slot, ok),
        received=accumulate_then_step.count_slot(acc['received'], slot))

  def server_step(state, acc):
    acc = accumulate_then_step.assert_distinct_slots(acc, p)
    acc = accumulate_then_step.assert_client_indices(
        acc, acc['client_index'], acc['valid'] > 0.0, n)
    acc['control_deltas'] = accumulate_then_step.stack_rows(acc['control_deltas'], zeros())
    return control_round(state, acc, n)

  return accumulate_then_step.build_server_state_aggregation(
      corrected_training.upload_type(weights_type), tff.TensorType(np.float32),
      initial_state=initial_state, zero_accumulator=zero_accumulator, accumulate=accumulate,
      server_step=server_step)
