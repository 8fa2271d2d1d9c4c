"""FedCDA: the cross-round cache and selection against NumPy brute force, the process end to end.

The NumPy reference keeps each client's cache as a newest-first Python list and evaluates
eq. 8 by materialising every candidate average in float64, independently of the Gram-matrix
evaluation in `tff_algos.aggregators.cross_round_cache`.
"""

import collections
import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos import data
from tests import helpers
from tff_algos import aggregators, execution
from tff_algos.aggregators import cache_selection
from tff_algos.aggregators import cross_round_cache as crc
from tff_algos.client_work import model_delta, model_upload
from tff_algos.fedcda import build_fedcda
from tff_algos.models import make_model_fn, zoo

execution.initialize_runtime()

# A small ModelWeights layout for the pure-TF tests: D = 3 + 4 + 1 = 8.
SHAPES_TRAINABLE = ([3], [2, 2])
SHAPES_NON_TRAINABLE = ([1],)


# --------------------------------------------------------------------------- #
# Independent NumPy reference
# --------------------------------------------------------------------------- #


def np_objective(models, losses, smoothness):
  """Eq. 8 over members given as lists of flat float64 vectors and losses."""
  if not models:
    return 0.0
  w = np.stack(models)
  mean = w.mean(axis=0)
  return (np.mean(losses) + 0.5 * smoothness * np.mean(np.sum(w * w, axis=1))
          - 0.5 * smoothness * float(mean @ mean))


class NpFedCDA:
  """Per client: newest-first list of (flat model, loss), and the age of its selection."""

  def __init__(self, num_clients, cache_size, smoothness, warmup_rounds):
    self.k, self.smoothness, self.warmup = cache_size, smoothness, warmup_rounds
    self.cache = [[] for _ in range(num_clients)]
    self.age = [0] * num_clients
    self.round = 0

  def members(self, exclude):
    return [n for n in range(len(self.cache)) if self.cache[n] and n not in exclude]

  def model(self, n, age=None):
    return self.cache[n][self.age[n] if age is None else age]

  def step(self, uploads, batches, selection='batch_greedy', random_ages=None):
    """uploads: list (by slot) of (client, flat model, loss) or None; batches: lists of slots;
    random_ages: for selection='random', the age each slot draws (from its cache as it is
    after this round's push).

    Returns (result, measurements) like the TF implementation.
    """
    valid = [u is not None for u in uploads]
    for u in uploads:
      if u is not None:
        n, w, loss = u[:3]
        self.cache[n].insert(0, (np.asarray(w, np.float64), float(loss)))
        del self.cache[n][self.k:]
    uploaders = {u[0]: s for s, u in enumerate(uploads) if u is not None}
    fixed = self.members(uploaders)

    def objective(choice):  # choice: slot -> age, over all cached clients
      ms = [self.model(n) for n in fixed]
      ms += [self.cache[uploads[s][0]][choice[s]] for s in range(len(uploads)) if valid[s]]
      return np_objective([m[0] for m in ms], [m[1] for m in ms], self.smoothness)

    newest = [0] * len(uploads)
    before = objective(newest)
    warm = self.round < self.warmup
    choice = list(newest)
    if not warm and selection in ('batch_greedy', 'exact'):
      for b, batch in enumerate(batches):
        # S_b: fixed clients, earlier batches at their new choice, this batch; not later ones
        members = [s for s in batch if valid[s]]
        base = [self.model(n) for n in fixed] + [
            self.cache[uploads[s][0]][choice[s]]
            for bb in batches[:b] for s in bb if valid[s]]
        best, best_val = None, np.inf
        for combo in itertools.product(*[range(len(self.cache[uploads[s][0]]))
                                         for s in members]):
          ms = base + [self.cache[uploads[s][0]][a] for s, a in zip(members, combo)]
          val = np_objective([m[0] for m in ms], [m[1] for m in ms], self.smoothness)
          if val < best_val:  # strict: the first (newest) combination wins ties
            best, best_val = combo, val
        for s, a in zip(members, best or ()):
          choice[s] = a
    if not warm and selection == 'random':
      choice = [a if v else 0 for a, v in zip(random_ages, valid)]
    after = objective(choice)
    for s, u in enumerate(uploads):
      if u is not None:
        self.age[u[0]] = choice[s]
    if warm:  # FedAvg weighted by data size
      kept = [u for u in uploads if u is not None]
      result = np.average([u[1] for u in kept], axis=0, weights=[upload_weight(u) for u in kept])
    else:
      result = np.mean([self.model(n)[0] for n in self.members(())], axis=0)
    self.round += 1
    switched = sum(1 for s in range(len(uploads)) if valid[s] and choice[s] > 0)
    return result, dict(objective_before=before, objective_after=after, switched=switched,
                        cached_clients=len(self.members(())), choice=choice)


# --------------------------------------------------------------------------- #
# The pure TF round against the reference
# --------------------------------------------------------------------------- #


