"""Central evaluation (tff_algos/evaluation.py) against an independent NumPy evaluation.

Every published accuracy and loss comes from `build_central_evaluation`, so it is checked here
against a forward pass written from scratch in NumPy (convolution, dense layers, a two-layer
LSTM), numpy argmax for the accuracy and a log-sum-exp cross-entropy for the loss, on the
same weights:

* `tiny_cnn` on the digits test split (360 images, all ten classes), random convolution and
  hidden layer with a least-squares classifier fitted on the training split, so the model is
  right on most images and wrong on some (the comparison can tell a miscount);
* `char_lstm` (length-12 windows, vocabulary 20) on variable-length, zero-padded windows of a
  Markov chain, with a least-squares classifier on the second LSTM's outputs. Accuracy and loss
  count the positions whose label is not padding (id 0), and only those.

A batch size that does not divide the test set exercises the batching loop (several batches,
a smaller last one). No eager Keras model is built: weights come from a TFF computation.
"""

import collections
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tff_algos import evaluation
from tff_algos import execution
from tff_algos import models
from tff_algos.client_work import model_delta

EVAL_BATCH = 64
SEQ_LEN, VOCAB = 12, 20
# Float32 TF and float64 NumPy logits differ by ~1e-6: a position whose two top logits are
# closer than this may be a hit in one and a miss in the other, so it may go either way.
TIE_MARGIN = 1e-4

LSTM_FN = models.make_model_fn('char_lstm', (SEQ_LEN,), VOCAB, seed=0)


pytestmark = pytest.mark.usefixtures('runtime')


# --------------------------------------------------------------------------- #
# NumPy reference forward passes
# --------------------------------------------------------------------------- #

def relu(a):
  return np.maximum(a, 0.0)


def sigmoid(a):
  return 1.0 / (1.0 + np.exp(-a))


def tiny_cnn_features(trainable, x):
  """Penultimate activations: Conv 3x3 'valid' + ReLU, Flatten (row-major), Dense + ReLU."""
  conv_k, conv_b, fc_k, fc_b = (np.asarray(t, np.float64) for t in trainable[:4])
  x = np.asarray(x, np.float64)
  n, h, w, _ = x.shape
  kh, kw, _, _ = conv_k.shape
  out = np.zeros((n, h - kh + 1, w - kw + 1, conv_k.shape[-1]))
  for i in range(kh):
    for j in range(kw):
      out += np.einsum('nhwc,cf->nhwf', x[:, i:i + h - kh + 1, j:j + w - kw + 1, :],
                       conv_k[i, j])
  conv = relu(out + conv_b)
  return relu(conv.reshape(n, -1) @ fc_k + fc_b)


def lstm_layer(inputs, kernel, recurrent, bias):
  """Keras LSTM (gate order i, f, c, o; sigmoid gates, tanh), all time steps returned."""
  n, steps, _ = inputs.shape
  units = recurrent.shape[0]
  h = np.zeros((n, units))
  c = np.zeros((n, units))
  outputs = []
  for t in range(steps):
    z = inputs[:, t] @ kernel + h @ recurrent + bias
    i, f, g, o = (z[:, k * units:(k + 1) * units] for k in range(4))
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    h = sigmoid(o) * np.tanh(c)
    outputs.append(h)
  return np.stack(outputs, axis=1)


def char_lstm_features(trainable, x):
  """Second LSTM's outputs. Padding is trailing, so the steps Keras masks come after every
  step that is evaluated and ignoring the mask changes no evaluated output."""
  w = [np.asarray(t, np.float64) for t in trainable]
  embedded = w[0][x]
  h = lstm_layer(embedded, w[1], w[2], w[3])
  return lstm_layer(h, w[4], w[5], w[6])


def fit_classifier(features, labels, num_classes):
  """Least-squares readout to one-hot labels (ridge 1e-3): a classifier that is mostly right."""
  design = np.concatenate([features, np.ones((features.shape[0], 1))], axis=1)
  target = np.eye(num_classes)[labels]
  gram = design.T @ design + 1e-3 * np.eye(design.shape[1])
  solution = np.linalg.solve(gram, design.T @ target)
  # Scaled so the softmax is confident on the easy cases: the loss is far from log(classes).
  return (4.0 * solution[:-1]).astype(np.float32), (4.0 * solution[-1]).astype(np.float32)


