"""tff_algos.baselines against TFF's own builders, and FedProx against a plain-TF reference.

Every comparison runs 2 rounds (so server and client optimiser states carry over a round) on
2 digits clients of different sizes (neither a multiple of the batch size), 2 local epochs, the
tiny CNN. TFF's builders get `tf.data` clients holding
exactly the batches our loop gathers from `order`: per epoch, the examples in that epoch's
order batched by BATCH (last batch smaller), epochs concatenated (TFF's client does one pass
over its dataset).

Each process costs ~15-40 s of CPU here (tracing plus the worker's first-call compilation,
not the data), which is what these tests spend; the processes both sides share are
module-scoped fixtures. All of them run in the default suite: FedAvg, client momentum, FedAvgM,
FedAdam and FedSGD against TFF's builders, FedProx against a plain-TF reference.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tests import helpers
from tff_algos import baselines
from tff_algos import models
from tff_algos.client_work import local_training
from tff_algos.client_work import model_delta

BATCH = 16
SIZES = (40, 13)   # neither is a multiple of BATCH
EPOCHS = 2
ROUNDS = 2
CLIENT_LR = 0.1
MU = 0.5
RTOL, ATOL = 1e-5, 1e-6
MODEL_FN = models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
DATA_TYPE = ('{<x=float32[?,8,8,1],y=int32[?],order=int32[?,?],index=int32,slot=int32,work=float32>*}'
             '@CLIENTS')


def sgd(momentum=None):
  return tff.learning.optimizers.build_sgdm(learning_rate=CLIENT_LR, momentum=momentum)


pytestmark = pytest.mark.usefixtures('runtime')


@pytest.fixture(scope='module')
def round_inputs():
  """ROUNDS lists of client inputs (disjoint digits slices, fresh orders every round)."""
  ds = data.load_digits()
  cuts = np.cumsum((0,) + SIZES)
  rounds = []
  for r in range(ROUNDS):
    inputs = []
    for c, (start, end) in enumerate(zip(cuts[:-1], cuts[1:])):
      rng = np.random.default_rng([0, r, c])
      inputs.append(data.client_input(ds.x_train[start:end], ds.y_train[start:end], EPOCHS,
                                      rng, c, c))
    rounds.append(inputs)
  return rounds


@pytest.fixture(scope='module')
def ours_fedavg():
  return baselines.build_fedavg(MODEL_FN, sgd(), BATCH)


@pytest.fixture(scope='module')
def tff_fedavg():
  return tff.learning.algorithms.build_weighted_fed_avg(MODEL_FN, client_optimizer_fn=sgd())


@pytest.fixture(scope='module')
def tff_fedprox():
  return tff.learning.algorithms.build_weighted_fed_prox(MODEL_FN, MU, sgd())


def as_dataset(inp, epochs=None):
  return helpers.as_tff_dataset(inp, BATCH, epochs)


def trainable(process, state):
  return [np.asarray(t) for t in process.get_model_weights(state).trainable]


def run(process, client_data_per_round):
  """[initial, after round 1, ...] trainable weights, and the last round's metrics."""
  state = process.initialize()
  history = [trainable(process, state)]
  metrics = None
  for client_data in client_data_per_round:
    out = process.next(state, client_data)
    state, metrics = out.state, out.metrics
    history.append(trainable(process, state))
  return history, metrics


def ours_data(round_inputs):
  return [[[inp] for inp in inputs] for inputs in round_inputs]


def tff_data(round_inputs, epochs=None):
  return [[as_dataset(inp, epochs) for inp in inputs] for inputs in round_inputs]


def assert_weights_close(actual, expected, rtol=RTOL, atol=ATOL):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def assert_histories_match(ours, theirs):
  # Same model_fn seed: both processes start from identical weights.
  for a, e in zip(ours[0], theirs[0]):
    np.testing.assert_array_equal(a, e)
  for r in range(1, len(ours)):
    assert_weights_close(ours[r], theirs[r])
  # ... and training moved them (the comparison is not vacuous).
  assert max(np.max(np.abs(a - b)) for a, b in zip(ours[-1], ours[0])) > 1e-3


def test_fedavg_matches_tff(round_inputs, ours_fedavg, tff_fedavg):
  check_fedavg(round_inputs, ours_fedavg, tff_fedavg)