def zero_state(n, k, dtype=tf.float32, clients_per_chunk=3):
  """An empty aggregator state; its cache in chunks of `clients_per_chunk` clients (3 by
  default, so every reference test also runs uploads across several chunks)."""
  cache = tff.learning.models.ModelWeights(
      trainable=[tf.zeros([n, k, *s], dtype) for s in SHAPES_TRAINABLE],
      non_trainable=[tf.zeros([n, k, *s], dtype) for s in SHAPES_NON_TRAINABLE])
  return collections.OrderedDict(
      cache=[tf.convert_to_tensor(c)
             for c in cache_selection.chunked_cache(cache, clients_per_chunk)],
      losses=tf.zeros([n, k]), sq_norms=tf.zeros([n, k], tf.float64),
      count=tf.zeros([n], tf.int32), selected=tf.zeros([n], tf.int32),
      selected_sum=tff.learning.models.ModelWeights(
          trainable=[tf.zeros(s, tf.float64) for s in SHAPES_TRAINABLE],
          non_trainable=[tf.zeros(s, tf.float64) for s in SHAPES_NON_TRAINABLE]),
      round_num=tf.constant(0, tf.int32))


def unflatten(vec):
  parts, i = [], 0
  for s in SHAPES_TRAINABLE + SHAPES_NON_TRAINABLE:
    size = int(np.prod(s))
    parts.append(np.asarray(vec[i:i + size], np.float32).reshape(s))
    i += size
  return parts


def flat(weights):
  return np.concatenate([np.ravel(t) for t in tf.nest.flatten(weights)])


def upload_weight(upload):
  """An upload is (client, flat model, loss) or (client, flat model, loss, example count)."""
  return upload[3] if len(upload) > 3 else 1.0


def accumulator(uploads, p):
  """The process's [P, ...] accumulator built directly from (client, vec, loss) by slot."""
  parts = [np.zeros([p, *s], np.float32) for s in SHAPES_TRAINABLE + SHAPES_NON_TRAINABLE]
  index = np.zeros([p], np.int32)
  loss, valid, weight = (np.zeros([p], np.float32) for _ in range(3))
  for s, u in enumerate(uploads):
    if u is None:
      continue
    for part, value in zip(parts, unflatten(u[1])):
      part[s] = value
    index[s], loss[s], valid[s], weight[s] = u[0], u[2], 1.0, upload_weight(u)
  nt = len(SHAPES_TRAINABLE)
  return collections.OrderedDict(
      models=tff.learning.models.ModelWeights(trainable=parts[:nt], non_trainable=parts[nt:]),
      client_index=index, loss=loss, valid=valid, weight=weight)


def random_uploads(rng, n, p, dropout):
  clients = rng.choice(n, size=p, replace=False)
  out = []
  for c in clients:
    if rng.uniform() < dropout:
      out.append(None)
    else:
      out.append((int(c), rng.normal(size=8) * rng.uniform(0.5, 2.0), rng.uniform(0.0, 2.0),
                  float(rng.integers(1, 100))))  # (client, model, loss, example count)
  return out


CONFIGS = [
    # (N, P, K, B, selection, dropout)
    (8, 4, 3, 3, 'batch_greedy', 0.0),
    (8, 4, 3, 1, 'batch_greedy', 0.0),
    (6, 6, 2, 2, 'batch_greedy', 0.0),   # every client participates: no fixed clients
    (10, 5, 3, 2, 'batch_greedy', 0.2),  # some slots without an upload
    (7, 3, 4, 3, 'batch_greedy', 0.0),
    (8, 4, 3, 1, 'exact', 0.0),
    (6, 5, 2, 1, 'exact', 0.2),
    (8, 4, 3, 3, 'newest', 0.0),
]


@pytest.mark.parametrize('n,p,k,b,selection,dropout', CONFIGS)
def test_cache_round_matches_numpy_brute_force(n, p, k, b, selection, dropout):
  rng = np.random.default_rng([n, p, k, b])
  smoothness, warmup, seed = 1.0 + rng.uniform(), 2, 7
  state = zero_state(n, k)
  ref = NpFedCDA(n, k, smoothness, warmup)
  nb = 1 if selection == 'exact' else b
  for t in range(7):
    uploads = random_uploads(rng, n, p, dropout)
    batches = [list(np.asarray(x)) for x in cache_selection.random_batches(
        p, nb, tf.constant([seed, t], tf.int32), [u is not None for u in uploads])]
    state, result, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=nb, warmup_rounds=warmup, smoothness=smoothness, selection=selection,
        seed=seed)
    want, want_m = ref.step(uploads, batches, selection)
    np.testing.assert_allclose(flat(result['model']), want, rtol=1e-5, atol=1e-5)
    assert float(result['has_result']) == 1.0
    for key in ('objective_before', 'objective_after'):
      np.testing.assert_allclose(float(m[key]), want_m[key], rtol=1e-4, atol=1e-4)
    assert float(m['switched']) == want_m['switched']
    assert float(m['cached_clients']) == want_m['cached_clients']
    assert float(m['warmup']) == float(t < warmup)
    # the selection state holds exactly what the reference selected
    count, selected = state['count'].numpy(), state['selected'].numpy()
    for c in range(n):
      if ref.cache[c]:
        assert (count[c] - 1 - selected[c]) % k == ref.age[c]
  assert int(state['round_num']) == 7


