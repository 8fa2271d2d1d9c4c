"""CADIS's clustered aggregation as an AggregationProcess.

The server side of CADIS (docs/algorithms.md#cadis, server steps 1-7, the factory and the
anonymous mode). `ClusteredAggregator(num_clients, clients_per_round, ...)` is a
`tff.aggregators.WeightedAggregationFactory` whose processes can be passed as
`model_aggregator` to `compose_learning_process` (`tff_algos.cadis.build_cadis`) or, in
anonymous mode, to TFF's own `build_weighted_fed_avg`.

Keyed mode: each client uploads OrderedDict(client_index, delta) with weight n_i (<= 0: left
out); the state is OrderedDict(q [N, N], f [N, N], tau, round_num), dense so `tff.program`
checkpoints it. Uploads fill C = `clients_per_round` rows in arrival order (more is an error;
each client at most once a round) and are sorted by client index, so the result does not
depend on arrival order. The similarity tensor is `similarity_index` (the classifier's bias or
kernel in every zoo model). 'two_hop' needs |C_i| of the round's rows only, so no [N, N]
relation is formed for the weights; `num_clusters`, `cluster_pair_accuracy` and
`clusters_match` need it and are computed only up to `two_hop_metrics_max_clients` (−1 / NaN
above). Measurements: participants, cluster_sizes, aggregation_weights, num_clusters,
seen_clients, tau; with `true_clusters`, q_matrix_mse, cluster_pair_accuracy, clusters_match.

The clustering maths (similarities, Q and F, the rescale, closures, weights, τ schedule, and
`reference_quirks`, what the authors' code does) is `tff_algos.aggregators.clustering`; this
module holds the TFF plumbing: the factory, its two modes, the upload accumulator and the
phases with a TFF factory on the deltas.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.aggregators import accumulate_then_step, clustering, factories
# The factory's argument defaults and the server step's options, read here by its importers too.
from tff_algos.aggregators.clustering import (  # noqa: F401
    DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_GROWTH, DEFAULT_THRESHOLD_MAX,
    DEFAULT_TRANSITIVE_HALF_WIDTH, DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS, ClusteringOptions)

KEYED_FIELDS = ('client_index', 'delta')


# --------------------------------------------------------------------------- #
# The upload accumulator
# --------------------------------------------------------------------------- #


def _zero_delta(delta_specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), delta_specs)


def empty_accumulator(capacity: int, delta_specs) -> collections.OrderedDict:
  """The upload accumulator: `count` uploads so far, and per row the client index (−1 =
  empty), its weight and its delta (`accumulate_then_step.zero_rows`: `capacity` separate rows, each
  empty until written, so the zero accumulator TFF serialises every round holds no delta and
  an upload writes its own row, not a copy of all of them)."""
  return collections.OrderedDict(
      count=tf.constant(0, tf.int32),
      index=tf.fill([capacity], -1),
      weight=tf.zeros([capacity], tf.float32),
      delta=accumulate_then_step.zero_rows(_zero_delta(delta_specs), capacity))


def stacked_deltas(acc, delta_specs):
  """The accumulator's delta rows as [capacity, ...] tensors (unwritten rows zero)."""
  return accumulate_then_step.stack_rows(acc['delta'], _zero_delta(delta_specs))


def append_upload(acc, index, weight, delta, capacity: int) -> collections.OrderedDict:
  """Writes one upload at row `count` (nothing when the accumulator is full); count += 1."""
  pos = tf.convert_to_tensor(acc['count'], tf.int32)

  def put():
    at = tf.reshape(pos, [1, 1])
    return (tf.tensor_scatter_nd_update(acc['index'], at, tf.reshape(index, [1])),
            tf.tensor_scatter_nd_update(acc['weight'], at, tf.reshape(weight, [1])))

  def full():
    return acc['index'], acc['weight']

  new_index, new_weight = tf.cond(pos < capacity, put, full)
  return collections.OrderedDict(count=pos + 1, index=new_index, weight=new_weight,
                                 delta=accumulate_then_step.put_row(acc['delta'], pos, delta))


