"""Clients that do not report, at the server of every method (docs/methods.md, "When
clients do not report").

A sampled client that never reports reaches the server as an upload of weight 0; in the
processes here it is a client with no examples (it trains 0 steps and gets weight 0), the
same thing at the server. Aggregator-level rules are checked against NumPy on random
inputs; every method is checked to leave its global model exactly unchanged, and finite, in a
round nobody reports in.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import baselines, data
from tff_algos import ClientStages, build_cadis, build_fedcda, build_fedcross, build_scaffold
from tff_algos.aggregators import clustering, reporting
from tff_algos.client_work import model_delta

pytestmark = pytest.mark.usefixtures('runtime')

BATCH = 16
SHAPES = ([3], [2, 2])


def value_type():
  return tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in SHAPES], list)


def random_values(rng, count):
  return [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(count)]


# --------------------------------------------------------------------------- #
# FedAvg family: the mean over reporters, and the finalizer that skips a silent round
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize('inner', ['weighted', 'unweighted'])
def test_reporting_factory_is_the_mean_over_reporters(inner):
  factory = reporting.ReportingFactory(
      None if inner == 'weighted' else tff.aggregators.UnweightedMeanFactory())
  process = factory.create(value_type(), tff.TensorType(np.float32))
  rng = np.random.default_rng(0)
  for trial in range(3):
    values = random_values(rng, 5)  # non-reporters upload garbage: it must not count
    weights = rng.uniform(0.5, 3.0, size=5).astype(np.float32)
    weights[rng.permutation(5)[:2 + trial % 2]] = 0.0
    reported = weights > 0
    if inner == 'weighted':
      share = weights / weights.sum()
    else:  # an unweighted factory: uniform over the reporters
      share = reported / reported.sum()
    out = process.next(process.initialize(), values, list(weights))
    assert out.result['has_result'] == 1.0
    for i, got in enumerate(out.result['update']):
      want = sum(s * v[i] for s, v in zip(share, values))
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # nobody reported: zeros (a weighted mean would be 0/0), and has_result 0
  out = process.next(process.initialize(), values, [np.float32(0.0)] * 5)
  assert out.result['has_result'] == 0.0
  for got in out.result['update']:
    np.testing.assert_array_equal(got, np.zeros_like(got))


def test_keep_unless_reported_skips_the_step_and_its_momentum():
  """SGD with momentum 0.9 as NumPy: a round without reporters moves neither the weights
  nor the momentum (a zero update would move the weights by 0.9·m)."""
  weights_type = tff.StructWithPythonType(
      [('trainable', value_type()),
       ('non_trainable', tff.StructWithPythonType([], list))],
      tff.learning.models.ModelWeights)
  lr, momentum = 0.5, 0.9
  finalizer = reporting.keep_unless_reported(model_delta.build_update_finalizer(
      tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=momentum), weights_type))
  rng = np.random.default_rng(1)
  w = random_values(rng, 1)[0]
  m = [np.zeros_like(t) for t in w]
  state = finalizer.initialize()
  current = tff.learning.models.ModelWeights(trainable=w, non_trainable=[])
  for has_result in (1.0, 0.0, 0.0, 1.0):
    update = random_values(rng, 1)[0]
    out = finalizer.next(state, current, collections.OrderedDict(
        update=update, has_result=np.float32(has_result)))
    if has_result:
      m = [momentum * a + u for a, u in zip(m, update)]
      w = [t - lr * a for t, a in zip(w, m)]
      for got, want in zip(out.result.trainable, w):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
      for got, old in zip(out.result.trainable, current.trainable):
        np.testing.assert_array_equal(got, old)
      for got, old in zip(tf.nest.flatten(out.state), tf.nest.flatten(state)):
        np.testing.assert_array_equal(got, old)
    state, current = out.state, out.result


# --------------------------------------------------------------------------- #
# Processes: client inputs with and without data
# --------------------------------------------------------------------------- #


def client(digits, index, slot, size=20, epochs=2, round_num=0):
  start = 25 * index
  x, y = digits.x_train[start:start + size], digits.y_train[start:start + size]
  return data.client_input(x, y, epochs, np.random.default_rng([round_num, index]), index,
                           slot)


def silent(digits, index, slot):
  """A client that does not report (until the `work` field: one with no examples)."""
  return client(digits, index, slot, size=0)


def as_next_input(inputs):
  return [[inp] for inp in inputs]


def flat(structure):
  return [np.asarray(t) for t in tf.nest.flatten(structure)]


def assert_identical(a, b):
  fa, fb = flat(a), flat(b)
  assert len(fa) == len(fb)
  for x, y in zip(fa, fb):
    np.testing.assert_array_equal(x, y)


def assert_silent_round_keeps_model(process, state, digits, indices):
  out = process.next(state, as_next_input(
      [silent(digits, i, s) for s, i in enumerate(indices)]))
  before = process.get_model_weights(state)
  after = process.get_model_weights(out.state)
  assert all(np.all(np.isfinite(t)) for t in flat(after))
  assert_identical(after, before)
  return out


@pytest.mark.parametrize('name', baselines.BASELINES)
def test_baseline_round_without_reporters_keeps_model_and_server_optimizer(
    name, digits, tiny_model_fn, sgd):
  process = baselines.build_baseline(name, tiny_model_fn, sgd(), BATCH)
  out = process.next(process.initialize(), as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=13)]))
  state = out.state
  out = assert_silent_round_keeps_model(process, state, digits, [2, 3])
  assert_identical(out.state.finalizer, state.finalizer)  # FedAvgM's m, FedAdam's moments


def test_fedavgm_mean_is_over_reporters(digits, tiny_model_fn, sgd):
  """[A, silent, B] is the round [A, B]: model and server momentum."""
  process = baselines.build_fedavgm(tiny_model_fn, sgd(), BATCH)
  a, b = client(digits, 0, 0), client(digits, 1, 1, size=13)
  state = process.next(process.initialize(), as_next_input([a, b])).state
  a1, b1 = client(digits, 0, 0, round_num=1), client(digits, 1, 2, size=13, round_num=1)
  with_silent = process.next(state, as_next_input([a1, silent(digits, 2, 1), b1])).state
  without = process.next(state, as_next_input([a1, b1])).state
  for x, y in zip(flat(with_silent.global_model_weights) + flat(with_silent.finalizer),
                  flat(without.global_model_weights) + flat(without.finalizer)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_fedcross_silent_slot_keeps_its_model(digits, tiny_model_fn, sgd):
  k = 3
  process = build_fedcross(tiny_model_fn, sgd(momentum=0.5), BATCH, k)
  state = process.initialize()
  out = process.next(state, as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=13), silent(digits, 2, 2)]))
  for new, old in zip(flat(out.state.aggregator['models']), flat(state.aggregator['models'])):
    np.testing.assert_array_equal(new[2], old[2])
    assert np.max(np.abs(new[0] - old[0])) > 0
  np.testing.assert_array_equal(out.metrics['aggregator']['collaborators'], [1, 0, -1])
  silent_out = assert_silent_round_keeps_model(process, out.state, digits, [3, 4, 5])
  assert_identical(silent_out.state.aggregator['models'], out.state.aggregator['models'])
  np.testing.assert_array_equal(silent_out.metrics['aggregator']['collaborators'], [-1] * k)


def test_fedcda_silent_client_keeps_cache_and_selection(digits, tiny_model_fn, sgd):
  n, p = 4, 2
  process = build_fedcda(tiny_model_fn, sgd(), BATCH, n, p, cache_size=2, warmup_rounds=1,
                         num_batches=1)
  state = process.next(process.initialize(), as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=13)])).state
  # after warmup: client 1 does not report, client 2 does
  out = process.next(state, as_next_input(
      [silent(digits, 1, 0), client(digits, 2, 1, round_num=1)]))
  old, new = state.aggregator, out.state.aggregator
  for key in ('losses', 'sq_norms', 'count', 'selected'):
    np.testing.assert_array_equal(np.asarray(new[key])[1], np.asarray(old[key])[1])
  assert np.asarray(new['count'])[2] == 1
  old_rows = np.concatenate([np.asarray(c) for c in old['cache']])[1]
  new_rows = np.concatenate([np.asarray(c) for c in new['cache']])[1]
  np.testing.assert_array_equal(new_rows, old_rows)
  assert out.metrics['aggregator']['uploads'] == 1.0
  # nobody reports: the model, every cache and selection as they were
  silent_out = assert_silent_round_keeps_model(process, out.state, digits, [0, 3])
  for key in ('cache', 'losses', 'sq_norms', 'count', 'selected', 'selected_sum'):
    assert_identical(silent_out.state.aggregator[key], out.state.aggregator[key])


def test_fedcda_silent_rounds_around_warmup_keep_model(digits, tiny_model_fn, sgd):
  """Silent in warmup, and silent in the first round after it: the global model is still
  the warmup's data-size weighted FedAvg, not the uniform mean of the caches."""
  process = build_fedcda(tiny_model_fn, sgd(), BATCH, 4, 2, cache_size=2, warmup_rounds=2)
  state = assert_silent_round_keeps_model(process, process.initialize(), digits, [0, 1]).state
  state = process.next(state, as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=7)])).state
  assert_silent_round_keeps_model(process, state, digits, [2, 3])


