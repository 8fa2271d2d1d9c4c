"""`model_fn`s: no-arg callables building fresh `tff.learning.models.VariableModel`s."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.models import catalog, zoo


def input_spec_for(name: str, input_shape: Optional[zoo.Shape] = None
                   ) -> collections.OrderedDict:
  """The `input_spec` of zoo model `name`: an OrderedDict(x=TensorSpec, y=TensorSpec).

  Image / vector models: x float32 [None, *input_shape], y int32 [None].
  'char_lstm': x and y int32 [None, seq_length] (input_shape is (seq_length,)).
  'leaf_char_lstm', 'sent140_lstm': x int32 [None, seq_length], y int32 [None].
  `input_shape` defaults to `zoo.DEFAULT_INPUT_SHAPES[name]`.
  """
  zoo.check_model_name(name)
  if input_shape is None:
    input_shape = zoo.DEFAULT_INPUT_SHAPES[name]
  input_shape = tuple(int(d) for d in input_shape)
  if name in zoo.SEQUENCE_MODELS or name in zoo.TOKEN_MODELS:
    if len(input_shape) != 1:
      raise ValueError(f'{name} expects input_shape (seq_length,), got {input_shape}')
    label_shape = [None, input_shape[0]] if name in zoo.SEQUENCE_MODELS else [None]
    return collections.OrderedDict(
        x=tf.TensorSpec([None, input_shape[0]], tf.int32),
        y=tf.TensorSpec(label_shape, tf.int32))
  return collections.OrderedDict(
      x=tf.TensorSpec([None, *input_shape], tf.float32),
      y=tf.TensorSpec([None], tf.int32))


class PaddedSequenceCrossentropy(tf.keras.losses.Loss):
  """Cross-entropy of logits, averaged over the positions whose label is not padding id 0.

  The loss of the sequence models with a target per position (`catalog.TOKENS_PER_POSITION`,
  e.g. `char_lstm`). TFF's Keras wrapper calls the loss as `loss(y_true, y_pred)` without the
  Embedding's mask, so a plain `SparseCategoricalCrossentropy` would also train the model to
  predict padding and average over padded positions; this is the mean over the same labels
  that central evaluation counts (`local_training.counted_labels`).
  """

  def __init__(self, name: str = 'padded_sequence_crossentropy'):
    super().__init__(name=name)

  def call(self, y_true, y_pred):  # per position; `__call__` does the masked mean
    return tf.keras.losses.sparse_categorical_crossentropy(
        tf.cast(y_true, tf.int32), y_pred, from_logits=True)

  def __call__(self, y_true, y_pred, sample_weight=None):
    del sample_weight  # TFF's Keras wrapper does not pass one
    counted = tf.cast(tf.not_equal(tf.cast(y_true, tf.int32), 0), tf.float32)
    per_position = tf.cast(self.call(y_true, y_pred), tf.float32)
    return tf.math.divide_no_nan(tf.reduce_sum(per_position * counted),
                                 tf.reduce_sum(counted))


def model_loss(name: str) -> tf.keras.losses.Loss:
  """The training loss of zoo model `name` (a fresh object per call)."""
  if catalog.MODEL_INPUTS[name] == catalog.TOKENS_PER_POSITION:
    return PaddedSequenceCrossentropy()
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model_fn(name: str, input_shape: Optional[zoo.Shape] = None,
                  num_classes: Optional[int] = None, seed: Optional[int] = None,
                  vocab_size: Optional[int] = None
                  ) -> Callable[[], tff.learning.models.VariableModel]:
  """Returns a no-arg `model_fn` for `tff.learning` building zoo model `name`.

  Every call builds a fresh Keras model (with `seed`, every call starts from the same initial
  weights) and wraps it with `tff.learning.models.from_keras_model`, using
  `SparseCategoricalCrossentropy(from_logits=True)` (for sequence models with a target per
  position, `PaddedSequenceCrossentropy`, which skips padding) and a
  `SparseCategoricalAccuracy` metric.
  The loss is created per call and the metric is passed as a constructor, so TFF gets fresh
  metric objects and rebuilds them from the constructor when finalizing (the form TFF 0.87
  recommends over metric instances).

  `vocab_size` is the token vocabulary of 'sent140_lstm' (see `zoo.build_keras_model`).

  Argument validation (unknown name, bad shapes, sizes a model cannot take) happens here, not
  at the first call: the Keras model is built once in a throwaway graph, so nothing eager is
  left behind to mix with TFF's traced models.
  """
  zoo.check_model_name(name)
  if input_shape is None:
    input_shape = zoo.DEFAULT_INPUT_SHAPES[name]
  if num_classes is None:
    num_classes = zoo.DEFAULT_NUM_CLASSES[name]
  input_shape = tuple(int(d) for d in input_shape)
  num_classes = int(num_classes)
  spec = input_spec_for(name, input_shape)  # validates the shape's rank for sequence models
  with tf.Graph().as_default():
    zoo.build_keras_model(name, input_shape, num_classes, seed=seed, vocab_size=vocab_size)

  def model_fn() -> tff.learning.models.VariableModel:
    keras_model = zoo.build_keras_model(name, input_shape, num_classes, seed=seed,
                                        vocab_size=vocab_size)
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=model_loss(name),
        input_spec=collections.OrderedDict(spec),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy],
    )

  model_fn.__name__ = f'{name}_model_fn'
  model_fn.__qualname__ = model_fn.__name__
  return model_fn


class _ListWeights(tff.learning.models.VariableModel):
  """A VariableModel whose weights are lists, as a `from_keras_model` model's are.

  `model_from_functional` keeps its variables in tuples, so the `ModelWeights` type of its
  model has tuple containers; the builders build weights (zeros, deltas, accumulators) as
  lists, and `tf.nest` refuses to pair a list with a tuple. One container for every model
  keeps every method's structures alike. Everything else is the wrapped model's.
  """

  def __init__(self, model: tff.learning.models.VariableModel):
    self._model = model

  @property
  def trainable_variables(self):
    return list(self._model.trainable_variables)

  @property
  def non_trainable_variables(self):
    return list(self._model.non_trainable_variables)

  @property
  def local_variables(self):
    return list(self._model.local_variables)

  @property
  def input_spec(self):
    return self._model.input_spec

  def forward_pass(self, batch_input, training=True):
    return self._model.forward_pass(batch_input, training=training)

  def predict_on_batch(self, x, training=True):
    return self._model.predict_on_batch(x, training=training)

  def report_local_unfinalized_metrics(self):
    return self._model.report_local_unfinalized_metrics()

  def metric_finalizers(self):
    return self._model.metric_finalizers()

  def reset_metrics(self):
    return self._model.reset_metrics()


def as_model_fn(model) -> Callable[[], tff.learning.models.VariableModel]:
  """What every builder does with its `model_fn` argument, as TFF's builders do.

  A no-arg callable returning a `tff.learning.models.VariableModel` (e.g. a
  `from_keras_model` model_fn) is returned as is; a `tff.learning.models.FunctionalModel`
  becomes a model_fn through `tff.learning.models.model_from_functional`, so it trains on
  the same fast path. Anything else is refused with one message naming what is supported.
  """
  if isinstance(model, tff.learning.models.FunctionalModel):
    functional = model

    def model_fn() -> tff.learning.models.VariableModel:
      return _ListWeights(tff.learning.models.model_from_functional(functional))

    return model_fn
  if isinstance(model, tf.keras.Model):  # callable, but it is a model, not a model_fn
    raise TypeError(
        'model_fn must be a no-arg callable returning a tff.learning.models.VariableModel, '
        'not a Keras model: wrap it, e.g. lambda: tff.learning.models.from_keras_model('
        'build_keras_model(), loss=..., input_spec=...), building the Keras model inside')
  if not callable(model):
    raise TypeError(
        'model_fn must be a no-arg callable returning a tff.learning.models.VariableModel '
        '(e.g. from tff.learning.models.from_keras_model) or a '
        f'tff.learning.models.FunctionalModel; got {type(model).__name__}')
  return model


def check_variable_model(model) -> tff.learning.models.VariableModel:
  """`model` if `model_fn()` built a VariableModel, else one clear TypeError."""
  if not isinstance(model, tff.learning.models.VariableModel):
    raise TypeError(
        'model_fn() must return a tff.learning.models.VariableModel (e.g. '
        'tff.learning.models.from_keras_model); pass a FunctionalModel itself, not a '
        f'function returning one; got {type(model).__name__}')
  return model
