"""FedCDA's cache, its layout and the selection maths of one round, as pure TF functions.

What `cross_round_cache.build_cross_round_cache_process` runs each round (`cache_round`: the
push into the clients' caches, eq. 8's selection, the new global model), each function
usable and tested on its own (docs/algorithms.md#fedcda); the process (its options, the
upload accumulator, the TFF wiring) is `cross_round_cache`.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import tensorflow as tf

from tff_algos import constants
from tff_algos.aggregators import accumulate_then_step

# The state, dense so `tff.program` checkpoints it:
#   cache         chunks of [G_c, K, D] tensors, N·K·D weights in the cache's dtype (one
#                 client's model one row, in `tf.nest.flatten` order; `stacked_cache`)
#   losses        float32 [N, K]; sq_norms float64 [N, K] (‖w‖² of each cached model)
#   count         int32 [N] uploads so far (slot `count[n] mod K` is written next)
#   selected      int32 [N] ring slot of each client's selected model
#   selected_sum  float64 model: the running sum over cached clients of their selections
#   round_num     int32
# A round adds O(P·K·D) of transient buffers and O(P·D) for the upload accumulator; no
# second copy of the cache is made.
#
# Chunks (`chunk_clients`, `push_and_read`): the runtime keeps the state it passes in, so one
# stacked [N, K, D] tensor would be copied whole every round; with the cache in chunks of G
# clients (the fewest holding MIN_CHUNK_BYTES) a `tf.cond` per chunk passes every chunk
# without an upload through untouched.
#
# Precision: eq. 8's divergence is a small difference of large sums of squares, so it is
# evaluated on the candidates measured from the round's mean upload, where nothing cancels;
# their Gram matrix is then taken in float32 and the choices match a float64 brute force.
# ‖w‖², the fixed clients' sums and `selected_sum` stay float64. `selected_sum` is updated,
# never recomputed (minus the uploaders' previous selections, read before a FIFO push may
# evict them, plus their new ones), so a round's work is O(P·K·D), not O(N·D); in float64
# its drift over U updates stays about U·2⁻⁵³·max|w|, far below float32's resolution.
# A lower-precision cache (`cache_dtype`) rounds uploads as they enter it, and everything
# after is computed from the rounded models.


# --------------------------------------------------------------------------- #
# The cache's layout
# --------------------------------------------------------------------------- #


def cache_size_bytes(num_clients: int, cache_size: int, num_params: int,
                     cache_dtype: str = 'float32') -> int:
  """Bytes of the model cache: b·N·K·D, b = 4 (float32) or 2 (float16, bfloat16)."""
  return (constants.FEDCDA_CACHE_DTYPES[cache_dtype] * int(num_clients) * int(cache_size)
          * int(num_params))


# A cache chunk holds at least this many bytes (unless the whole cache is smaller): a round
# passes every chunk without an upload through one `tf.cond` and copies every chunk with one
# (a conditional costs about what copying 1 MiB does: benchmarks/server_scale.py
# --server_step, RESULTS.md), so smaller chunks would cost more in conditionals than they save.
MIN_CHUNK_BYTES = 1 << 20


def chunk_clients(num_clients: int, cache_size: int, num_params: int,
                  cache_dtype: str = 'float32') -> int:
  """G: the clients per cache chunk, the fewest whose caches hold `MIN_CHUNK_BYTES` (one
  client per chunk for any real model: FedAvg's CNN caches 20 MB per client at K = 3)."""
  per_client = cache_size_bytes(1, cache_size, num_params, cache_dtype)
  return int(min(int(num_clients), max(1, -(-MIN_CHUNK_BYTES // per_client))))


def chunk_sizes(num_clients: int, clients_per_chunk: int) -> list[int]:
  """The clients of each chunk, in client order: [G, G, ..., the rest]."""
  n, g = int(num_clients), int(clients_per_chunk)
  return [min(g, n - start) for start in range(0, n, g)]


def flat_rows(weights, num_rows: int):
  """A structure of [R, ...] tensors as one [R, D] tensor (its tensors' values in
  `tf.nest.flatten` order: the cache's layout of one model)."""
  return tf.concat([tf.reshape(t, [num_rows, -1]) for t in tf.nest.flatten(weights)], axis=1)


def unflat(vector, like):
  """A [D] tensor as the structure `like` (of tensors with one model's shapes)."""
  shapes = [t.shape for t in tf.nest.flatten(like)]
  parts = tf.split(vector, [int(np.prod(s)) for s in shapes])
  return tf.nest.pack_sequence_as(like, [tf.reshape(v, s) for v, s in zip(parts, shapes)])


def stacked_cache(cache, like):
  """The chunked cache (a list of [G_c, K, D] tensors) as a ModelWeights of NumPy [N, K, ...]
  arrays shaped like the model `like` (e.g. the state's `selected_sum`): client n's ring slot
  j at [n, j] (tests and benchmarks)."""
  flat = np.concatenate([np.asarray(c) for c in cache])
  n, k = flat.shape[:2]
  shapes = [np.shape(t) for t in tf.nest.flatten(like)]
  parts = np.split(flat, np.cumsum([int(np.prod(s)) for s in shapes])[:-1], axis=2)
  return tf.nest.pack_sequence_as(like, [
      part.reshape(n, k, *s) for part, s in zip(parts, shapes)])


def chunked_cache(stacked, clients_per_chunk: int) -> list:
  """A ModelWeights of [N, K, ...] arrays as the state's chunked cache: a list of NumPy
  [G_c, K, D] arrays of `clients_per_chunk` clients each (the last may hold fewer)."""
  tensors = [np.asarray(t) for t in tf.nest.flatten(stacked)]
  n, k = tensors[0].shape[:2]
  flat = np.concatenate([t.reshape(n, k, -1) for t in tensors], axis=2)
  sizes = chunk_sizes(n, clients_per_chunk)
  return [flat[end - size:end] for size, end in zip(sizes, np.cumsum(sizes))]


def batch_sizes(num_uploads: int, num_batches: int) -> list[int]:
  """Sizes of the B batches P uploaders are split into (differ by at most one; may be 0)."""
  p, b = int(num_uploads), int(num_batches)
  return [p // b + (1 if i < p % b else 0) for i in range(b)]


# --------------------------------------------------------------------------- #
# Pure TF functions (each usable and tested on its own)
# --------------------------------------------------------------------------- #


def candidate_slots(count, cache_size: int):
  """int32 [..., K]: ring slot of each client's j-th newest model (j = 0 newest)."""
  count = tf.convert_to_tensor(count, tf.int32)
  ages = tf.range(cache_size, dtype=tf.int32)
  return tf.math.floormod(count[..., None] - 1 - ages, cache_size)


def selected_sum_from_cache(cache, count, selected):
  """Σ over cached clients (count > 0) of cache[n, selected[n]], from scratch, in float64.

  NumPy, O(N·D) time and O(D) extra memory (one client's model at a time): what the running
  `selected_sum` replaces each round; benchmarks and tests use it as the reference. `cache` is a
  ModelWeights of [N, K, ...] (`stacked_cache` of the state's chunks).
  Returns a ModelWeights (like `cache`) of float64 arrays with the model's shapes.
  """
  rows = np.flatnonzero(np.asarray(count) > 0)
  selected = np.asarray(selected)

  def one(t):
    t = np.asarray(t)
    total = np.zeros(t.shape[2:], np.float64)
    for n in rows:
      total += t[n, selected[n]].astype(np.float64)
    return total

  return tf.nest.map_structure(one, cache)


def push_and_read(cache, valid, clients, ring, previous, uploads, candidate_ages):
  """The FIFO push of a round's uploads into the chunked cache, and what the step reads.

  Args:
    cache: the state's list of chunks, [G_c, K, D] tensors of the cache's dtype (chunk c
      holds clients G_0 + ... + G_{c-1} onwards; a client's model is one row of D values).
    valid: bool [P], the slots whose upload enters the cache.
    clients: int32 [P], each slot's client index.
    ring: int32 [P], the ring slot each upload is written to.
    previous: int32 [P], each slot's client's selected ring slot before this round.
    uploads: float32 [P, D], the round's models (`flat_rows`).
    candidate_ages: int32 [P, K], the ring slot of each slot's client's j-th newest model
      after the push.

  Returns:
    (new cache, previous, candidates, row_of_slot), in the order the chunks were written
    (putting them in slot order would copy O(P·K·D) more; the caller reorders its small
    results instead): `previous` [W + 1, D] holds each uploader's selected model before the
    push, `candidates` [(W + 1)·K, D] each uploader's K models after it (row w·K + j = its
    j-th newest), both in the cache's dtype with a zero last row (block); `row_of_slot`
    int32 [P] is slot p's row w there (W, the zero row, for an invalid slot).

  Why chunks: the runtime still holds the input state, so writing into one stacked
  [N, K, D] cache allocates and copies all of it every round (a whole state's worth of
  copying and, while TFF's worker kept each round alive, of memory). Here each chunk is its own tensor and a `tf.cond` passes every chunk without an
  upload through untouched: a round copies and reads O(P·G·K·D), not O(N·K·D).
  """
  p, k = int(valid.shape[0]), int(candidate_ages.shape[1])
  new_chunks, order, previous_rows, candidate_rows = [], [], [], []
  start = 0
  for chunk in cache:
    size, d = int(chunk.shape[0]), int(chunk.shape[2])
    here = tf.logical_and(valid, tf.logical_and(clients >= start, clients < start + size))

    def write(chunk=chunk, here=here, start=start):
      slots = tf.cast(tf.where(here)[:, 0], tf.int32)                     # [m]
      rows = tf.gather(clients, slots) - start
      ages = tf.gather(candidate_ages, slots)                              # [m, K]
      old = tf.gather_nd(chunk, tf.stack([rows, tf.gather(previous, slots)], axis=1))
      new = tf.tensor_scatter_nd_update(
          chunk, tf.stack([rows, tf.gather(ring, slots)], axis=1),
          tf.cast(tf.gather(uploads, slots), chunk.dtype))
      candidates = tf.gather_nd(
          new, tf.stack([tf.broadcast_to(rows[:, None], tf.shape(ages)), ages], axis=-1))
      return new, slots, old, candidates

    def keep(chunk=chunk, d=d):
      return (chunk, tf.zeros([0], tf.int32), tf.zeros([0, d], chunk.dtype),
              tf.zeros([0, k, d], chunk.dtype))

    new, slots, old, candidates = tf.cond(tf.reduce_any(here), write, keep)
    new_chunks.append(new)
    order.append(slots)
    previous_rows.append(old)
    candidate_rows.append(candidates)
    start += size
  # An invalid slot reads the zero row appended to the concatenations.
  order = tf.concat(order, axis=0)                                          # [W]
  d = int(cache[0].shape[2])
  row_of_slot = tf.tensor_scatter_nd_update(tf.fill([p], tf.size(order)), order[:, None],
                                            tf.range(tf.size(order)))
  dtype = cache[0].dtype
  previous_models = tf.concat(previous_rows + [tf.zeros([1, d], dtype)], axis=0)
  candidates = tf.reshape(tf.concat(candidate_rows + [tf.zeros([1, k, d], dtype)], axis=0),
                          [-1, d])
  return new_chunks, previous_models, candidates, row_of_slot


def weighted_row_sum(weights, rows):
  """Σ_r weights[r]·rows[r] ([R] and [R, D] -> [D]) as a row vector times the matrix (a
  transposed matvec computes the same in a slower kernel on CPU)."""
  return tf.matmul(weights[None, :], rows)[0]


def divergence_objective(loss_sum, sq_norm_sum, sum_sq_norm, count, smoothness):
  """Eq. 8 from sums over the M members: (1/M)ΣF + (L/2)((1/M)Σ‖w‖² − ‖Σw‖²/M²); 0 if M=0."""
  m = tf.cast(count, loss_sum.dtype)
  mean_f = tf.math.divide_no_nan(loss_sum, m)
  mean_sq = tf.math.divide_no_nan(sq_norm_sum, m)
  mean_norm_sq = tf.math.divide_no_nan(sum_sq_norm, m * m)
  return mean_f + 0.5 * smoothness * (mean_sq - mean_norm_sq)


def _combinations(cache_size: int, size: int) -> np.ndarray:
  """int32 [K^size, size], lexicographic (so ties go to the newest candidates)."""
  return np.array(list(itertools.product(range(cache_size), repeat=size)),
                  np.int32).reshape(-1, size)


def select_models(gram, fixed_dot, fixed, losses, num_candidates, valid, batches,
                  smoothness: float, cache_size: int):
  """Batch-greedy selection of eq. 8 in the space of the uploaders' candidates.

  Args:
    gram: float64 [P·K, P·K] inner products of the candidates (row p·K + j = uploader p's
      j-th newest model).
    fixed_dot: float64 [P·K]: inner product of each candidate with the sum of the fixed
      (non-uploading, cached) clients' selected models.
    fixed: OrderedDict(loss_sum, sq_norm_sum, sum_sq_norm, count) of the fixed clients.
    losses: float64 [P·K] last-epoch losses of the candidates.
    num_candidates: int32 [P] cached models per uploader (after this round's push).
    valid: bool [P]: uploaders (an invalid slot takes no part in anything).
    batches: a list of int32 [m_b] tensors (static sizes): the slots of each batch, in
      processing order.
    smoothness: L.
    cache_size: K.

  Returns:
    choice int32 [P]: age of the selected candidate per slot (0 = newest; 0 for invalid
    slots).
  """
  k = int(cache_size)
  dt = gram.dtype
  valid = tf.convert_to_tensor(valid, tf.bool)
  choice = tf.zeros(tf.shape(valid), tf.int32)
  loss_sum, sq_sum = fixed['loss_sum'], fixed['sq_norm_sum']
  sum_sq, count = fixed['sum_sq_norm'], tf.cast(fixed['count'], dt)
  dot_with_fixed = fixed_dot
  for slots in batches:
    m = int(slots.shape[0])
    if m == 0:
      continue
    combos = tf.constant(_combinations(k, m))                        # [C, m]
    slot_valid = tf.gather(valid, slots)                              # [m]
    allowed = tf.where(slot_valid[None, :],
                       combos < tf.gather(num_candidates, slots)[None, :],
                       tf.equal(combos, 0))
    ok = tf.reduce_all(allowed, axis=1)                               # [C]
    idx = slots[None, :] * k + combos                                 # [C, m]
    member = tf.cast(slot_valid, dt)[None, :]                 # [1, m]
    c_loss = tf.reduce_sum(member * tf.gather(losses, idx), axis=1)
    diag = tf.linalg.diag_part(gram)
    c_sq = tf.reduce_sum(member * tf.gather(diag, idx), axis=1)
    c_cross = tf.reduce_sum(member * tf.gather(dot_with_fixed, idx), axis=1)
    pair = tf.gather(tf.gather(gram, idx), idx, axis=2, batch_dims=1)  # [C, m, m]
    pair_mask = member[:, :, None] * member[:, None, :]
    c_pair = tf.reduce_sum(pair * pair_mask, axis=[1, 2])
    c_count = tf.reduce_sum(member)
    objective = divergence_objective(loss_sum + c_loss, sq_sum + c_sq,
                                     sum_sq + 2.0 * c_cross + c_pair, count + c_count,
                                     smoothness)
    objective = tf.where(ok, objective, np.inf)
    best = tf.argmin(objective, output_type=tf.int32)  # first minimum: newest on ties
    chosen = tf.gather(combos, best)                                   # [m]
    chosen = tf.where(slot_valid, chosen, 0)
    choice = tf.tensor_scatter_nd_update(choice, slots[:, None], chosen)
    chosen_idx = slots * k + chosen
    w = tf.cast(slot_valid, dt)
    loss_sum += tf.reduce_sum(w * tf.gather(losses, chosen_idx))
    sq_sum += tf.reduce_sum(w * tf.gather(diag, chosen_idx))
    sum_sq += 2.0 * tf.reduce_sum(w * tf.gather(dot_with_fixed, chosen_idx)) + tf.reduce_sum(
        w[:, None] * w[None, :] * tf.gather(tf.gather(gram, chosen_idx), chosen_idx, axis=1))
    count += tf.reduce_sum(w)
    dot_with_fixed += tf.linalg.matvec(tf.gather(gram, chosen_idx), w, transpose_a=True)
  return choice


def objective_of_choice(gram, fixed_dot, fixed, losses, choice, valid, smoothness: float,
                        cache_size: int):
  """Eq. 8 over all cached clients with uploader p at candidate age `choice[p]`."""
  k = int(cache_size)
  p = tf.shape(valid)[0]
  idx = tf.range(p, dtype=tf.int32) * k + choice
  w = tf.cast(valid, gram.dtype)
  diag = tf.linalg.diag_part(gram)
  sub = tf.gather(tf.gather(gram, idx), idx, axis=1)
  return divergence_objective(
      fixed['loss_sum'] + tf.reduce_sum(w * tf.gather(losses, idx)),
      fixed['sq_norm_sum'] + tf.reduce_sum(w * tf.gather(diag, idx)),
      fixed['sum_sq_norm'] + 2.0 * tf.reduce_sum(w * tf.gather(fixed_dot, idx))
      + tf.reduce_sum(w[:, None] * w[None, :] * sub),
      tf.cast(fixed['count'], gram.dtype) + tf.reduce_sum(w), smoothness)


def random_batches(num_uploads: int, num_batches: int, seed, valid=None):
  """A random split of slots range(P) into B batches of static sizes `batch_sizes(P, B)`.

  The slots are shuffled (stateless, from `seed`) with the `valid` ones first and dealt
  round-robin, so the valid slots of the batches differ in number by at most one too.
  """
  p = int(num_uploads)
  keys = tf.random.stateless_uniform([p], seed=seed)
  if valid is not None:
    keys += 2.0 * tf.cast(tf.logical_not(tf.convert_to_tensor(valid, tf.bool)), tf.float32)
  perm = tf.cast(tf.argsort(keys, stable=True), tf.int32)
  out = []
  for b, size in enumerate(batch_sizes(p, num_batches)):
    batch = perm[b::num_batches]
    batch.set_shape([size])
    out.append(batch)
  return out


def cache_round(state, acc, *, num_clients: int, clients_per_round: int, cache_size: int,
                num_batches: int, warmup_rounds: int, smoothness: float, selection: str,
                seed: int, warmup_weighting: str = 'data_size'):
  """One server round on the state and the round's upload accumulator (pure TF).

  `acc` = OrderedDict(models=ModelWeights of [P, ...], client_index int32 [P], loss float32
  [P], valid float32 [P], weight float32 [P]) as gathered by the process (an invalid slot
  has a zero model and weight); `num_batches` is 1 for 'exact'. `state['selected_sum']` must
  be the sum of the cached clients' selected models (it is kept so, never recomputed).
  Returns (new state, OrderedDict(model, has_result), measurements).
  """
  n, p, k = num_clients, clients_per_round, cache_size
  valid = acc['valid'] > 0.0
  clients = acc['client_index']
  # One upload per client: a second would subtract its previous selection twice.
  writers = accumulate_then_step.checked_distinct_clients(tf.boolean_mask(clients, valid))
  # 1. Push the uploads into the ring buffers, reading on the way the uploaders' previous
  #    selections (before the push, which may overwrite exactly the selected slot: FIFO
  #    eviction) and their candidates (after it). Uploads are rounded to the cache's dtype
  #    as they enter it (a no-op for float32); everything below uses the cached values.
  safe_clients = tf.where(valid, clients, 0)
  ring = tf.math.floormod(tf.gather(state['count'], safe_clients), k)
  count = tf.tensor_scatter_nd_add(state['count'], writers[:, None],
                                   tf.ones_like(writers))
  cand_slots = candidate_slots(tf.gather(count, safe_clients), k)       # [P, K]
  uploads_flat = flat_rows(acc['models'], p)                             # [P, D] float32
  cache, previous_models, written_cands, row_of_slot = push_and_read(
      state['cache'], valid, clients, ring, tf.gather(state['selected'], safe_clients),
      uploads_flat, cand_slots)
  # Row of candidate p·K + j (slot order) among the written candidates.
  cand_rows = tf.reshape(row_of_slot[:, None] * k + tf.range(k)[None, :], [-1])
  at = tf.stack([writers, tf.boolean_mask(ring, valid)], axis=1)
  # 2. The fixed clients' sum = the running sum minus the uploaders' previous selections:
  #    O(P·D), not O(N·D), in float64.
  had_model = tf.cast(tf.logical_and(valid, tf.gather(state['count'], safe_clients) > 0),
                      tf.float64)
  had_model_written = tf.tensor_scatter_nd_add(
      tf.zeros([tf.shape(previous_models)[0]], tf.float64), row_of_slot[:, None], had_model)
  fixed_flat = (flat_rows(state['selected_sum'], 1)[0]
                - weighted_row_sum(had_model_written, tf.cast(previous_models, tf.float64)))
  losses = tf.tensor_scatter_nd_update(state['losses'], at,
                                       tf.boolean_mask(acc['loss'], valid))
  uploader = tf.scatter_nd(writers[:, None], tf.ones_like(writers), [n]) > 0
  cached = count > 0
  fixed_mask = tf.logical_and(cached, tf.logical_not(uploader))
  fixed_count = tf.reduce_sum(tf.cast(fixed_mask, tf.int32))
  # ‖w‖² of each upload as cached (the state keeps them for later rounds' fixed sums).
  upload_sq = tf.reduce_sum(tf.square(tf.cast(tf.cast(uploads_flat, cache[0].dtype),
                                               tf.float64)), axis=1)
  sq_norms = tf.tensor_scatter_nd_update(state['sq_norms'], at,
                                         tf.boolean_mask(upload_sq, valid))
  # 3. Eq. 8 from inner products in the uploaders' candidates' space, every model measured
  #    from a reference point inside the round's models (the valid uploads' mean): J is
  #    unchanged by moving all models by one vector, and so measured its sums of squares do
  #    not cancel, so the Gram matrix is taken in float32 ("Precision" above).
  valid_f = tf.cast(valid, tf.float32)
  ref = weighted_row_sum(valid_f / tf.maximum(tf.reduce_sum(valid_f), 1.0),
                         uploads_flat)                                    # [D] float32
  ref64 = tf.cast(ref, tf.float64)
  centered = tf.cast(written_cands, tf.float32) - ref
  gram = tf.gather(tf.gather(tf.cast(tf.matmul(centered, centered, transpose_b=True),
                                     tf.float64), cand_rows), cand_rows, axis=1)  # [P·K, P·K]
  fixed_centered = fixed_flat - tf.cast(fixed_count, tf.float64) * ref64  # Σ (w_n − ref)
  fixed_dot = tf.gather(tf.cast(tf.linalg.matvec(
      centered, tf.cast(fixed_centered, tf.float32)), tf.float64), cand_rows)
  # O(N·K) scalars: the fixed clients' losses and squared norms (no D factor); their
  # Σ‖w_n − ref‖² = Σ‖w_n‖² − 2 ref·Σw_n + M_f‖ref‖² (float64, exact ‖w_n‖² from the state).
  fixed_onehot = tf.one_hot(state['selected'], k) * tf.cast(fixed_mask, tf.float32)[:, None]
  cand_losses = tf.cast(tf.reshape(
      tf.gather_nd(losses, tf.stack(
          [tf.broadcast_to(safe_clients[:, None], [p, k]), cand_slots], -1)), [-1]), tf.float64)
  num_cands = tf.minimum(tf.gather(count, safe_clients), k)
  fixed = collections.OrderedDict(
      loss_sum=tf.reduce_sum(tf.cast(fixed_onehot * losses, tf.float64)),
      sq_norm_sum=(tf.reduce_sum(tf.cast(fixed_onehot, tf.float64) * sq_norms)
                   - 2.0 * tf.tensordot(ref64, fixed_flat, 1)
                   + tf.cast(fixed_count, tf.float64) * tf.tensordot(ref64, ref64, 1)),
      sum_sq_norm=tf.reduce_sum(tf.square(fixed_centered)),
      count=fixed_count)
  newest = tf.zeros([p], tf.int32)
  before = objective_of_choice(gram, fixed_dot, fixed, cand_losses, newest, valid,
                               smoothness, k)
  round_num = state['round_num']
  round_seed = tf.stack([tf.constant(seed, tf.int32), round_num])
  if selection == 'newest':
    choice = newest
  elif selection == 'random':
    draw = tf.random.stateless_uniform([p], seed=round_seed)
    choice = tf.minimum(tf.cast(draw * tf.cast(num_cands, tf.float32), tf.int32),
                        tf.maximum(num_cands - 1, 0))
    choice = tf.where(valid, choice, 0)
  else:
    batches = random_batches(p, num_batches, round_seed, valid)
    choice = select_models(gram, fixed_dot, fixed, cand_losses, num_cands, valid,
                              batches, smoothness, k)
  in_warmup = round_num < warmup_rounds
  choice = tf.where(in_warmup, newest, choice)
  after = objective_of_choice(gram, fixed_dot, fixed, cand_losses, choice, valid,
                              smoothness, k)
  chosen_slot = tf.gather(cand_slots, choice, batch_dims=1)
  selected = tf.tensor_scatter_nd_update(state['selected'], writers[:, None],
                                         tf.boolean_mask(chosen_slot, valid))
  # The uploaders' new selections are rows of their candidates: add them back.
  chosen_rows = tf.boolean_mask(tf.range(p, dtype=tf.int32) * k + choice, valid)
  selected_sum = unflat(
      fixed_flat + tf.reduce_sum(tf.cast(tf.gather(written_cands, tf.gather(
          cand_rows, chosen_rows)), tf.float64), axis=0), state['selected_sum'])
  # 4. the new global model.
  uploads = tf.reduce_sum(acc['valid'])
  warmup_weight = acc['weight'] if warmup_weighting == 'data_size' else acc['valid']
  upload_mean = tf.nest.map_structure(
      lambda t: tf.math.divide_no_nan(tf.tensordot(warmup_weight, t, axes=1),
                                      tf.reduce_sum(warmup_weight)), acc['models'])
  cached_count = tf.reduce_sum(tf.cast(cached, tf.float32))
  cache_mean = tf.nest.map_structure(
      lambda total, like: tf.cast(tf.math.divide_no_nan(
          total, tf.cast(cached_count, tf.float64)), like.dtype),
      selected_sum, acc['models'])
  model = tf.nest.map_structure(lambda a, b: tf.where(in_warmup, a, b),
                                upload_mean, cache_mean)
  # A round nobody reported in keeps the global model (docs/methods.md, "When clients do
  # not report"): no cache changed, and the model stays exactly what it was.
  has_result = tf.cast(uploads > 0, tf.float32)
  new_state = collections.OrderedDict(cache=cache, losses=losses, sq_norms=sq_norms,
                                      count=count, selected=selected,
                                      selected_sum=selected_sum, round_num=round_num + 1)
  measurements = collections.OrderedDict(
      warmup=tf.cast(in_warmup, tf.float32),
      cached_clients=cached_count,
      uploads=uploads,
      switched=tf.reduce_sum(tf.cast(tf.logical_and(valid, choice > 0), tf.float32)),
      objective_before=tf.cast(before, tf.float32),
      objective_after=tf.cast(after, tf.float32))
  result = collections.OrderedDict(model=model, has_result=has_result)
  return new_state, result, measurements
