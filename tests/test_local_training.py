"""The shared local-training loop against independent plain-TF computations, and its edge cases
(empty clients, non-finite updates) in the client work process and in FedAvg."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top
import math  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tff_algos import baselines
from tff_algos import models
from tff_algos.client_work import model_delta
from tff_algos.client_work import model_upload
from tff_algos.client_work import local_training

BATCH = 8
EPOCHS = 3
LR = 0.1
RTOL, ATOL = 1e-5, 1e-6

pytestmark = pytest.mark.usefixtures('runtime')


def make_input(ds, start, n, index, seed=0, epochs=EPOCHS, work=1.0):
  rng = np.random.default_rng([seed, index])
  return data.client_input(ds.x_train[start:start + n], ds.y_train[start:start + n], epochs,
                           rng, index, index, work)


@pytest.fixture(scope='module')
def client_train(tiny_model_fn, sgd):
  """A TFF computation running build_local_training for one client (tiny CNN, SGD)."""
  weights_type = model_delta.model_weights_type(tiny_model_fn)
  data_type = local_training.client_data_type(model_delta.model_input_spec(tiny_model_fn))

  @tff.tensorflow.computation(weights_type, data_type)
  def train_one(initial_weights, dataset):
    train = local_training.build_local_training(tiny_model_fn(), sgd(LR), BATCH)
    out = train(initial_weights, local_training.single_element(dataset))
    return collections.OrderedDict(
        trainable=out.model_weights.trainable, num_examples=out.num_examples,
        loss_sum=out.loss_sum, examples_trained=out.examples_trained,
        correct=out.correct, seen=out.seen, last_epoch_loss=out.last_epoch_loss,
        steps_trained=out.steps_trained, epochs_trained=out.epochs_trained,
        reported=out.reported)

  return train_one


@pytest.fixture(scope='module')
def initial_weights(tiny_model_fn):
  return model_delta.initial_model_weights_fn(tiny_model_fn)()


@pytest.fixture(scope='module')
def client_work(tiny_model_fn, sgd):
  return model_delta.build_model_delta_client_work(tiny_model_fn, sgd(LR), BATCH)


@pytest.fixture(scope='module')
def fedavg(tiny_model_fn, sgd):
  return baselines.build_fedavg(tiny_model_fn, sgd(LR), BATCH)


def reference_sgd(initial, inp, steps=None):
  """Plain eager TF: GradientTape SGD over the batches `order` defines (the first `steps` of
  them when given); per-batch losses."""
  keras_model = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  variables = keras_model.trainable_variables
  for v, w in zip(variables, initial):
    v.assign(w)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  n = inp['x'].shape[0]
  losses = []  # (epoch, batch size, loss)
  correct = 0
  batches = [(epoch, epoch_order[start:start + BATCH])
             for epoch, epoch_order in enumerate(inp['order']) for start in range(0, n, BATCH)]
  for epoch, idx in batches[:steps]:
    with tf.GradientTape() as tape:
      logits = keras_model(inp['x'][idx], training=True)
      loss = loss_fn(inp['y'][idx], logits)
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
      v.assign_sub(LR * g)
    losses.append((epoch, len(idx), float(loss)))
    correct += int(np.sum(np.argmax(logits.numpy(), -1) == inp['y'][idx]))
  return [v.numpy() for v in variables], losses, correct


def test_matches_gradient_tape_sgd(digits, client_train, initial_weights):
  inp = make_input(digits, 0, 21, index=0)  # 21 = 2 full batches + 5
  out = client_train(initial_weights, [inp])
  expected, losses, correct = reference_sgd(initial_weights.trainable, inp)
  assert len(out['trainable']) == len(expected)
  for a, e in zip(out['trainable'], expected):
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)
  assert max(np.max(np.abs(np.asarray(a) - np.asarray(w)))
             for a, w in zip(out['trainable'], initial_weights.trainable)) > 1e-3
  assert out['num_examples'] == 21
  assert out['examples_trained'] == 21 * EPOCHS
  assert out['seen'] == 21 * EPOCHS
  assert out['correct'] == correct
  np.testing.assert_allclose(out['loss_sum'], sum(c * l for _, c, l in losses), rtol=1e-5)


def test_last_epoch_loss_is_example_weighted_mean_over_last_epoch(
    digits, client_train, initial_weights):
  inp = make_input(digits, 100, 13, index=1)  # batches of 8 and 5: weighting matters
  out = client_train(initial_weights, [inp])
  _, losses, _ = reference_sgd(initial_weights.trainable, inp)
  last = [(c, l) for e, c, l in losses if e == EPOCHS - 1]
  assert [c for c, _ in last] == [8, 5]
  expected = sum(c * l for c, l in last) / sum(c for c, _ in last)
  np.testing.assert_allclose(out['last_epoch_loss'], expected, rtol=1e-5)
  unweighted = np.mean([l for _, l in last])
  assert abs(expected - unweighted) > 1e-6  # the check can tell the two apart


def test_single_epoch_and_exact_batches(digits, client_train, initial_weights):
  inp = make_input(digits, 200, 16, index=2, epochs=1)
  out = client_train(initial_weights, [inp])
  expected, losses, _ = reference_sgd(initial_weights.trainable, inp)
  assert len(losses) == 2
  for a, e in zip(out['trainable'], expected):
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(out['last_epoch_loss'],
                             (8 * losses[0][2] + 8 * losses[1][2]) / 16, rtol=1e-5)


def client_results(client_work, initial_weights, inputs):
  state = client_work.initialize()
  out = client_work.next(state, [initial_weights] * len(inputs), [[inp] for inp in inputs])
  return out.result, out.measurements['train']


def test_empty_client_gives_zero_update_and_weight(digits, client_work, initial_weights):
  empty = data.client_input(np.zeros([0, 8, 8, 1], np.float32), np.zeros([0], np.int32),
                            EPOCHS, np.random.default_rng(0), 5, 1)
  assert empty['order'].shape == (EPOCHS, 0)
  results, train = client_results(client_work, initial_weights,
                                  [make_input(digits, 0, 21, 0), empty])
  assert results[1].update_weight == 0
  for u in results[1].update:
    np.testing.assert_array_equal(u, np.zeros_like(u))
  assert results[0].update_weight == 21
  assert train['num_examples'] == 21 and train['num_clients'] == 2
  assert train['non_finite_clients'] == 0
  # Costs as counted by the clients: the empty one ran no epoch and saw no example.
  assert (train['client_epochs'], train['examples_trained']) == (EPOCHS, 21 * EPOCHS)
  for key in ('loss', 'accuracy', 'last_epoch_loss'):
    assert np.isfinite(train[key]), key


def test_non_finite_update_is_zeroed_with_weight_zero(digits, client_work, initial_weights):
  bad = make_input(digits, 300, 12, index=3)
  bad['x'] = bad['x'].copy()
  bad['x'][0, 0, 0, 0] = np.nan
  results, train = client_results(client_work, initial_weights,
                                  [make_input(digits, 0, 21, 0), bad])
  assert results[1].update_weight == 0
  for u in results[1].update:
    np.testing.assert_array_equal(u, np.zeros_like(u))
  assert results[0].update_weight == 21
  assert np.all([np.all(np.isfinite(u)) for u in results[0].update])
  assert train['non_finite_clients'] == 1
  # The diverged client's work was done: it counts in the costs.
  assert (train['client_epochs'], train['examples_trained']) == (2 * EPOCHS, 33 * EPOCHS)


def test_exploding_learning_rate_is_non_finite(digits, initial_weights, tiny_model_fn, sgd):
  work = model_delta.build_model_delta_client_work(tiny_model_fn, sgd(1e30), BATCH)
  results, train = client_results(work, initial_weights, [make_input(digits, 0, 40, 0)])
  assert results[0].update_weight == 0
  for u in results[0].update:
    np.testing.assert_array_equal(u, np.zeros_like(u))
  assert train['non_finite_clients'] == 1


def test_fedsgd_counts_no_local_epoch_and_one_pass_over_the_data(digits, tiny_model_fn):
  """FedSGD's clients take one full-batch gradient: 0 client-epochs, each example once
  (the inputs carry EPOCHS permutations, which it does not train on)."""
  process = baselines.build_fedsgd(tiny_model_fn)
  _, metrics = fedavg_weights(process, [make_input(digits, 0, 21, 0),
                                        make_input(digits, 50, 30, 1)])
  train = metrics['client_work']['train']
  assert (train['client_epochs'], train['examples_trained']) == (0, 51)


def fedavg_weights(process, inputs):
  state = process.initialize()
  out = process.next(state, [[inp] for inp in inputs])
  return [np.asarray(t) for t in process.get_model_weights(out.state).trainable], out.metrics


def test_fedavg_ignores_empty_and_non_finite_clients(digits, fedavg):
  good = [make_input(digits, 0, 21, 0), make_input(digits, 50, 30, 1)]
  empty = data.client_input(np.zeros([0, 8, 8, 1], np.float32), np.zeros([0], np.int32),
                            EPOCHS, np.random.default_rng(0), 2, 2)
  bad = make_input(digits, 300, 12, index=3)
  bad['x'] = np.full_like(bad['x'], np.nan)
  gone = make_input(digits, 400, 17, index=4, work=0.0)
  expected, _ = fedavg_weights(fedavg, good)
  actual, metrics = fedavg_weights(fedavg, [good[0], empty, bad, gone, good[1]])
  for a, e in zip(actual, expected):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)
  train = metrics['client_work']['train']
  assert train['non_finite_clients'] == 1 and train['unreported_clients'] == 1
  assert train['num_clients'] == 5
  # The diverged client is left out of the round's training metrics.
  assert np.isfinite(train['loss']) and np.isfinite(train['accuracy'])
  assert train['num_examples'] == 21 + 30


# --------------------------------------------------------------------------- #
# Client faults: the input's `work`
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize('work', [1 / 3, 0.05, *np.random.default_rng(4).uniform(0.1, 1, 3)])
def test_straggler_runs_exactly_ceil_work_times_k_steps(digits, client_train, initial_weights,
                                                        work):
  """21 examples, batches of 8, 3 epochs: K = 9 steps; a straggler runs the first
  ceil(work x 9) of them (1/3 is stored as float32 0.33333334: still 3 steps), stopping
  inside an epoch; its last-epoch loss is over that epoch's batches that ran."""
  inp = make_input(digits, 0, 21, index=0, work=float(work))
  steps = math.ceil(float(work) * 9)
  out = client_train(initial_weights, [inp])
  expected, losses, correct = reference_sgd(initial_weights.trainable, inp, steps)
  assert len(losses) == steps == out['steps_trained']
  for a, e in zip(out['trainable'], expected):
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)
  assert out['examples_trained'] == out['seen'] == sum(c for _, c, _ in losses)
  assert out['correct'] == correct
  np.testing.assert_allclose(out['epochs_trained'], steps / 3, rtol=1e-6)
  np.testing.assert_allclose(out['loss_sum'], sum(c * l for _, c, l in losses), rtol=1e-5)
  last = [(c, l) for e, c, l in losses if e == losses[-1][0]]
  np.testing.assert_allclose(out['last_epoch_loss'],
                             sum(c * l for c, l in last) / sum(c for c, _ in last), rtol=1e-5)
  assert out['num_examples'] == 21 and out['reported'] == 1


