"""Evaluation of a model's weights: on a central test set, and on every client's own data.

`build_central_evaluation` is a TFF TensorFlow computation on one test set;
`build_per_client_evaluation` a federated computation that evaluates the global model on each
client's held-out data and returns one accuracy per client, which
`summarize_client_accuracies` turns into the mean, spread and low tail over clients. Both
build their model inside the computation, so they need no eager Keras model in the Python
process (eager Keras models and TFF's graph-built ones do not mix in TF 2.14).
"""

from __future__ import annotations

import collections
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.client_work import local_training, model_delta
from tff_algos.constants import CLIENT_ACCURACY_FIGURES
from tff_algos.models import model_fns


def build_central_evaluation(model_fn, batch_size: int = 1000) -> tff.Computation:
  """`(model_weights, x, y) -> OrderedDict(accuracy, loss, num_examples)`.

  accuracy and loss (cross-entropy of the model's logits, the zoo's output) are means over the
  same labels (`local_training.counted_labels`): every example, or for sequence models every
  position whose label is not padding. The model's own loss is not used: for `char_lstm`,
  TFF's Keras wrapper does not pass the Embedding mask to the loss, so it counts padding.
  """
  model_fn = model_fns.as_model_fn(model_fn)
  weights_type = model_delta.model_weights_type(model_fn)
  element = local_training.client_element_type(model_delta.model_input_spec(model_fn))

  @tff.tensorflow.computation(weights_type, element.x, element.y)
  def evaluate(model_weights, x, y):
    model = model_fn()

    @tf.function
    def run():
      hits, counted, loss_sum = _evaluate_in_batches(model, model_weights, x, y, batch_size)
      return collections.OrderedDict(
          accuracy=tf.math.divide_no_nan(hits, counted),
          loss=tf.math.divide_no_nan(loss_sum, counted),
          num_examples=tf.cast(tf.shape(y)[0], tf.float32))

    return run()

  return evaluate


def _evaluate_in_batches(model, model_weights, x, y, batch_size):
  """(correct, counted labels, summed loss) of `model` at `model_weights` on x, y, in
  batches of `batch_size` (inside a tf.function: the assigns must run)."""
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), weights, model_weights)
  n = tf.shape(y)[0]
  hits = tf.constant(0.0)
  counted = tf.constant(0.0)
  loss_sum = tf.constant(0.0)
  for start in tf.range(0, n, batch_size):
    end = tf.minimum(start + batch_size, n)
    logits = model.predict_on_batch(x[start:end], training=False)
    labels = local_training.aligned_labels(logits, y[start:end])
    h, c = local_training.accuracy_terms(logits, labels)
    hits += h
    counted += c
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32))
    loss_sum += tf.reduce_sum(losses * local_training.counted_labels(labels))
  return hits, counted, loss_sum