def cross_entropy(logits, labels):
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_z = np.log(np.exp(shifted).sum(axis=-1))
  return log_z - np.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]


def accuracy_bounds(logits, labels):
  """(lowest, highest) accuracy: hits are exact except at near-ties, which may go either way."""
  top = np.sort(logits, axis=-1)
  near_tie = top[..., -1] - top[..., -2] < TIE_MARGIN
  hits = logits.argmax(axis=-1) == labels
  assert near_tie.mean() < 0.01   # the bounds stay tight
  return np.mean(hits & ~near_tie), np.mean(hits | near_tie)


def with_classifier(weights, kernel, bias):
  trainable = [np.asarray(t) for t in weights.trainable]
  trainable[-2:] = [kernel, bias]
  return tff.learning.models.ModelWeights(trainable=trainable,
                                          non_trainable=list(weights.non_trainable))


# --------------------------------------------------------------------------- #
# Tests
# --------------------------------------------------------------------------- #

@pytest.fixture(scope='module')
def cnn_case(tiny_model_fn):
  evaluate = evaluation.build_central_evaluation(tiny_model_fn, batch_size=EVAL_BATCH)
  initial = model_delta.initial_model_weights_fn(tiny_model_fn)()
  ds = data.load_digits()
  kernel, bias = fit_classifier(tiny_cnn_features(initial.trainable, ds.x_train),
                                ds.y_train, 10)
  return evaluate, with_classifier(initial, kernel, bias), ds.x_test, ds.y_test


def test_cnn_accuracy_and_loss_match_numpy(cnn_case):
  evaluate, weights, x, y = cnn_case
  assert x.shape[0] % EVAL_BATCH != 0 and x.shape[0] > 2 * EVAL_BATCH
  logits = tiny_cnn_features(weights.trainable, x) @ weights.trainable[-2] + weights.trainable[-1]
  predictions = logits.argmax(axis=-1)
  expected_accuracy = np.mean(predictions == y)
  lowest, highest = accuracy_bounds(logits, y)
  expected_loss = cross_entropy(logits, y).mean()
  # Non-trivial: all classes in the test set, many predicted, right and wrong answers.
  assert len(np.unique(y)) == 10 and len(np.unique(predictions)) >= 8
  assert 0.5 < expected_accuracy < 0.99, expected_accuracy

  result = evaluate(weights, x, y)
  assert result['num_examples'] == x.shape[0]
  assert lowest - 1e-6 <= result['accuracy'] <= highest + 1e-6
  assert result['loss'] == pytest.approx(expected_loss, rel=1e-5)


def markov_windows(rng, n):
  """x, y int32 [n, SEQ_LEN]: windows of a chain that mostly steps c -> 3c+1 (mod VOCAB-1),
  each with 3..SEQ_LEN+1 tokens followed by zero padding (x = window[:-1], y = window[1:])."""
  windows = np.zeros((n, SEQ_LEN + 1), np.int32)
  for row in windows:
    length = rng.integers(3, SEQ_LEN + 2)
    c = rng.integers(1, VOCAB)
    for t in range(length):
      row[t] = c
      c = (3 * (c - 1) + 1) % (VOCAB - 1) + 1 if rng.random() < 0.8 else rng.integers(1, VOCAB)
  return windows[:, :-1], windows[:, 1:]


@pytest.fixture(scope='module')
def lstm_case():
  evaluate = evaluation.build_central_evaluation(LSTM_FN, batch_size=EVAL_BATCH)
  initial = model_delta.initial_model_weights_fn(LSTM_FN)()
  rng = np.random.default_rng(0)
  x_fit, y_fit = markov_windows(rng, 300)
  features = char_lstm_features(initial.trainable, x_fit)
  counted = y_fit != 0
  kernel, bias = fit_classifier(features[counted], y_fit[counted], VOCAB)
  x, y = markov_windows(rng, 150)
  return evaluate, with_classifier(initial, kernel, bias), x, y


