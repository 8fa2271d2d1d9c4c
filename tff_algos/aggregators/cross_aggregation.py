"""FedCross's cross-aggregation stage as an AggregationProcess.

Collaborator choice and cross-aggregation over K middleware models
(docs/algorithms.md#fedcross, steps 3-4, acceleration and the decisions the paper leaves
open). The state holds the models as dense `[K, ...]` tensors per weight tensor and a round
counter, so `tff.program` checkpoints them. `next(state, value@CLIENTS, weight@CLIENTS)`
takes `client_work.model_upload`'s OrderedDict(client_index, slot, model, last_epoch_loss)
(weight <= 0: a client that did not report, whose slot keeps its model), gathers the uploads
keyed by slot into K rows (`accumulate_then_step.put_row`, O(K·D) memory whatever the number
of clients) and returns the mean of the new models. Measurements: `similarity` [K, K],
`collaborators` [K] (-1 = none), `alpha`, `propellers_used`, `eligible` [K] (the slots that
reported).
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.aggregators import accumulate_then_step
from tff_algos.client_work import model_upload



# --------------------------------------------------------------------------- #
# Pure TF functions (each usable and tested on its own)
# --------------------------------------------------------------------------- #


def flatten_models(stacked_models) -> tf.Tensor:
  """[K, D] float32 from a structure of [K, ...] tensors (structure order: trainable, then
  non-trainable for a ModelWeights)."""
  flat = [tf.reshape(tf.cast(t, tf.float32), [tf.shape(t)[0], -1])
          for t in tf.nest.flatten(stacked_models)]
  return tf.concat(flat, axis=1)


def cosine_similarity_matrix(flat_models) -> tf.Tensor:
  """[K, K] cosine similarity of the rows of `flat_models` [K, D] (0 for a zero row)."""
  flat = tf.convert_to_tensor(flat_models, tf.float32)
  norms = tf.norm(flat, axis=1)
  dots = tf.matmul(flat, flat, transpose_b=True)
  return tf.math.divide_no_nan(dots, norms[:, None] * norms[None, :])


def layerwise_similarity_matrix(stacked_models) -> tf.Tensor:
  """[K, K] similarity as the FedCross authors' code computes it (PFLlib, servercross.py).

  The model's tensors, in structure order (trainable, then non-trainable), are taken two at
  a time (a layer's kernel and bias); each pair's concatenation gives one cosine, and the
  cosines are summed, the last pair counted twice as that code does. With an odd number of
  tensors the last one stands alone and counts once. Pairs are layers for models whose
  layers all have a kernel and a bias and no non-trainable variables; otherwise (BatchNorm,
  bias-free or LSTM layers) the pairing follows our tensor order, not PyTorch's. A zero pair
  has cosine 0. Each pair's Gram matrix is summed from its tensors' (no concatenation).
  """
  flat = [tf.reshape(tf.cast(t, tf.float32), [tf.shape(t)[0], -1])
          for t in tf.nest.flatten(stacked_models)]
  if not flat:
    raise ValueError('the models have no tensors')
  cosines = []
  for i in range(0, len(flat), 2):
    pair = flat[i:i + 2]
    dots = tf.add_n([tf.matmul(t, t, transpose_b=True) for t in pair])
    norms = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t), axis=1) for t in pair]))
    cosines.append(tf.math.divide_no_nan(dots, norms[:, None] * norms[None, :]))
  if len(flat) % 2 == 0:
    cosines.append(cosines[-1])
  return tf.add_n(cosines)


def similarity_matrix(stacked_models, similarity: str = 'model') -> tf.Tensor:
  """[K, K] similarity of the models [K, ...] by `similarity`, one of
  `constants.FEDCROSS_SIMILARITIES`."""
  if similarity == 'model':
    return cosine_similarity_matrix(flatten_models(stacked_models))
  if similarity == 'layerwise':
    return layerwise_similarity_matrix(stacked_models)
  raise ValueError(f'similarity must be one of {constants.FEDCROSS_SIMILARITIES}, '
                   f'got {similarity!r}')


def in_order_collaborators(num_models: int, round_num) -> tf.Tensor:
  """c(k) = (k + (t mod (K-1)) + 1) mod K, int32 [K]; [-1] when K = 1."""
  k = int(num_models)
  if k == 1:
    return tf.constant([-1], tf.int32)
  t = tf.cast(round_num, tf.int32)
  idx = tf.range(k, dtype=tf.int32)
  return (idx + tf.math.floormod(t, k - 1) + 1) % k


def select_collaborators(sim, rule: str, round_num, eligible=None) -> tf.Tensor:
  """CoModelSel: int32 [K] collaborator index per model (-1 = none: K = 1, or below).

  Args:
    sim: [K, K] similarity matrix (static K).
    rule: 'in_order', 'highest_similarity' (argmax over j != k) or 'lowest_similarity'
      (argmin over j != k). Ties go to the lowest index.
    round_num: the round t (used by 'in_order').
    eligible: optional bool [K], the models uploaded this round (docs/methods.md, "When
      clients do not report"): only they get a collaborator and only they are one; a model
      with no eligible candidate (its in-order partner not eligible) gets -1.
  """
  if rule not in constants.FEDCROSS_SELECTIONS:
    raise ValueError(f'selection must be one of {constants.FEDCROSS_SELECTIONS}, got {rule!r}')
  sim = tf.convert_to_tensor(sim, tf.float32)
  k = sim.shape[0]
  if k is None:
    raise ValueError('the number of models must be static')
  if rule == 'in_order' or k == 1:
    return only_eligible(in_order_collaborators(k, round_num), eligible)
  candidates = tf.logical_not(tf.eye(k, dtype=tf.bool))
  if eligible is not None:
    eligible = tf.convert_to_tensor(eligible, tf.bool)
    candidates = tf.logical_and(candidates,
                                tf.logical_and(eligible[:, None], eligible[None, :]))
  if rule == 'highest_similarity':
    masked = tf.where(candidates, sim, tf.fill([k, k], -np.inf))
    best = tf.reduce_max(masked, axis=1, keepdims=True)
  else:
    masked = tf.where(candidates, sim, tf.fill([k, k], np.inf))
    best = tf.reduce_min(masked, axis=1, keepdims=True)
  hits = tf.logical_and(candidates, tf.equal(masked, best))
  columns = tf.broadcast_to(tf.range(k, dtype=tf.int32)[None, :], [k, k])
  chosen = tf.reduce_min(tf.where(hits, columns, k), axis=1)
  return tf.where(chosen < k, chosen, -1)


def only_eligible(partners, eligible):
  """`partners` (int32 [K] or [K, P], -1 = none) with -1 wherever model k or its partner is
  not `eligible` (bool [K]; None: all are)."""
  if eligible is None:
    return partners
  eligible = tf.convert_to_tensor(eligible, tf.bool)
  ok = tf.gather(eligible, tf.maximum(partners, 0))
  own = tf.reshape(eligible, [-1] + [1] * (partners.shape.rank - 1))
  return tf.where(tf.logical_and(ok, own), partners, -1)


def cross_aggregate(models, collaborators, alpha):
  """CrossAggr: w^k = alpha * v^k + (1 - alpha) * v^{c(k)} for each [K, ...] tensor.

  `models` is a structure of [K, ...] tensors; `collaborators` int32 [K]; an index < 0
  means "no collaborator" and keeps v^k unchanged.
  """
  collaborators = tf.convert_to_tensor(collaborators, tf.int32)
  has = collaborators >= 0
  safe = tf.maximum(collaborators, 0)

  def fuse(v):
    v = tf.convert_to_tensor(v)
    a = tf.cast(alpha, v.dtype)
    mixed = a * v + (1 - a) * tf.gather(v, safe)
    mask = tf.reshape(has, [-1] + [1] * (v.shape.rank - 1))
    # Every model has a collaborator when K > 1: skip that K·D pass then.
    return tf.cond(tf.reduce_all(has), lambda: mixed, lambda: tf.where(mask, mixed, v))

  return tf.nest.map_structure(fuse, models)


def in_order_propellers(num_models: int, num_propellers: int, round_num) -> tf.Tensor:
  """int32 [K, P]: propeller i of model k = (k + ((t + i) mod (K-1)) + 1) mod K."""
  k, p = int(num_models), int(num_propellers)
  if k == 1:
    return tf.fill([1, p], -1)
  if not 1 <= p <= k - 1:
    raise ValueError(f'num_propellers must be in [1, K-1={k - 1}], got {p}')
  t = tf.cast(round_num, tf.int32)
  offsets = tf.math.floormod(t + tf.range(p, dtype=tf.int32), k - 1) + 1
  return (tf.range(k, dtype=tf.int32)[:, None] + offsets[None, :]) % k


def propeller_aggregate(models, propellers, alpha):
  """w^k = alpha * v^k + (1 - alpha) * mean_i v^{p_i(k)}; `propellers` int32 [K, P], the
  mean over those >= 0 (-1 = none); a model without any keeps v^k."""
  propellers = tf.convert_to_tensor(propellers, tf.int32)
  present = tf.cast(propellers >= 0, tf.float32)                     # [K, P]
  has = tf.reduce_any(propellers >= 0, axis=1)
  share = tf.math.divide_no_nan(present, tf.reduce_sum(present, axis=1, keepdims=True))
  safe = tf.maximum(propellers, 0)

  def fuse(v):
    v = tf.convert_to_tensor(v)
    a = tf.cast(alpha, v.dtype)
    w = tf.reshape(tf.cast(share, v.dtype), share.shape.as_list() + [1] * (v.shape.rank - 1))
    mean = tf.reduce_sum(tf.gather(v, safe) * w, axis=1)  # [K, P, ...] -> [K, ...]
    mask = tf.reshape(has, [-1] + [1] * (v.shape.rank - 1))
    return tf.where(mask, a * v + (1 - a) * mean, v)

  return tf.nest.map_structure(fuse, models)


def alpha_for_round(alpha: float, round_num, accel_rounds: int = 0,
                    alpha_schedule: bool = False) -> tf.Tensor:
  """Dynamic alpha: 0.5 + (alpha - 0.5) * min(t, R) / R over R = accel_rounds; else alpha."""
  if not alpha_schedule or accel_rounds <= 0:
    return tf.constant(alpha, tf.float32)
  t = tf.cast(round_num, tf.float32)
  frac = tf.minimum(t, float(accel_rounds)) / float(accel_rounds)
  return tf.constant(0.5, tf.float32) + (alpha - 0.5) * frac


def stack_model(weights, num_models: int):
  """A structure of [K, ...] tensors holding K copies of `weights`."""
  return tf.nest.map_structure(
      lambda t: tf.tile(tf.expand_dims(tf.convert_to_tensor(t), 0),
                        [num_models] + [1] * len(t.shape)), weights)


def mean_model(stacked):
  return tf.nest.map_structure(lambda t: tf.reduce_mean(t, axis=0), stacked)


def validate_options(num_models: int, alpha: float, selection: str, num_propellers: int,
                     accel_rounds: int, similarity: str = 'model') -> None:
  if isinstance(num_models, bool) or not isinstance(num_models, (int, np.integer)) \
      or num_models < 1:
    raise ValueError(f'num_models must be an integer >= 1, got {num_models!r}')
  if not constants.fedcross_alpha_is_valid(alpha):
    raise ValueError(f'alpha must be in {constants.FEDCROSS_ALPHA_INTERVAL}, got {alpha}')
  if selection not in constants.FEDCROSS_SELECTIONS:
    raise ValueError(f'selection must be one of {constants.FEDCROSS_SELECTIONS}, got {selection!r}')
  if similarity not in constants.FEDCROSS_SIMILARITIES:
    raise ValueError(f'similarity must be one of {constants.FEDCROSS_SIMILARITIES}, '
                     f'got {similarity!r}')
  if similarity != 'model' and selection == 'in_order':
    raise ValueError(f'similarity={similarity!r} is read only by the similarity rules, not by '
                     "selection='in_order'; drop it (similarity='model') or choose "
                     "'lowest_similarity' or 'highest_similarity'")
  if num_propellers < 1 or (num_models > 1 and num_propellers > num_models - 1):
    raise ValueError(
        f'num_propellers must be in [1, max(1, K-1)={max(1, num_models - 1)}], '
        f'got {num_propellers}')
  if accel_rounds < 0:
    raise ValueError(f'accel_rounds must be >= 0, got {accel_rounds}')


def cross_aggregation_step(uploaded, round_num, *, num_models: int, alpha: float,
                           selection: str, alpha_schedule: bool, num_propellers: int,
                           accel_rounds: int, eligible=None, similarity: str = 'model'):
  """One server step from uploaded models [K, ...]: (new models, measurements dict)."""
  k = int(num_models)
  sim = similarity_matrix(uploaded, similarity)
  a = alpha_for_round(alpha, round_num, accel_rounds, alpha_schedule)
  collaborators = select_collaborators(sim, selection, round_num, eligible)
  crossed = cross_aggregate(uploaded, collaborators, a)
  propellers_used = tf.constant(0.0)
  if k > 1 and num_propellers > 1 and accel_rounds > 0:
    in_accel = tf.cast(round_num, tf.int32) < accel_rounds
    props = only_eligible(in_order_propellers(k, num_propellers, round_num), eligible)
    propelled = propeller_aggregate(uploaded, props, a)
    crossed = tf.nest.map_structure(lambda p, c: tf.where(in_accel, p, c), propelled, crossed)
    first = tf.gather(props, tf.argmax(tf.cast(props >= 0, tf.int32), axis=1,
                                       output_type=tf.int32), batch_dims=1)
    collaborators = tf.where(in_accel, first, collaborators)
    propellers_used = tf.cast(in_accel, tf.float32)
  measurements = collections.OrderedDict(
      similarity=sim,
      collaborators=collaborators,
      alpha=a,
      propellers_used=propellers_used)
  return crossed, measurements


# --------------------------------------------------------------------------- #
# The AggregationProcess
# --------------------------------------------------------------------------- #


def build_cross_aggregation_process(
    weights_type: tff.Type,
    num_models: int,
    *,
    alpha: float = 0.99,
    selection: str = 'lowest_similarity',
    alpha_schedule: bool = False,
    num_propellers: int = 1,
    accel_rounds: int = 0,
    initial_weights_fn: Optional[tff.Computation] = None,
    similarity: str = 'model',
) -> tff.templates.AggregationProcess:
  """FedCross's cross-aggregation as a stateful weighted `tff.templates.AggregationProcess`.

  Args:
    weights_type: the `tff.learning.models.ModelWeights` type of one model.
    num_models: K, the number of middleware models (= clients per round).
    alpha: the CrossAggr weight of a model's own upload (paper default 0.99).
    selection: collaborator rule, one of `constants.FEDCROSS_SELECTIONS`.
    alpha_schedule: dynamic alpha over the first `accel_rounds` rounds.
    num_propellers: propellers per model during the first `accel_rounds` rounds (> 1 on).
    accel_rounds: length of the acceleration phase.
    initial_weights_fn: no-arg TF computation returning the initial `ModelWeights`; the K
      middleware models start as copies of it (default: zeros).
    similarity: 'model' (whole-model cosine) or 'layerwise' (the authors' code's sum of
      per-layer cosines); read by the similarity rules, reported under every rule;
      'layerwise' with 'in_order', which reads no similarity, is refused (ValueError).

  Returns:
    An AggregationProcess: state = OrderedDict(models=ModelWeights of [K, ...] tensors,
    round_num=int32); next(state, upload@CLIENTS, float32@CLIENTS) ->
    result = mean of the new middleware models @SERVER, measurements (see module doc).
  """
  k = int(num_models) if isinstance(num_models, (int, np.integer)) else num_models
  validate_options(k, alpha, selection, num_propellers, accel_rounds, similarity)
  value_type = model_upload.model_upload_type(weights_type)
  weight_type = tff.TensorType(np.float32)
  options = dict(num_models=k, alpha=alpha, selection=selection,
                 alpha_schedule=alpha_schedule, num_propellers=num_propellers,
                 accel_rounds=accel_rounds, similarity=similarity)

  def initial_state():
    if initial_weights_fn is None:
      w = accumulate_then_step.zero_model_weights(weights_type)
    else:
      w = initial_weights_fn()
    return collections.OrderedDict(
        models=stack_model(w, k), round_num=tf.constant(0, tf.int32))

  def zero_accumulator():
    return collections.OrderedDict(
        models=accumulate_then_step.zero_rows(
            accumulate_then_step.zero_model_weights(weights_type), k),
        received=tf.zeros([k], tf.float32),
        weight=tf.zeros([k], tf.float32))

  def accumulate(acc, value, weight):
    slot = accumulate_then_step.checked_slot(value['slot'], k, 'num_models')
    return collections.OrderedDict(
        models=accumulate_then_step.put_row(acc['models'], slot, value['model']),
        received=accumulate_then_step.count_slot(acc['received'], slot),
        weight=accumulate_then_step.scatter_row(acc['weight'], slot, weight))

  def server_step(state, acc):
    acc = accumulate_then_step.assert_distinct_slots(acc, k)
    # A slot whose client did not report (weight 0) or that no client had keeps its
    # pre-round model: it is nobody's collaborator and has none (`select_collaborators`).
    eligible = tf.logical_and(acc['received'] > 0.0, acc['weight'] > 0.0)

    def keep_missing(new, old):
      mask = tf.reshape(eligible, [-1] + [1] * (new.shape.rank - 1))
      return tf.where(mask, new, old)

    stacked = accumulate_then_step.stack_rows(acc['models'],
                                              accumulate_then_step.zero_model_weights(weights_type))
    # Every slot reports in a full round: skip the K·D pass that keeps the others.
    uploaded = tf.cond(
        tf.reduce_all(eligible), lambda: stacked,
        lambda: tf.nest.map_structure(keep_missing, stacked, state['models']))
    new_models, measurements = cross_aggregation_step(
        uploaded, state['round_num'], eligible=eligible, **options)
    measurements['eligible'] = tf.cast(eligible, tf.float32)
    new_state = collections.OrderedDict(models=new_models,
                                        round_num=state['round_num'] + 1)
    return new_state, mean_model(new_models), measurements

  return accumulate_then_step.build_server_state_aggregation(
      value_type, weight_type, initial_state=initial_state,
      zero_accumulator=zero_accumulator, accumulate=accumulate, server_step=server_step)

