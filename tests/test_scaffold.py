"""SCAFFOLD (option II) against an independent NumPy SCAFFOLD, its control-variate state, its
type signature and limits, and a digits run through the training program.

The NumPy reference trains a linear softmax model with its own float64 gradients, batch by
batch in the order the client inputs give, and keeps x, c and every c_i as plain arrays
(Karimireddy et al. 2020, Algorithm 1 with option II).
"""

import math
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top
import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
import tff_algos
from tff_algos import models
from tff_algos import optimizers
from tff_algos.aggregators import control_variates
from tff_algos.client_work import corrected_training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES, CLASSES = 5, 3
N, P, BATCH, EPOCHS, LR = 6, 3, 4, 2, 0.2
SIZES = (7, 12, 5, 9, 10, 6)   # partial last batches: K_i differs between clients
# Clients of each round in slot order: client 1 takes part in every round (its updated c_i
# is used the next time), client 2 in round 1 only (its c_i must then stay as it was),
# client 5's round-3 update is not finite (its c_i stays zero).
SCHEDULE = ((0, 1, 2), (1, 3, 4), (4, 1, 5), (3, 0, 1))
NON_FINITE = (3, 5)   # (round, client)
# Clients' work, (round, client) -> work (1 elsewhere): client 1 straggles in round 1 (3 of
# its 6 steps: it stops inside its second epoch, and option II divides by 3), client 3 drops
# out of round 2 (left out as the non-finite client), client 0 runs 3 of its 4 steps in
# round 4.
WORK = {(1, 1): 0.4, (2, 3): 0.0, (4, 0): 0.7}


pytestmark = pytest.mark.usefixtures('runtime')


def linear_model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
      tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.keras.initializers.RandomNormal(
          stddev=0.5, seed=1), bias_initializer=tf.keras.initializers.RandomNormal(
              stddev=0.1, seed=2))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(x=tf.TensorSpec([None, FEATURES], tf.float32),
                                         y=tf.TensorSpec([None], tf.int32)))


def sgd(learning_rate=LR):
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)


@functools.lru_cache(maxsize=None)
def _process(server_learning_rate, client_weighting):
  return tff_algos.build_scaffold(linear_model_fn, sgd(), BATCH, N, P,
                                  server_learning_rate=server_learning_rate,
                                  client_weighting=client_weighting)


def _client_data():
  rng = np.random.default_rng(0)
  return [(rng.normal(size=(n, FEATURES)).astype(np.float32),
           rng.integers(0, CLASSES, size=n).astype(np.int32)) for n in SIZES]


def _round_inputs(clients, round_num, client_data):
  inputs = []
  for slot, i in enumerate(clients):
    x, y = client_data[i]
    if (round_num, i) == NON_FINITE:
      x = x.copy()
      x[0, 0] = np.inf
    inputs.append(data.client_input(x, y, EPOCHS, np.random.default_rng([round_num, i]), i,
                                    slot, WORK.get((round_num, i), 1.0)))
  return inputs


# --------------------------------------------------------------------------- #
# Independent NumPy SCAFFOLD
# --------------------------------------------------------------------------- #


def np_gradient(w, x, y):
  """Mean softmax cross-entropy gradient of logits = x @ kernel + bias, in float64."""
  kernel, bias = w
  with np.errstate(invalid='ignore', over='ignore'):   # the non-finite client's inf input
    return _np_gradient(kernel, bias, x, y)


def _np_gradient(kernel, bias, x, y):
  logits = x @ kernel + bias
  logits -= logits.max(axis=1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.sum(axis=0) / len(y)]