def test_sequence_accuracy_skips_padding_labels_and_loss_matches_numpy(lstm_case):
  evaluate, weights, x, y = lstm_case
  assert x.shape[0] % EVAL_BATCH != 0 and x.shape[0] > 2 * EVAL_BATCH
  logits = (char_lstm_features(weights.trainable, x) @ weights.trainable[-2]
            + weights.trainable[-1])
  scored = y != 0            # positions whose label is not padding
  predictions = logits.argmax(axis=-1)
  expected_accuracy = np.mean(predictions[scored] == y[scored])
  lowest, highest = accuracy_bounds(logits[scored], y[scored])
  expected_loss = cross_entropy(logits, y)[scored].mean()
  # Padding is frequent, and counting padded positions (whatever the model outputs there) moves
  # both metrics well beyond the comparison's tolerance.
  assert 0.1 < scored.mean() < 0.9
  assert 0.3 < expected_accuracy < 0.99, expected_accuracy
  assert abs(np.mean(predictions == y) - expected_accuracy) > 0.01
  assert abs(cross_entropy(logits, y).mean() - expected_loss) > 0.01

  result = evaluate(weights, x, y)
  assert result['num_examples'] == x.shape[0]
  assert lowest - 1e-6 <= result['accuracy'] <= highest + 1e-6
  assert result['loss'] == pytest.approx(expected_loss, rel=1e-5)


def test_padded_sequence_loss_is_the_masked_numpy_cross_entropy():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(4, 7, VOCAB)).astype(np.float32) * 3
  labels = rng.integers(0, VOCAB, size=(4, 7)).astype(np.int32)
  labels[:, 4:] = 0  # padded tails
  scored = labels != 0
  loss = models.model_fns.PaddedSequenceCrossentropy()(labels, logits)
  assert float(loss) == pytest.approx(cross_entropy(logits, labels)[scored].mean(), rel=1e-5)
  assert float(models.model_fns.PaddedSequenceCrossentropy()(np.zeros((2, 3), np.int32),
                                                            logits[:2, :3])) == 0.0


def test_sequence_training_loss_skips_padding_as_evaluation_does(lstm_case):
  # The loss TFF's training uses is `forward_pass(...).loss` of the model_fn's model.
  _, weights, x, y = lstm_case
  weights_type = model_delta.model_weights_type(LSTM_FN)

  @tff.tensorflow.computation(weights_type, tff.TensorType(np.int32, x.shape),
                              tff.TensorType(np.int32, y.shape))
  def training_loss(model_weights, x, y):
    model = LSTM_FN()

    @tf.function  # orders the assignments before the forward pass
    def run():
      tf.nest.map_structure(lambda v, t: v.assign(t),
                            tff.learning.models.ModelWeights.from_model(model), model_weights)
      return model.forward_pass(collections.OrderedDict(x=x, y=y), training=False).loss

    return run()

  logits = (char_lstm_features(weights.trainable, x) @ weights.trainable[-2]
            + weights.trainable[-1])
  scored = y != 0
  assert float(training_loss(weights, x, y)) == pytest.approx(
      cross_entropy(logits, y)[scored].mean(), rel=1e-5)


# --------------------------------------------------------------------------- #
# Per-client evaluation
# --------------------------------------------------------------------------- #

def reference_client_figures(accuracies):
  """The four figures written out by hand: unweighted mean, population std, the 10th
  percentile interpolated between the ranks around (n - 1) / 10, and the minimum."""
  a = sorted(accuracies)
  mean = sum(a) / len(a)
  std = (sum((v - mean) ** 2 for v in a) / len(a)) ** 0.5
  h = (len(a) - 1) * 0.1
  lo = int(np.floor(h))
  hi = min(lo + 1, len(a) - 1)
  p10 = a[lo] + (h - lo) * (a[hi] - a[lo])
  return dict(client_accuracy_mean=mean, client_accuracy_std=std, client_accuracy_p10=p10,
              client_accuracy_min=a[0])