def test_fedavg_client_momentum_matches_tff(round_inputs):
  """Client optimiser state (momentum) is re-initialised per client as in TFF."""
  check_fedavg(round_inputs, baselines.build_fedavg(MODEL_FN, sgd(0.9), BATCH),
               tff.learning.algorithms.build_weighted_fed_avg(
                   MODEL_FN, client_optimizer_fn=sgd(0.9)))


def check_fedavg(round_inputs, ours, theirs):
  h_ours, m_ours = run(ours, ours_data(round_inputs))
  h_tff, _ = run(theirs, tff_data(round_inputs))
  assert_histories_match(h_ours, h_tff)
  train = m_ours['client_work']['train']
  assert train['num_examples'] == sum(SIZES)
  assert train['num_clients'] == len(SIZES)
  assert train['non_finite_clients'] == 0
  assert np.isfinite(train['loss']) and 0.0 <= train['accuracy'] <= 1.0
  assert 'proximal_loss' not in train   # FedAvg has no proximal term to report


def test_fedavgm_matches_tff(round_inputs):
  ours = baselines.build_fedavgm(MODEL_FN, sgd(), BATCH)
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
      MODEL_FN, client_optimizer_fn=sgd(),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9))
  assert_histories_match(run(ours, ours_data(round_inputs))[0],
                         run(theirs, tff_data(round_inputs))[0])


def test_fedadam_matches_tff(round_inputs):
  hparams = dict(beta_1=0.9, beta_2=0.99, epsilon=1e-3)
  ours = baselines.build_fedadam(MODEL_FN, sgd(), BATCH, server_learning_rate=1e-2,
                                 **hparams)
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
      MODEL_FN, client_optimizer_fn=sgd(),
      server_optimizer_fn=tff.learning.optimizers.build_adam(1e-2, **hparams))
  assert_histories_match(run(ours, ours_data(round_inputs))[0],
                         run(theirs, tff_data(round_inputs))[0])


def test_fedsgd_matches_tff(round_inputs):
  ours = baselines.build_fedsgd(MODEL_FN, client_batch_size=BATCH)
  theirs = tff.learning.algorithms.build_fed_sgd(MODEL_FN)
  # FedSGD uses only the first epoch's order (the full-batch gradient at the received weights).
  assert_histories_match(run(ours, ours_data(round_inputs))[0],
                         run(theirs, tff_data(round_inputs, epochs=1))[0])


def reference_fedprox(initial, round_inputs, mu):
  """FedProx from the paper in plain eager TF: local SGD on loss + (mu/2)||w - w_t||^2,
  example-weighted mean of the deltas, server SGD with learning rate 1. Returns the weights
  after every round and the last round's (mu/2)||w - w_t||^2, example-weighted over its
  steps (at each step's weights, before the step)."""
  keras_model = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  variables = keras_model.trainable_variables
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  weights = [np.array(w) for w in initial]
  history = [weights]
  for inputs in round_inputs:
    delta_sum = [np.zeros_like(w) for w in weights]
    total = 0.0
    proximal_sum, trained = 0.0, 0
    for inp in inputs:
      for v, w in zip(variables, weights):
        v.assign(w)
      n = inp['x'].shape[0]
      for epoch_order in inp['order']:
        for start in range(0, n, BATCH):
          idx = epoch_order[start:start + BATCH]
          drift = sum(float(np.sum((v.numpy().astype(np.float64) - w) ** 2))
                      for v, w in zip(variables, weights))
          proximal_sum += 0.5 * mu * drift * len(idx)
          trained += len(idx)
          with tf.GradientTape() as tape:
            loss = loss_fn(inp['y'][idx], keras_model(inp['x'][idx], training=True))
          grads = tape.gradient(loss, variables)
          for v, g, w in zip(variables, grads, weights):
            v.assign(v - CLIENT_LR * (g + mu * (v - w)))
      delta_sum = [s + n * (w - v.numpy()) for s, w, v in zip(delta_sum, weights, variables)]
      total += n
    weights = [w - s / total for w, s in zip(weights, delta_sum)]
    history.append(weights)
  return history, proximal_sum / trained


