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

The authors' code (`reference_quirks=True`; a diagnosis option, never the default). What the
public code of the paper (AIoT-Lab-BKAI/ORO-CCGRID2023-CADIS, `algorithm/cadis.py`, the module
its run scripts select with `--algorithm cadis`) does and the paper does not; with the option
both replace the rules above:

  (a) step 3 scores a pair with the wrong model. `Server.update_Q_matrix` walks the round's
      participants in their list order with two loops, the inner one pairing the positions
      j = i+1, ..., K−1 with the uploads taken again from the start of the list, so pair
      (i, j) gets the cosine of upload i with upload j−i−1 instead of upload j. j−i−1 runs
      over 0..K−i−2, so it never wraps or goes negative; where it equals i (j = 2i+1) the
      pair gets upload i's cosine with itself, 1. Here the positions are those of the valid
      rows (the clients that trained; the reference's list drops the others) in canonical
      order, i.e. by client index, where the reference takes the order of its sampled list (a
      Python set's iteration order: ascending for small client ids, not in general).
  (b) step 5 takes the absolute value after the min-max rescale. `Server.get_impact_factor`
      rescales Q* with lo, hi taken over its positive entries as above, but applies the
      rescale to every entry with F > 0 and then takes abs(): an entry below lo becomes
      |Q* − lo| / (hi − lo), an edge once Q* < lo − τ·(hi − lo) (hi is 1, the diagonal, so
      at least every average cosine below −τ), and strongly dissimilar clients are
      clustered together. With hi = lo, positive entries still rescale to 1 and the others
      are edges (the reference divides by zero there: +inf for the latter, NaN, i.e. no
      edge, for the former, which would leave a client outside its own cluster).

  The rest is as above: the closure is the one chosen (the reference's is 'two_hop'), and
  the weights follow `sample_weighted` (the reference's are 1/|C_i|, i.e. False). The
  reference's cosine of a zero vector is NaN, after which that pair's Q* reads 0 for good;
  here the cosine is 0. Its multi-process variant (`algorithm/mp_cadis.py`) has (b), not (a).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.aggregators import accumulate_then_step as server_state
from tff_algos.aggregators import cross_aggregation, factories

CLOSURES = ('two_hop', 'components', 'oracle')
SIMILARITY_LAYERS = ('bias', 'kernel')
DEFAULT_THRESHOLD = 0.975
DEFAULT_THRESHOLD_MAX = 0.985
DEFAULT_THRESHOLD_GROWTH = 1.0005
DEFAULT_TRANSITIVE_HALF_WIDTH = 0.02
# Above this N, 'two_hop' skips the metrics that need its whole [N, N] relation (module doc).
DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS = 1000
KEYED_FIELDS = ('client_index', 'delta')


# --------------------------------------------------------------------------- #
# Pure TF functions (each usable and tested on its own)
# --------------------------------------------------------------------------- #


def similarity_vectors(deltas, similarity_index: int) -> tf.Tensor:
  """[C, b] float32: the flattened delta tensor at `similarity_index` of [C, ...] deltas."""
  t = tf.nest.flatten(deltas)[similarity_index]
  t = tf.cast(tf.convert_to_tensor(t), tf.float32)
  return tf.reshape(t, [tf.shape(t)[0], -1])


def update_similarity(q, f, client_index, similarity, valid):
  """Step 3: (Q, F) after adding one round's pairwise similarities.

  Args:
    q, f: float32 [N, N].
    client_index: int32 [C] client index of each row (ignored where not `valid`).
    similarity: float32 [C, C] s_ij between rows; only its upper triangle is read (s_ji :=
      s_ij), so Q stays exactly symmetric, which `component_labels` relies on. The cosine
      matrix of `cross_aggregation.cosine_similarity_matrix` was symmetric bit for bit in
      every case tried, so this changes nothing there; it makes the invariant certain.
    valid: bool [C], the rows that take part (distinct client indices).
  """
  q = tf.convert_to_tensor(q, tf.float32)
  f = tf.convert_to_tensor(f, tf.float32)
  valid = tf.convert_to_tensor(valid, tf.bool)
  idx = tf.where(valid, tf.convert_to_tensor(client_index, tf.int32), 0)
  c = tf.shape(idx)[0]
  pair = tf.logical_and(valid[:, None], valid[None, :])
  eye = tf.eye(c, dtype=tf.bool)
  similarity = tf.convert_to_tensor(similarity, tf.float32)
  upper = tf.range(c)[:, None] <= tf.range(c)[None, :]
  similarity = tf.where(upper, similarity, tf.transpose(similarity))
  add_q = tf.where(pair, tf.where(eye, tf.ones_like(similarity), similarity),
                   tf.zeros_like(similarity))
  add_f = tf.cast(pair, tf.float32)
  rows, cols = tf.meshgrid(idx, idx, indexing='ij')
  grid = tf.stack([rows, cols], axis=-1)
  return tf.tensor_scatter_nd_add(q, grid, add_q), tf.tensor_scatter_nd_add(f, grid, add_f)


def average_similarity(q, f) -> tf.Tensor:
  """Q* = Q / F, 0 where F = 0."""
  return tf.math.divide_no_nan(tf.convert_to_tensor(q, tf.float32),
                               tf.convert_to_tensor(f, tf.float32))


def rescale_similarity(q_avg, f, reference_quirks: bool = False) -> tf.Tensor:
  """Step 5: min-max rescale of Q* over its strictly positive entries with F > 0; other
  entries 0; equal entries rescale to 1. `reference_quirks`: the authors' code, (b) of the
  module doc (|Q* − lo| / span on every entry with F > 0)."""
  q_avg = tf.convert_to_tensor(q_avg, tf.float32)
  if reference_quirks:
    return _reference_rescale(q_avg, tf.convert_to_tensor(f, tf.float32) > 0.0)
  positive = tf.logical_and(tf.convert_to_tensor(f, tf.float32) > 0.0, q_avg > 0.0)
  # Scalars broadcast and a tf.cond on the scalar span, rather than [N, N] fills and
  # selects: the same values with fewer 400 MB temporaries at N = 10,000.
  lo = tf.reduce_min(tf.where(positive, q_avg, np.float32(np.inf)))
  hi = tf.reduce_max(tf.where(positive, q_avg, np.float32(-np.inf)))
  span = hi - lo
  scaled = tf.cond(span > 0.0, lambda: (q_avg - lo) / span, lambda: tf.ones_like(q_avg))
  return tf.where(positive, scaled, np.float32(0.0))


def _reference_rescale(q_avg, together) -> tf.Tensor:
  """(b) of the module doc: |Q* − lo| / (hi − lo) where F > 0, lo and hi over Q* > 0;
  with hi = lo, 1 on the positive entries and +inf on the other entries with F > 0."""
  positive = q_avg > 0.0
  lo = tf.reduce_min(tf.where(positive, q_avg, np.float32(np.inf)))
  hi = tf.reduce_max(tf.where(positive, q_avg, np.float32(-np.inf)))
  span = hi - lo
  scaled = tf.cond(span > 0.0, lambda: tf.abs(q_avg - lo) / span,
                   lambda: tf.where(positive, np.float32(1.0), np.float32(np.inf)))
  return tf.where(together, scaled, np.float32(0.0))


def reference_pair_similarity(similarity, valid) -> tf.Tensor:
  """[C, C] the authors' code's pair scores, (a) of the module doc: for valid rows r < s at
  positions a < b among the valid rows, entry [r, s] is the cosine of row r with the valid
  row at position b − a − 1 (not row s). Only the upper triangle over valid rows is
  meaningful (all `update_similarity` reads)."""
  sim = cross_aggregation.cosine_similarity_matrix(similarity)
  valid = tf.convert_to_tensor(valid, tf.bool)
  c = tf.shape(valid)[0]
  position = tf.cumsum(tf.cast(valid, tf.int32)) - 1
  valid_rows = tf.argsort(tf.cast(tf.logical_not(valid), tf.int32), stable=True)
  partner = tf.clip_by_value(position[None, :] - position[:, None] - 1, 0, c - 1)
  return tf.gather(sim, tf.gather(valid_rows, partner), batch_dims=1)


def transitive_update(q, f, tau, half_width: float = DEFAULT_TRANSITIVE_HALF_WIDTH):
  """Step 4: (Q, F) with transitive estimates for pairs never seen together (module doc)."""
  q = tf.convert_to_tensor(q, tf.float32)
  f = tf.convert_to_tensor(f, tf.float32)
  tau = tf.cast(tau, tf.float32)
  q_avg = average_similarity(q, f)
  seen_pair = f > 0.0
  n = tf.shape(q)[0]
  ids = tf.range(n)
  never = tf.logical_and(tf.equal(f, 0.0), tf.not_equal(ids[:, None], ids[None, :]))

  def body(k, total, count):
    a = q_avg[:, k]
    b = q_avg[k, :]
    linked = tf.logical_and((seen_pair[:, k] & tf.not_equal(ids, k))[:, None],
                            (seen_pair[k, :] & tf.not_equal(ids, k))[None, :])
    mean = a[:, None] * b[None, :]
    width = tf.sqrt(tf.maximum(1.0 - tf.square(a), 0.0)[:, None] *
                    tf.maximum(1.0 - tf.square(b), 0.0)[None, :])
    accept = linked & never & (width < half_width) & (mean > tau)
    return (k + 1, total + tf.where(accept, mean, tf.zeros_like(mean)),
            count + tf.cast(accept, tf.float32))

  zeros = tf.zeros_like(q)
  _, total, count = tf.while_loop(lambda k, *_: k < n, body, (tf.constant(0), zeros, zeros))
  estimated = count > 0.0
  q = q + tf.where(estimated, tf.math.divide_no_nan(total, count), zeros)
  f = f + tf.cast(estimated, tf.float32)
  return q, f


def seen_clients(f) -> tf.Tensor:
  """bool [N]: clients seen at least once (F_ii > 0)."""
  return tf.linalg.diag_part(tf.convert_to_tensor(f, tf.float32)) > 0.0


def adjacency(q_matrix, f, tau) -> tf.Tensor:
  """bool [N, N]: A = (Q-matrix > τ) among seen clients."""
  seen = seen_clients(f)
  a = tf.convert_to_tensor(q_matrix, tf.float32) > tf.cast(tau, tf.float32)
  return a & seen[:, None] & seen[None, :]


def threshold_adjacency(q_avg, f, tau) -> tf.Tensor:
  """bool [N, N]: `adjacency(rescale_similarity(q_avg, f), f, tau)`, bit for bit, for
  q_avg = `average_similarity(q, f)`, in a few [N, N] passes instead of a dozen (at
  N = 10,000 each pass over a float32 matrix moves 400 MB).

  q_avg is 0 where F = 0, so "positive" (F > 0 and Q* > 0) is just Q* > 0, and the largest
  positive entry is the largest entry. The rescaled entry of a positive x is compared with
  τ as fl(fl(x − lo) / span) > τ, which is non-decreasing in x (IEEE subtraction and
  division by span > 0 round monotonically), so it holds exactly for x >= x_min, the
  smallest positive float32 for which it holds: a bisection over the float32 bit patterns
  (positive floats order as their bits) evaluates the very same expression on scalars, and
  one comparison with x_min replaces the subtract, divide and compare passes. A non-positive
  entry has Q-matrix 0: an edge iff 0 > τ.
  """
  q_avg = tf.convert_to_tensor(q_avg, tf.float32)
  tau = tf.cast(tau, tf.float32)
  seen = seen_clients(f)
  hi = tf.reduce_max(q_avg)
  lo = tf.reduce_min(tf.where(q_avg > 0.0, q_avg, np.float32(np.inf)))
  span = hi - lo

  def holds(bits):  # the rescaled entry of the positive float with these bits is > τ
    x = tf.bitcast(bits, tf.float32)
    return tf.where(span > 0.0, (x - lo) / span, 1.0) > tau

  def smallest_passing():
    top = tf.bitcast(hi, tf.int32)

    def body(low, high):  # holds(high); not holds(low), or low = 0 (below every positive)
      mid = low + (high - low) // 2
      passing = holds(mid)
      return tf.where(passing, low, mid), tf.where(passing, mid, high)

    _, first = tf.while_loop(lambda low, high: high - low > 1, body,
                             (tf.constant(0, tf.int32), top))
    return tf.bitcast(first, tf.float32)

  x_min = tf.cond(tf.logical_and(hi > 0.0, holds(tf.bitcast(hi, tf.int32))),
                  smallest_passing, lambda: tf.constant(np.inf, tf.float32))
  # A subnormal x_min may be read as 0 where TF flushes denormals (then `>= x_min` would take
  # zeros in), so that rare case also asks for x > 0, as `rescale_similarity` does.
  tiny = tf.constant(np.finfo(np.float32).tiny, tf.float32)
  a = tf.cond(tf.constant(0.0, tf.float32) > tau,
              lambda: tf.ones(tf.shape(q_avg), tf.bool),
              lambda: tf.cond(x_min >= tiny, lambda: q_avg >= x_min,
                              lambda: tf.logical_and(q_avg >= x_min, q_avg > 0.0)))
  return a & seen[:, None] & seen[None, :]


def cluster_relation(adj, seen, closure: str = 'two_hop') -> tf.Tensor:
  """bool [N, N]: i ~ j; every seen client is related to itself, unseen ones to nobody.

  'two_hop': i ~ j iff some k has A_ki = A_kj = 1; 'components': i ~ j iff a path of A
  joins them.
  """
  if closure not in CLOSURES[:2]:
    raise ValueError(f'closure must be one of {CLOSURES[:2]}, got {closure!r}')
  seen = tf.convert_to_tensor(seen, tf.bool)
  n = tf.shape(seen)[0]
  self_loops = tf.logical_and(tf.eye(n, dtype=tf.bool), seen[None, :])
  a = tf.logical_or(tf.convert_to_tensor(adj, tf.bool), self_loops)
  af = tf.cast(a, tf.float32)
  if closure == 'two_hop':
    return tf.matmul(af, af, transpose_a=True) > 0.0

  def body(reach, changed):
    rf = tf.cast(reach, tf.float32)
    new = tf.logical_or(reach, tf.matmul(rf, rf) > 0.0)
    return new, tf.reduce_any(tf.not_equal(new, reach))

  reach, _ = tf.while_loop(lambda r, changed: changed, body, (a, tf.constant(True)))
  return reach


def oracle_relation(true_clusters, seen) -> tf.Tensor:
  """bool [N, N]: i ~ j iff both are seen and share a true cluster (closure 'oracle': the
  true clusters in place of the recovered ones, which separates CADIS's clustering from its
  weighting)."""
  seen = tf.convert_to_tensor(seen, tf.bool)
  same = ideal_similarity(true_clusters) > 0.5
  return same & seen[:, None] & seen[None, :]


def cluster_sizes(relation) -> tf.Tensor:
  """int32 [N]: |C_i| (at least 1: a never-seen client is its own cluster)."""
  sizes = tf.reduce_sum(tf.cast(relation, tf.int32), axis=1)
  return tf.maximum(sizes, 1)


def count_clusters(relation, seen) -> tf.Tensor:
  """int32: the number of distinct sets C_i among seen clients."""
  seen = tf.convert_to_tensor(seen, tf.bool)
  rf = tf.cast(relation, tf.float32)
  overlap = tf.matmul(rf, rf, transpose_b=True)
  size = tf.linalg.diag_part(overlap)
  same = tf.logical_and(tf.equal(overlap, size[:, None]), tf.equal(overlap, size[None, :]))
  n = tf.shape(seen)[0]
  ids = tf.range(n)
  earlier = ids[None, :] < ids[:, None]
  duplicate = tf.reduce_any(same & earlier & seen[None, :], axis=1)
  return tf.reduce_sum(tf.cast(seen & tf.logical_not(duplicate), tf.int32))


def two_hop_sizes(adj, seen, rows) -> tf.Tensor:
  """int32 [P]: |C_i| under 'two_hop' for the clients `rows` (int32 [P]), equal to
  `tf.gather(cluster_sizes(cluster_relation(adj, seen, 'two_hop')), rows)` without the
  [N, N] x [N, N] product.

  Row i of the relation is the union of the rows A'_k. over the k with A'_ki = 1 (A' = A
  with self-loops on seen clients), i.e. row i of A'^T A' > 0: for P rows that is a
  [P, N] x [N, N] product, 2 P N^2 flops (2 GFLOP at P = 10, N = 10,000) instead of 2 N^3.
  The 0/1 products and sums are exact in float32 (they count at most N < 2^24).
  """
  seen = tf.convert_to_tensor(seen, tf.bool)
  rows = tf.convert_to_tensor(rows, tf.int32)
  af = tf.cast(tf.convert_to_tensor(adj, tf.bool), tf.float32)
  seen_f = tf.cast(seen, tf.float32)
  p = tf.shape(rows)[0]
  # cols[:, r] = column rows[r] of A' (the self-loop added where that client is seen).
  cols = tf.gather(af, rows, axis=1)
  cols = tf.tensor_scatter_nd_max(cols, tf.stack([rows, tf.range(p)], axis=1),
                                  tf.gather(seen_f, rows))
  # cols^T A' = cols^T A + cols^T diag(seen).
  reach = tf.matmul(cols, af, transpose_a=True) + tf.transpose(cols) * seen_f[None, :]
  sizes = tf.reduce_sum(tf.cast(reach > 0.0, tf.int32), axis=1)
  return tf.maximum(sizes, 1)


def component_labels(adj, seen) -> tf.Tensor:
  """int32 [N]: connected-component labels of A: two seen clients have the same label iff a
  path of A joins them (the 'components' relation of `cluster_relation`); a never-seen
  client keeps its own index. Each label is the index of a client of its component.

  Needs A symmetric (Q is, see `update_similarity`) and zero outside seen clients (as
  `adjacency` gives it). Min-label propagation with hooking and pointer jumping instead of
  dense N^3 reach products: a pass gives every client the smallest label of its closed
  neighbourhood (one vectorised [N, N] select and row min), hooks the client's old label
  onto that smaller one, and follows labels to their roots; it repeats until no edge joins
  two labels (a cheaper [N, N] compare). Labels only decrease and stay inside their
  component, and a pass that leaves an edge between two labels lowers the larger, so the
  loop ends with labels constant on components and (being members) distinct across them.
  Dense clusters take one pass; a long chain about log N.
  """
  adj = tf.convert_to_tensor(adj, tf.bool)
  n = tf.shape(adj)[0]
  # The row min runs on float32 labels (a vectorised reduction, about 1.5x faster than int32
  # here); labels < N <= 2^24 are exact in float32.
  no_label = tf.cast(n, tf.float32)

  def pointer_jump(labels):
    return tf.while_loop(lambda x: tf.reduce_any(tf.not_equal(tf.gather(x, x), x)),
                         lambda x: (tf.gather(x, x),), (labels,))[0]

  def body(labels, done):
    del done
    low = tf.reduce_min(tf.where(adj, tf.cast(labels, tf.float32)[None, :], no_label), axis=1)
    low = tf.minimum(tf.cast(low, tf.int32), labels)  # the client itself is in the min
    hooked = tf.minimum(tf.tensor_scatter_nd_min(labels, labels[:, None], low), low)
    new = pointer_jump(hooked)
    split = tf.reduce_any(tf.logical_and(adj, tf.not_equal(new[:, None], new[None, :])))
    return new, tf.logical_not(split)

  labels, _ = tf.while_loop(lambda labels, done: tf.logical_not(done), body,
                            (tf.range(n), tf.constant(False)))
  return labels


def oracle_labels(true_clusters) -> tf.Tensor:
  """int32 [N]: the true clusters renumbered 0..K-1 (the 'oracle' relation as labels)."""
  return tf.unique(tf.convert_to_tensor(true_clusters, tf.int32))[1]


def label_cluster_sizes(labels, seen) -> tf.Tensor:
  """int32 [N]: |C_i| when i ~ j iff both are seen and share a label (labels in [0, N));
  1 for a never-seen client, as `cluster_sizes`."""
  labels = tf.convert_to_tensor(labels, tf.int32)
  seen = tf.convert_to_tensor(seen, tf.bool)
  counts = tf.math.unsorted_segment_sum(tf.cast(seen, tf.int32), labels, tf.size(labels))
  return tf.where(seen, tf.gather(counts, labels), 1)


def count_label_clusters(labels, seen) -> tf.Tensor:
  """int32: distinct labels among seen clients (= `count_clusters` of the label relation)."""
  labels = tf.convert_to_tensor(labels, tf.int32)
  counts = tf.math.unsorted_segment_sum(tf.cast(tf.convert_to_tensor(seen, tf.bool), tf.int32),
                                        labels, tf.size(labels))
  return tf.reduce_sum(tf.cast(counts > 0, tf.int32))


def label_agreement(labels, seen, true_clusters):
  """`cluster_agreement` of the label relation, from counts instead of [N, N] matrices.

  Over pairs of seen clients, "same label" and "same true cluster" disagree on
  same_label + same_true − 2·both pairs, each a sum of m(m−1)/2 over the group sizes m of
  the labels, the true clusters and their (label, true cluster) pairs; counted in int64
  (exact), then divided in float32 as `cluster_agreement` does (whose float32 sums of ones
  are exact while the pair count is below 2^24, i.e. up to ~5,800 seen clients; beyond
  that this one is the exact one).
  """
  labels = tf.cast(tf.convert_to_tensor(labels, tf.int32), tf.int64)
  seen = tf.convert_to_tensor(seen, tf.bool)
  truth = tf.cast(oracle_labels(true_clusters), tf.int64)
  n = tf.size(labels)
  one = tf.cast(seen, tf.int64)

  def pairs(group_sizes):
    return tf.reduce_sum(group_sizes * (group_sizes - 1) // 2)

  num = pairs(tf.reduce_sum(one)[None])
  same_label = pairs(tf.math.unsorted_segment_sum(one, labels, n))
  same_true = pairs(tf.math.unsorted_segment_sum(one, truth, n))
  key = tf.boolean_mask(labels * tf.cast(n, tf.int64) + truth, seen)
  both = pairs(tf.cast(tf.unique_with_counts(key)[2], tf.int64))
  hits = num - (same_label + same_true - 2 * both)
  hits_f, num_f = tf.cast(hits, tf.float32), tf.cast(num, tf.float32)
  accuracy = tf.where(num > 0, tf.math.divide_no_nan(hits_f, num_f), 1.0)
  return accuracy, tf.cast(tf.equal(hits, num), tf.float32)


def aggregation_weights(sizes, num_examples, valid, sample_weighted: bool = True):
  """float32 [C]: p_i ∝ (1/|C_i|)·(n_i/n) (or 1/|C_i|) over valid rows, summing to 1 (all
  zero when no row is valid)."""
  valid = tf.convert_to_tensor(valid, tf.bool)
  sizes = tf.cast(sizes, tf.float32)
  inv = tf.where(valid, tf.math.divide_no_nan(1.0, sizes), tf.zeros_like(sizes))
  if sample_weighted:
    n_i = tf.where(valid, tf.cast(num_examples, tf.float32), tf.zeros_like(sizes))
    inv = inv * tf.math.divide_no_nan(n_i, tf.reduce_sum(n_i))
  return tf.math.divide_no_nan(inv, tf.reduce_sum(inv))


def weighted_sum(deltas, weights):
  """Σ_i p_i Δ_i for each [C, ...] tensor of `deltas` (structure preserved)."""
  weights = tf.convert_to_tensor(weights, tf.float32)

  def combine(t):
    t = tf.convert_to_tensor(t)
    return tf.tensordot(tf.cast(weights, t.dtype), t, axes=[[0], [0]])

  return tf.nest.map_structure(combine, deltas)


def next_threshold(tau, round_num, threshold_max: float = DEFAULT_THRESHOLD_MAX,
                   growth: float = DEFAULT_THRESHOLD_GROWTH) -> tf.Tensor:
  """τ_{t+1} = min(τ_t · growth^t, τ_max)."""
  t = tf.cast(round_num, tf.float32)
  return tf.minimum(tf.cast(tau, tf.float32) * tf.pow(tf.constant(growth, tf.float32), t),
                    tf.constant(threshold_max, tf.float32))


def ideal_similarity(true_clusters) -> tf.Tensor:
  """float32 [N, N]: 1 where two clients share a true cluster, else 0."""
  tc = tf.convert_to_tensor(true_clusters)
  return tf.cast(tf.equal(tc[:, None], tc[None, :]), tf.float32)


def q_matrix_mse(q_matrix, f, true_clusters) -> tf.Tensor:
  """Mean of (Q-matrix − ideal)² over off-diagonal pairs with F > 0 (0 if none)."""
  q_matrix = tf.convert_to_tensor(q_matrix, tf.float32)
  n = tf.shape(q_matrix)[0]
  mask = tf.logical_and(tf.convert_to_tensor(f, tf.float32) > 0.0,
                        tf.logical_not(tf.eye(n, dtype=tf.bool)))
  err = tf.square(q_matrix - ideal_similarity(true_clusters))
  m = tf.cast(mask, tf.float32)
  return tf.math.divide_no_nan(tf.reduce_sum(err * m), tf.reduce_sum(m))


def cluster_agreement(relation, seen, true_clusters):
  """(pair accuracy, match flag), float32: agreement of i ~ j with the true clusters over
  pairs i < j of seen clients (1.0, 1.0 with fewer than two seen)."""
  seen = tf.convert_to_tensor(seen, tf.bool)
  n = tf.shape(seen)[0]
  ids = tf.range(n)
  pairs = seen[:, None] & seen[None, :] & (ids[:, None] < ids[None, :])
  truth = ideal_similarity(true_clusters) > 0.5
  agree = tf.equal(tf.convert_to_tensor(relation, tf.bool), truth)
  num = tf.reduce_sum(tf.cast(pairs, tf.float32))
  hits = tf.reduce_sum(tf.cast(pairs & agree, tf.float32))
  accuracy = tf.where(num > 0.0, tf.math.divide_no_nan(hits, num), 1.0)
  return accuracy, tf.cast(tf.equal(hits, num), tf.float32)


def _zero_delta(delta_specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), delta_specs)


def empty_accumulator(capacity: int, delta_specs) -> collections.OrderedDict:
  """The upload accumulator: `count` uploads so far, and per row the client index (−1 =
  empty), its weight and its delta (`server_state.zero_rows`: `capacity` separate rows, each
  empty until written, so the zero accumulator TFF serialises every round holds no delta and
  an upload writes its own row, not a copy of all of them)."""
  return collections.OrderedDict(
      count=tf.constant(0, tf.int32),
      index=tf.fill([capacity], -1),
      weight=tf.zeros([capacity], tf.float32),
      delta=server_state.zero_rows(_zero_delta(delta_specs), capacity))


def stacked_deltas(acc, delta_specs):
  """The accumulator's delta rows as [capacity, ...] tensors (unwritten rows zero)."""
  return server_state.stack_rows(acc['delta'], _zero_delta(delta_specs))


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
                                 delta=server_state.put_row(acc['delta'], pos, delta))


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
      delta=[tf.nest.map_structure(lambda t, i=i: server_state.open_shape(t[i]), merged)
             for i in range(capacity)])


@dataclasses.dataclass(frozen=True)
class ClusteringOptions:
  """The server step's options (see `ClusteredAggregator` for their meaning)."""
  similarity_index: int = -1
  closure: str = 'two_hop'
  sample_weighted: bool = True
  transitive: bool = False
  transitive_half_width: float = DEFAULT_TRANSITIVE_HALF_WIDTH
  threshold_max: float = DEFAULT_THRESHOLD_MAX
  threshold_growth: float = DEFAULT_THRESHOLD_GROWTH
  two_hop_metrics_max_clients: Optional[int] = DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS
  reference_quirks: bool = False


def two_hop_metrics_computed(num_clients, options: ClusteringOptions) -> bool:
  """Whether `clustering_step` computes the metrics that need the whole 'two_hop' relation
  (`num_clusters`, `cluster_pair_accuracy`, `clusters_match`): N is known statically and at
  most `options.two_hop_metrics_max_clients` (None: always)."""
  limit = options.two_hop_metrics_max_clients
  return limit is None or (num_clients is not None and int(num_clients) <= limit)


def clustering_step(state, client_index, weights, similarity,
                    options: ClusteringOptions = ClusteringOptions(), true_clusters=None):
  """Steps 2-6 and 8 on C uploaded rows: (new state, p [C], measurements).

  Args:
    state: OrderedDict(q [N, N], f [N, N], tau, round_num).
    client_index: int32 [C]; −1 marks an empty row.
    weights: float32 [C] n_i; rows with weight <= 0 (or index −1) are ignored.
    similarity: float32 [C, b], each row's similarity vector (`similarity_vectors`).
    options: `ClusteringOptions` (its `similarity_index` is not used here).
    true_clusters: optional int [N] for the true-cluster measurements.
  """
  client_index = tf.convert_to_tensor(client_index, tf.int32)
  weights = tf.convert_to_tensor(weights, tf.float32)
  valid = tf.logical_and(client_index >= 0, weights > 0.0)
  tau = tf.cast(state['tau'], tf.float32)
  if options.reference_quirks:
    sim = reference_pair_similarity(similarity, valid)
  else:
    sim = cross_aggregation.cosine_similarity_matrix(similarity)
  q, f = update_similarity(state['q'], state['f'], client_index, sim, valid)
  if options.transitive:
    q, f = transitive_update(q, f, tau, options.transitive_half_width)
  q_avg = average_similarity(q, f)
  seen = seen_clients(f)
  rows = tf.where(valid, client_index, 0)
  # Only |C_i| of this round's rows and the metrics are needed, so no [N, N] relation is
  # built at scale: 'two_hop' takes P rows of A'^T A', 'components' and 'oracle' take labels.
  relation = labels = None
  if options.closure == 'oracle':
    labels = oracle_labels(true_clusters)
  else:
    if options.reference_quirks:
      adj = adjacency(rescale_similarity(q_avg, f, True), f, tau)
    else:
      adj = threshold_adjacency(q_avg, f, tau)
    if options.closure == 'components':
      labels = component_labels(adj, seen)
    elif two_hop_metrics_computed(q.shape[0], options):
      relation = cluster_relation(adj, seen, 'two_hop')
  if labels is not None:
    sizes_rows = tf.gather(label_cluster_sizes(labels, seen), rows)
    num_clusters = count_label_clusters(labels, seen)
  else:
    sizes_rows = two_hop_sizes(adj, seen, rows)
    # A set C_i per client, possibly overlapping: counting the distinct ones and comparing
    # the relation with the truth need all of it (2 N^3 flops each), so only up to the size
    # limit; above it the metrics read -1 / NaN ("not computed").
    num_clusters = (count_clusters(relation, seen) if relation is not None
                    else tf.constant(-1, tf.int32))
  sizes = tf.where(valid, sizes_rows, 0)
  p = aggregation_weights(sizes, weights, valid, options.sample_weighted)
  measurements = collections.OrderedDict(
      participants=tf.where(client_index >= 0, client_index, -1),
      cluster_sizes=sizes,
      aggregation_weights=p,
      num_clusters=num_clusters,
      seen_clients=tf.reduce_sum(tf.cast(seen, tf.int32)),
      tau=tau)
  if true_clusters is not None:
    if labels is not None:
      accuracy, match = label_agreement(labels, seen, true_clusters)
    elif relation is not None:
      accuracy, match = cluster_agreement(relation, seen, true_clusters)
    else:
      accuracy = match = tf.constant(np.nan, tf.float32)
    measurements['q_matrix_mse'] = q_matrix_mse(
        rescale_similarity(q_avg, f, options.reference_quirks), f, true_clusters)
    measurements['cluster_pair_accuracy'] = accuracy
    measurements['clusters_match'] = match
  new_state = collections.OrderedDict(
      q=q, f=f,
      tau=next_threshold(tau, state['round_num'], options.threshold_max,
                         options.threshold_growth),
      round_num=tf.cast(state['round_num'], tf.int32) + 1)
  return new_state, p, measurements


def clustered_aggregation_step(state, client_index, weights, deltas,
                               options: ClusteringOptions = ClusteringOptions(),
                               true_clusters=None):
  """One server round (steps 2-8) on C uploaded rows: (new state, result, measurements).

  As `clustering_step`, with `deltas` (a structure of [C, ...] tensors) in place of the
  similarity vectors (taken from them at `options.similarity_index`); result = Σ p_i Δ_i.
  """
  new_state, p, measurements = clustering_step(
      state, client_index, weights, similarity_vectors(deltas, options.similarity_index),
      options, true_clusters)
  return new_state, weighted_sum(deltas, p), measurements


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
        scored with the wrong upload, (b) abs() after the min-max rescale; module doc). A
        diagnosis, off by default.
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
    if similarity_layer not in SIMILARITY_LAYERS:
      raise ValueError(
          f'similarity_layer must be one of {SIMILARITY_LAYERS}, got {similarity_layer!r}')
    if similarity_index is not None and (isinstance(similarity_index, bool) or
                                         not isinstance(similarity_index, (int, np.integer))):
      raise ValueError(f'similarity_index must be None or an int, got {similarity_index!r}')
    if closure not in CLOSURES:
      raise ValueError(f'closure must be one of {CLOSURES}, got {closure!r}')
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


def build_clustered_aggregator(num_clients: Optional[int], clients_per_round: int,
                               **kwargs) -> ClusteredAggregator:
  """`ClusteredAggregator(num_clients, clients_per_round, **kwargs)` (builder-style alias)."""
  return ClusteredAggregator(num_clients, clients_per_round, **kwargs)


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
    new_state, result, measurements = clustered_aggregation_step(
        step_state, index, weight, delta, options, true_clusters)
    if not keyed:
      new_state = collections.OrderedDict(tau=new_state['tau'],
                                          round_num=new_state['round_num'])
    return new_state, result, measurements

  return server_state.build_server_state_aggregation(
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
        similarity=tf.reshape(similarity_vectors(
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
    new_state, p, measurements = clustering_step(state, index, weight, similarity, options,
                                                 true_clusters)
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
