"""CADIS's clustering maths (tff_algos/aggregators/clustering.py), piece by piece and over
rounds, against independent NumPy references."""

import collections
import itertools

import numpy as np
import pytest

from tests.cadis_helpers import NpCadis, check_round, clustered_deltas, stacked, tf_state
from tff_algos.aggregators import clustered_aggregation
from tff_algos.aggregators import clustering as cla


def test_rescale_adjacency_closures_and_sizes_by_hand():
  # rescale: positives with F > 0 only; equal entries -> 1; nothing positive -> 0
  q_avg = np.array([[1.0, 0.5, -0.2], [0.5, 1.0, 0.0], [-0.2, 0.0, 0.0]], np.float32)
  f = np.array([[2, 1, 1], [1, 1, 0], [1, 0, 0]], np.float32)
  np.testing.assert_allclose(cla.rescale_similarity(q_avg, f).numpy(),
                             [[1, 0, 0], [0, 1, 0], [0, 0, 0]], atol=1e-7)
  np.testing.assert_array_equal(cla.rescale_similarity(np.full([2, 2], 0.3), np.ones([2, 2])),
                                np.ones([2, 2]))
  np.testing.assert_array_equal(cla.rescale_similarity(-np.ones([2, 2]), np.ones([2, 2])),
                                np.zeros([2, 2]))
  # a chain 0-1-2-3 plus an isolated seen 4 and a never-seen 5
  adj = np.zeros([6, 6], bool)
  for i, j in ((0, 1), (1, 2), (2, 3)):
    adj[i, j] = adj[j, i] = True
  seen = np.array([True] * 5 + [False])
  two_hop = cla.cluster_relation(adj, seen, 'two_hop').numpy()
  comps = cla.cluster_relation(adj, seen, 'components').numpy()
  assert two_hop[0, 2] and not two_hop[0, 3] and two_hop[1, 3]
  assert comps[0, 3] and not comps[0, 4] and not comps[5].any()
  np.testing.assert_array_equal(cla.cluster_sizes(two_hop).numpy(), [3, 4, 4, 3, 1, 1])
  np.testing.assert_array_equal(cla.cluster_sizes(comps).numpy(), [4, 4, 4, 4, 1, 1])
  assert int(cla.count_clusters(comps, seen)) == 2
  assert int(cla.count_clusters(two_hop, seen)) == 4  # {0,1,2}, {0,1,2,3} (twice), {1,2,3}, {4}
  with pytest.raises(ValueError, match='closure'):
    cla.cluster_relation(adj, seen, 'single_link')


# The server step's clustering at scale (issue 58) against dense NumPy: every quantity the
# step reports, from the same float32 Q and F, by the N x N rule written out directly.


def np_adjacency(q, f, tau):
  """A of docs/algorithms.md#cadis (steps 3-4) in float32 NumPy, and the seen mask."""
  q, f = np.asarray(q, np.float32), np.asarray(f, np.float32)
  q_avg = np.where(f > 0, q / np.where(f > 0, f, np.float32(1)), np.float32(0))
  positive = (f > 0) & (q_avg > 0)
  q_matrix = np.zeros_like(q_avg)
  if positive.any():
    lo, hi = q_avg[positive].min(), q_avg[positive].max()
    scaled = (q_avg - lo) / (hi - lo) if hi > lo else np.ones_like(q_avg)
    q_matrix = np.where(positive, scaled, np.float32(0))
  seen = np.diag(f) > 0
  return (q_matrix > np.float32(tau)) & seen[:, None] & seen[None, :], seen


def np_relation(adj, seen, closure, true_clusters=None):
  """bool [N, N] i ~ j, dense: two_hop = (A'^T A' > 0); components = reachability."""
  if closure == 'oracle':
    tc = np.asarray(true_clusters)
    return (tc[:, None] == tc[None, :]) & seen[:, None] & seen[None, :]
  a = (adj | np.diag(seen)).astype(np.int64)
  if closure == 'two_hop':
    return a.T @ a > 0
  reach = a > 0
  while True:
    grown = reach | ((reach.astype(np.int64) @ reach.astype(np.int64)) > 0)
    if (grown == reach).all():
      return reach
    reach = grown