def random_ages(ref, uploads, seed, round_num):
  """The ages 'random' selection draws, drawn as the aggregator does (one stateless uniform
  per slot from (seed, round)) over each uploader's cache as it is after this round's push."""
  draw = tf.random.stateless_uniform([len(uploads)],
                                     seed=tf.constant([seed, round_num], tf.int32)).numpy()
  ages = []
  for s, u in enumerate(uploads):
    held = 0 if u is None else min(len(ref.cache[u[0]]) + 1, ref.k)
    ages.append(min(int(draw[s] * np.float32(held)), max(held - 1, 0)))
  return ages


RUNNING_SUM_CONFIGS = [
    # (K, selection, cache dtype)
    (2, 'batch_greedy', 'float32'),
    (3, 'batch_greedy', 'float32'),
    (3, 'exact', 'float32'),
    (2, 'newest', 'float32'),
    (3, 'random', 'float32'),
    (3, 'batch_greedy', 'bfloat16'),
]


@pytest.mark.parametrize('k,selection,cache_dtype', RUNNING_SUM_CONFIGS)
def test_running_sum_over_many_rounds_is_the_mean_recomputed_from_scratch(k, selection,
                                                                          cache_dtype):
  """40 rounds of N = 7, P = 3: clients come back often, so FIFO pushes evict models, some of
  them selected ones. Each round the reference recomputes the mean over every cached
  client's selected model; the aggregator's result must equal it, and its running
  `selected_sum` must be the sum of those models to float64 precision (a float32 sum, or an
  evicted selection never subtracted, would fail 1e-12)."""
  n, p, warmup, seed = 7, 3, 4, 5
  np_dtype = tf.as_dtype(cache_dtype).as_numpy_dtype
  as_cached = lambda vec: np.asarray(vec, np.float32).astype(np_dtype).astype(np.float64)
  nb = 1 if selection == 'exact' else 2
  rng = np.random.default_rng([k, nb, len(selection), len(cache_dtype)])
  state = zero_state(n, k, tf.as_dtype(cache_dtype))
  ref = NpFedCDA(n, k, 1.0, warmup)
  evicted_selected = switched = 0
  for t in range(40):
    uploads = random_uploads(rng, n, p, 0.0)
    if t % 6 == 5:
      uploads[-1] = None  # a slot without an upload: that client keeps its selection
    valid = [u is not None for u in uploads]
    batches = [list(np.asarray(x)) for x in cache_selection.random_batches(
        p, nb, tf.constant([seed, t], tf.int32), valid)]
    ages = random_ages(ref, uploads, seed, t)
    evicted_selected += sum(1 for u in uploads if u is not None
                            and len(ref.cache[u[0]]) == k and ref.age[u[0]] == k - 1)
    state, result, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=nb, warmup_rounds=warmup, smoothness=1.0, selection=selection, seed=seed)
    want, want_m = ref.step([None if u is None else (u[0], as_cached(u[1]), *u[2:])
                             for u in uploads], batches, selection, ages)
    if t < warmup:  # FedAvg over the uploads as they arrive (float32), not the cache
      kept = [u for u in uploads if u is not None]
      want = np.average([as_cached(u[1]) if cache_dtype == 'float32' else
                         np.float32(u[1]) for u in kept], 0, weights=[u[3] for u in kept])
    np.testing.assert_allclose(flat(result['model']), want, rtol=1e-5, atol=1e-6)
    assert float(result['has_result']) == 1.0
    assert float(m['switched']) == want_m['switched']
    switched += want_m['switched']
    count, selected = state['count'].numpy(), state['selected'].numpy()
    cached = [c for c in range(n) if ref.cache[c]]
    for c in cached:
      assert (count[c] - 1 - selected[c]) % k == ref.age[c], (t, c)
    np.testing.assert_allclose(flat(state['selected_sum']),
                               np.sum([ref.model(c)[0] for c in cached], axis=0),
                               rtol=1e-12, atol=1e-12)
  if selection != 'newest':  # the cases this test is for did happen
    assert switched > 0 and evicted_selected > 0, (switched, evicted_selected)


@pytest.mark.parametrize('cache_dtype', ['float16', 'bfloat16'])
def test_lower_precision_cache_is_the_reference_on_rounded_uploads(cache_dtype):
  # The cache holds the uploads rounded to its dtype; selection, objective and the global
  # model are then exactly the float64 reference's on those rounded models. The warmup mean
  # is over the uploads as they arrive (float32).
  n, p, k, b, warmup = 8, 4, 3, 2, 2
  np_dtype = tf.as_dtype(cache_dtype).as_numpy_dtype
  rounded = lambda vec: np.asarray(vec, np.float32).astype(np_dtype).astype(np.float64)
  rng = np.random.default_rng(11)
  state = zero_state(n, k, tf.as_dtype(cache_dtype))
  ref = NpFedCDA(n, k, 1.0, warmup)
  switched = 0
  for t in range(8):
    uploads = random_uploads(rng, n, p, 0.0)
    batches = [list(np.asarray(x)) for x in cache_selection.random_batches(
        p, b, tf.constant([3, t], tf.int32), [True] * p)]
    state, result, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=b, warmup_rounds=warmup, smoothness=1.0, selection='batch_greedy', seed=3)
    assert {t.dtype for t in tf.nest.flatten(state['cache'])} == {tf.as_dtype(cache_dtype)}
    want, want_m = ref.step([(c, rounded(w), loss, count) for c, w, loss, count in uploads],
                            batches)
    if t < warmup:
      want = np.average([u[1] for u in uploads], 0, weights=[u[3] for u in uploads])
    np.testing.assert_allclose(flat(result['model']), want, rtol=1e-5, atol=1e-5)
    for key in ('objective_before', 'objective_after'):
      np.testing.assert_allclose(float(m[key]), want_m[key], rtol=1e-4, atol=1e-4)
    assert float(m['switched']) == want_m['switched']
    switched += want_m['switched']
    count, selected = state['count'].numpy(), state['selected'].numpy()
    for c in range(n):
      if ref.cache[c]:
        assert (count[c] - 1 - selected[c]) % k == ref.age[c]
        newest = cache_selection.stacked_cache(state['cache'], state['selected_sum']).trainable[0][
            c, (count[c] - 1) % k]
        np.testing.assert_array_equal(newest.astype(np.float64), ref.cache[c][0][0][:3])
  assert switched > 0  # the selection did pick older models from the rounded cache


