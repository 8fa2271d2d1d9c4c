"""CADIS's server written out in NumPy, and the synthetic uploads its tests share
(tests/test_cadis_clustering.py, tests/test_cadis_aggregator.py)."""

import collections

import numpy as np
import pytest


def np_cos(u, v):
  nu, nv = np.linalg.norm(u), np.linalg.norm(v)
  return 0.0 if nu == 0 or nv == 0 else float(u @ v / (nu * nv))


class NpCadis:
  """The CADIS server, written from docs/algorithms.md#cadis with loops and sets."""

  def __init__(self, n, tau=0.975, tau_max=0.985, closure='two_hop', transitive=False,
               sample_weighted=True, growth=1.0005, half_width=0.02):
    self.n = n
    self.q = np.zeros([n, n])
    self.f = np.zeros([n, n])
    self.tau, self.tau_max, self.growth = tau, tau_max, growth
    self.closure, self.transitive, self.sample_weighted = closure, transitive, sample_weighted
    self.half_width = half_width
    self.t = 0

  def avg(self):
    return np.where(self.f > 0, self.q / np.where(self.f > 0, self.f, 1), 0.0)

  def q_matrix(self):
    qa = self.avg()
    pos = [(i, j) for i in range(self.n) for j in range(self.n)
           if self.f[i, j] > 0 and qa[i, j] > 0]
    out = np.zeros([self.n, self.n])
    if pos:
      lo, hi = min(qa[p] for p in pos), max(qa[p] for p in pos)
      for p in pos:
        out[p] = (qa[p] - lo) / (hi - lo) if hi > lo else 1.0
    return out

  def seen(self):
    return [i for i in range(self.n) if self.f[i, i] > 0]

  def relation(self, tau, true_clusters=None):
    qm, seen = self.q_matrix(), self.seen()
    adj = {(i, j) for i in seen for j in seen if qm[i, j] > tau}
    rel = np.zeros([self.n, self.n], bool)
    if self.closure == 'oracle':   # the true clusters among the seen clients; Q unused
      for i in seen:
        for j in seen:
          rel[i, j] = true_clusters[i] == true_clusters[j]
    elif self.closure == 'two_hop':
      for i in seen:
        for j in seen:
          rel[i, j] = i == j or any((k, i) in adj and (k, j) in adj for k in seen)
    else:
      for i in seen:
        reach, todo = {i}, [i]
        while todo:
          u = todo.pop()
          for v in seen:
            if (u, v) in adj and v not in reach:
              reach.add(v)
              todo.append(v)
        for j in reach:
          rel[i, j] = True
    return rel

  def round(self, ids, weights, deltas, sim_index=-1, true_clusters=None):
    """ids, weights: per upload; deltas: per upload a list of arrays. Returns (result,
    measurements dict keyed by client id / scalars)."""
    tau = self.tau
    valid = [k for k in range(len(ids)) if weights[k] > 0]
    vec = {ids[k]: np.asarray(deltas[k][sim_index], np.float64).ravel() for k in valid}
    for a in valid:
      for b in valid:
        i, j = ids[a], ids[b]
        self.q[i, j] += 1.0 if i == j else np_cos(vec[i], vec[j])
        self.f[i, j] += 1.0
    if self.transitive:
      qa = self.avg()
      estimates = {}
      for i in range(self.n):
        for j in range(self.n):
          if i == j or self.f[i, j] > 0:
            continue
          vals = []
          for k in range(self.n):
            if k in (i, j) or self.f[i, k] == 0 or self.f[k, j] == 0:
              continue
            a, b = qa[i, k], qa[k, j]
            width = np.sqrt(max(0.0, 1 - a * a) * max(0.0, 1 - b * b))
            if width < self.half_width and a * b > tau:
              vals.append(a * b)
          if vals:
            estimates[i, j] = np.mean(vals)
      for (i, j), v in estimates.items():
        self.q[i, j] += v
        self.f[i, j] += 1
    rel = self.relation(tau, true_clusters)
    seen = self.seen()
    size = {i: max(1, int(rel[i].sum())) for i in range(self.n)}
    total_n = sum(weights[k] for k in valid)
    raw = {}
    for k in valid:
      raw[k] = 1.0 / size[ids[k]] * (weights[k] / total_n if self.sample_weighted else 1.0)
    norm = sum(raw.values())
    p = {k: raw[k] / norm for k in valid}
    result = [sum(p[k] * np.asarray(deltas[k][t], np.float64) for k in valid)
              if valid else np.zeros_like(deltas[0][t]) for t in range(len(deltas[0]))]
    meas = dict(
        sizes={ids[k]: size[ids[k]] for k in valid},
        weights={ids[k]: p[k] for k in valid},
        num_clusters=len({frozenset(np.flatnonzero(rel[i])) for i in seen}),
        seen_clients=len(seen), tau=tau)
    if true_clusters is not None:
      tc = np.asarray(true_clusters)
      qm = self.q_matrix()
      pairs = [(i, j) for i in range(self.n) for j in range(self.n)
               if i != j and self.f[i, j] > 0]
      meas['q_matrix_mse'] = float(np.mean(
          [(qm[i, j] - float(tc[i] == tc[j])) ** 2 for i, j in pairs])) if pairs else 0.0
      seen_pairs = [(i, j) for i in seen for j in seen if i < j]
      agree = [rel[i, j] == (tc[i] == tc[j]) for i, j in seen_pairs]
      meas['cluster_pair_accuracy'] = float(np.mean(agree)) if agree else 1.0
      meas['clusters_match'] = float(all(agree))
    self.tau = min(self.tau * self.growth ** self.t, self.tau_max)
    self.t += 1
    return result, meas


