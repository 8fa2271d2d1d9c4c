"""CADIS: KD loss, the keyed client work and the LearningProcess, against independent NumPy /
plain-TF references (the clustering maths: tests/test_cadis_clustering.py; the aggregation
factory: tests/test_cadis_aggregator.py)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tests import helpers
from tff_algos.aggregators import clustered_aggregation as cla
from tff_algos.cadis import build_cadis, classifier_similarity_index
from tff_algos.client_work import distillation, local_training, model_delta, plugins
from tff_algos.models import representation, zoo

pytestmark = pytest.mark.usefixtures('runtime')

BATCH = 8
LR = 0.1  # the `sgd` fixture's default rate, which reference_kd_training repeats


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


@pytest.mark.parametrize('m, low, high', [(8, 0.02, 0.04), (32, 0.0012, 0.0020)])
def test_kd_std_moves_the_loss_as_the_docs_say(m, low, high):
  """docs/algorithms.md: the population σ's KD loss exceeds the sample σ's by about 3% at a
  batch of 8 and 0.16% at 32 (σ itself by √(P/(P−1)), P = m(m−1): 0.9% and 0.05%), as a
  mean over random batches of ReLU-like representations."""
  rng = np.random.default_rng([m, 2])
  ratios = []
  for _ in range(10):
    teacher = np.maximum(rng.normal(size=[m, 32]), 0).astype(np.float32)
    student = np.maximum(teacher + rng.normal(scale=0.3, size=[m, 32]), 0).astype(np.float32)
    population = distillation.kde_similarity_kl(teacher, student).numpy()
    sample = distillation.kde_similarity_kl(teacher, student, 'sum', 'sample').numpy()
    ratios.append(population / sample - 1.0)
  assert low < np.mean(ratios) < high, np.mean(ratios)


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
def client_works(tiny_model_fn, sgd):
  plain = model_delta.build_model_delta_client_work(tiny_model_fn, sgd(), BATCH)
  keyed0 = model_delta.build_model_delta_client_work(
      tiny_model_fn, sgd(), BATCH, keyed=True, client_stages=plugins.ClientStages(kd_weight=0.0))
  kd = model_delta.build_model_delta_client_work(
      tiny_model_fn, sgd(), BATCH, keyed=True,
      client_stages=plugins.ClientStages(kd_weight=0.5, kd_reduction='mean'))
  return plain, keyed0, kd


@pytest.fixture(scope='module')
def initial_weights(tiny_model_fn):
  return model_delta.initial_model_weights_fn(tiny_model_fn)()


def client_inputs(ds):
  """Four clients, 2 epochs: 37 examples, 1 example, none, 20 examples."""
  sizes, out, start = (37, 1, 0, 20), [], 0
  for c, n in enumerate(sizes):
    out.append(data.client_input(ds.x_train[start:start + n], ds.y_train[start:start + n], 2,
                                 np.random.default_rng([11, c]), 5 + c, c))
    start += n
  return out


def test_kd_options_are_validated(tiny_model_fn, sgd):
  for stages, kwargs, match in ((dict(kd_weight=-1.0), {}, 'kd_weight'),
                                (dict(kd_weight=np.nan), {}, 'kd_weight'),
                                (dict(kd_reduction='max'), {}, 'kd_reduction'),
                                (dict(kd_std='bessel'), {}, 'kd_std'),
                                (dict(kd_weight=1.0), dict(full_gradient=True), 'full_gradient')):
    with pytest.raises(ValueError, match=match):
      model_delta.build_model_delta_client_work(
          tiny_model_fn, sgd(), BATCH, client_stages=plugins.ClientStages(**stages), **kwargs)


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


def test_kd_std_sample_reaches_the_client_work(client_works, digits, initial_weights,
                                                tiny_model_fn, sgd):
  _, _, kd = client_works   # kd_reduction='mean', σ population
  sample = model_delta.build_model_delta_client_work(
      tiny_model_fn, sgd(), BATCH, keyed=True,
      client_stages=plugins.ClientStages(kd_weight=0.5, kd_reduction='mean', kd_std='sample'))
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
# build_cadis
# --------------------------------------------------------------------------- #

N_CLIENTS, PER_ROUND = 10, 10


@pytest.fixture(scope='module')
def fed(digits):
  return data.federate(digits,
                       data.make_partitioner('cluster_mc', num_clients=N_CLIENTS, seed=0))


@pytest.fixture(scope='module')
def cadis_process(fed, tiny_model_fn, sgd):
  return build_cadis(tiny_model_fn, sgd(), BATCH, N_CLIENTS, clients_per_round=PER_ROUND,
                     threshold=0.9, threshold_max=0.95, true_clusters=fed.true_clusters)


def test_build_cadis_refuses_bad_arguments(tiny_model_fn, sgd):
  # The stages' own values: tests/test_plugins.py.
  bad = [dict(threshold=1.2), dict(closure='chain'), dict(similarity_layer='penultimate'),
         dict(clients_per_round=11), dict(true_clusters=[0, 1, 2]),
         dict(threshold=0.98, threshold_max=0.9)]
  for kwargs in bad:
    args = dict(clients_per_round=5)
    args.update(kwargs)
    with pytest.raises(ValueError):
      build_cadis(tiny_model_fn, sgd(), BATCH, 10, **args)
  with pytest.raises(ValueError):
    build_cadis(tiny_model_fn, sgd(), 0, 10, clients_per_round=5)
  assert classifier_similarity_index(tiny_model_fn, 'bias') == 5
  assert classifier_similarity_index(tiny_model_fn, 'kernel') == 4


def test_build_cadis_passes_the_two_hop_metrics_limit(cadis_process, fed, tiny_model_fn, sgd):
  # Below N the whole-relation metrics are skipped (-1); sizes and weights stay the same.
  limited = build_cadis(tiny_model_fn, sgd(), BATCH, N_CLIENTS, clients_per_round=PER_ROUND,
                        threshold=0.9, threshold_max=0.95, true_clusters=fed.true_clusters,
                        two_hop_metrics_max_clients=N_CLIENTS - 1)
  _, inputs = data.round_inputs(fed, 0, PER_ROUND, 1, seed=0)
  full = cadis_process.next(cadis_process.initialize(), [[x] for x in inputs]).metrics
  cut = limited.next(limited.initialize(), [[x] for x in inputs]).metrics
  assert int(full['aggregator']['num_clusters']) >= 1
  assert int(cut['aggregator']['num_clusters']) == -1
  for key in ('cluster_sizes', 'aggregation_weights'):
    np.testing.assert_array_equal(cut['aggregator'][key], full['aggregator'][key])


def test_build_cadis_type_signature(cadis_process, tiny_model_fn):
  proc = cadis_process
  assert isinstance(proc, tff.learning.templates.LearningProcess)
  weights_type = model_delta.model_weights_type(tiny_model_fn)
  data_type = local_training.client_data_type(model_delta.model_input_spec(tiny_model_fn))
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


def test_anonymous_aggregator_inside_tff_fed_avg(digits, tiny_model_fn, sgd):
  """TFF's own build_weighted_fed_avg accepts the factory (anonymous mode)."""
  factory = cla.ClusteredAggregator(None, 3, threshold=0.5)
  proc = tff.learning.algorithms.build_weighted_fed_avg(
      tiny_model_fn, client_optimizer_fn=sgd(),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), model_aggregator=factory)
  state = proc.initialize()
  clients = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=digits.x_train[i * 30:(i + 1) * 30], y=digits.y_train[i * 30:(i + 1) * 30]
      .astype(np.int32))).batch(BATCH) for i in range(3)]
  out = proc.next(state, clients)
  agg = out.metrics['aggregator']
  assert agg['seen_clients'] == 3 and agg['aggregation_weights'].sum() == pytest.approx(1.0)
  assert out.state.aggregator['round_num'] == 1