class NpScaffold:
  """x, c and every c_i as float64 arrays; `round` is Algorithm 1, lines 4-17."""

  def __init__(self, x, num_clients, lr, server_lr, weighting):
    self.x = [np.asarray(t, np.float64) for t in x]
    self.c = [np.zeros_like(t) for t in self.x]
    self.ci = [[np.zeros_like(t) for t in self.x] for _ in range(num_clients)]
    self.n, self.lr, self.server_lr, self.weighting = num_clients, lr, server_lr, weighting

  def client(self, i, inp, work):
    x, y, order = (np.asarray(inp['x'], np.float64), inp['y'], inp['order'])
    if work == 0:   # never reports
      return None
    w = [t.copy() for t in self.x]
    steps = 0
    batches = [epoch[start:start + BATCH] for epoch in order
               for start in range(0, len(epoch), BATCH)]
    for idx in batches[:math.ceil(work * len(batches))]:
      g = np_gradient(w, x[idx], y[idx])
      w = [wt - self.lr * (gt + ct - cit)
           for wt, gt, ct, cit in zip(w, g, self.c, self.ci[i])]
      steps += 1
    if not all(np.all(np.isfinite(t)) for t in w):
      return None
    new_ci = [cit - ct + (xt - wt) / (steps * self.lr)
              for cit, ct, xt, wt in zip(self.ci[i], self.c, self.x, w)]
    return w, new_ci

  def round(self, clients, inputs, works):
    done = {i: self.client(i, inp, work) for i, inp, work in zip(clients, inputs, works)}
    done = {i: r for i, r in done.items() if r is not None}
    weights = {i: 1.0 if self.weighting == 'uniform' else len(inputs[clients.index(i)]['y'])
               for i in done}
    total = sum(weights.values())
    mean_change = [sum(weights[i] * (done[i][0][k] - self.x[k]) for i in done) / total
                   for k in range(len(self.x))]
    self.x = [xt + self.server_lr * d for xt, d in zip(self.x, mean_change)]
    self.c = [ct + sum(done[i][1][k] - self.ci[i][k] for i in done) / self.n
              for k, ct in enumerate(self.c)]
    for i, (_, new_ci) in done.items():
      self.ci[i] = new_ci
    return len(done)


def _assert_close(actual, expected):
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(np.asarray(a), e, rtol=2e-5, atol=2e-6)


# --------------------------------------------------------------------------- #
# The process against the reference
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize('server_learning_rate, client_weighting',
                         [(0.7, 'uniform'), (1.0, 'num_examples')])
def test_rounds_match_numpy_scaffold(server_learning_rate, client_weighting):
  """Four rounds, against NumPy: x (with eta_g and the weighting), c and every c_i; a client
  sampled again starts from its updated c_i; a non-finite client is left out and counted, so
  is one that drops out; a straggler's c_i divides by the steps it ran; c stays the mean of
  the c_i (both start at zero)."""
  process = _process(server_learning_rate, client_weighting)
  client_data = _client_data()
  state = process.initialize()
  ref = NpScaffold(process.get_model_weights(state).trainable, N, LR, server_learning_rate,
                   client_weighting)
  after_round_1 = None
  for round_num, clients in enumerate(SCHEDULE, start=1):
    inputs = _round_inputs(clients, round_num, client_data)
    out = process.next(state, [[x] for x in inputs])
    state = out.state
    works = [WORK.get((round_num, i), 1.0) for i in clients]
    uploads = ref.round(list(clients), inputs, works)
    agg = state.aggregator
    _assert_close(process.get_model_weights(state).trainable, ref.x)
    _assert_close(agg['server_control'], ref.c)
    for i in range(N):
      _assert_close([t[i] for t in agg['client_controls']], ref.ci[i])
    for c, rows in zip(agg['server_control'], agg['client_controls']):
      np.testing.assert_allclose(c, np.mean(rows, axis=0), rtol=1e-5, atol=1e-7)
    metrics = out.metrics
    assert metrics['aggregator']['uploads'] == uploads
    assert metrics['client_work']['train']['non_finite_clients'] == float(
        round_num == NON_FINITE[0])
    assert metrics['client_work']['train']['unreported_clients'] == works.count(0.0)
    assert metrics['client_work']['train']['reported_clients'] == P - works.count(0.0)
    if round_num == 1:
      after_round_1 = [np.asarray(t).copy() for t in agg['client_controls']]
  # Client 2 took part in round 1 only: its c_i is bit for bit what round 1 left; client 5's
  # only update (round 3) was non-finite: its c_i is still exactly zero.
  for before, now in zip(after_round_1, state.aggregator['client_controls']):
    np.testing.assert_array_equal(np.asarray(now)[2], before[2])
    assert np.any(before[2] != 0.0)
    np.testing.assert_array_equal(np.asarray(now)[5], 0.0)
  np.testing.assert_array_equal(state.aggregator['client_updates'], [2, 4, 1, 1, 2, 0])