@pytest.mark.parametrize('quirks', [False, True])
def test_cadis_silent_row_is_not_clustered(quirks):
  """A weight-0 row (zero delta: a client that trained nothing) adds nothing to Q or F and
  gets p = 0; the reporters' p are those of the round without that row, on random inputs."""
  n, c = 6, 5
  rng = np.random.default_rng(7)
  options = clustering.ClusteringOptions(reference_quirks=quirks)
  state = collections.OrderedDict(q=tf.zeros([n, n]), f=tf.zeros([n, n]),
                                  tau=tf.constant(0.5), round_num=tf.constant(0))
  for _ in range(3):
    index = rng.permutation(n)[:c].astype(np.int32)
    index.sort()
    weights = rng.uniform(5, 20, size=c).astype(np.float32)
    sim = rng.normal(size=[c, 4]).astype(np.float32)
    drop = rng.integers(c)
    weights[drop] = 0.0
    sim[drop] = 0.0
    keep = np.arange(c) != drop
    new, p, _ = clustering.clustering_step(state, index, weights, sim, options)
    ref, p_ref, _ = clustering.clustering_step(state, index[keep], weights[keep], sim[keep],
                                               options)
    for key in ('q', 'f'):
      np.testing.assert_array_equal(new[key], ref[key])
    silent_client = index[drop]
    assert np.all(np.asarray(new['f'])[silent_client] == np.asarray(state['f'])[silent_client])
    assert p[drop] == 0.0
    np.testing.assert_allclose(np.asarray(p)[keep], p_ref, rtol=1e-6)
    state = new