@pytest.mark.parametrize('cache_dtype', ['float16', 'bfloat16'])
def test_lower_precision_cache_halves_the_state_inside_tff(cache_dtype):
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, s) for s in SHAPES_TRAINABLE],
      non_trainable=[tff.TensorType(np.float32, s) for s in SHAPES_NON_TRAINABLE]))
  n, p, k = 6, 3, 2
  proc = crc.build_cross_round_cache_process(weights_type, n, p, cache_size=k, num_batches=1,
                                             warmup_rounds=0, cache_dtype=cache_dtype)
  state = proc.initialize()
  size = sum(np.asarray(t).nbytes for t in tf.nest.flatten(state))
  assert size == crc.state_size_bytes(n, k, 8, cache_dtype)
  assert (cache_selection.cache_size_bytes(n, k, 8, cache_dtype) * 2
          == cache_selection.cache_size_bytes(n, k, 8))
  rng = np.random.default_rng(5)
  uploads = random_uploads(rng, n, p, 0.0)
  values = [collections.OrderedDict(
      client_index=np.int32(c), slot=np.int32(s),
      model=tff.learning.models.ModelWeights(trainable=unflatten(vec)[:2],
                                             non_trainable=unflatten(vec)[2:]),
      last_epoch_loss=np.float32(loss)) for s, (c, vec, loss, _) in enumerate(uploads)]
  out = proc.next(state, values, [np.float32(u[3]) for u in uploads])
  # no warmup: the global model is the uniform mean of the (rounded) cached uploads
  np_dtype = tf.as_dtype(cache_dtype).as_numpy_dtype
  want = np.mean([np.asarray(u[1], np.float32).astype(np_dtype).astype(np.float64)
                  for u in uploads], 0)
  np.testing.assert_allclose(flat(out.result['model']), want, rtol=1e-6, atol=1e-6)
  assert {np.asarray(c).dtype for c in out.state['cache']} == {np.dtype(np_dtype)}
  with pytest.raises(ValueError, match='cache_dtype'):
    crc.validate_options(n, p, k, 1, 1, 1.0, 'exact', 'data_size', 'float64')
  with pytest.raises(ValueError, match='float16'):  # the limit's message names the option
    crc.build_cross_round_cache_process(weights_type, 10**7, 3, max_cache_gib=1.0)


def test_uniform_warmup_weighting_is_the_plain_mean():
  n, p, k = 6, 3, 2
  rng = np.random.default_rng(2)
  uploads = random_uploads(rng, n, p, 0.0)
  results = {}
  for weighting in constants.FEDCDA_WARMUP_WEIGHTINGS:
    _, res, _ = cache_selection.cache_round(
        zero_state(n, k), accumulator(uploads, p), num_clients=n, clients_per_round=p,
        cache_size=k, num_batches=1, warmup_rounds=1, smoothness=1.0, selection='exact',
        seed=0, warmup_weighting=weighting)
    results[weighting] = flat(res['model'])
  np.testing.assert_allclose(results['uniform'], np.mean([u[1] for u in uploads], 0),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      results['data_size'],
      np.average([u[1] for u in uploads], 0, weights=[u[3] for u in uploads]),
      rtol=1e-5, atol=1e-6)
  assert not np.allclose(results['uniform'], results['data_size'])
  with pytest.raises(ValueError, match='warmup_weighting'):
    crc.validate_options(n, p, k, 1, 1, 1.0, 'exact', 'by_loss')


def test_selection_is_exact_for_models_far_from_the_origin():
  """Real models have large norms and eq. 8 is a small difference of large sums of squares:
  with a common offset of 300 per weight (‖w‖² ≈ 7e5) and differences of 0.05, float32
  arithmetic would pick at random; the float64 evaluation matches the brute force."""
  n, p, k = 8, 4, 3
  rng = np.random.default_rng(11)
  state = zero_state(n, k)
  ref = NpFedCDA(n, k, 1.0, 0)
  for t in range(6):
    uploads = []
    for c in rng.choice(n, size=p, replace=False):
      vec = (300.0 + 0.05 * rng.normal(size=8)).astype(np.float32).astype(np.float64)
      uploads.append((int(c), vec, 1e-4 * rng.uniform()))
    batches = [list(np.asarray(x)) for x in cache_selection.random_batches(
        p, 1, tf.constant([0, t], tf.int32), [True] * p)]
    state, _, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=1, warmup_rounds=0, smoothness=1.0, selection='exact', seed=0)
    _, want = ref.step(uploads, batches, 'exact')
    count, selected = state['count'].numpy(), state['selected'].numpy()
    for s, (c, *_) in enumerate(uploads):
      assert (count[c] - 1 - selected[c]) % k == want['choice'][s], t