def np_clustering(rel, seen, rows, valid, weights, sample_weighted, true_clusters=None):
  sizes_all = np.maximum(rel.sum(axis=1), 1)
  sizes = np.where(valid, sizes_all[np.where(valid, rows, 0)], 0)
  raw = np.where(valid, 1.0 / np.maximum(sizes, 1), 0.0)
  if sample_weighted:
    raw = raw * np.where(valid, weights, 0) / max(np.where(valid, weights, 0).sum(), 1e-30)
  out = dict(cluster_sizes=sizes,
             aggregation_weights=raw / raw.sum() if raw.sum() > 0 else raw,
             num_clusters=len({tuple(np.flatnonzero(rel[i])) for i in np.flatnonzero(seen)}))
  if true_clusters is not None:
    tc = np.asarray(true_clusters)
    ids = np.flatnonzero(seen)
    agree = [rel[i, j] == (tc[i] == tc[j]) for i in ids for j in ids if i < j]
    # float32 division of the two counts, as the step reports it
    out['cluster_pair_accuracy'] = (float(np.float32(sum(agree)) / np.float32(len(agree)))
                                    if agree else 1.0)
    out['clusters_match'] = float(all(agree))
  return out


def random_cadis_state(rng, n, true_clusters):
  """Q, F as a run leaves them (symmetric; F_ij > 0 only between seen clients), with
  average similarities spread over [-1, 1] and near-1 within true clusters."""
  seen = rng.random(n) < rng.uniform(0.3, 1.0)
  together = np.triu(rng.random([n, n]) < rng.uniform(0.2, 1.0), 1)
  together = (together | together.T) & seen[:, None] & seen[None, :]
  f = np.where(together, rng.integers(1, 6, [n, n]), 0).astype(np.float32)
  f = np.triu(f, 1) + np.triu(f, 1).T + np.diag(np.where(seen, rng.integers(1, 9, n), 0))
  same = true_clusters[:, None] == true_clusters[None, :]
  avg = np.where(same, rng.uniform(0.9, 1.0, [n, n]), rng.uniform(-1.0, 1.0, [n, n]))
  avg = np.triu(avg, 1) + np.triu(avg, 1).T
  q = (f * avg).astype(np.float32)
  q[np.diag_indices(n)] = np.diag(f)
  return collections.OrderedDict(q=q, f=f.astype(np.float32))


@pytest.mark.parametrize('seed', range(6))
def test_relation_pieces_match_dense_numpy(seed):
  rng = np.random.default_rng([58, seed])
  for _ in range(8):
    n = int(rng.integers(5, 41))
    seen = rng.random(n) < rng.uniform(0.2, 1.0)
    # a symmetric graph among seen clients; every fourth one a long chain in random order
    if rng.random() < 0.25:
      order = rng.permutation(np.flatnonzero(seen))
      adj = np.zeros([n, n], bool)
      adj[order[:-1], order[1:]] = True
    else:
      adj = np.triu(rng.random([n, n]) < rng.uniform(0.0, 0.4), 1)
    adj = (adj | adj.T) & seen[:, None] & seen[None, :]
    truth = rng.integers(0, int(rng.integers(1, 6)), n) * 7 - 3   # arbitrary cluster ids
    rows = rng.integers(0, n, int(rng.integers(1, 11))).astype(np.int32)
    labels = cla.component_labels(adj, seen)
    comps = np_relation(adj, seen, 'components')
    # equal labels iff related; a never-seen client shares its label with no one
    np.testing.assert_array_equal(labels.numpy()[:, None] == labels.numpy()[None, :],
                                  comps | np.eye(n, dtype=bool))
    np.testing.assert_array_equal(cla.label_cluster_sizes(labels, seen).numpy(),
                                  np.maximum(comps.sum(axis=1), 1))
    assert int(cla.count_label_clusters(labels, seen)) == len(
        {tuple(np.flatnonzero(comps[i])) for i in np.flatnonzero(seen)})
    want = np_clustering(comps, seen, rows, np.ones(len(rows), bool), np.ones(len(rows)),
                         False, truth)
    accuracy, match = cla.label_agreement(labels, seen, truth)
    assert float(accuracy) == want['cluster_pair_accuracy']
    assert float(match) == want['clusters_match']
    # two_hop sizes need no symmetry: also on a directed graph
    directed = (rng.random([n, n]) < 0.2) & seen[:, None] & seen[None, :]
    for graph in (adj, directed):
      np.testing.assert_array_equal(
          cla.two_hop_sizes(graph, seen, rows).numpy(),
          np.maximum(np_relation(graph, seen, 'two_hop').sum(axis=1), 1)[rows])