def build_per_client_evaluation(model_fn, num_clients: int,
                                batch_size: int = 1000) -> tff.Computation:
  """`(model_weights@SERVER, client data@CLIENTS) -> per-client accuracies@SERVER`.

  Each client's data is a one-element sequence (as in our processes' `next`; TFF's
  `tff.program` native context passes client values only as sequences) of
  `OrderedDict(x, y, index)`: its held-out examples as whole tensors (`x`, `y` as the model's
  input_spec, with any number of rows) and its int32 client index in [0, num_clients)
  (`client_evaluation_inputs` builds them from (x, y) arrays). The weights
  are broadcast, every client counts its correct predictions (as `build_central_evaluation`:
  for sequence models, the positions whose label is not padding), and the counts travel to
  the server keyed by index (a `federated_aggregate` into [num_clients] vectors: identity is
  kept, the result is server-placed, so `tff.program` contexts and worker services take the
  computation). The result is `OrderedDict(accuracy, correct, count)`, float32
  [num_clients] each, client n at position n; a client that sent nothing, or has no counted
  label, has count 0 and accuracy NaN. Indices must be distinct (a repeated one adds up).
  """
  model_fn = model_fns.as_model_fn(model_fn)
  if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) \
      or num_clients < 1:
    raise ValueError(f'num_clients must be an integer >= 1, got {num_clients!r}')
  num_clients = int(num_clients)
  weights_type = model_delta.model_weights_type(model_fn)
  element = local_training.client_element_type(model_delta.model_input_spec(model_fn))
  client_type = tff.StructWithPythonType(
      [('x', element.x), ('y', element.y), ('index', tff.TensorType(np.int32))],
      collections.OrderedDict)
  counts_type = tff.StructWithPythonType(
      [('correct', tff.TensorType(np.float32, [num_clients])),
       ('count', tff.TensorType(np.float32, [num_clients]))], collections.OrderedDict)

  @tff.tensorflow.computation(weights_type, tff.SequenceType(client_type))
  def client_counts(model_weights, dataset):
    model = model_fn()

    @tf.function
    def run():
      data = local_training.single_element(dataset)
      hits, counted, _ = _evaluate_in_batches(model, model_weights, data['x'], data['y'],
                                              batch_size)
      return collections.OrderedDict(index=data['index'], correct=hits, count=counted)

    return run()

  @tff.tensorflow.computation
  def zeros():
    return collections.OrderedDict(correct=tf.zeros([num_clients]),
                                   count=tf.zeros([num_clients]))

  @tff.tensorflow.computation(counts_type, client_counts.type_signature.result)
  def accumulate(totals, value):
    at = [[value['index']]]   # out of range: the call fails (in the worker), no client dropped
    return collections.OrderedDict(
        correct=tf.tensor_scatter_nd_add(totals['correct'], at, [value['correct']]),
        count=tf.tensor_scatter_nd_add(totals['count'], at, [value['count']]))

  @tff.tensorflow.computation(counts_type, counts_type)
  def merge(a, b):
    return collections.OrderedDict(correct=a['correct'] + b['correct'],
                                   count=a['count'] + b['count'])

  @tff.tensorflow.computation(counts_type)
  def report(totals):
    accuracy = tf.where(totals['count'] > 0,
                        tf.math.divide_no_nan(totals['correct'], totals['count']),
                        tf.fill([num_clients], float('nan')))
    return collections.OrderedDict(accuracy=accuracy, correct=totals['correct'],
                                   count=totals['count'])

  @tff.federated_computation(tff.FederatedType(weights_type, tff.SERVER),
                             tff.FederatedType(tff.SequenceType(client_type), tff.CLIENTS))
  def evaluate(model_weights, client_data):
    counts = tff.federated_map(
        client_counts, (tff.federated_broadcast(model_weights), client_data))
    return tff.federated_aggregate(counts, zeros(), accumulate, merge, report)

  return evaluate


def client_evaluation_inputs(client_arrays: Sequence[tuple],
                             num_clients: Optional[int] = None) -> list:
  """The client data of `build_per_client_evaluation`: client n's (x, y) arrays with index n,
  each client's as a one-element list (its sequence).

  Labels become int32 (the zoo's input_spec); pass each client's held-out examples, e.g.
  `data.ClientDataInputs(test_client_data).client_arrays(n)` for a ClientData of your own.
  With `num_clients` (the computation's), more clients than that are refused here, in one
  line, instead of failing inside TFF's worker.
  """
  if num_clients is not None and len(client_arrays) > num_clients:
    raise ValueError(f'{len(client_arrays)} clients but the evaluation was built for '
                     f'num_clients={num_clients}; build it with num_clients='
                     f'{len(client_arrays)}')
  inputs = []
  for n, (x, y) in enumerate(client_arrays):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape[0] != y.shape[0]:
      raise ValueError(f'client {n}: {x.shape[0]} inputs but {y.shape[0]} labels')
    inputs.append([collections.OrderedDict(x=x, y=y.astype(np.int32, copy=False),
                                           index=np.int32(n))])
  return inputs


def summarize_client_accuracies(result) -> collections.OrderedDict:
  """The spread of per-client accuracies, over the clients that have a counted label.

  `result` is `build_per_client_evaluation`'s output (a mapping with `accuracy` and
  `count`) or an array of per-client accuracies (NaN = no data). Unweighted over clients
  (each client counts once, whatever its size): `client_accuracy_mean` the mean,
  `client_accuracy_std` the population standard deviation (ddof 0),
  `client_accuracy_p10` the 10th percentile (numpy's default 'linear' method: interpolated
  between the two nearest ranks), `client_accuracy_min` the lowest; `clients_evaluated`
  how many clients they are over. With no such client the four are NaN.
  """
  if isinstance(result, Mapping):
    accuracy = np.asarray(result['accuracy'], np.float64)
    accuracy = np.where(np.asarray(result['count']) > 0, accuracy, np.nan)
  else:
    accuracy = np.asarray(result, np.float64)
  accuracy = accuracy.reshape(-1)
  accuracy = accuracy[np.isfinite(accuracy)]
  if accuracy.size == 0:
    figures = [float('nan')] * 4
  else:
    figures = [float(np.mean(accuracy)), float(np.std(accuracy)),
               float(np.percentile(accuracy, 10, method='linear')), float(np.min(accuracy))]
  summary = collections.OrderedDict(zip(CLIENT_ACCURACY_FIGURES, figures))
  summary['clients_evaluated'] = int(accuracy.size)
  return summary