def test_selection_at_a_real_model_size_is_the_float64_brute_force():
  """At FedAvg's CNN's size (D = 1,663,370) the candidates' Gram matrix is taken in float32
  around the uploads' mean: with weights spread like a real model's (0.05) and clients
  differing by 3e-3, every choice and the new global model are those of the float64 brute
  force (which materialises every candidate average), and the objective is within 2e-5 of
  it (float32 accumulation over 1.66M terms: 1.1e-5 measured)."""
  n, p, k, d = 5, 3, 3, 1663370
  rng = np.random.default_rng(5)
  base = rng.normal(0.0, 0.05, d)
  offsets = rng.normal(0.0, 3e-3, (n, d))
  state = collections.OrderedDict(
      cache=[tf.zeros([1, k, d])] * n, losses=tf.zeros([n, k]),
      sq_norms=tf.zeros([n, k], tf.float64), count=tf.zeros([n], tf.int32),
      selected=tf.zeros([n], tf.int32),
      selected_sum=tff.learning.models.ModelWeights(trainable=[tf.zeros([d], tf.float64)],
                                                    non_trainable=[]),
      round_num=tf.constant(0, tf.int32))
  ref = NpFedCDA(n, k, 1.0, 0)
  for t in range(4):
    clients = rng.choice(n, size=p, replace=False)
    uploads = [(int(c), (base + offsets[c] + rng.normal(0.0, 1e-3, d)).astype(np.float32),
                rng.uniform(0.0, 1.0)) for c in clients]
    acc = collections.OrderedDict(
        models=tff.learning.models.ModelWeights(
            trainable=[np.stack([u[1] for u in uploads])], non_trainable=[]),
        client_index=clients.astype(np.int32), loss=np.float32([u[2] for u in uploads]),
        valid=np.ones([p], np.float32), weight=np.ones([p], np.float32))
    state, result, m = cache_selection.cache_round(
        state, acc, num_clients=n, clients_per_round=p, cache_size=k, num_batches=1,
        warmup_rounds=0, smoothness=1.0, selection='exact', seed=0)
    want, want_m = ref.step([(c, w.astype(np.float64), loss) for c, w, loss in uploads],
                            [list(range(p))], 'exact')
    count, selected = state['count'].numpy(), state['selected'].numpy()
    assert [(count[c] - 1 - selected[c]) % k for c in clients] == want_m['choice'], t
    np.testing.assert_allclose(float(m['objective_after']), want_m['objective_after'],
                               rtol=2e-5)
    np.testing.assert_allclose(result['model'].trainable[0], want, rtol=0, atol=1e-7)
  assert sum(want_m['choice']) > 0   # the last round did choose older models


def test_exact_equals_batch_greedy_with_one_batch_and_is_the_global_minimum():
  n, p, k = 9, 4, 3
  rng = np.random.default_rng(3)
  for trial in range(3):
    states = {s: zero_state(n, k) for s in ('exact', 'batch_greedy')}
    for t in range(4):
      uploads = random_uploads(rng, n, p, 0.0)
      outs = {}
      for sel in states:
        states[sel], res, m = cache_selection.cache_round(
            states[sel], accumulator(uploads, p), num_clients=n, clients_per_round=p,
            cache_size=k, num_batches=1, warmup_rounds=0, smoothness=1.0, selection=sel,
            seed=trial)
        outs[sel] = (flat(res['model']), float(m['objective_after']),
                     float(m['objective_before']))
      np.testing.assert_array_equal(outs['exact'][0], outs['batch_greedy'][0])
      assert outs['exact'][1] == outs['batch_greedy'][1]
      assert outs['exact'][1] <= outs['exact'][2] + 1e-6  # never worse than all-newest


def test_one_batch_never_ends_above_all_newest_and_does_choose_older_models():
  """With B = 1 the search covers all-newest, so the objective can only go down. (With B > 1
  the final objective may exceed all-newest: each J_b leaves later batches out.)"""
  n, p, k = 12, 6, 3
  rng = np.random.default_rng(5)
  state = zero_state(n, k)
  improved = 0
  for t in range(8):
    uploads = random_uploads(rng, n, p, 0.0)
    state, _, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=1, warmup_rounds=0, smoothness=1.0, selection='batch_greedy', seed=0)
    assert float(m['objective_after']) <= float(m['objective_before']) + 1e-5
    improved += float(m['objective_after']) < float(m['objective_before']) - 1e-6
  assert improved > 0  # the search does choose older models on random data