def merge_accumulators(a, b, capacity: int, delta_specs) -> collections.OrderedDict:
  """`a` with `b`'s rows appended after its own (as far as they fit); counts add."""
  k = tf.range(capacity)
  dest = a['count'] + k
  take = tf.logical_and(k < b['count'], dest < capacity)
  src = tf.boolean_mask(k, take)
  at = tf.expand_dims(tf.boolean_mask(dest, take), 1)

  def insert(x, y):
    return tf.tensor_scatter_nd_update(x, at, tf.gather(y, src))

  merged = tf.nest.map_structure(insert, stacked_deltas(a, delta_specs),
                                 stacked_deltas(b, delta_specs))
  return collections.OrderedDict(
      count=a['count'] + b['count'],
      index=insert(a['index'], b['index']),
      weight=insert(a['weight'], b['weight']),
      delta=[tf.nest.map_structure(lambda t, i=i: accumulate_then_step.open_shape(t[i]), merged)
             for i in range(capacity)])


# --------------------------------------------------------------------------- #
# The aggregation factory and process
# --------------------------------------------------------------------------- #


def _check_int(value, name, low):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f'{name} must be an integer >= {low}, got {value!r}')
  return int(value)


def _check_unit(value, name):
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
      or not 0.0 <= float(value) < 1.0:
    raise ValueError(f'{name} must be a number in [0, 1), got {value!r}')
  return float(value)


def is_keyed_type(value_type: tff.Type) -> bool:
  """Whether `value_type` is OrderedDict(client_index=int32 scalar, delta=...)."""
  if not isinstance(value_type, tff.StructType):
    return False
  names = tff.structure.name_list(value_type)
  if tuple(names) != KEYED_FIELDS:
    return False
  index_type = value_type.client_index
  return (isinstance(index_type, tff.TensorType) and index_type.dtype == np.int32
          and tuple(index_type.shape) == ())