def test_cadis_round_without_reporters_keeps_model_and_momentum(digits, tiny_model_fn, sgd):
  process = build_cadis(tiny_model_fn, sgd(), BATCH, num_clients=4, clients_per_round=2,
                        client_stages=ClientStages(kd_weight=0.0),
                        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9))
  state = process.next(process.initialize(), as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=13)])).state
  out = assert_silent_round_keeps_model(process, state, digits, [2, 3])
  assert_identical(out.state.finalizer, state.finalizer)
  for key in ('q', 'f'):
    assert_identical(out.state.aggregator[key], state.aggregator[key])


def test_scaffold_silent_clients_keep_their_control_variates(digits, tiny_model_fn, sgd):
  n = 4
  process = build_scaffold(tiny_model_fn, sgd(), BATCH, num_clients=n, clients_per_round=2)
  state = process.next(process.initialize(), as_next_input(
      [client(digits, 0, 0), client(digits, 1, 1, size=13)])).state
  out = process.next(state, as_next_input(
      [client(digits, 0, 0, round_num=1), silent(digits, 1, 1)]))
  old, new = state.aggregator, out.state.aggregator
  for c_old, c_new, srv_old, srv_new in zip(old['client_controls'], new['client_controls'],
                                            old['server_control'], new['server_control']):
    c_old, c_new = np.asarray(c_old), np.asarray(c_new)
    np.testing.assert_array_equal(c_new[1:], c_old[1:])  # the silent client 1, and 2, 3
    # c <- c + (1/N) Σ over reporters of Δc_i: client 0 alone
    np.testing.assert_allclose(np.asarray(srv_new) - np.asarray(srv_old),
                               (c_new[0] - c_old[0]) / n, rtol=1e-4, atol=1e-7)
  silent_out = assert_silent_round_keeps_model(process, out.state, digits, [2, 3])
  assert_identical(silent_out.state.aggregator['client_controls'], new['client_controls'])
  assert_identical(silent_out.state.aggregator['server_control'], new['server_control'])