def test_fifo_cache_keeps_the_newest_k_in_age_order():
  n, p, k = 3, 1, 3
  state = zero_state(n, k)
  vecs = [np.full(8, float(i + 1)) for i in range(5)]
  for i, v in enumerate(vecs):
    state, _, _ = cache_selection.cache_round(
        state, accumulator([(1, v, 10.0 + i)], p), num_clients=n, clients_per_round=p,
        cache_size=k, num_batches=1, warmup_rounds=100, smoothness=1.0,
        selection='batch_greedy', seed=0)
  count = state['count'].numpy()
  assert list(count) == [0, 5, 0]
  slots = cache_selection.candidate_slots(count, k).numpy()[1]  # newest first
  stacked = cache_selection.stacked_cache(state['cache'], state['selected_sum'])
  cache_flat = np.concatenate(
      [np.reshape(t[1], [k, -1]) for t in tf.nest.flatten(stacked)], axis=1)
  for age, slot in enumerate(slots):
    np.testing.assert_array_equal(cache_flat[slot], vecs[4 - age])
    assert state['losses'].numpy()[1, slot] == 14.0 - age
    np.testing.assert_allclose(state['sq_norms'].numpy()[1, slot], 8 * (5.0 - age) ** 2)
  # other clients' rows were never written
  for t in tf.nest.flatten(stacked):
    assert not np.any(t[[0, 2]])


def test_cold_clients_are_left_out_of_the_mean():
  n, p, k = 5, 2, 2
  state = zero_state(n, k)
  a, b = np.arange(8.0), -2.0 * np.ones(8)
  state, res, m = cache_selection.cache_round(
      state, accumulator([(3, a, 1.0), (0, b, 1.0)], p), num_clients=n, clients_per_round=p,
      cache_size=k, num_batches=1, warmup_rounds=0, smoothness=1.0, selection='newest',
      seed=0)
  np.testing.assert_allclose(flat(res['model']), (a + b) / 2)
  assert float(m['cached_clients']) == 2.0
  # next round client 3 alone uploads: the mean still counts client 0's cached model
  c = np.ones(8)
  state, res, m = cache_selection.cache_round(
      state, accumulator([(3, c, 1.0), None], p), num_clients=n, clients_per_round=p,
      cache_size=k, num_batches=1, warmup_rounds=0, smoothness=1.0, selection='newest',
      seed=0)
  np.testing.assert_allclose(flat(res['model']), (c + b) / 2)
  assert float(m['uploads']) == 1.0


def test_no_upload_yet_has_no_result():
  state = zero_state(4, 2)
  _, res, m = cache_selection.cache_round(
      state, accumulator([None, None], 2), num_clients=4, clients_per_round=2, cache_size=2,
      num_batches=1, warmup_rounds=1, smoothness=1.0, selection='batch_greedy', seed=0)
  assert float(res['has_result']) == 0.0
  assert np.all(np.isfinite(flat(res['model'])))


def test_random_batches_partition_the_slots():
  for p, b in ((4, 3), (7, 3), (2, 3), (6, 1), (9, 4)):
    sizes = cache_selection.batch_sizes(p, b)
    assert sum(sizes) == p and max(sizes) - min(sizes) <= 1 and len(sizes) == b
    batches = cache_selection.random_batches(p, b, tf.constant([1, 2], tf.int32))
    assert [int(x.shape[0]) for x in batches] == sizes
    assert sorted(np.concatenate([x.numpy() for x in batches]).tolist()) == list(range(p))
  # valid slots are dealt round-robin first: their counts per batch differ by at most one
  valid = np.array([True, False, True, False, True, True, False])
  for t in range(10):
    batches = cache_selection.random_batches(7, 3, tf.constant([3, t], tf.int32), valid)
    counts = [int(valid[x.numpy()].sum()) for x in batches]
    assert max(counts) - min(counts) <= 1, counts
  # the split changes with the round
  splits = {tuple(np.concatenate([x.numpy() for x in cache_selection.random_batches(
      6, 3, tf.constant([0, t], tf.int32))])) for t in range(10)}
  assert len(splits) > 1


def test_random_selection_picks_cached_models_only():
  n, p, k = 6, 3, 3
  rng = np.random.default_rng(0)
  state = zero_state(n, k)
  picked = set()
  for t in range(10):
    uploads = random_uploads(rng, n, p, 0.0)
    state, _, m = cache_selection.cache_round(
        state, accumulator(uploads, p), num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=1, warmup_rounds=0, smoothness=1.0, selection='random', seed=0)
    count, selected = state['count'].numpy(), state['selected'].numpy()
    for c, *_ in uploads:
      age = (count[c] - 1 - selected[c]) % k
      assert age < min(count[c], k)
      picked.add(int(age))
  assert picked == {0, 1, 2}


def test_state_size_formula_and_memory_limit():
  weights_type = tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [1000, 100])], non_trainable=[])
  weights_type = tff.types.to_type(weights_type)
  assert crc.num_weights(weights_type) == 100_000
  assert cache_selection.cache_size_bytes(20, 3, 100_000) == 4 * 20 * 3 * 100_000
  with pytest.raises(ValueError, match='GiB'):
    crc.build_cross_round_cache_process(weights_type, 1000, 10, cache_size=3,
                                        max_cache_gib=1.0)
  for bad in (dict(cache_size=0), dict(num_batches=0), dict(warmup_rounds=-1),
              dict(smoothness=-1.0), dict(selection='best')):
    with pytest.raises(ValueError):
      crc.build_cross_round_cache_process(weights_type, 10, 4, **bad)
  with pytest.raises(ValueError, match='combinations'):
    crc.build_cross_round_cache_process(weights_type, 40, 30, cache_size=3,
                                        selection='exact')
  with pytest.raises(ValueError, match='clients_per_round'):
    crc.build_cross_round_cache_process(weights_type, 4, 5)