@pytest.mark.parametrize('seed', range(4))
def test_threshold_adjacency_is_bit_identical_to_rescale_then_threshold(seed):
  rng = np.random.default_rng([59, seed])
  for _ in range(12):
    n = int(rng.integers(2, 30))
    state = random_cadis_state(rng, n, rng.integers(0, 3, n))
    if rng.random() < 0.2:   # all positive entries equal (no span), or none positive
      state['q'] = np.where(state['f'] > 0, rng.choice([-0.5, 0.5]) * state['f'],
                            0).astype(np.float32)
    q_avg = cla.average_similarity(state['q'], state['f'])
    rescaled = cla.rescale_similarity(q_avg, state['f']).numpy()
    # thresholds at and just around the rescaled entries (ties with the strict >), 0, and
    # one below 0 (every seen pair an edge)
    values = rng.choice(rescaled.ravel(), 6)
    taus = [0.0, -0.25, float(rng.uniform())] + [float(v) for v in values] + [
        float(np.nextafter(np.float32(v), np.float32(d))) for v in values[:3] for d in (0, 2)]
    for tau in taus:
      want = cla.adjacency(rescaled, state['f'], tau).numpy()
      np.testing.assert_array_equal(cla.threshold_adjacency(q_avg, state['f'], tau).numpy(),
                                    want, err_msg=f'tau={tau}')
      np.testing.assert_array_equal(np_adjacency(state['q'], state['f'], tau)[0], want)