def test_a_left_out_upload_changes_no_control_variate():
  """The aggregation process alone: an upload of weight 0 (no data or non-finite) leaves its
  client's c_i, c and the mean untouched; the others' c_i move by their control deltas."""
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [2, 3]), tff.TensorType(np.float32, [3])],
      non_trainable=[]))
  proc = control_variates.build_control_variate_aggregation(weights_type, 5, 3)
  state = proc.initialize()
  size = sum(np.asarray(t).nbytes for t in tf.nest.flatten(state))
  assert size == control_variates.state_size_bytes(5, 9)
  rng = np.random.default_rng(3)
  values, weights = [], []
  for slot, client in enumerate((4, 0, 2)):
    values.append(collections.OrderedDict(
        client_index=np.int32(client), slot=np.int32(slot),
        model_delta=[rng.normal(size=[2, 3]).astype(np.float32),
                     rng.normal(size=[3]).astype(np.float32)],
        control_delta=[rng.normal(size=[2, 3]).astype(np.float32),
                       rng.normal(size=[3]).astype(np.float32)]))
    weights.append(np.float32(slot + 1))
  weights[1] = np.float32(0.0)   # client 0 is left out
  out = proc.next(state, values, weights)
  kept = (0, 2)
  for k in range(2):
    want = sum(weights[s] * values[s]['model_delta'][k] for s in kept) / sum(
        weights[s] for s in kept)
    np.testing.assert_allclose(out.result[k], want, rtol=1e-6)
    np.testing.assert_allclose(out.state['server_control'][k],
                               sum(values[s]['control_delta'][k] for s in kept) / 5,
                               rtol=1e-6)
    rows = np.asarray(out.state['client_controls'][k])
    np.testing.assert_array_equal(rows[4], values[0]['control_delta'][k])
    np.testing.assert_array_equal(rows[2], values[2]['control_delta'][k])
    np.testing.assert_array_equal(rows[[0, 1, 3]], 0.0)
  np.testing.assert_array_equal(out.state['client_updates'], [0, 0, 1, 0, 1])
  assert out.measurements['uploads'] == 2.0
  assert out.measurements['controlled_clients'] == 2.0
  twice = collections.OrderedDict(values[2], slot=np.int32(1))
  with pytest.raises(Exception, match='same client_index'):
    proc.next(state, [values[0], twice, values[2]], [np.float32(1.0)] * 3)


def test_type_signature():
  process = _process(0.7, 'uniform')
  sig = process.next.type_signature
  assert str(sig.parameter[1]) == (
      '{<x=float32[?,5],y=int32[?],order=int32[?,?],index=int32,slot=int32,work=float32>*}@CLIENTS')
  state = sig.result.state.member
  assert str(state.aggregator) == (
      '<server_control=<float32[5,3],float32[3]>,'
      'client_controls=<float32[6,5,3],float32[6,3]>,client_updates=int32[6]>')
  assert str(state.finalizer) == '<learning_rate=float32>'
  assert tff.structure.name_list(sig.result.metrics.member) == [
      'distributor', 'client_work', 'aggregator', 'finalizer']
  assert tff.structure.name_list(sig.result.metrics.member.aggregator) == [
      'uploads', 'controlled_clients', 'server_control_norm', 'control_delta_norm']
  assert process.initialize.type_signature.result.member == state
  # The hparams: eta_l (client work) and eta_g (finalizer), as compose_learning_process's.
  hparams = process.get_hparams(process.initialize())
  assert {k: float(v['learning_rate']) for k, v in hparams.items()} == pytest.approx(
      dict(client_work=LR, finalizer=0.7))
  changed = process.set_hparams(process.initialize(), collections.OrderedDict(
      client_work=collections.OrderedDict(learning_rate=np.float32(0.05)),
      finalizer=collections.OrderedDict(learning_rate=np.float32(0.5))))
  assert float(changed.client_work['learning_rate']) == pytest.approx(0.05)
  assert float(changed.finalizer['learning_rate']) == pytest.approx(0.5)