# --------------------------------------------------------------------------- #
# The AggregationProcess and the LearningProcess
# --------------------------------------------------------------------------- #

MODEL_FN = make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
BATCH = 16


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=0.1)


def test_aggregation_process_on_its_own():
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, s) for s in SHAPES_TRAINABLE],
      non_trainable=[tff.TensorType(np.float32, s) for s in SHAPES_NON_TRAINABLE]))
  n, p, k = 6, 3, 2
  proc = crc.build_cross_round_cache_process(weights_type, n, p, cache_size=k, num_batches=2,
                                             warmup_rounds=1, seed=4)
  assert proc.is_weighted
  state = proc.initialize()
  size = sum(np.asarray(t).nbytes for t in tf.nest.flatten(state))
  assert size == crc.state_size_bytes(n, k, 8)
  ref = NpFedCDA(n, k, 1.0, 1)
  rng = np.random.default_rng(1)
  for t in range(4):
    uploads = random_uploads(rng, n, p, 0.0)
    values, weights = [], []
    for s, (c, vec, loss, count) in enumerate(uploads):
      parts = unflatten(vec)
      values.append(collections.OrderedDict(
          client_index=np.int32(c), slot=np.int32(s),
          model=tff.learning.models.ModelWeights(trainable=parts[:2], non_trainable=parts[2:]),
          last_epoch_loss=np.float32(loss)))
      weights.append(np.float32(count))
    # a diverged client (weight 0) in slot 2 on round 2: it must not enter the cache
    if t == 2:
      weights[2] = np.float32(0.0)
      uploads[2] = None
    order = rng.permutation(p)  # clients arrive in any order
    out = proc.next(state, [values[i] for i in order], [weights[i] for i in order])
    state = out.state
    batches = [list(np.asarray(x)) for x in cache_selection.random_batches(
        p, 2, tf.constant([4, t], tf.int32), [u is not None for u in uploads])]
    want, want_m = ref.step(uploads, batches)
    np.testing.assert_allclose(flat(out.result['model']), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.measurements['objective_after'], want_m['objective_after'],
                               rtol=1e-4, atol=1e-4)


@pytest.fixture(scope='module')
def fed():
  return data.federate(data.load_digits(), data.DirichletPartitioner(8, 0.5, seed=0))


@pytest.fixture(scope='module')
def fedcda():
  return build_fedcda(MODEL_FN, sgd(), BATCH, 8, 4, warmup_rounds=2, cache_size=2,
                      num_batches=2)


def test_type_signature(fedcda):
  sig = fedcda.next.type_signature
  assert str(sig.parameter[1]) == (
      '{<x=float32[?,8,8,1],y=int32[?],order=int32[?,?],index=int32,slot=int32,work=float32>*}@CLIENTS')
  agg = sig.result.state.member.aggregator
  # The tiny CNN's 8 clients' caches are under MIN_CHUNK_BYTES: one chunk of [N, K, D].
  assert [str(c) for c in agg.cache] == [f'float32[8,2,{crc.num_weights(agg.selected_sum)}]']
  assert str(agg.losses) == 'float32[8,2]'
  assert tff.structure.name_list(sig.result.metrics.member.aggregator) == [
      'warmup', 'cached_clients', 'uploads', 'switched', 'objective_before',
      'objective_after']