class ClusteredAggregator(tff.aggregators.WeightedAggregationFactory):
  """CADIS's similarity-matrix clustered weighting as a weighted aggregation factory.

  See the module docstring for the rules, the state, the measurements and the two modes.
  """

  def __init__(self,
               num_clients: Optional[int],
               clients_per_round: int,
               *,
               threshold: float = DEFAULT_THRESHOLD,
               threshold_max: float = DEFAULT_THRESHOLD_MAX,
               threshold_growth: float = DEFAULT_THRESHOLD_GROWTH,
               similarity_layer: str = 'bias',
               similarity_index: Optional[int] = None,
               sample_weighted: bool = True,
               closure: str = 'two_hop',
               transitive: bool = False,
               transitive_half_width: float = DEFAULT_TRANSITIVE_HALF_WIDTH,
               true_clusters: Optional[Sequence[int]] = None,
               delta_aggregator: Optional[factories.ModelAggregator] = None,
               two_hop_metrics_max_clients: Optional[int] = DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS,
               reference_quirks: bool = False):
    """Args:
      num_clients: N, the size of the Q and F matrices (client indices lie in [0, N));
        must be None for anonymous mode (uploads without client_index; `create` refuses
        a plain value type when num_clients is given, rather than drop to anonymous mode).
      clients_per_round: C, the most uploads one round may bring (the accumulator's rows).
      threshold: τ_0 in [0, 1) (paper 0.975).
      threshold_max: τ_max in [τ_0, 1) (0.985).
      threshold_growth: the schedule's base (1.0005), >= 1.
      similarity_layer: 'bias' (default) or 'kernel' of the final classifier; selects the
        default `similarity_index` (−1 resp. −2 among the flattened delta tensors).
      similarity_index: explicit position of the similarity tensor among the flattened
        delta tensors (overrides the layer's default position).
      sample_weighted: p_i ∝ (1/|C_i|)(n_i/n) (True, the paper) or 1/|C_i| (reference code).
      closure: 'two_hop' (reference code), 'components', or 'oracle' (|C_i| from
        `true_clusters` over the seen clients instead of from Q: a diagnosis that separates
        the clustering from the weighting; needs `true_clusters`).
      transitive: add transitive estimates for pairs never seen together (§3.6).
      transitive_half_width: the acceptance bound on √((1−a²)(1−b²)) (0.02).
      true_clusters: optional int [N] true cluster per client, for measurements only.
      delta_aggregator: optional TFF aggregation factory (weighted or unweighted) that
        aggregates the deltas with the weights p_i, keyed mode only (module doc, "A TFF
        factory on the deltas"); None: Σ p_i Δ_i on the server's accumulator.
      two_hop_metrics_max_clients: with closure 'two_hop', `num_clusters`,
        `cluster_pair_accuracy` and `clusters_match` need the whole [N, N] relation (4 N^3
        flops); they are computed for N up to this (default 1000; None: any N) and read
        −1 / NaN above it. The weights never depend on it.
      reference_quirks: what the authors' code does, not what the paper says ((a) the pair
        scored with the wrong upload, (b) abs() after the min-max rescale; `clustering`
        module doc). A diagnosis, off by default.
    """
    if num_clients is not None:
      num_clients = _check_int(num_clients, 'num_clients', 1)
    self._num_clients = num_clients
    self._capacity = _check_int(clients_per_round, 'clients_per_round', 1)
    if num_clients is not None and self._capacity > num_clients:
      raise ValueError(f'clients_per_round ({clients_per_round}) must be <= num_clients '
                       f'({num_clients})')
    self._threshold = _check_unit(threshold, 'threshold')
    threshold_max = _check_unit(threshold_max, 'threshold_max')
    if threshold_max < self._threshold:
      raise ValueError(f'threshold_max ({threshold_max}) must be >= threshold '
                       f'({self._threshold})')
    if not np.isfinite(threshold_growth) or threshold_growth < 1.0:
      raise ValueError(f'threshold_growth must be >= 1, got {threshold_growth!r}')
    if similarity_layer not in constants.CADIS_SIMILARITY_LAYERS:
      raise ValueError(
          f'similarity_layer must be one of {constants.CADIS_SIMILARITY_LAYERS}, '
          f'got {similarity_layer!r}')
    if similarity_index is not None and (isinstance(similarity_index, bool) or
                                         not isinstance(similarity_index, (int, np.integer))):
      raise ValueError(f'similarity_index must be None or an int, got {similarity_index!r}')
    if closure not in constants.CADIS_CLOSURES:
      raise ValueError(f'closure must be one of {constants.CADIS_CLOSURES}, got {closure!r}')
    if not np.isfinite(transitive_half_width) or transitive_half_width <= 0:
      raise ValueError(f'transitive_half_width must be > 0, got {transitive_half_width!r}')
    if true_clusters is not None:
      true_clusters = np.asarray(true_clusters)
      if true_clusters.dtype.kind not in 'iu' or true_clusters.ndim != 1:
        raise ValueError('true_clusters must be a 1-D integer array (one cluster id per '
                         f'client), got dtype {true_clusters.dtype} shape {true_clusters.shape}')
      if num_clients is None or true_clusters.shape[0] != num_clients:
        raise ValueError(f'true_clusters has {true_clusters.shape[0]} entries; it needs one '
                         f'per client (num_clients={num_clients})')
      true_clusters = true_clusters.astype(np.int32)
    if closure == 'oracle' and true_clusters is None:
      raise ValueError("closure='oracle' takes |C_i| from the true clusters: pass "
                       'true_clusters (one cluster id per client)')
    self._true_clusters = true_clusters
    factories.check_model_aggregator(delta_aggregator, 'delta_aggregator')
    self._delta_aggregator = delta_aggregator
    self._similarity_layer = similarity_layer
    self._similarity_index = None if similarity_index is None else int(similarity_index)
    if two_hop_metrics_max_clients is not None:
      two_hop_metrics_max_clients = _check_int(two_hop_metrics_max_clients,
                                               'two_hop_metrics_max_clients', 0)
    self._options = dict(closure=closure, sample_weighted=bool(sample_weighted),
                         two_hop_metrics_max_clients=two_hop_metrics_max_clients,
                         transitive=bool(transitive),
                         transitive_half_width=float(transitive_half_width),
                         threshold_max=threshold_max, threshold_growth=float(threshold_growth),
                         reference_quirks=bool(reference_quirks))

  def _resolve_similarity_index(self, delta_specs) -> int:
    flat = tf.nest.flatten(delta_specs)
    if self._similarity_index is not None:
      index = self._similarity_index
      if not -len(flat) <= index < len(flat):
        raise ValueError(f'similarity_index {index} is out of range for a delta of '
                         f'{len(flat)} tensors')
      return index % len(flat)
    if self._similarity_layer == 'bias':
      index, rank = len(flat) - 1, 1
    else:
      index, rank = len(flat) - 2, 2
    if index < 0 or flat[index].shape.rank != rank:
      raise ValueError(
          f'similarity_layer={self._similarity_layer!r} expects the classifier '
          f'{self._similarity_layer} (rank {rank}) at position {index} of the delta tensors '
          f'(their shapes: {[tuple(s.shape) for s in flat]}); pass similarity_index for this '
          'model')
    return index

  def create(self, value_type: tff.Type,
             weight_type: tff.Type) -> tff.templates.AggregationProcess:
    if not (isinstance(weight_type, tff.TensorType) and weight_type.dtype == np.float32
            and tuple(weight_type.shape) == ()):
      raise TypeError(f'the weight must be a float32 scalar, got {weight_type}')
    keyed = is_keyed_type(value_type)
    delta_type = value_type.delta if keyed else value_type
    delta_specs = tff.types.type_to_tf_tensor_specs(delta_type)
    flat_specs = tf.nest.flatten(delta_specs)
    if not flat_specs or any(not s.dtype.is_floating or not s.shape.is_fully_defined()
                             for s in flat_specs):
      raise TypeError('the delta must be a structure of float tensors with static shapes; '
                      f'got {delta_type}')
    if keyed and self._num_clients is None:
      raise ValueError('num_clients is needed for keyed uploads (the Q and F matrices)')
    if not keyed and self._true_clusters is not None:
      raise ValueError('true_clusters needs client identities: the value type has no '
                       f'client_index ({value_type}); see the module doc, "Anonymous mode"')
    if not keyed and self._delta_aggregator is not None:
      raise ValueError(
          f'delta_aggregator={type(self._delta_aggregator).__name__} needs keyed uploads: '
          'each client gets its weight p_i back by its client_index, and the uploads carry '
          f'none ({value_type}); use tff_algos.build_cadis(model_aggregator=...)')
    if not keyed and self._num_clients is not None:
      # Silently clustering each round alone when the caller asked for N clients' Q and F
      # would lose the cumulative similarity CADIS is built on; say so instead.
      raise ValueError(
          f'num_clients={self._num_clients} asks for the Q and F matrices over N clients, but '
          f'the uploads carry no client_index ({value_type}): TFF\'s own client work (e.g. '
          'inside build_weighted_fed_avg) is anonymous. Use tff_algos.build_cadis or '
          'build_model_delta_client_work(keyed=True) for CADIS proper, or pass '
          'num_clients=None for per-round clustering (module doc, "Anonymous mode")')
    options = ClusteringOptions(similarity_index=self._resolve_similarity_index(delta_specs),
                                **self._options)
    if self._delta_aggregator is not None:
      return _build_delta_aggregator_process(
          value_type, weight_type, delta_specs, self._num_clients, self._capacity,
          self._threshold, options, self._true_clusters, self._delta_aggregator)
    return _build_process(value_type, weight_type, delta_specs, keyed, self._num_clients,
                          self._capacity, self._threshold, options, self._true_clusters)


