"""CADIS's aggregation factory (tff_algos/aggregators/clustered_aggregation.py): the
accumulator, validation, the keyed and anonymous processes, the authors' code and a TFF
factory on the deltas, against independent NumPy references."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.cadis_helpers import NpCadis, check_round, clustered_deltas, np_cos
from tff_algos.aggregators import clustered_aggregation as cla
from tff_algos.client_work import model_delta

pytestmark = pytest.mark.usefixtures('runtime')


def test_accumulator_append_and_merge_equal_sequential():
  rng = np.random.default_rng(0)
  specs = [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([3], tf.float32)]
  uploads = [(np.int32(i), np.float32(rng.uniform(1, 5)),
              [rng.normal(size=[2, 3]).astype(np.float32),
               rng.normal(size=[3]).astype(np.float32)]) for i in (7, 2, 9, 4, 0)]
  cap = 5

  def fold(items):
    acc = cla.empty_accumulator(cap, specs)
    for idx, w, d in items:
      acc = cla.append_upload(acc, idx, w, d, cap)
    return acc

  whole = fold(uploads)
  for split in range(len(uploads) + 1):
    merged = cla.merge_accumulators(fold(uploads[:split]), fold(uploads[split:]), cap, specs)
    for key in ('count', 'index', 'weight'):
      np.testing.assert_array_equal(np.asarray(whole[key]), np.asarray(merged[key]))
    for a, b in zip(tf.nest.flatten(cla.stacked_deltas(whole, specs)),
                    tf.nest.flatten(cla.stacked_deltas(merged, specs))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for j in range(len(specs)):   # the rows in arrival order, as uploaded
    np.testing.assert_array_equal(cla.stacked_deltas(whole, specs)[j].numpy(),
                                  np.stack([u[2][j] for u in uploads]))
  assert int(whole['count']) == 5
  np.testing.assert_array_equal(whole['index'].numpy(), [7, 2, 9, 4, 0])
  # overflow: rows stay, the count tells
  over = cla.append_upload(whole, np.int32(3), np.float32(1.0), uploads[0][2], cap)
  assert int(over['count']) == 6
  np.testing.assert_array_equal(over['index'].numpy(), whole['index'].numpy())


def test_oracle_closure_needs_the_true_clusters():
  with pytest.raises(ValueError, match="closure='oracle' takes .C_i. from the true clusters"):
    cla.ClusteredAggregator(12, 5, closure='oracle')
  cla.ClusteredAggregator(3, 2, closure='oracle', true_clusters=[0, 0, 1])


def test_factory_validation():
  bad = [dict(threshold=1.0), dict(threshold=0.99, threshold_max=0.98), dict(closure='x'),
         dict(similarity_layer='weights'), dict(true_clusters=[0, 1]),
         dict(true_clusters=np.zeros([6, 1], int)), dict(threshold_growth=0.9),
         dict(transitive_half_width=0.0), dict(similarity_index=1.5)]
  for kwargs in bad:
    with pytest.raises(ValueError):
      cla.ClusteredAggregator(6, 4, **kwargs)
  for n, c in ((0, 1), (4, 5), (6, 0)):
    with pytest.raises(ValueError):
      cla.ClusteredAggregator(n, c)
  factory = cla.ClusteredAggregator(6, 4)
  weird = tff.StructWithPythonType([tff.TensorType(np.float32, [3, 2])], list)
  with pytest.raises(ValueError, match='similarity_layer'):  # no rank-1 bias at the end
    factory.create(model_delta.keyed_update_type(weird), tff.TensorType(np.float32))
  with pytest.raises(TypeError):
    factory.create(model_delta.keyed_update_type(weird), tff.TensorType(np.int32))
  with pytest.raises(ValueError, match='true_clusters'):
    cla.ClusteredAggregator(6, 4, true_clusters=np.arange(6)).create(
        tff.StructWithPythonType([tff.TensorType(np.float32, [3])], list),
        tff.TensorType(np.float32))


# --------------------------------------------------------------------------- #
# The aggregation process on synthetic client values
# --------------------------------------------------------------------------- #

DELTA_TYPE = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [3, 10]), tff.TensorType(np.float32, [10])], list)


@pytest.fixture(scope='module')
def keyed_process():
  factory = cla.ClusteredAggregator(8, 4, threshold=0.6, threshold_max=0.9, transitive=True,
                                    true_clusters=[0, 0, 0, 1, 1, 2, 2, 2])
  return factory.create(model_delta.keyed_update_type(DELTA_TYPE), tff.TensorType(np.float32))


def test_aggregation_process_matches_numpy(keyed_process):
  proc = keyed_process
  assert proc.is_weighted
  true_clusters = np.array([0, 0, 0, 1, 1, 2, 2, 2])
  state = proc.initialize()
  assert set(state) == {'q', 'f', 'tau', 'round_num'}
  assert state['q'].shape == (8, 8) and state['f'].shape == (8, 8)
  ref = NpCadis(8, 0.6, 0.9, 'two_hop', True, True)
  rng = np.random.default_rng(4)
  centers = rng.normal(size=[3, 10])
  for t in range(5):
    k = 4 if t != 3 else 3  # a round with fewer clients than rows
    ids = rng.choice(8, size=k, replace=False)
    weights = rng.integers(1, 30, size=k).astype(np.float32)
    if t == 1:
      weights[1] = 0.0
    deltas = clustered_deltas(rng, true_clusters, ids, [0.05, 0.3, 0.05], centers=centers)
    values = [collections.OrderedDict(client_index=np.int32(i), delta=d)
              for i, d in zip(ids, deltas)]
    out = proc.next(state, values, list(weights))  # clients arrive in sample order
    ref_result, ref_meas = ref.round(list(ids), list(weights), deltas,
                                     true_clusters=true_clusters)
    order = np.argsort(ids)  # the server's canonical order
    meas = {k_: tf.constant(v) for k_, v in out.measurements.items()}
    np.testing.assert_array_equal(out.measurements['participants'],
                                  np.concatenate([ids[order], -np.ones(4 - k, int)]))
    state = out.state
    check_round({k_: tf.constant(v) for k_, v in state.items()},
                [tf.constant(r) for r in out.result], meas, ref,
                list(ids[order]) + [-1] * (4 - k), ref_result, ref_meas,
                [w > 0 for w in weights[order]] + [False] * (4 - k))
  assert state['round_num'] == 5
  assert 0.0 < out.measurements['q_matrix_mse'] < 1.0
  # more clients than clients_per_round: the round fails instead of dropping one
  values = [collections.OrderedDict(client_index=np.int32(i), delta=deltas[0]) for i in range(5)]
  with pytest.raises(Exception, match='clients_per_round'):
    proc.next(state, values, [np.float32(1.0)] * 5)


class NpReferenceCadis:
  """The server of the authors' code (AIoT-Lab-BKAI/ORO-CCGRID2023-CADIS,
  `algorithm/cadis.py`: `update_Q_matrix`, `get_impact_factor`, `update_threshold`),
  transcribed in float64 NumPy: what `reference_quirks=True` must reproduce."""

  def __init__(self, n, thr):
    self.q, self.f, self.thr = np.zeros([n, n]), np.zeros([n, n]), thr

  def round(self, client_idx, vectors, t):
    """client_idx: the clients that trained, in the order the server walks them; vectors:
    their similarity vectors. Returns (|C_i|, impact factor 1/|C_i|) of each."""
    k = len(client_idx)
    new_q, new_f = np.zeros_like(self.q), np.zeros_like(self.f)
    for i, vec_i in zip(range(k), vectors):
      new_q[client_idx[i], client_idx[i]] = 1
      for j, vec_j in zip(range(i + 1, k), vectors):   # vec_j is upload j - i - 1
        new_q[client_idx[i], client_idx[j]] = np_cos(vec_i, vec_j)
        new_q[client_idx[j], client_idx[i]] = new_q[client_idx[i], client_idx[j]]
    for i in range(k):
      new_f[client_idx[i], client_idx[i]] = 1
      for j in range(i + 1, k):
        new_f[client_idx[i], client_idx[j]] = new_f[client_idx[j], client_idx[i]] = 1
    self.f += new_f
    self.q = self.q + new_q
    with np.errstate(divide='ignore', invalid='ignore'):
      q_ast = np.nan_to_num(self.q / self.f, nan=0.0, posinf=0.0, neginf=0.0)
      lo, hi = q_ast[q_ast > 0].min(), q_ast[q_ast > 0].max()
      q_ast = np.abs((q_ast - lo) / (hi - lo) * (self.f > 0))
      a = (q_ast > self.thr) * 1.0
      a = ((a.T @ a) > 0) * 1.0
      size = a.sum(axis=0)
      impact = np.nan_to_num(1 / size, nan=0.0, posinf=0.0)
    self.thr = min(self.thr * (1 + 0.0005) ** t, 0.985)
    return size[client_idx], impact[client_idx]


def test_reference_quirks_match_a_transcription_of_the_authors_code():
  n, c, tau0 = 12, 6, 0.9
  proc = cla.ClusteredAggregator(n, c, threshold=tau0, sample_weighted=False,
                                 reference_quirks=True).create(
                                     model_delta.keyed_update_type(DELTA_TYPE),
                                     tff.TensorType(np.float32))
  ref = NpReferenceCadis(n, tau0)
  true_clusters = np.repeat(np.arange(4), 3)
  rng = np.random.default_rng(17)
  centers = rng.normal(size=[4, 10])
  state = proc.initialize()
  quirky_sizes = []
  for t in range(8):
    k = c if t != 4 else 4   # a round with fewer clients than rows
    ids = rng.choice(n, size=k, replace=False)
    weights = rng.integers(1, 30, size=k).astype(np.float32)
    if t == 2:
      weights[1] = 0.0   # did not train: absent from the reference's list
    deltas = clustered_deltas(rng, true_clusters, ids, [0.05, 0.3, 0.05, 1.0], centers=centers)
    out = proc.next(state, [collections.OrderedDict(client_index=np.int32(i), delta=d)
                            for i, d in zip(ids, deltas)], list(weights))
    state = out.state
    # the server walks the clients that trained in its canonical order (by client index)
    order = [r for r in np.argsort(ids) if weights[r] > 0]
    want_sizes, impact = ref.round([int(ids[r]) for r in order],
                                   [np.asarray(deltas[r][-1], np.float64) for r in order], t)
    np.testing.assert_allclose(state['q'], ref.q, atol=2e-5)
    np.testing.assert_array_equal(state['f'], ref.f)
    rows = out.measurements['participants'][:len(order) + (weights == 0).sum()]
    trained = [r for r, i in enumerate(rows) if weights[list(ids).index(i)] > 0]
    np.testing.assert_array_equal(out.measurements['cluster_sizes'][trained], want_sizes)
    np.testing.assert_allclose(out.measurements['aggregation_weights'][trained],
                               impact / impact.sum(), rtol=1e-5)
    assert float(state['tau']) == pytest.approx(ref.thr, rel=1e-5)   # float32 schedule
    quirky_sizes.extend(want_sizes)
  assert max(quirky_sizes) > 3   # the quirks were exercised: clusters beyond the truth's 3


def test_anonymous_mode_clusters_each_round_alone():
  proc = cla.ClusteredAggregator(None, 5, threshold=0.5).create(DELTA_TYPE,
                                                                 tff.TensorType(np.float32))
  state = proc.initialize()
  assert set(state) == {'tau', 'round_num'}
  rng = np.random.default_rng(9)
  true_clusters = np.array([0, 0, 0, 1, 1])
  centers = rng.normal(size=[2, 10])
  for t in range(2):
    deltas = clustered_deltas(rng, true_clusters, range(5), 0.05, centers=centers)
    weights = [np.float32(w) for w in (5, 10, 0, 20, 25)]
    out = proc.next(state, deltas, weights)
    ref = NpCadis(5, float(state['tau']), 0.985)  # a fresh Q/F every round
    ref.t = t
    ref_result, ref_meas = ref.round(list(range(5)), weights, deltas)
    for g, w in zip(out.result, ref_result):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert sorted(out.measurements['cluster_sizes']) == sorted(
        list(ref_meas['sizes'].values()) + [0])
    assert out.measurements['seen_clients'] == 4
    state = out.state
    assert float(state['tau']) == pytest.approx(ref.tau, rel=1e-6)


# A TFF factory on the deltas: p_i from the clustering, the deltas through the factory.

def np_clip(delta, norm):
  """The delta (a list of arrays) scaled to global L2 norm <= `norm`, as TFF clips."""
  total = np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in delta))
  scale = min(1.0, norm / total) if total > 0 else 1.0
  return [np.asarray(t, np.float64) * scale for t in delta]


def factory_rounds(factory, rule, rounds=2):
  """Runs `ClusteredAggregator(delta_aggregator=factory)` on synthetic keyed uploads and
  checks every round against NpCadis: the same Q, F and p_i, and result = rule(p, K,
  deltas) with p and deltas per upload in arrival order and K the number of uploads."""
  factory = cla.ClusteredAggregator(8, 4, threshold=0.6, threshold_max=0.9,
                                    delta_aggregator=factory)
  proc = factory.create(model_delta.keyed_update_type(DELTA_TYPE), tff.TensorType(np.float32))
  state = proc.initialize()
  assert set(state) == {'q', 'f', 'tau', 'round_num', 'delta_aggregator'}
  ref = NpCadis(8, 0.6, 0.9)
  rng = np.random.default_rng(12)
  true_clusters = np.array([0, 0, 0, 1, 1, 2, 2, 2])
  centers = rng.normal(size=[3, 10])
  for t in range(rounds):
    ids = rng.choice(8, size=4, replace=False)
    weights = rng.integers(1, 30, size=4).astype(np.float32)
    if t == 1:
      weights[2] = 0.0  # did not train: p = 0, but it still uploads (K counts it)
    deltas = clustered_deltas(rng, true_clusters, ids, [0.05, 0.3, 0.05], centers=centers)
    out = proc.next(state, [collections.OrderedDict(client_index=np.int32(i), delta=d)
                            for i, d in zip(ids, deltas)], list(weights))
    _, ref_meas = ref.round(list(ids), list(weights), deltas)
    p = np.array([ref_meas['weights'].get(i, 0.0) for i in ids])
    np.testing.assert_allclose(out.state['q'], ref.q, atol=2e-5)
    np.testing.assert_array_equal(out.state['f'], ref.f)
    order = np.argsort(ids)
    np.testing.assert_allclose(out.measurements['aggregation_weights'], p[order],
                               rtol=1e-5, atol=1e-7)
    for got, want in zip(out.result, rule(p, len(ids), deltas)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    state = out.state
  return proc, out


def np_eq1(p, k, deltas):
  """Σ p_i Δ_i: eq. 1, what the default aggregation returns."""
  return [sum(p_i * np.asarray(d[t], np.float64) for p_i, d in zip(p, deltas))
          for t in range(len(deltas[0]))]


def test_mean_factory_on_the_deltas_gives_the_default_rule():
  proc, out = factory_rounds(tff.aggregators.MeanFactory(), np_eq1)
  assert proc.is_weighted and out.state['round_num'] == 2
  assert set(out.measurements['delta_aggregator']) == {'mean_value', 'mean_weight'}


def test_clipping_factory_on_the_deltas_clips_each_delta_before_weighting():
  norm = 2.5  # the synthetic deltas' norms are ~6: every one is clipped
  factory = tff.aggregators.clipping_factory(norm, tff.aggregators.MeanFactory())
  _, out = factory_rounds(factory, lambda p, k, deltas: [
      sum(p_i * np_clip(d, norm)[t] for p_i, d in zip(p, deltas)) for t in range(2)])
  assert out.measurements['delta_aggregator']['clipped_count'] == 4  # a real clip


def test_unweighted_dp_factory_gets_k_times_p_times_delta():
  norm = 5.0  # clips some of the scaled deltas K·p_i·Δ_i, not all
  dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=4, clip=norm)
  norms = []

  def dp_rule(p, k, deltas):  # fixed denominator: the factory's clients_per_round
    scaled = [[k * p_i * np.asarray(x, np.float64) for x in d] for p_i, d in zip(p, deltas)]
    norms.extend(np.sqrt(sum(np.sum(x * x) for x in d)) for d in scaled)
    return [sum(np_clip(d, norm)[t] for d in scaled) / 4 for t in range(2)]

  factory_rounds(dp, dp_rule)
  assert min(norms) < norm < max(norms)


def test_delta_aggregator_is_refused_where_it_cannot_apply():
  with pytest.raises(TypeError, match='delta_aggregator must be a tff.aggregators'):
    cla.ClusteredAggregator(8, 4, delta_aggregator=cla.ClusteredAggregator)
  with pytest.raises(ValueError, match='needs keyed uploads'):
    cla.ClusteredAggregator(None, 4, delta_aggregator=tff.aggregators.MeanFactory()).create(
        DELTA_TYPE, tff.TensorType(np.float32))