@pytest.mark.parametrize('closure', ['two_hop', 'components', 'oracle'])
@pytest.mark.parametrize('sample_weighted', [True, False])
def test_clustering_step_matches_dense_numpy_on_random_states(closure, sample_weighted):
  rng = np.random.default_rng([60, len(closure), sample_weighted])
  for _ in range(10):
    n = int(rng.integers(5, 41))
    c = int(rng.integers(1, min(n, 10) + 1))
    truth = rng.integers(0, int(rng.integers(1, 6)), n)
    state = random_cadis_state(rng, n, truth)
    k = int(rng.integers(1, c + 1))
    ids = rng.choice(n, k, replace=False)
    weights = rng.integers(0, 30, k).astype(np.float32)   # 0: did not train
    centers = rng.normal(size=[6, 10])
    sim = centers[truth[ids]] + rng.uniform(0.0, 1.0) * rng.normal(size=[k, 10])
    index = np.concatenate([ids, -np.ones(c - k, int)]).astype(np.int32)
    w_rows = np.concatenate([weights, np.zeros(c - k, np.float32)])
    sim_rows = np.concatenate([sim, np.zeros([c - k, 10])]).astype(np.float32)
    tau = float(rng.choice([0.0, rng.uniform(0.3, 0.99), 0.975]))
    state.update(tau=np.float32(tau), round_num=np.int32(3))
    options = cla.ClusteringOptions(closure=closure, sample_weighted=sample_weighted)
    new_state, p, meas = cla.clustering_step(state, index, w_rows, sim_rows, options, truth)
    # the reference clusters the step's own (float32) Q and F after the round's update
    adj, seen = np_adjacency(new_state['q'].numpy(), new_state['f'].numpy(), tau)
    valid = (index >= 0) & (w_rows > 0)
    want = np_clustering(np_relation(adj, seen, closure, truth), seen, index, valid, w_rows,
                         sample_weighted, truth)
    np.testing.assert_array_equal(meas['cluster_sizes'].numpy(), want['cluster_sizes'])
    np.testing.assert_allclose(p.numpy(), want['aggregation_weights'], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(meas['aggregation_weights'].numpy(), p.numpy())
    assert int(meas['num_clusters']) == want['num_clusters']
    assert int(meas['seen_clients']) == seen.sum()
    assert float(meas['cluster_pair_accuracy']) == want['cluster_pair_accuracy']
    assert float(meas['clusters_match']) == want['clusters_match']


def test_two_hop_whole_relation_metrics_only_up_to_the_limit():
  rng = np.random.default_rng(61)
  n, c = 30, 6
  truth = rng.integers(0, 4, n)
  state = random_cadis_state(rng, n, truth)
  state.update(tau=np.float32(0.9), round_num=np.int32(0))
  index = rng.choice(n, c, replace=False).astype(np.int32)
  sim = rng.normal(size=[c, 10]).astype(np.float32)
  runs = {}
  for limit in (None, n, n - 1, 0):
    options = cla.ClusteringOptions(two_hop_metrics_max_clients=limit)
    runs[limit] = cla.clustering_step(state, index, np.ones(c, np.float32), sim, options,
                                      truth)[2]
  for limit in (n, n - 1, 0):   # the weights and sizes never depend on the limit
    for key in ('cluster_sizes', 'aggregation_weights', 'seen_clients', 'q_matrix_mse'):
      np.testing.assert_array_equal(runs[limit][key].numpy(), runs[None][key].numpy())
  for limit in (None, n):
    assert int(runs[limit]['num_clusters']) >= 1
    assert 0.0 <= float(runs[limit]['cluster_pair_accuracy']) <= 1.0
  for limit in (n - 1, 0):   # above the limit: explicitly "not computed"
    assert int(runs[limit]['num_clusters']) == -1
    assert np.isnan(float(runs[limit]['cluster_pair_accuracy']))
    assert np.isnan(float(runs[limit]['clusters_match']))
  assert cla.two_hop_metrics_computed(1000, cla.ClusteringOptions())
  assert not cla.two_hop_metrics_computed(1001, cla.ClusteringOptions())
  with pytest.raises(ValueError, match='two_hop_metrics_max_clients'):
    clustered_aggregation.ClusteredAggregator(6, 4, two_hop_metrics_max_clients=-1)


def test_threshold_schedule_and_weights():
  tau, taus = np.float32(0.975), []
  for t in range(40):
    taus.append(float(tau))
    tau = cla.next_threshold(tau, t, 0.985).numpy()
  want, w = [], 0.975
  for t in range(40):
    want.append(w)
    w = min(w * 1.0005 ** t, 0.985)
  np.testing.assert_allclose(taus, want, rtol=1e-6)
  assert taus[-1] == pytest.approx(0.985) and taus[1] == pytest.approx(0.975)
  sizes = np.array([1, 2, 2, 4, 3])
  n = np.array([10.0, 20.0, 0.0, 40.0, 5.0], np.float32)
  valid = n > 0
  p = cla.aggregation_weights(sizes, n, valid, True).numpy()
  raw = np.where(valid, n / n.sum() / sizes, 0)
  np.testing.assert_allclose(p, raw / raw.sum(), rtol=1e-6)
  p = cla.aggregation_weights(sizes, n, valid, False).numpy()
  raw = np.where(valid, 1.0 / sizes, 0)
  np.testing.assert_allclose(p, raw / raw.sum(), rtol=1e-6)
  np.testing.assert_array_equal(
      cla.aggregation_weights(sizes, n, np.zeros(5, bool), True).numpy(), np.zeros(5))


def test_transitive_step_by_hand():
  # clients 0-1 and 1-2 seen together with a = 0.999, b = 0.998; 0-2 never; client 3 is
  # linked to 0 and 2 through a weak similarity (rejected by the half-width).
  q = np.zeros([4, 4], np.float32)
  f = np.zeros([4, 4], np.float32)
  for i in range(4):
    q[i, i] = f[i, i] = 1.0
  for (i, j), s in {(0, 1): 0.999, (1, 2): 0.998, (0, 3): 0.9, (3, 2): 0.95}.items():
    q[i, j] = q[j, i] = s
    f[i, j] = f[j, i] = 1.0
  q2, f2 = cla.transitive_update(q, f, 0.975)
  q2, f2 = q2.numpy(), f2.numpy()
  assert f2[0, 2] == f2[2, 0] == 1.0
  assert q2[0, 2] == pytest.approx(0.999 * 0.998, rel=1e-6)  # only k = 1 qualifies
  assert f2[1, 3] == 0.0  # via 0: width √((1-.999²)(1-.9²)) > 0.02; via 2: likewise
  # the mean is also bounded by tau
  q3, f3 = cla.transitive_update(q, f, 0.9999)
  assert f3.numpy()[0, 2] == 0.0


CONFIGS = (list(itertools.product(['two_hop', 'components'], [False, True], [True, False]))
           + [('oracle', False, True), ('oracle', False, False)])


@pytest.mark.parametrize('closure,transitive,sample_weighted', CONFIGS)
def test_server_step_matches_numpy_over_rounds(closure, transitive, sample_weighted):
  n, c = 12, 5
  rng = np.random.default_rng([len(closure), transitive, sample_weighted])
  true_clusters = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3])
  centers = rng.normal(size=[4, 10])
  noise = [0.02, 0.4, 0.05, 1.5]  # tight, loose, tight, noisy clusters
  for tau0 in (0.5, 0.9, 0.975):
    options = cla.ClusteringOptions(similarity_index=-1, closure=closure,
                                    sample_weighted=sample_weighted, transitive=transitive,
                                    threshold_max=max(0.985, tau0))
    ref = NpCadis(n, tau0, max(0.985, tau0), closure, transitive, sample_weighted)
    state = tf_state(n, tau0)
    for t in range(6):
      k = int(rng.integers(2, c + 1))
      ids = rng.choice(n, size=k, replace=False)
      weights = rng.integers(1, 50, size=k).astype(np.float32)
      if t == 2:
        weights[0] = 0.0  # a client that did not train: excluded from everything
      deltas = clustered_deltas(rng, true_clusters, ids, noise, centers=centers)
      # pad to C rows with empty rows (index -1)
      pad = c - k
      index = np.concatenate([ids, -np.ones(pad, int)]).astype(np.int32)
      w_rows = np.concatenate([weights, np.zeros(pad, np.float32)])
      rows = deltas + [[np.zeros_like(d) for d in deltas[0]]] * pad
      state, result, meas = cla.clustered_aggregation_step(
          state, index, w_rows, stacked(rows), options, true_clusters)
      ref_result, ref_meas = ref.round(list(ids), list(weights), deltas,
                                       true_clusters=true_clusters)
      check_round(state, result, meas, ref, list(ids), ref_result, ref_meas,
                  [w > 0 for w in weights])
      np.testing.assert_array_equal(meas['participants'].numpy(), index)
      assert int(state['round_num']) == t + 1


