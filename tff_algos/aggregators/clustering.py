"""CADIS's clustering maths: pure TF functions on tensors.

The server side of CADIS (docs/algorithms.md#cadis, server steps 2-8) on one round's uploaded
rows: the pairwise similarities added to the cumulative Q and F, transitive estimates, the
min-max rescale and threshold adjacency, the closures ('two_hop' sizes, component labels, the
'oracle' true clusters), the weights p_i, the τ schedule and the measurements against true
clusters. `clustering_step` runs them on one round; `clustered_aggregation.ClusteredAggregator`
wraps it in a TFF aggregation process. Each function is usable and tested on its own.

The authors' code (`reference_quirks=True`; a diagnosis option, never the default). What the
public code of the paper (AIoT-Lab-BKAI/ORO-CCGRID2023-CADIS, `algorithm/cadis.py`, the module
its run scripts select with `--algorithm cadis`) does and the paper does not; with the option
both replace the paper's rules (docs/algorithms.md#cadis, steps 3 and 5):

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
      rescales Q* with lo, hi taken over its positive entries as the paper does, but applies the
      rescale to every entry with F > 0 and then takes abs(): an entry below lo becomes
      |Q* − lo| / (hi − lo), an edge once Q* < lo − τ·(hi − lo) (hi is 1, the diagonal, so
      at least every average cosine below −τ), and strongly dissimilar clients are
      clustered together. With hi = lo, positive entries still rescale to 1 and the others
      are edges (the reference divides by zero there: +inf for the latter, NaN, i.e. no
      edge, for the former, which would leave a client outside its own cluster).

  The rest is the paper's: the closure is the one chosen (the reference's is 'two_hop'), and
  the weights follow `sample_weighted` (the reference's are 1/|C_i|, i.e. False). The
  reference's cosine of a zero vector is NaN, after which that pair's Q* reads 0 for good;
  here the cosine is 0. Its multi-process variant (`algorithm/mp_cadis.py`) has (b), not (a).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_algos import constants
from tff_algos.aggregators import cross_aggregation

DEFAULT_THRESHOLD = 0.975
DEFAULT_THRESHOLD_MAX = 0.985
DEFAULT_THRESHOLD_GROWTH = 1.0005
DEFAULT_TRANSITIVE_HALF_WIDTH = 0.02
# Above this N, 'two_hop' skips the metrics that need its whole [N, N] relation
# (`two_hop_metrics_computed`).
DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS = 1000


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
  """Step 4: (Q, F) with transitive estimates for pairs never seen together
  (docs/algorithms.md#cadis)."""
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
  if closure not in constants.CADIS_CLOSURES[:2]:
    raise ValueError(f'closure must be one of {constants.CADIS_CLOSURES[:2]}, got {closure!r}')
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
  # The row min runs on float32 labels (CPU's vectorised float reduction is the faster one);
  # labels < N <= 2^24 are exact in float32.
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


@dataclasses.dataclass(frozen=True)
class ClusteringOptions:
  """The server step's options (see `clustered_aggregation.ClusteredAggregator` for their
  meaning)."""
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