def test_fedprox_matches_plain_tf_reference(round_inputs, tff_fedprox):
  ours = baselines.build_fedprox(MODEL_FN, sgd(), BATCH, proximal_strength=MU)
  tff_prox = tff_fedprox
  h_ours, metrics = run(ours, ours_data(round_inputs))
  h_tff, _ = run(tff_prox, tff_data(round_inputs))
  expected, proximal = reference_fedprox(h_ours[0], round_inputs, MU)
  for r in range(1, ROUNDS + 1):
    assert_weights_close(h_ours[r], expected[r])
  # The proximal term's size beside the loss: its example-weighted mean over every step.
  assert proximal > 1e-4
  assert float(metrics['client_work']['train']['proximal_loss']) == pytest.approx(proximal,
                                                                                 rel=1e-3)
  # TFF 0.87's FedProx is not the paper's: its proximal term has the opposite sign.
  gap = max(np.max(np.abs(a - b)) for a, b in zip(h_tff[-1], expected[-1]))
  assert gap > 1e-3


def test_tff_fedprox_is_our_loop_with_negated_mu(round_inputs, tff_fedprox):
  """TFF 0.87's build_weighted_fed_prox(mu) adds mu * (w_t - w) to every gradient
  (templates/proximal_client_work.py): our loop with proximal_strength=-mu."""
  weights_type = model_delta.model_weights_type(MODEL_FN)
  data_type = local_training.client_data_type(model_delta.model_input_spec(MODEL_FN))

  @tff.tensorflow.computation(weights_type, data_type)
  def client_train(initial_weights, dataset):
    train = local_training.build_local_training(MODEL_FN(), sgd(), BATCH,
                                                proximal_strength=-MU)
    out = train(initial_weights, local_training.single_element(dataset))
    return out.model_weights.trainable, out.num_examples

  h_tff, _ = run(tff_fedprox, tff_data(round_inputs))
  weights = h_tff[0]
  non_trainable = []
  for r, inputs in enumerate(round_inputs, start=1):
    delta_sum = [np.zeros_like(w) for w in weights]
    total = 0.0
    for inp in inputs:
      final, n = client_train(
          tff.learning.models.ModelWeights(trainable=weights, non_trainable=non_trainable),
          [inp])
      delta_sum = [s + n * (w - np.asarray(f)) for s, w, f in zip(delta_sum, weights, final)]
      total += n
    weights = [w - s / total for w, s in zip(weights, delta_sum)]
    assert_weights_close(h_tff[r], weights)


def test_process_types_and_model_weights(round_inputs, ours_fedavg, tff_fedavg):
  process = ours_fedavg
  next_type = process.next.type_signature
  assert str(next_type.parameter[1]) == DATA_TYPE
  assert next_type.parameter[0].placement is tff.SERVER
  assert next_type.result.state.placement is tff.SERVER
  assert next_type.result.metrics.placement is tff.SERVER
  assert process.next.type_signature.parameter[0] == process.initialize.type_signature.result

  state = process.initialize()
  weights = process.get_model_weights(state)
  assert isinstance(weights, tff.learning.models.ModelWeights)
  shifted = tff.learning.models.ModelWeights(
      trainable=[np.asarray(t) + 1.0 for t in weights.trainable],
      non_trainable=list(weights.non_trainable))
  state2 = process.set_model_weights(state, shifted)
  assert_weights_close(trainable(process, state2), shifted.trainable, rtol=0, atol=0)
  # Training continues from the set weights: same update as TFF's builder from there.
  theirs = tff_fedavg
  tff_state = theirs.set_model_weights(theirs.initialize(), shifted)
  ours_after = process.next(state2, ours_data(round_inputs)[0]).state
  tff_after = theirs.next(tff_state, tff_data(round_inputs)[0]).state
  assert_weights_close(trainable(process, ours_after), trainable(theirs, tff_after))


def test_fedavg_learns_digits(ours_fedavg):
  """10 IID digits clients, 5 per round, batch 16, 2 epochs, 8 rounds: test accuracy > 0.6."""
  ds = data.load_digits()
  fed = data.federate(ds, data.IidPartitioner(num_clients=10, seed=0))
  process = ours_fedavg
  state = process.initialize()
  for r in range(8):
    _, inputs = data.round_inputs(fed, r, clients_per_round=5, epochs=2, seed=0)
    state = process.next(state, [[inp] for inp in inputs]).state
  weights = process.get_model_weights(state)
  keras_model = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=1)
  weights.assign_weights_to(keras_model)
  predictions = np.argmax(keras_model.predict(fed.x_test, verbose=0), axis=-1)
  accuracy = float(np.mean(predictions == fed.y_test))
  assert accuracy > 0.6, accuracy
