"""Access to the classifier layer, the penultimate representation and the wrapped Keras model."""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.models.zoo import CLASSIFIER_LAYER

# TFF 0.87 `tff.learning.models.from_keras_model` returns a private `_KerasModel`
# (tensorflow_federated/python/learning/models/keras_utils.py) that keeps the Keras model in
# this attribute.
_KERAS_MODEL_ATTR = '_keras_model'


def classifier_layer(keras_model: tf.keras.Model) -> tf.keras.layers.Dense:
  """Returns the final Dense layer named `CLASSIFIER_LAYER` ('classifier') of `keras_model`.

  Raises:
    TypeError: `keras_model` is not a `tf.keras.Model`.
    ValueError: it has no Dense layer named 'classifier'.
  """
  if not isinstance(keras_model, tf.keras.Model):
    raise TypeError(f'Expected a tf.keras.Model, got {type(keras_model).__name__}')
  try:
    layer = keras_model.get_layer(CLASSIFIER_LAYER)
  except ValueError:
    layer = None
  if not isinstance(layer, tf.keras.layers.Dense):
    raise ValueError(
        f'Model {keras_model.name!r} has no Dense layer named {CLASSIFIER_LAYER!r}; build it '
        f'with tff_algos.models (layers: {[l.name for l in keras_model.layers]})')
  return layer


def representation_model(keras_model: tf.keras.Model) -> tf.keras.Model:
  """A Keras model mapping `keras_model`'s inputs to the INPUT of its classifier layer.

  The returned model shares its layers (and so its variables) with `keras_model`: it always
  reflects the current weights. Its output is the penultimate representation, e.g. [B, 512] for
  `fedavg_cnn`, [B, 64] for `resnet20`, [B, seq_length, 256] for `char_lstm`.

  Raises:
    TypeError: `keras_model` is not a graph-network (functional or Sequential) Keras model.
    ValueError: it has no classifier layer.
  """
  layer = classifier_layer(keras_model)
  if not getattr(keras_model, '_is_graph_network', False) or not keras_model.inputs:
    raise TypeError(
        'representation_model needs a functional or Sequential Keras model with defined '
        f'inputs; {keras_model.name!r} is a subclassed or unbuilt model')
  if len(layer.inbound_nodes) != 1:
    raise ValueError(
        f'The classifier layer of {keras_model.name!r} is called {len(layer.inbound_nodes)} '
        'times; its input is ambiguous')
  return tf.keras.Model(inputs=keras_model.inputs, outputs=layer.input,
                        name=f'{keras_model.name}_representation')


def keras_model_of(variable_model) -> tf.keras.Model:
  """Returns the Keras model inside a `tff.learning.models.from_keras_model` VariableModel.

  A `tf.keras.Model` passed directly is returned unchanged.

  Raises:
    TypeError: `variable_model` is not Keras-backed (e.g. a hand-written VariableModel or a
      `tff.learning.models.FunctionalModel`).
  """
  if isinstance(variable_model, tf.keras.Model):
    return variable_model
  keras_model = getattr(variable_model, _KERAS_MODEL_ATTR, None)
  if isinstance(variable_model, tff.learning.models.VariableModel) and isinstance(
      keras_model, tf.keras.Model):
    return keras_model
  raise TypeError(
      'keras_model_of expects a tff.learning.models.VariableModel built by '
      'tff.learning.models.from_keras_model (or a tf.keras.Model); got '
      f'{type(variable_model).__module__}.{type(variable_model).__name__}, which is not '
      'Keras-backed')


def classifier_weight_indices(variable_model) -> tuple[int, int]:
  """(kernel, bias) positions of the classifier layer's tensors in the model's trainable
  weights (the order of `ModelWeights.trainable` and so of model deltas).

  Raises:
    TypeError / ValueError: as `keras_model_of` / `classifier_layer`, or when the classifier
      has no bias or its variables are not trainable.
  """
  layer = classifier_layer(keras_model_of(variable_model))
  if getattr(layer, 'bias', None) is None:
    raise ValueError(f'the classifier layer of {layer.name!r} has no bias')
  trainable = (variable_model.trainable_variables
               if isinstance(variable_model, tff.learning.models.VariableModel)
               else keras_model_of(variable_model).trainable_variables)
  positions = {}
  for name, var in (('kernel', layer.kernel), ('bias', layer.bias)):
    hits = [i for i, v in enumerate(trainable) if v is var]
    if len(hits) != 1:
      raise ValueError(f'the classifier {name} is not among the trainable weights')
    positions[name] = hits[0]
  return positions['kernel'], positions['bias']