def test_per_client_accuracies_and_their_figures_match_numpy(cnn_case, tiny_model_fn):
  _, weights, x, y = cnn_case
  rng = np.random.default_rng(1)
  # Random clients of the test images: sizes from 0 (no data: left out of the figures) to
  # more than one evaluation batch, so each client's batching loop runs too.
  sizes = [0, 1, 5, 17, 40, 70, 90, 137]
  order = rng.permutation(x.shape[0])
  cuts = np.cumsum(sizes)
  clients = [(x[order[a - s:a]], y[order[a - s:a]]) for a, s in zip(cuts, sizes)]
  num_clients = len(clients) + 1   # index 8 gets no data at all: count 0 as well
  evaluate = evaluation.build_per_client_evaluation(tiny_model_fn, num_clients,
                                                    batch_size=EVAL_BATCH)
  inputs = evaluation.client_evaluation_inputs(clients)
  shuffled = [inputs[i] for i in rng.permutation(len(inputs))]   # keyed by index, not order
  result = evaluate(weights, shuffled)

  logits = tiny_cnn_features(weights.trainable, x) @ weights.trainable[-2] + weights.trainable[-1]
  expected = []
  for n, (cx, cy) in enumerate(clients):
    assert result['count'][n] == len(cy)
    if not len(cy):
      assert np.isnan(result['accuracy'][n])
      continue
    client_logits = logits[order[cuts[n] - sizes[n]:cuts[n]]]
    lowest, highest = accuracy_bounds(client_logits, cy) if len(cy) > 1 else (
        float(client_logits.argmax() == cy[0]),) * 2
    assert lowest - 1e-6 <= result['accuracy'][n] <= highest + 1e-6
    expected.append(float(np.mean(client_logits.argmax(axis=-1) == cy)))
  assert result['count'][8] == 0 and np.isnan(result['accuracy'][8])
  assert len(set(np.round(expected, 3))) >= 5   # the clients differ: the spread means something

  figures = evaluation.summarize_client_accuracies(result)
  assert figures['clients_evaluated'] == 7
  for name, value in reference_client_figures(expected).items():
    assert figures[name] == pytest.approx(value, abs=1e-6), name
  # An array of accuracies (NaN = no data) gives the same figures.
  assert evaluation.summarize_client_accuracies(result['accuracy']) == figures
  with pytest.raises(ValueError, match='build it with num_clients=8'):
    evaluation.client_evaluation_inputs(clients, num_clients=7)


def test_per_client_figures_are_unweighted_over_clients():
  # Two clients, 1 of 1 and 1 of 9 right: the mean over clients is (1 + 1/9) / 2, not 2/10.
  figures = evaluation.summarize_client_accuracies(
      dict(accuracy=np.array([1.0, 1 / 9, np.nan]), count=np.array([1.0, 9.0, 0.0])))
  assert figures['client_accuracy_mean'] == pytest.approx((1 + 1 / 9) / 2)
  assert figures['client_accuracy_min'] == pytest.approx(1 / 9)
  assert figures['client_accuracy_p10'] == pytest.approx(1 / 9 + 0.1 * (1 - 1 / 9))
  assert figures['clients_evaluated'] == 2
  empty = evaluation.summarize_client_accuracies(np.array([np.nan]))
  assert empty['clients_evaluated'] == 0 and np.isnan(empty['client_accuracy_mean'])
  assert tuple(figures)[:4] == evaluation.CLIENT_ACCURACY_FIGURES


def test_per_client_evaluation_of_sequences_counts_non_padding_labels(lstm_case):
  _, weights, x, y = lstm_case
  clients = [(x[:60], y[:60]), (x[60:], y[60:])]
  evaluate = evaluation.build_per_client_evaluation(LSTM_FN, 2, batch_size=EVAL_BATCH)
  result = evaluate(weights, evaluation.client_evaluation_inputs(clients))
  logits = (char_lstm_features(weights.trainable, x) @ weights.trainable[-2]
            + weights.trainable[-1])
  for n, (start, end) in enumerate([(0, 60), (60, len(y))]):
    scored = y[start:end] != 0
    assert result['count'][n] == scored.sum()
    lowest, highest = accuracy_bounds(logits[start:end][scored], y[start:end][scored])
    assert lowest - 1e-6 <= result['accuracy'][n] <= highest + 1e-6


def test_per_client_evaluation_splits_across_worker_services(tiny_model_fn):
  # Server-placed and one aggregation: the mergeable form the training program's
  # --workers/--local_workers runs need.
  evaluate = evaluation.build_per_client_evaluation(tiny_model_fn, 3)
  execution.check_mergeable(evaluate, 'per-client evaluation')
  assert evaluate.type_signature.result.placement is tff.SERVER