def _initial_state_fn(keyed: bool, n: int, threshold: float):
  def initial_state():
    state = collections.OrderedDict(
        tau=tf.constant(threshold, tf.float32), round_num=tf.constant(0, tf.int32))
    if keyed:
      state = collections.OrderedDict(q=tf.zeros([n, n], tf.float32),
                                      f=tf.zeros([n, n], tf.float32), **state)
    return state
  return initial_state


def _canonical_rows(acc, keyed: bool, n: int, c: int, delta_specs):
  """(client index [C] with −1 for empty rows, weight [C], delta rows) of the accumulator in
  canonical order (keyed: by client index, empty rows last, so arrival order is irrelevant;
  anonymous: arrival order, the index being the row), behind the round's checks."""
  checks = [tf.debugging.assert_less_equal(
      acc['count'], c, message=f'more clients uploaded this round than clients_per_round={c}')]
  received = tf.range(c) < acc['count']
  if keyed:
    index = tf.where(received, acc['index'], -1)
    checks.append(tf.debugging.assert_equal(
        tf.reduce_all(tf.logical_or(tf.logical_not(received),
                                    tf.logical_and(index >= 0, index < n))), True,
        message=f'a client_index is outside [0, num_clients={n})'))
    order = tf.argsort(tf.where(received, index, n), stable=True)
  else:
    order = tf.range(c)
    index = tf.where(received, tf.range(c), -1)
  with tf.control_dependencies(checks):
    index = tf.gather(index, order)
  weight = tf.gather(tf.where(received, acc['weight'], 0.0), order)
  delta = tf.nest.map_structure(lambda t: tf.gather(t, order),
                                stacked_deltas(acc, delta_specs))
  return index, weight, delta


