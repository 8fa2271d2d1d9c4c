"""Central (server-side) evaluation of a model's weights on a held-out test set.

Runs as a TFF TensorFlow computation, so it needs no eager Keras model in the Python process
(eager Keras models and TFF's graph-built ones do not mix in TF 2.14).
"""

from __future__ import annotations

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.client_work import local_training, model_delta
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
      return collections.OrderedDict(
          accuracy=tf.math.divide_no_nan(hits, counted),
          loss=tf.math.divide_no_nan(loss_sum, counted),
          num_examples=tf.cast(n, tf.float32))

    return run()

  return evaluate
