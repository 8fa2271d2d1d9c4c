"""CADIS: KD loss, clustered aggregation and the LearningProcess, against independent NumPy /
plain-TF references."""

import collections
import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tests import helpers
from tff_algos import execution
from tff_algos.aggregators import clustered_aggregation as cla
from tff_algos.cadis import build_cadis, classifier_similarity_index
from tff_algos.client_work import distillation, local_training, model_delta
from tff_algos.models import make_model_fn, representation, zoo

execution.initialize_runtime()

MODEL_FN = make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
BATCH = 8
LR = 0.1


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=LR)


# --------------------------------------------------------------------------- #
# Independent NumPy references
# --------------------------------------------------------------------------- #


def np_kd(teacher, student, reduction='sum', ddof=0):
  """KL(teacher ‖ student) of the kernel conditionals, float64, explicit loops; σ with
  `ddof` (0: population, 1: sample) over the m(m−1) ordered distances."""

  def conditionals(r):
    r = np.asarray(r, np.float64).reshape(len(r), -1)
    m = len(r)
    d = np.array([[np.linalg.norm(r[i] - r[j]) for j in range(m)] for i in range(m)])
    off = [d[i, j] for i in range(m) for j in range(m) if i != j]
    mu, sigma = np.mean(off), np.std(off, ddof=ddof)
    k = np.exp(-0.5 * (d - mu) ** 2 / (sigma ** 2 + 1e-3))
    p = np.zeros([m, m])
    for i in range(m):
      row = sum(k[i, j] for j in range(m) if j != i)
      for j in range(m):
        if j != i:
          p[i, j] = k[i, j] / row
    return p

  m = len(teacher)
  if m <= 1:
    return 0.0
  pt, ps = conditionals(teacher), conditionals(student)
  total = sum(pt[i, j] * np.log(pt[i, j] / ps[i, j])
              for i in range(m) for j in range(m) if i != j)
  return total / m if reduction == 'mean' else total


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