def _build_process(value_type, weight_type, delta_specs, keyed: bool, num_clients,
                   capacity: int, threshold: float, options: ClusteringOptions,
                   true_clusters) -> tff.templates.AggregationProcess:
  c = capacity
  n = num_clients if keyed else c

  def zero_accumulator():
    return empty_accumulator(c, delta_specs)

  def accumulate(acc, value, weight):
    if keyed:
      return append_upload(acc, value['client_index'], weight, value['delta'], c)
    return append_upload(acc, acc['count'], weight, value, c)

  def merge(a, b):
    return merge_accumulators(a, b, c, delta_specs)

  def server_step(state, acc):
    index, weight, delta = _canonical_rows(acc, keyed, n, c, delta_specs)
    if keyed:
      q, f = state['q'], state['f']
    else:
      q = f = tf.zeros([n, n], tf.float32)
    step_state = collections.OrderedDict(q=q, f=f, tau=state['tau'],
                                         round_num=state['round_num'])
    new_state, result, measurements = clustering.clustered_aggregation_step(
        step_state, index, weight, delta, options, true_clusters)
    if not keyed:
      new_state = collections.OrderedDict(tau=new_state['tau'],
                                          round_num=new_state['round_num'])
    return new_state, result, measurements

  return accumulate_then_step.build_server_state_aggregation(
      value_type, weight_type, initial_state=_initial_state_fn(keyed, n, threshold),
      zero_accumulator=zero_accumulator, accumulate=accumulate, server_step=server_step,
      merge=merge)