@pytest.mark.parametrize('closure', ['two_hop', 'components'])
def test_perfect_clusters_are_recovered_and_transitive_is_not_slower(closure):
  n, c = 20, 5
  true_clusters = np.repeat(np.arange(5), [6, 6, 4, 2, 2])
  rng = np.random.default_rng(2)
  centers = rng.normal(size=[5, 10])
  rounds_to_match = {}
  for transitive in (False, True):
    options = cla.ClusteringOptions(closure=closure, transitive=transitive)
    state = tf_state(n, 0.975)
    sample_rng = np.random.default_rng(5)  # same participation for both variants
    rounds_to_match[transitive] = None
    for t in range(150):
      ids = sample_rng.choice(n, size=c, replace=False)
      deltas = clustered_deltas(rng, true_clusters, ids, 1e-3, centers=centers)
      state, _, meas = cla.clustered_aggregation_step(
          state, ids.astype(np.int32), np.ones(c, np.float32), stacked(deltas), options,
          true_clusters)
      if int(meas['seen_clients']) == n and float(meas['clusters_match']) == 1.0:
        rounds_to_match[transitive] = t + 1
        break
    assert rounds_to_match[transitive] is not None, transitive
    assert int(meas['num_clusters']) == 5
    relation = cla.cluster_relation(
        cla.adjacency(cla.rescale_similarity(cla.average_similarity(state['q'], state['f']),
                                             state['f']), state['f'], state['tau']),
        cla.seen_clients(state['f']), closure).numpy()
    np.testing.assert_array_equal(relation, true_clusters[:, None] == true_clusters[None, :])
  assert rounds_to_match[True] <= rounds_to_match[False]