def test_work_zero_trains_nothing(digits, client_train, initial_weights):
  out = client_train(initial_weights, [make_input(digits, 0, 21, index=0, work=0.0)])
  for a, w in zip(out['trainable'], initial_weights.trainable):
    np.testing.assert_array_equal(a, w)
  assert (out['steps_trained'], out['epochs_trained'], out['examples_trained'],
          out['loss_sum'], out['last_epoch_loss'], out['reported']) == (0, 0, 0, 0, 0, 0)


def test_unreported_client_uploads_nothing_and_is_counted(digits, client_work,
                                                          initial_weights):
  good = make_input(digits, 0, 21, 0)
  gone = make_input(digits, 50, 30, 1, work=0.0)
  lagging = make_input(digits, 100, 13, 2, work=0.5)   # 6 steps: 3 of them, 1.5 epochs
  results, train = client_results(client_work, initial_weights, [good, gone, lagging])
  alone_results, alone = client_results(client_work, initial_weights, [good])
  assert [r.update_weight for r in results] == [21, 0, 13]   # a straggler keeps its weight
  for u in results[1].update:
    np.testing.assert_array_equal(u, np.zeros_like(u))
  for a, e in zip(results[0].update, alone_results[0].update):
    np.testing.assert_array_equal(a, e)
  assert (train['reported_clients'], train['unreported_clients'], train['num_clients'],
          train['non_finite_clients']) == (2, 1, 3, 0)
  assert (train['client_epochs'], train['examples_trained']) == (EPOCHS + 1.5, 21 * EPOCHS + 8 + 5 + 8)
  assert train['num_examples'] == 21 + 13
  _, lag_losses, _ = reference_sgd(initial_weights.trainable, lagging, 3)
  _, good_losses, _ = reference_sgd(initial_weights.trainable, good)
  expected_loss = sum(c * l for _, c, l in good_losses + lag_losses) / (21 * EPOCHS + 21)
  np.testing.assert_allclose(train['loss'], expected_loss, rtol=1e-5)
  _, nobody = client_results(client_work, initial_weights, [gone])
  assert (nobody['reported_clients'], nobody['unreported_clients']) == (0, 1)
  assert (nobody['loss'], nobody['accuracy'], nobody['num_examples']) == (0, 0, 0)