@pytest.mark.parametrize('weighting', constants.FEDCDA_WARMUP_WEIGHTINGS)
def test_warmup_equals_tff_fedavg(fedcda, fed, weighting):
  """The warmup is TFF's FedAvg: weighted by example counts by default (the paper), or
  uniformly with warmup_weighting='uniform'."""
  client_weighting = dict(data_size=tff.learning.ClientWeighting.NUM_EXAMPLES,
                          uniform=tff.learning.ClientWeighting.UNIFORM)[weighting]
  tff_avg = tff.learning.algorithms.build_weighted_fed_avg(
      MODEL_FN, client_optimizer_fn=sgd(),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      client_weighting=client_weighting)
  if weighting != 'data_size':
    fedcda = build_fedcda(MODEL_FN, sgd(), BATCH, 8, 4, warmup_rounds=2, cache_size=2,
                          num_batches=2, warmup_weighting=weighting)
  ours, theirs = fedcda.initialize(), tff_avg.initialize()
  for t in range(2):
    _, inputs = data.round_inputs(fed, t, 4, 2, seed=3)
    ours = fedcda.next(ours, [[x] for x in inputs]).state
    theirs = tff_avg.next(theirs, [helpers.as_tff_dataset(x, BATCH) for x in inputs]).state
    for a, b in zip(fedcda.get_model_weights(ours).trainable,
                    tff_avg.get_model_weights(theirs).trainable):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_end_to_end_learns_and_checkpoint_roundtrip(fedcda, fed, tmp_path):
  state = fedcda.initialize()
  keras_model = zoo.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  switched = 0.0
  for t in range(8):
    _, inputs = data.round_inputs(fed, t, 4, 2, seed=0)
    out = fedcda.next(state, [[x] for x in inputs])
    state = out.state
    switched += out.metrics['aggregator']['switched']
    assert out.metrics['aggregator']['warmup'] == float(t < 2)
  fedcda.get_model_weights(state).assign_weights_to(keras_model)
  acc = (keras_model.predict(fed.x_test, verbose=0).argmax(-1) == fed.y_test).mean()
  assert acc > 0.5, acc
  agg = state.aggregator
  assert int(agg['round_num']) == 8
  assert np.all(agg['count'] <= 8) and np.sum(agg['count']) == 32
  # the global model is the uniform mean of the cached clients' selected models
  count, sel = np.asarray(agg['count']), np.asarray(agg['selected'])
  cached = np.flatnonzero(count > 0)
  stacked = cache_selection.stacked_cache(agg['cache'], agg['selected_sum'])
  for g, c in zip(fedcda.get_model_weights(state).trainable, stacked.trainable):
    np.testing.assert_allclose(g, np.mean([np.asarray(c)[i, sel[i]] for i in cached], 0),
                               rtol=1e-5, atol=1e-6)

  manager = tff.program.FileProgramStateManager(str(tmp_path))
  helpers.run_async(manager.save(state, 8))
  restored, version = helpers.run_async(manager.load_latest(fedcda.initialize()))
  assert version == 8
  for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(restored)):
    np.testing.assert_array_equal(a, b)
  _, inputs = data.round_inputs(fed, 8, 4, 2, seed=0)
  out_a = fedcda.next(state, [[x] for x in inputs])
  out_b = fedcda.next(restored, [[x] for x in inputs])
  for a, b in zip(tf.nest.flatten(out_a.state), tf.nest.flatten(out_b.state)):
    np.testing.assert_array_equal(a, b)


def test_the_exported_stage_composes_into_fedcda(fedcda, fed):
  """A user's own compose_learning_process from the public parts (the stage and its
  replace finalizer from tff_algos.aggregators, TFF's broadcast) is build_fedcda."""
  initial = model_delta.initial_model_weights_fn(MODEL_FN)
  weights_type = initial.type_signature.result
  own = tff.learning.templates.compose_learning_process(
      initial, tff.learning.templates.build_broadcast_process(weights_type),
      model_upload.build_model_upload_client_work(MODEL_FN, sgd(), BATCH),
      aggregators.build_cross_round_cache_process(weights_type, 8, 4, cache_size=2,
                                             num_batches=2, warmup_rounds=2),
      aggregators.build_replace_finalizer(weights_type))
  states = [own.initialize(), fedcda.initialize()]
  for r in range(3):  # two warmup rounds, then one selecting round
    _, inputs = data.round_inputs(fed, r, 4, 1, seed=0)
    states = [p.next(s, [[x] for x in inputs]).state for p, s in zip((own, fedcda), states)]
  for a, b in zip(tf.nest.flatten(own.get_model_weights(states[0])),
                  tf.nest.flatten(fedcda.get_model_weights(states[1]))):
    np.testing.assert_array_equal(a, b)


def test_a_round_of_more_clients_than_clients_per_round_names_the_fix(fedcda, fed):
  _, inputs = data.round_inputs(fed, 0, 5, 1, seed=0)  # slots 0..4 for P = 4
  with pytest.raises(Exception, match=r'outside \[0, clients_per_round=4\).*at most 4'):
    fedcda.next(fedcda.initialize(), [[x] for x in inputs])


def test_duplicate_slots_fail_the_round():
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [2])], non_trainable=[]))
  proc = crc.build_cross_round_cache_process(weights_type, 4, 2, cache_size=2, num_batches=1)
  value = collections.OrderedDict(
      client_index=np.int32(1), slot=np.int32(0),
      model=tff.learning.models.ModelWeights(trainable=[np.ones(2, np.float32)],
                                             non_trainable=[]),
      last_epoch_loss=np.float32(1.0))
  other = collections.OrderedDict(value, client_index=np.int32(2))
  with pytest.raises(Exception, match='same slot'):
    proc.next(proc.initialize(), [value, other], [np.float32(1.0), np.float32(1.0)])
  past = collections.OrderedDict(other, slot=np.int32(2))  # a third client, P = 2
  with pytest.raises(Exception, match=r'outside \[0, clients_per_round=2\).*at most 2'):
    proc.next(proc.initialize(), [value, past], [np.float32(1.0), np.float32(1.0)])
  # one client in two slots would take its previous selection out of selected_sum twice
  again = collections.OrderedDict(value, slot=np.int32(1))
  with pytest.raises(Exception, match='same client_index'):
    proc.next(proc.initialize(), [value, again], [np.float32(1.0), np.float32(1.0)])


def test_builder_refuses_a_cache_above_the_limit():
  with pytest.raises(ValueError, match='GiB'):
    build_fedcda(MODEL_FN, sgd(), BATCH, 10**6, 4, cache_size=3, max_cache_gib=0.5)