def test_reference_rescale_takes_the_absolute_value_by_hand():
  q_avg = np.array([[1.0, 0.5, -0.8], [0.5, 1.0, 0.0], [-0.8, 0.0, 1.0]], np.float32)
  f = np.array([[2, 1, 1], [1, 2, 0], [1, 0, 2]], np.float32)
  # lo = 0.5, hi = 1: |x - 0.5| / 0.5 where F > 0
  np.testing.assert_allclose(cla.rescale_similarity(q_avg, f, True).numpy(),
                             [[1, 0, 2.6], [0, 1, 0], [2.6, 0, 1]], atol=1e-6)
  np.testing.assert_allclose(cla.rescale_similarity(q_avg, f).numpy(),
                             [[1, 0, 0], [0, 1, 0], [0, 0, 1]], atol=1e-6)
  # no span: positive entries 1, the other entries with F > 0 +inf (edges)
  flat = np.where(q_avg > 0, 1.0, q_avg).astype(np.float32)
  np.testing.assert_array_equal(cla.rescale_similarity(flat, f, True).numpy(),
                                [[1, 1, np.inf], [1, 1, 0], [np.inf, 0, 1]])


def test_reference_quirks_merge_mc_like_groups_into_large_clusters():
  """Five groups of four clients whose classifier-bias deltas favour the group's own two
  labels (similar within a group, negatively correlated across), all clients every round:
  the paper's rules keep the groups apart, the authors' code lumps them together."""
  n = 20
  true_clusters = np.repeat(np.arange(5), 4)
  centers = np.full([5, 10], -0.25)
  for g in range(5):
    centers[g, 2 * g:2 * g + 2] = 1.0
  mean_size = {}
  for quirks in (False, True):
    options = cla.ClusteringOptions(reference_quirks=quirks)
    state = tf_state(n, 0.975)
    rng = np.random.default_rng(3)
    ids = np.arange(n, dtype=np.int32)   # the canonical order of a full round
    sizes = []
    for _ in range(10):
      deltas = clustered_deltas(rng, true_clusters, ids, 0.1, centers=centers)
      state, _, meas = cla.clustered_aggregation_step(
          state, ids, np.ones(n, np.float32), stacked(deltas), options, true_clusters)
      sizes.append(meas['cluster_sizes'].numpy().mean())
    mean_size[quirks] = np.mean(sizes[-5:])
  assert mean_size[False] <= 4.0   # never beyond the true groups
  assert mean_size[True] >= n / 2 and mean_size[True] >= 3 * mean_size[False], mean_size