def reference_full_gradient(initial, x, y):
  """The mean cross-entropy gradient over (x, y) at `initial`, in one plain-TF batch."""
  keras_model = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  for v, w in zip(keras_model.trainable_variables, initial):
    v.assign(w)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  with tf.GradientTape() as tape:
    loss = loss_fn(y, keras_model(x, training=False))
  return [g.numpy() for g in tape.gradient(loss, keras_model.trainable_variables)]


def test_fedsgd_straggler_takes_the_gradient_over_its_first_examples(
    digits, tiny_model_fn, initial_weights):
  """FedSGD: the mean gradient over the first ceil(work x n) examples of epoch 0's order
  (21 examples, work 0.6: 13, two batches of 8 and 5); work 0 uploads nothing."""
  work = model_delta.build_model_delta_client_work(tiny_model_fn, None, BATCH,
                                                   full_gradient=True)
  lagging = make_input(digits, 0, 21, 0, work=0.6)
  gone = make_input(digits, 50, 30, 1, work=0.0)
  results, train = client_results(work, initial_weights, [lagging, gone])
  first = lagging['order'][0][:13]
  expected = reference_full_gradient(initial_weights.trainable, lagging['x'][first],
                                     lagging['y'][first])
  for a, e in zip(results[0].update, expected):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6)
  whole = reference_full_gradient(initial_weights.trainable, lagging['x'], lagging['y'])
  assert max(np.max(np.abs(a - b)) for a, b in zip(expected, whole)) > 1e-4
  assert [r.update_weight for r in results] == [21, 0]
  for u in results[1].update:
    np.testing.assert_array_equal(u, np.zeros_like(u))
  assert (train['examples_trained'], train['reported_clients'],
          train['unreported_clients']) == (13, 1, 1)


def test_model_upload_of_an_unreported_client_weighs_nothing(digits, tiny_model_fn, sgd,
                                                            initial_weights):
  upload = model_upload.build_model_upload_client_work(tiny_model_fn, sgd(LR), BATCH)
  state = upload.initialize()
  inputs = [make_input(digits, 0, 21, 0), make_input(digits, 50, 30, 1, work=0.0)]
  out = upload.next(state, [initial_weights] * 2, [[inp] for inp in inputs])
  assert [r.update_weight for r in out.result] == [21, 0]
  gone = out.result[1].update
  for a, w in zip(gone['model'].trainable, initial_weights.trainable):
    np.testing.assert_array_equal(a, w)
  assert gone['last_epoch_loss'] == 0 and gone['client_index'] == 1
  train = out.measurements['train']
  assert (train['reported_clients'], train['unreported_clients']) == (1, 1)