def test_refusals_name_the_reason():
  with pytest.raises(ValueError, match=r'the SCAFFOLD control-variate state needs .* GiB '
                     r'\(4·N·D bytes: N=1000000 clients, D=18 trainable weights\), above the '
                     r'1e-05 GiB limit'):
    tff_algos.build_scaffold(linear_model_fn, sgd(), BATCH, 10**6, P, max_control_gib=1e-5)
  # Far below the limit when it is raised, or with fewer clients.
  assert control_variates.state_size_bytes(10**6, 18) == 4 * 10**6 * 18 + 4 * 18 + 4 * 10**6
  for optimizer in (tff.learning.optimizers.build_sgdm(learning_rate=0.1, momentum=0.5),
                    tff.learning.optimizers.build_adam(learning_rate=0.1)):
    with pytest.raises(ValueError, match='plain SGD client optimizer'):
      tff_algos.build_scaffold(linear_model_fn, optimizer, BATCH, N, P)
  assert corrected_training.check_plain_sgd(optimizers.with_weight_decay(sgd(0.3), 1e-4)) == \
      pytest.approx(0.3)
  with pytest.raises(ValueError, match='cannot take model_aggregator'):
    tff_algos.build_scaffold(linear_model_fn, sgd(), BATCH, N, P,
                             model_aggregator=tff.aggregators.MeanFactory())
  with pytest.raises(ValueError, match='server_learning_rate must be > 0'):
    tff_algos.build_scaffold(linear_model_fn, sgd(), BATCH, N, P, server_learning_rate=0.0)


def test_batchnorm_statistics_are_averaged_and_have_no_control_variate():
  """A model with non-trainable weights (BatchNorm's moving statistics): the control
  variates cover the trainable weights only, and the global statistics become the
  participants' mean after local training, as FedAvg's (`model_delta.update_type`)."""

  def batchnorm_model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
        tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(CLASSES)])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(x=tf.TensorSpec([None, FEATURES], tf.float32),
                                           y=tf.TensorSpec([None], tf.int32)))

  process = tff_algos.build_scaffold(batchnorm_model_fn, sgd(), BATCH, N, 2)
  state = process.initialize()
  before = process.get_model_weights(state)
  assert len(before.non_trainable) == 2   # moving mean and variance
  controls = state.aggregator['client_controls']
  assert [np.shape(c)[1:] for c in controls] == [np.shape(t) for t in before.trainable]
  client_data = _client_data()
  inputs = _round_inputs((0, 3), 1, client_data)
  state = process.next(state, [[x] for x in inputs]).state
  after = process.get_model_weights(state)
  # Every training batch moves a client's moving mean m <- 0.99 m + 0.01 (batch mean)
  # (Keras's momentum); the global one becomes the two clients' mean (uniform weights).
  finals = []
  for inp in inputs:
    m = np.asarray(before.non_trainable[0], np.float64)
    for epoch in inp['order']:
      for start in range(0, len(epoch), BATCH):
        m = 0.99 * m + 0.01 * inp['x'][epoch[start:start + BATCH]].mean(axis=0)
    finals.append(m)
  np.testing.assert_allclose(after.non_trainable[0], np.mean(finals, axis=0), rtol=1e-5,
                             atol=1e-6)
  assert np.any(np.asarray(after.non_trainable[1]) != np.asarray(before.non_trainable[1]))
  np.testing.assert_array_equal(state.aggregator['client_updates'], [1, 0, 0, 1, 0, 0])


# --------------------------------------------------------------------------- #
# Through the training program
# --------------------------------------------------------------------------- #


def test_digits_run_through_the_program_learns(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, '-m', 'programs.train', '--algorithm=scaffold', '--dataset=digits',
       '--num_clients=10', '--clients_per_round=5', '--rounds=6', '--local_epochs=2',
       '--batch_size=16', '--client_lr=0.1', '--client_momentum=0', '--progress=false',
       f'--root_output_dir={tmp_path}', '--experiment_name=s'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / 's' / 'summary.json') as f:
    summary = json.load(f)
  assert summary['final_accuracy'] > 0.6, summary   # 10 classes: chance is 0.1
  assert summary['scaffold_state_formula_bytes'] == summary['aggregator_state_bytes']
  assert summary['scaffold_control_formula'].startswith('4*N*D = 4*10*')