# --------------------------------------------------------------------------- #
# KD loss
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize('m', [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize('reduction', ['sum', 'mean'])
def test_kd_loss_matches_numpy(m, reduction):
  rng = np.random.default_rng([m, len(reduction)])
  for shape in ([m, 6], [m, 4, 3]):
    teacher = rng.normal(size=shape).astype(np.float32)
    student = (teacher + rng.normal(scale=0.7, size=shape)).astype(np.float32)
    got = distillation.kde_similarity_kl(teacher, student, reduction).numpy()
    want = np_kd(teacher, student, reduction)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    if m > 2:
      assert got > 1e-4  # non-trivial cases only
    assert distillation.kde_similarity_kl(teacher, teacher, reduction).numpy() == \
        pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize('m', [2, 3, 5, 8])
@pytest.mark.parametrize('reduction', ['sum', 'mean'])
def test_kd_sample_std_matches_numpy_ddof_1(m, reduction):
  rng = np.random.default_rng([m, len(reduction), 1])
  teacher = rng.normal(size=[m, 6]).astype(np.float32)
  student = (teacher + rng.normal(scale=0.7, size=[m, 6])).astype(np.float32)
  got = distillation.kde_similarity_kl(teacher, student, reduction, 'sample').numpy()
  assert got == pytest.approx(np_kd(teacher, student, reduction, ddof=1), rel=1e-4, abs=1e-6)
  population = distillation.kde_similarity_kl(teacher, student, reduction).numpy()
  if m > 2:   # m = 2: one distance, p = 1 either way
    assert abs(got - population) > 1e-4 * abs(population)
  else:
    assert got == population == 0.0
  with pytest.raises(ValueError, match='kd_std must be one of'):
    distillation.kde_similarity_kl(teacher, student, reduction, 'bessel')


def test_kd_loss_far_apart_points_and_duplicates_stay_finite():
  rng = np.random.default_rng(7)
  teacher = rng.normal(size=[6, 5]).astype(np.float32)
  student = teacher.copy()
  student[0] *= 50.0  # one outlier: its kernel values underflow in float32 without logs
  student[3] = student[2]  # a duplicate pair: distance 0
  got = distillation.kde_similarity_kl(teacher, student).numpy()
  assert np.isfinite(got)
  assert got == pytest.approx(np_kd(teacher, student), rel=1e-3)
  s = tf.Variable(student)
  with tf.GradientTape() as tape:
    loss = distillation.kde_similarity_kl(teacher, s)
  assert np.all(np.isfinite(tape.gradient(loss, s).numpy()))
  with pytest.raises(ValueError, match='kd_reduction'):
    distillation.kde_similarity_kl(teacher, student, 'batchmean')


@pytest.mark.parametrize('reduction', ['sum', 'mean'])
def test_kd_gradient_flows_only_into_the_student(reduction):
  rng = np.random.default_rng(3)
  t = tf.Variable(rng.normal(size=[8, 4]).astype(np.float32))
  s = tf.Variable(rng.normal(size=[8, 4]).astype(np.float32))
  with tf.GradientTape() as tape:
    loss = distillation.kde_similarity_kl(t, s, reduction)
  g_t, g_s = tape.gradient(loss, [t, s])
  assert g_t is None
  assert np.all(np.isfinite(g_s.numpy())) and np.abs(g_s.numpy()).max() > 0
  # the gradient is a descent direction of the reference loss
  before = np_kd(t.numpy(), s.numpy(), reduction)
  after = np_kd(t.numpy(), s.numpy() - 1e-2 * g_s.numpy() / np.abs(g_s.numpy()).max(),
                reduction)
  assert after < before


# --------------------------------------------------------------------------- #
# Client work: keyed upload, λ = 0, KD against a plain-TF reference
# --------------------------------------------------------------------------- #


@pytest.fixture(scope='module')
def digits():
  return data.load_digits()


@pytest.fixture(scope='module')
def client_works():
  plain = model_delta.build_model_delta_client_work(MODEL_FN, sgd(), BATCH)
  keyed0 = model_delta.build_model_delta_client_work(MODEL_FN, sgd(), BATCH, keyed=True,
                                                     kd_weight=0.0)
  kd = model_delta.build_model_delta_client_work(MODEL_FN, sgd(), BATCH, keyed=True,
                                                 kd_weight=0.5, kd_reduction='mean')
  return plain, keyed0, kd


@pytest.fixture(scope='module')
def initial_weights():
  return model_delta.initial_model_weights_fn(MODEL_FN)()


def client_inputs(ds):
  """Four clients, 2 epochs: 37 examples, 1 example, none, 20 examples."""
  sizes, out, start = (37, 1, 0, 20), [], 0
  for c, n in enumerate(sizes):
    out.append(data.client_input(ds.x_train[start:start + n], ds.y_train[start:start + n], 2,
                                 np.random.default_rng([11, c]), 5 + c, c))
    start += n
  return out


def test_kd_options_are_validated():
  for kwargs, match in ((dict(kd_weight=-1.0), 'kd_weight'), (dict(kd_weight=np.nan), 'kd_weight'),
                        (dict(kd_reduction='max'), 'kd_reduction'),
                        (dict(kd_std='bessel'), 'kd_std'),
                        (dict(kd_weight=1.0, full_gradient=True), 'full_gradient')):
    with pytest.raises(ValueError, match=match):
      model_delta.build_model_delta_client_work(MODEL_FN, sgd(), BATCH, **kwargs)


def test_lambda_zero_equals_plain_client_work_bit_for_bit(client_works, digits,
                                                          initial_weights):
  plain, keyed0, _ = client_works
  inputs = client_inputs(digits)
  w = [initial_weights] * len(inputs)
  out_p = plain.next(plain.initialize(), w, [[x] for x in inputs])
  out_k = keyed0.next(keyed0.initialize(), w, [[x] for x in inputs])
  update_type = keyed0.next.type_signature.result.result.member.update
  assert tff.structure.name_list(update_type) == ['client_index', 'delta']
  for rp, rk, inp in zip(out_p.result, out_k.result, inputs):
    assert int(rk.update['client_index']) == int(inp['index'])
    assert float(rk.update_weight) == float(rp.update_weight) == len(inp['y'])
    for a, b in zip(rp.update, rk.update['delta']):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert out_p.measurements == out_k.measurements


def reference_kd_training(initial, inp, kd_weight, reduction, std='population'):
  """Plain eager TF: CE + λ·KL with the student's representation from a second forward
  pass and the teacher a separate frozen Keras model; SGD; returns (initial − final,
  Σ over steps of λ·KL × batch size, examples trained)."""
  student = zoo.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  teacher = zoo.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  for model in (student, teacher):
    for v, t in zip(model.trainable_variables, initial.trainable):
      v.assign(t)
  s_rep = representation.representation_model(student)
  t_rep = representation.representation_model(teacher)
  ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y, order = inp['x'], inp['y'], inp['order']
  n = len(y)
  extra_sum, trained = 0.0, 0
  for epoch in range(order.shape[0]):
    for start in range(0, n, BATCH):
      idx = order[epoch, start:start + BATCH]
      xb, yb = x[idx], y[idx]
      with tf.GradientTape() as tape:
        loss = ce(yb, student(xb, training=True))
        kl = distillation.kde_similarity_kl(t_rep(xb, training=False),
                                            s_rep(xb, training=True), reduction, std)
        loss = loss + kd_weight * kl
      extra_sum += kd_weight * float(kl) * len(idx)
      trained += len(idx)
      grads = tape.gradient(loss, student.trainable_variables)
      for v, g in zip(student.trainable_variables, grads):
        v.assign_sub(LR * g)
  delta = [np.asarray(a) - v.numpy() for a, v in zip(initial.trainable,
                                                      student.trainable_variables)]
  return delta, extra_sum, trained


def test_kd_client_work_matches_plain_tf_reference(client_works, digits, initial_weights):
  plain, _, kd = client_works
  inputs = client_inputs(digits)
  w = [initial_weights] * len(inputs)
  out = kd.next(kd.initialize(), w, [[x] for x in inputs])
  out_plain = plain.next(plain.initialize(), w, [[x] for x in inputs])
  extra_sum, trained = 0.0, 0
  for r, rp, inp in zip(out.result, out_plain.result, inputs):
    assert int(r.update['client_index']) == int(inp['index'])
    assert float(r.update_weight) == len(inp['y'])  # the empty client has weight 0
    delta = [np.asarray(t) for t in r.update['delta']]
    assert all(np.all(np.isfinite(t)) for t in delta)
    if len(inp['y']) == 0:
      assert all(np.all(t == 0) for t in delta)
      continue
    want, extra, count = reference_kd_training(initial_weights, inp, 0.5, 'mean')
    extra_sum, trained = extra_sum + extra, trained + count
    for g, ww in zip(delta, want):
      np.testing.assert_allclose(g, ww, rtol=2e-4, atol=2e-6)
    if len(inp['y']) > 2 * BATCH:  # KD changed the update (batches of > 2 examples)
      assert max(np.abs(g - np.asarray(p)).max()
                 for g, p in zip(delta, rp.update)) > 1e-5
  assert out.measurements['train']['num_clients'] == len(inputs)
  # The KD term's size beside the cross-entropy: its example-weighted mean over every step.
  assert extra_sum > 0
  assert float(out.measurements['train']['extra_loss']) == pytest.approx(
      extra_sum / trained, rel=1e-3)
  assert 'extra_loss' not in out_plain.measurements['train']


def test_kd_std_sample_reaches_the_client_work(client_works, digits, initial_weights):
  _, _, kd = client_works   # kd_reduction='mean', σ population
  sample = model_delta.build_model_delta_client_work(
      MODEL_FN, sgd(), BATCH, keyed=True, kd_weight=0.5, kd_reduction='mean', kd_std='sample')
  inp = client_inputs(digits)[0]
  w = [initial_weights]
  got = [np.asarray(t) for t in sample.next(sample.initialize(), w, [[inp]]).result[0]
         .update['delta']]
  want, _, _ = reference_kd_training(initial_weights, inp, 0.5, 'mean', 'sample')
  for g, ww in zip(got, want):
    np.testing.assert_allclose(g, ww, rtol=2e-4, atol=2e-6)
  population = kd.next(kd.initialize(), w, [[inp]]).result[0].update['delta']
  assert max(np.abs(g - np.asarray(p)).max() for g, p in zip(got, population)) > 1e-6


# --------------------------------------------------------------------------- #
# Clustered aggregation: pure TF pieces against NumPy
# --------------------------------------------------------------------------- #


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
    cla.ClusteredAggregator(6, 4, two_hop_metrics_max_clients=-1)


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


def test_oracle_closure_needs_the_true_clusters():
  with pytest.raises(ValueError, match="closure='oracle' takes .C_i. from the true clusters"):
    cla.ClusteredAggregator(12, 5, closure='oracle')
  cla.ClusteredAggregator(3, 2, closure='oracle', true_clusters=[0, 0, 1])


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


# --------------------------------------------------------------------------- #
# build_cadis
# --------------------------------------------------------------------------- #

N_CLIENTS, PER_ROUND = 10, 10


@pytest.fixture(scope='module')
def fed():
  return data.federate(data.load_digits(),
                       data.make_partitioner('cluster_mc', num_clients=N_CLIENTS, seed=0))


@pytest.fixture(scope='module')
def cadis_process(fed):
  return build_cadis(MODEL_FN, sgd(), BATCH, N_CLIENTS, clients_per_round=PER_ROUND,
                     threshold=0.9, threshold_max=0.95, true_clusters=fed.true_clusters)


def test_build_cadis_refuses_bad_arguments():
  bad = [dict(kd_weight=-0.1), dict(kd_reduction='avg'), dict(threshold=1.2),
         dict(closure='chain'), dict(similarity_layer='penultimate'),
         dict(clients_per_round=11), dict(true_clusters=[0, 1, 2]),
         dict(threshold=0.98, threshold_max=0.9)]
  for kwargs in bad:
    args = dict(clients_per_round=5)
    args.update(kwargs)
    with pytest.raises(ValueError):
      build_cadis(MODEL_FN, sgd(), BATCH, 10, **args)
  with pytest.raises(ValueError):
    build_cadis(MODEL_FN, sgd(), 0, 10, clients_per_round=5)
  assert classifier_similarity_index(MODEL_FN, 'bias') == 5
  assert classifier_similarity_index(MODEL_FN, 'kernel') == 4


def test_build_cadis_passes_the_two_hop_metrics_limit(cadis_process, fed):
  # Below N the whole-relation metrics are skipped (-1); sizes and weights stay the same.
  limited = build_cadis(MODEL_FN, sgd(), BATCH, N_CLIENTS, clients_per_round=PER_ROUND,
                        threshold=0.9, threshold_max=0.95, true_clusters=fed.true_clusters,
                        two_hop_metrics_max_clients=N_CLIENTS - 1)
  _, inputs = data.round_inputs(fed, 0, PER_ROUND, 1, seed=0)
  full = cadis_process.next(cadis_process.initialize(), [[x] for x in inputs]).metrics
  cut = limited.next(limited.initialize(), [[x] for x in inputs]).metrics
  assert int(full['aggregator']['num_clusters']) >= 1
  assert int(cut['aggregator']['num_clusters']) == -1
  for key in ('cluster_sizes', 'aggregation_weights'):
    np.testing.assert_array_equal(cut['aggregator'][key], full['aggregator'][key])


def test_build_cadis_type_signature(cadis_process):
  proc = cadis_process
  assert isinstance(proc, tff.learning.templates.LearningProcess)
  weights_type = model_delta.model_weights_type(MODEL_FN)
  data_type = local_training.client_data_type(model_delta.model_input_spec(MODEL_FN))
  param = proc.next.type_signature.parameter
  assert param[1].member.is_equivalent_to(data_type)
  state_type = proc.initialize.type_signature.result.member
  assert state_type.global_model_weights.is_equivalent_to(weights_type)
  agg = state_type.aggregator
  assert tuple(agg.q.shape) == (N_CLIENTS, N_CLIENTS) and tuple(agg.f.shape) == (10, 10)
  assert agg.tau.dtype == np.float32 and agg.round_num.dtype == np.int32
  metrics = proc.next.type_signature.result.metrics.member
  assert set(tff.structure.name_list(metrics.aggregator)) == {
      'participants', 'cluster_sizes', 'aggregation_weights', 'num_clusters', 'seen_clients',
      'tau', 'q_matrix_mse', 'cluster_pair_accuracy', 'clusters_match'}
  assert tuple(metrics.aggregator.cluster_sizes.shape) == (PER_ROUND,)


def test_cadis_learns_on_cluster_skewed_digits_and_checkpoints(cadis_process, fed, tmp_path):
  proc = cadis_process
  state = proc.initialize()
  sizes = fed.client_sizes()

  def run_round(state, t):
    ids, inputs = data.round_inputs(fed, t, PER_ROUND, 1, seed=0)
    out = proc.next(state, [[x] for x in inputs])
    agg = out.metrics['aggregator']
    # participants in canonical order, weights ∝ n_i / |C_i| summing to 1
    np.testing.assert_array_equal(agg['participants'], np.sort(ids))
    raw = sizes[agg['participants']] / agg['cluster_sizes']
    np.testing.assert_allclose(agg['aggregation_weights'], raw / raw.sum(), rtol=1e-5)
    assert out.metrics['client_work']['train']['num_clients'] == PER_ROUND
    return out

  for t in range(3):
    out = run_round(state, t)
    state = out.state
  manager = tff.program.FileProgramStateManager(str(tmp_path))
  helpers.run_async(manager.save(state, 3))
  restored, version = helpers.run_async(manager.load_latest(proc.initialize()))
  assert version == 3
  for key in ('q', 'f', 'tau', 'round_num'):
    np.testing.assert_array_equal(restored.aggregator[key], state.aggregator[key])
  assert state.aggregator['round_num'] == 3 and np.asarray(state.aggregator['f']).max() == 3
  out_a = run_round(state, 3)
  out_b = run_round(restored, 3)
  for a, b in zip(tf.nest.flatten(out_a.state), tf.nest.flatten(out_b.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  state = out_a.state
  for t in range(4, 7):
    out = run_round(state, t)
    state = out.state
  agg = out.metrics['aggregator']
  assert agg['seen_clients'] == N_CLIENTS
  assert 1 <= agg['num_clusters'] <= N_CLIENTS
  assert 0.0 <= agg['q_matrix_mse'] < 0.25 and 0.5 < agg['cluster_pair_accuracy'] <= 1.0
  assert agg['tau'] == pytest.approx(min(0.9 * np.prod(1.0005 ** np.arange(6)), 0.95),
                                     rel=1e-5)
  keras_model = zoo.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  proc.get_model_weights(state).assign_weights_to(keras_model)
  acc = (keras_model.predict(fed.x_test, verbose=0).argmax(-1) == fed.y_test).mean()
  assert acc > 0.45, acc  # chance is 0.1


def test_anonymous_aggregator_inside_tff_fed_avg(digits):
  """TFF's own build_weighted_fed_avg accepts the factory (anonymous mode)."""
  factory = cla.ClusteredAggregator(None, 3, threshold=0.5)
  proc = tff.learning.algorithms.build_weighted_fed_avg(
      MODEL_FN, client_optimizer_fn=sgd(),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), model_aggregator=factory)
  state = proc.initialize()
  clients = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=digits.x_train[i * 30:(i + 1) * 30], y=digits.y_train[i * 30:(i + 1) * 30]
      .astype(np.int32))).batch(BATCH) for i in range(3)]
  out = proc.next(state, clients)
  agg = out.metrics['aggregator']
  assert agg['seen_clients'] == 3 and agg['aggregation_weights'].sum() == pytest.approx(1.0)
  assert out.state.aggregator['round_num'] == 1