def _build_delta_aggregator_process(value_type, weight_type, delta_specs, num_clients,
                                    capacity: int, threshold: float,
                                    options: ClusteringOptions, true_clusters,
                                    delta_aggregator) -> tff.templates.AggregationProcess:
  """Keyed mode with a TFF factory on the deltas: two aggregations (module doc)."""
  c, n = capacity, num_clients
  delta_type = value_type.delta
  weighted = isinstance(delta_aggregator, tff.aggregators.WeightedAggregationFactory)
  if weighted:
    inner = delta_aggregator.create(delta_type, tff.TensorType(np.float32))
  else:
    inner = delta_aggregator.create(delta_type)
  similarity_spec = tf.TensorSpec(
      [int(np.prod(tf.nest.flatten(delta_specs)[options.similarity_index].shape))], tf.float32)
  clustering_state_fn = tff.tensorflow.computation(_initial_state_fn(True, n, threshold))
  clustering_state_type = clustering_state_fn.type_signature.result

  @tff.tensorflow.computation(value_type)
  def similarity_upload(value):  # phase 1 uploads the similarity vector, not the delta
    return collections.OrderedDict(
        client_index=value['client_index'],
        similarity=tf.reshape(clustering.similarity_vectors(
            tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), value['delta']),
            options.similarity_index), [-1]))

  upload_type = similarity_upload.type_signature.result

  @tff.tensorflow.computation
  def zero_fn():
    return empty_accumulator(c, similarity_spec)

  acc_type = zero_fn.type_signature.result

  @tff.tensorflow.computation(acc_type, (upload_type, weight_type))
  def accumulate_fn(acc, upload_and_weight):
    upload, weight = upload_and_weight
    return append_upload(acc, upload['client_index'], weight, upload['similarity'], c)

  @tff.tensorflow.computation(acc_type, acc_type)
  def merge_fn(a, b):
    return merge_accumulators(a, b, c, similarity_spec)

  @tff.tensorflow.computation(acc_type)
  def report_fn(acc):
    return acc

  @tff.tensorflow.computation(clustering_state_type, acc_type)
  def clustering_fn(state, acc):
    index, weight, similarity = _canonical_rows(acc, True, n, c, similarity_spec)
    new_state, p, measurements = clustering.clustering_step(
        state, index, weight, similarity, options, true_clusters)
    # What each client needs to find its own weight: the rows' indices and p, and the
    # number of uploads K (an unweighted factory's mean divides by it).
    row_weights = collections.OrderedDict(
        participants=measurements['participants'], weights=p,
        num_uploads=tf.cast(tf.minimum(acc['count'], c), tf.float32))
    return new_state, row_weights, measurements

  @tff.tensorflow.computation(clustering_fn.type_signature.result[1],
                              tff.TensorType(np.int32))
  def client_weight_fn(row_weights, client_index):
    mine = tf.equal(row_weights['participants'], client_index)
    p_i = tf.reduce_sum(tf.where(mine, row_weights['weights'], 0.0))
    # Unweighted factories average uniformly over the K uploads: hand them K·p_i·Δ_i.
    return p_i if weighted else p_i * row_weights['num_uploads']

  @tff.tensorflow.computation(delta_type, tff.TensorType(np.float32))
  def scaled_delta(delta, scale):
    return tf.nest.map_structure(lambda t: t * tf.cast(scale, t.dtype), delta)

  clustering_fields = tff.structure.name_list(clustering_state_type)

  @tff.federated_computation
  def init_fn():
    clustering = tff.federated_eval(clustering_state_fn, tff.SERVER)
    return tff.federated_zip(collections.OrderedDict(
        [(k, getattr(clustering, k)) for k in clustering_fields] +
        [('delta_aggregator', inner.initialize())]))

  state_type = init_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(value_type, tff.CLIENTS),
                             tff.FederatedType(weight_type, tff.CLIENTS))
  def next_fn(state, value, weight):
    # Phase 1: the similarity vectors (keyed by client index) reach the server, which
    # updates Q, F and the clusters and computes every participant's p_i (eq. 1).
    acc = tff.federated_aggregate(
        tff.federated_zip((tff.federated_map(similarity_upload, value), weight)), zero_fn(),
        accumulate_fn, merge_fn, report_fn)
    clustering = tff.federated_zip(collections.OrderedDict(
        [(k, getattr(state, k)) for k in clustering_fields]))
    new_clustering, row_weights, measurements = tff.federated_map(clustering_fn,
                                                                  (clustering, acc))
    # Phase 2: each client picks its p_i out of the broadcast rows; the factory
    # aggregates the deltas with it.
    client_weight = tff.federated_map(
        client_weight_fn, (tff.federated_broadcast(row_weights), value.client_index))
    if weighted:
      inner_output = inner.next(state.delta_aggregator, value.delta, client_weight)
    else:
      inner_output = inner.next(state.delta_aggregator,
                                tff.federated_map(scaled_delta, (value.delta, client_weight)))
    new_state = tff.federated_zip(collections.OrderedDict(
        [(k, getattr(new_clustering, k)) for k in clustering_fields] +
        [('delta_aggregator', inner_output.state)]))
    measurement_fields = tff.structure.name_list(measurements.type_signature.member)
    all_measurements = tff.federated_zip(collections.OrderedDict(
        [(k, getattr(measurements, k)) for k in measurement_fields] +
        [('delta_aggregator', inner_output.measurements)]))
    return tff.templates.MeasuredProcessOutput(new_state, inner_output.result,
                                               all_measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)