def clustered_deltas(rng, true_clusters, ids, noise, bias_dim=10, centers=None):
  """Per client: [kernel-like noise [3, bias_dim], bias = its cluster centre + noise]."""
  out = []
  for i in ids:
    c = true_clusters[i]
    scale = noise[c] if isinstance(noise, (list, tuple, np.ndarray)) else noise
    bias = centers[c] + scale * rng.normal(size=bias_dim)
    out.append([rng.normal(size=[3, bias_dim]).astype(np.float32), bias.astype(np.float32)])
  return out


def tf_state(n, tau):
  return collections.OrderedDict(q=np.zeros([n, n], np.float32),
                                 f=np.zeros([n, n], np.float32),
                                 tau=np.float32(tau), round_num=np.int32(0))


def stacked(deltas):
  return [np.stack([d[t] for d in deltas]) for t in range(len(deltas[0]))]


def check_round(got_state, got_result, got_meas, ref, ids, ref_result, ref_meas, valid_rows):
  np.testing.assert_allclose(got_state['q'].numpy(), ref.q, atol=2e-5)
  np.testing.assert_array_equal(got_state['f'].numpy(), ref.f)
  assert float(got_state['tau']) == pytest.approx(ref.tau, rel=1e-6)
  for g, w in zip(got_result, ref_result):
    np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)
  sizes = got_meas['cluster_sizes'].numpy()
  weights = got_meas['aggregation_weights'].numpy()
  for row, i in enumerate(ids):
    if valid_rows[row]:
      assert sizes[row] == ref_meas['sizes'][i], (i, sizes, ref_meas['sizes'])
      assert weights[row] == pytest.approx(ref_meas['weights'][i], rel=1e-5, abs=1e-7)
    else:
      assert sizes[row] == 0 and weights[row] == 0.0
  assert int(got_meas['num_clusters']) == ref_meas['num_clusters']
  assert int(got_meas['seen_clients']) == ref_meas['seen_clients']
  assert float(got_meas['tau']) == pytest.approx(ref_meas['tau'], rel=1e-6)
  for key in ('q_matrix_mse', 'cluster_pair_accuracy', 'clusters_match'):
    if key in ref_meas:
      assert float(got_meas[key]) == pytest.approx(ref_meas[key], abs=2e-5), key
