"""Keras model zoo used by the papers this library implements.

Every builder returns an (uncompiled) functional `tf.keras.Model` whose last layer is a
`tf.keras.layers.Dense` named exactly `CLASSIFIER_LAYER` (``'classifier'``) that outputs
**logits** (no softmax): pair the models with losses/metrics built with ``from_logits=True``.
Methods that need the penultimate representation (CADIS) or the final layer (FedLEx, CADIS)
find it by that name, see `tff_algos.models.representation`.

Models:

* `fedavg_cnn`: the CNN of McMahan et al. 2017 ("Communication-efficient learning of deep
  networks from decentralized data"): two 5x5 convolutions (32, 64 channels, 'same' padding,
  ReLU), each followed by 2x2 max pooling, a 512-unit ReLU dense layer and the classifier.
  1,663,370 parameters for 28x28x1 inputs and 10 classes.
* `simple_cnn`: the "simple CNN" of FedCDA: the same layer list as `fedavg_cnn` but with
  **'valid'** convolution padding (the paper does not name the padding; 'valid' is the common
  PyTorch default, ``nn.Conv2d(..., 5)``, and keeps the two builders distinct). 582,026
  parameters for 28x28x1 inputs and 10 classes.
* `mlp_2nn`: the "2NN" of McMahan et al.: two hidden ReLU layers of 200 units.
* `mlp_2nn_dropout`: `mlp_2nn` with dropout at rate `MLP_2NN_DROPOUT` (0.1) after each hidden
  ReLU, active only in training (`forward_pass(training=True)`). The rate is the one the FedLEx
  reference's README passes (`--dropout 0.1`); its own TwoNN (Flatten, Linear-ReLU,
  Linear-ReLU, Linear) takes no dropout argument, so that run trains the plain `mlp_2nn`.
* `resnet20`: He et al. 2016's CIFAR ResNet-20: a 3x3 16-channel stem, 3 stages x 3 basic
  blocks (16/32/64 filters, the first block of stages 2 and 3 has stride 2), BatchNorm after
  every convolution, global average pooling and the classifier. Shortcuts that change shape use
  option A (stride-2 subsampling and zero-padded channels, parameter free, as in the paper's
  CIFAR experiments) or, with ``shortcut='B'``, a 1x1 convolution + BatchNorm.
* `vgg16`: CIFAR-style VGG-16: 13 3x3 convolutions (64,64,M,128,128,M,256x3,M,512x3,M,512x3,M),
  each followed by BatchNorm and ReLU, then the head: Flatten (512 features after 5 poolings of
  a 32x32 input), two 512-unit ReLU dense layers and the classifier, i.e. 16 weight layers as in
  Simonyan & Zisserman, with the small 512-unit CIFAR head of the widely used PyTorch CIFAR
  VGG. No dropout (deterministic forward pass). ``head_units=()`` gives the 14-layer variant
  whose classifier sits directly on the 512 conv features.
* `char_lstm`: TFF's Shakespeare next-character model (TFF research
  ``shakespeare_models.create_recurrent_model``): Embedding(vocab, 8, mask_zero=True), two stacked
  LSTM(256, return_sequences=True), and a per-position Dense classifier over the vocabulary.
  int32 inputs [batch, seq_length] -> logits [batch, seq_length, vocab]. Character id 0 is
  padding: the Embedding masks it for the LSTMs, and since TFF's Keras wrapper does not pass
  that mask to the loss, `model_fns.make_model_fn` trains it with a loss that skips label 0
  (`PaddedSequenceCrossentropy`), as central evaluation does.
* `leaf_char_lstm`: LEAF's Shakespeare model (LEAF ``models/shakespeare/stacked_lstm.py``):
  Embedding(vocab, 8), two stacked LSTM(256) and a Dense classifier over the vocabulary on the
  **last** step's output: int32 [batch, 80] -> logits [batch, vocab], one next character per
  window, as LEAF writes its data. No masking: LEAF's character id 0 is a newline.
* `sent140_lstm`: LEAF's Sent140 model (LEAF ``models/sent140/stacked_lstm.py``): a trainable
  Embedding(vocab, 100), two stacked LSTM(100), a linear 128-unit dense layer on the last
  step's output and the classifier (2 classes). LEAF looks its ids up in a 300-d GloVe table
  that needs a download; here the embedding is learnt from scratch over the vocabulary the
  loader builds from the training tweets (`data.load_leaf`: 0 = padding, 1 = out of
  vocabulary, then words by frequency), with id 0 masked so padding does not count.
* `tiny_cnn`: a very small CNN for tests on scikit-learn's 8x8 digits.

BatchNorm note (ResNet-20, VGG-16): its moving statistics are non-trainable variables; TFF
warns that `tff.learning` aggregates only trainable variables by default.

Determinism: every builder takes ``seed``. With an int seed, each layer gets its own seeded
Keras initializer (seeds derived from ``seed`` and the layer's position with
`numpy.random.SeedSequence`), so the same seed gives identical initial weights, in eager mode
and when TFF traces the model inside a graph, without touching any global random state. With
``seed=None`` Keras' unseeded initializers are used (different weights on every build).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_algos.models import catalog

CLASSIFIER_LAYER = 'classifier'

Shape = Sequence[int]


class _Initializers:
  """Hands out Keras initializers, each with its own seed derived from one model seed."""

  def __init__(self, seed: Optional[int]):
    if seed is not None:
      if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f'seed must be an int or None, got {seed!r}')
      if seed < 0:
        raise ValueError(f'seed must be non-negative, got {seed}')
    self._seed = None if seed is None else int(seed)
    self._count = 0

  def _next_seed(self) -> Optional[int]:
    if self._seed is None:
      return None
    state = np.random.SeedSequence([self._seed, self._count]).generate_state(1)
    self._count += 1
    return int(state[0] % (2**31 - 1))

  def glorot_uniform(self):
    return tf.keras.initializers.GlorotUniform(seed=self._next_seed())

  def he_normal(self):
    return tf.keras.initializers.HeNormal(seed=self._next_seed())

  def orthogonal(self):
    return tf.keras.initializers.Orthogonal(seed=self._next_seed())

  def dropout_seed(self) -> Optional[int]:
    return self._next_seed()

  def embedding_uniform(self):
    # Keras' Embedding default is RandomUniform(-0.05, 0.05).
    return tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=self._next_seed())


def _check_image_shape(input_shape: Shape, name: str) -> tuple[int, ...]:
  shape = tuple(int(d) for d in input_shape)
  if len(shape) != 3 or any(d <= 0 for d in shape):
    raise ValueError(
        f'{name} expects input_shape (height, width, channels) with positive sizes, '
        f'got {tuple(input_shape)}')
  return shape


def _check_num_classes(num_classes: int) -> int:
  if int(num_classes) < 1:
    raise ValueError(f'num_classes must be >= 1, got {num_classes}')
  return int(num_classes)


def _classifier(num_classes: int, init: _Initializers) -> tf.keras.layers.Dense:
  return tf.keras.layers.Dense(
      num_classes, activation=None, kernel_initializer=init.glorot_uniform(),
      name=CLASSIFIER_LAYER)


def _two_conv_cnn(input_shape, num_classes, padding, seed, name):
  input_shape = _check_image_shape(input_shape, name)
  num_classes = _check_num_classes(num_classes)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=input_shape, name='x')
  h = tf.keras.layers.Conv2D(32, 5, padding=padding, activation='relu',
                             kernel_initializer=init.glorot_uniform(), name='conv1')(inputs)
  h = tf.keras.layers.MaxPool2D(2, name='pool1')(h)
  h = tf.keras.layers.Conv2D(64, 5, padding=padding, activation='relu',
                             kernel_initializer=init.glorot_uniform(), name='conv2')(h)
  h = tf.keras.layers.MaxPool2D(2, name='pool2')(h)
  h = tf.keras.layers.Flatten(name='flatten')(h)
  h = tf.keras.layers.Dense(512, activation='relu', kernel_initializer=init.glorot_uniform(),
                            name='fc1')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name=name)


def fedavg_cnn(input_shape: Shape = (28, 28, 1), num_classes: int = 10,
               seed: Optional[int] = None) -> tf.keras.Model:
  """McMahan et al.'s CNN ('same' padding); 1,663,370 params for 28x28x1 / 10 classes."""
  return _two_conv_cnn(input_shape, num_classes, 'same', seed, 'fedavg_cnn')


def simple_cnn(input_shape: Shape = (28, 28, 1), num_classes: int = 10,
               seed: Optional[int] = None) -> tf.keras.Model:
  """FedCDA's simple CNN: as `fedavg_cnn` but with 'valid' convolution padding."""
  return _two_conv_cnn(input_shape, num_classes, 'valid', seed, 'simple_cnn')


def mlp_2nn(input_shape: Shape = (28, 28, 1), num_classes: int = 10, hidden: int = 200,
            seed: Optional[int] = None, dropout: float = 0.0) -> tf.keras.Model:
  """McMahan et al.'s 2NN: Flatten, two hidden ReLU layers of `hidden` units, classifier.

  `dropout` > 0 puts a Dropout layer of that rate after each hidden ReLU ('dropout1',
  'dropout2'; Keras applies it only when called with training=True).
  """
  shape = tuple(int(d) for d in input_shape)
  if not shape or any(d <= 0 for d in shape):
    raise ValueError(f'mlp_2nn expects a non-empty input_shape of positive sizes, got {shape}')
  if not 0.0 <= float(dropout) < 1.0:
    raise ValueError(f'mlp_2nn dropout must be in [0, 1), got {dropout}')
  num_classes = _check_num_classes(num_classes)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=shape, name='x')
  h = tf.keras.layers.Flatten(name='flatten')(inputs)
  for i in (1, 2):
    h = tf.keras.layers.Dense(hidden, activation='relu',
                              kernel_initializer=init.glorot_uniform(), name=f'fc{i}')(h)
    if dropout:
      h = tf.keras.layers.Dropout(float(dropout), seed=init.dropout_seed(),
                                  name=f'dropout{i}')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name='mlp_2nn_dropout' if dropout else 'mlp_2nn')


MLP_2NN_DROPOUT = 0.1


def mlp_2nn_dropout(input_shape: Shape = (28, 28, 1), num_classes: int = 10,
                    hidden: int = 200, seed: Optional[int] = None) -> tf.keras.Model:
  """`mlp_2nn` with dropout `MLP_2NN_DROPOUT` after each hidden ReLU (module docstring)."""
  return mlp_2nn(input_shape, num_classes, hidden, seed, dropout=MLP_2NN_DROPOUT)


@tf.keras.utils.register_keras_serializable(package='tff_algos')
class ShortcutA(tf.keras.layers.Layer):
  """He et al.'s option-A shortcut: spatial subsampling by `stride`, zero-padded channels."""

  def __init__(self, out_channels: int, stride: int = 2, **kwargs):
    super().__init__(**kwargs)
    self.out_channels = int(out_channels)
    self.stride = int(stride)

  def call(self, inputs):
    x = inputs[:, ::self.stride, ::self.stride, :]
    extra = self.out_channels - inputs.shape[-1]
    if extra < 0:
      raise ValueError('ShortcutA cannot reduce the number of channels')
    if extra:
      x = tf.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])
    return x

  def get_config(self):
    config = super().get_config()
    config.update(out_channels=self.out_channels, stride=self.stride)
    return config


def _conv_bn(h, filters, stride, init, name, relu=True):
  h = tf.keras.layers.Conv2D(filters, 3, strides=stride, padding='same', use_bias=False,
                             kernel_initializer=init.he_normal(), name=f'{name}_conv')(h)
  h = tf.keras.layers.BatchNormalization(name=f'{name}_bn')(h)
  if relu:
    h = tf.keras.layers.ReLU(name=f'{name}_relu')(h)
  return h


def resnet20(input_shape: Shape = (32, 32, 3), num_classes: int = 10,
             shortcut: str = 'A', seed: Optional[int] = None) -> tf.keras.Model:
  """He et al.'s CIFAR ResNet-20 (n=3); `shortcut` 'A' (zero-padding) or 'B' (1x1 conv)."""
  input_shape = _check_image_shape(input_shape, 'resnet20')
  num_classes = _check_num_classes(num_classes)
  shortcut = shortcut.upper()
  if shortcut not in ('A', 'B'):
    raise ValueError(f"resnet20 shortcut must be 'A' or 'B', got {shortcut!r}")
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=input_shape, name='x')
  h = _conv_bn(inputs, 16, 1, init, 'stem')
  in_filters = 16
  for stage, filters in enumerate((16, 32, 64), start=1):
    for block in range(3):
      stride = 2 if (stage > 1 and block == 0) else 1
      name = f'stage{stage}_block{block}'
      r = _conv_bn(h, filters, stride, init, f'{name}_a')
      r = _conv_bn(r, filters, 1, init, f'{name}_b', relu=False)
      if stride != 1 or in_filters != filters:
        if shortcut == 'A':
          s = ShortcutA(filters, stride, name=f'{name}_shortcut')(h)
        else:
          s = tf.keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                     kernel_initializer=init.he_normal(),
                                     name=f'{name}_shortcut_conv')(h)
          s = tf.keras.layers.BatchNormalization(name=f'{name}_shortcut_bn')(s)
      else:
        s = h
      h = tf.keras.layers.Add(name=f'{name}_add')([r, s])
      h = tf.keras.layers.ReLU(name=f'{name}_out')(h)
      in_filters = filters
  h = tf.keras.layers.GlobalAveragePooling2D(name='avg_pool')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name='resnet20')


_VGG16_CONV = (64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'M', 512, 512, 512, 'M',
               512, 512, 512, 'M')


def vgg16(input_shape: Shape = (32, 32, 3), num_classes: int = 10,
          head_units: Sequence[int] = (512, 512),
          seed: Optional[int] = None) -> tf.keras.Model:
  """CIFAR VGG-16: 13 conv+BN+ReLU, 5 max-pools, Flatten, `head_units` ReLU dense, classifier.

  Needs height and width >= 32 (five 2x2 poolings).
  """
  input_shape = _check_image_shape(input_shape, 'vgg16')
  if min(input_shape[:2]) < 32:
    raise ValueError(
        f'vgg16 needs height and width >= 32 (five 2x2 max-poolings), got {input_shape}')
  num_classes = _check_num_classes(num_classes)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=input_shape, name='x')
  h = inputs
  conv, pool = 0, 0
  for v in _VGG16_CONV:
    if v == 'M':
      pool += 1
      h = tf.keras.layers.MaxPool2D(2, name=f'pool{pool}')(h)
    else:
      conv += 1
      h = tf.keras.layers.Conv2D(v, 3, padding='same', use_bias=False,
                                 kernel_initializer=init.he_normal(), name=f'conv{conv}')(h)
      h = tf.keras.layers.BatchNormalization(name=f'bn{conv}')(h)
      h = tf.keras.layers.ReLU(name=f'relu{conv}')(h)
  h = tf.keras.layers.Flatten(name='flatten')(h)
  for i, units in enumerate(head_units, start=1):
    h = tf.keras.layers.Dense(int(units), activation='relu',
                              kernel_initializer=init.glorot_uniform(), name=f'fc{i}')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name='vgg16')


def char_lstm(vocab_size: int = 86, seq_length: int = 80, embedding_dim: int = 8,
              units: int = 256, mask_zero: bool = True,
              seed: Optional[int] = None) -> tf.keras.Model:
  """TFF's Shakespeare character model: int32 [B, seq_length] -> logits [B, seq_length, vocab].

  The default vocab_size of 86 is the size of TFF's Shakespeare character set; a pipeline that
  adds pad/OOV/BOS/EOS ids (TFF research's) passes its own size (86 + 4 = 90). With
  `mask_zero`, id 0 is padding, masked for the LSTMs (the training loss skips it:
  `model_fns.PaddedSequenceCrossentropy`).
  """
  if int(vocab_size) < 2:
    raise ValueError(f'vocab_size must be >= 2, got {vocab_size}')
  if int(seq_length) < 1:
    raise ValueError(f'seq_length must be >= 1, got {seq_length}')
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=(int(seq_length),), dtype=tf.int32, name='x')
  h = tf.keras.layers.Embedding(int(vocab_size), int(embedding_dim), mask_zero=mask_zero,
                                embeddings_initializer=init.embedding_uniform(),
                                name='embedding')(inputs)
  for i in (1, 2):
    h = tf.keras.layers.LSTM(int(units), return_sequences=True,
                             kernel_initializer=init.glorot_uniform(),
                             recurrent_initializer=init.orthogonal(), name=f'lstm{i}')(h)
  outputs = _classifier(int(vocab_size), init)(h)
  return tf.keras.Model(inputs, outputs, name='char_lstm')


def _check_token_model(vocab_size: int, seq_length: int) -> tuple[int, int]:
  if int(vocab_size) < 2:
    raise ValueError(f'vocab_size must be >= 2, got {vocab_size}')
  if int(seq_length) < 1:
    raise ValueError(f'seq_length must be >= 1, got {seq_length}')
  return int(vocab_size), int(seq_length)


def _stacked_lstm_on_last_step(inputs, units: int, init: _Initializers):
  h = inputs
  for i in (1, 2):
    h = tf.keras.layers.LSTM(units, return_sequences=(i == 1),
                             kernel_initializer=init.glorot_uniform(),
                             recurrent_initializer=init.orthogonal(), name=f'lstm{i}')(h)
  return h


def leaf_char_lstm(vocab_size: int = 81, seq_length: int = 80, embedding_dim: int = 8,
                   units: int = 256, seed: Optional[int] = None) -> tf.keras.Model:
  """LEAF's Shakespeare model: int32 [B, seq_length] -> next-character logits [B, vocab].

  vocab_size 81 = LEAF's 80 letters + the loader's out-of-alphabet id.
  """
  vocab_size, seq_length = _check_token_model(vocab_size, seq_length)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=(seq_length,), dtype=tf.int32, name='x')
  h = tf.keras.layers.Embedding(vocab_size, int(embedding_dim),
                                embeddings_initializer=init.embedding_uniform(),
                                name='embedding')(inputs)
  h = _stacked_lstm_on_last_step(h, int(units), init)
  outputs = _classifier(vocab_size, init)(h)
  return tf.keras.Model(inputs, outputs, name='leaf_char_lstm')


def sent140_lstm(vocab_size: int = 1000, seq_length: int = 25, num_classes: int = 2,
                 units: int = 100, dense_units: int = 128,
                 seed: Optional[int] = None) -> tf.keras.Model:
  """LEAF's Sent140 model: int32 token ids [B, seq_length] (0 = padding) -> logits [B, 2]."""
  vocab_size, seq_length = _check_token_model(vocab_size, seq_length)
  num_classes = _check_num_classes(num_classes)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=(seq_length,), dtype=tf.int32, name='x')
  h = tf.keras.layers.Embedding(vocab_size, int(units), mask_zero=True,
                                embeddings_initializer=init.embedding_uniform(),
                                name='embedding')(inputs)
  h = _stacked_lstm_on_last_step(h, int(units), init)
  # LEAF's fc1 has no activation.
  h = tf.keras.layers.Dense(int(dense_units), kernel_initializer=init.glorot_uniform(),
                            name='fc1')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name='sent140_lstm')


def tiny_cnn(input_shape: Shape = (8, 8, 1), num_classes: int = 10,
             seed: Optional[int] = None) -> tf.keras.Model:
  """Tiny test CNN: Conv 3x3x8 ('valid', ReLU), Flatten, Dense 32 ReLU, classifier."""
  input_shape = _check_image_shape(input_shape, 'tiny_cnn')
  num_classes = _check_num_classes(num_classes)
  init = _Initializers(seed)
  inputs = tf.keras.Input(shape=input_shape, name='x')
  h = tf.keras.layers.Conv2D(8, 3, activation='relu', kernel_initializer=init.glorot_uniform(),
                             name='conv1')(inputs)
  h = tf.keras.layers.Flatten(name='flatten')(h)
  h = tf.keras.layers.Dense(32, activation='relu', kernel_initializer=init.glorot_uniform(),
                            name='fc1')(h)
  outputs = _classifier(num_classes, init)(h)
  return tf.keras.Model(inputs, outputs, name='tiny_cnn')


# The builders, under the names (and in the order) of `catalog.MODEL_NAMES`.
MODELS: dict[str, Callable[..., tf.keras.Model]] = {
    'fedavg_cnn': fedavg_cnn,
    'simple_cnn': simple_cnn,
    'mlp_2nn': mlp_2nn,
    'mlp_2nn_dropout': mlp_2nn_dropout,
    'resnet20': resnet20,
    'vgg16': vgg16,
    'char_lstm': char_lstm,
    'tiny_cnn': tiny_cnn,
    'leaf_char_lstm': leaf_char_lstm,
    'sent140_lstm': sent140_lstm,
}

# Per-model defaults used when `build_keras_model` gets no input_shape / num_classes.
# For 'char_lstm', input_shape is (seq_length,) and num_classes is the vocabulary size.
DEFAULT_INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    'fedavg_cnn': (28, 28, 1),
    'simple_cnn': (28, 28, 1),
    'mlp_2nn': (28, 28, 1),
    'mlp_2nn_dropout': (28, 28, 1),
    'resnet20': (32, 32, 3),
    'vgg16': (32, 32, 3),
    'char_lstm': (80,),
    'tiny_cnn': (8, 8, 1),
    'leaf_char_lstm': (80,),
    'sent140_lstm': (25,),
}
DEFAULT_NUM_CLASSES: dict[str, int] = {
    'fedavg_cnn': 10, 'simple_cnn': 10, 'mlp_2nn': 10, 'mlp_2nn_dropout': 10, 'resnet20': 10, 'vgg16': 10,
    'char_lstm': 86, 'tiny_cnn': 10, 'leaf_char_lstm': 81, 'sent140_lstm': 2,
}
# Vocabulary of the token models whose vocabulary is not their class count.
DEFAULT_VOCAB_SIZES: dict[str, int] = {'sent140_lstm': 1000}

# Models whose inputs are int32 token ids and whose labels are one id per position.
SEQUENCE_MODELS = frozenset(
    n for n, kind in catalog.MODEL_INPUTS.items() if kind == catalog.TOKENS_PER_POSITION)
# Models whose inputs are int32 token ids and whose label is one id per example.
TOKEN_MODELS = frozenset(
    n for n, kind in catalog.MODEL_INPUTS.items() if kind == catalog.TOKENS_TO_LABEL)


def check_model_name(name: str) -> str:
  """Returns `name` if it is in `MODELS`, else raises ValueError listing the valid names."""
  if not isinstance(name, str) or name not in MODELS:
    raise ValueError(
        f'Unknown model name {name!r}; valid names are: {", ".join(sorted(MODELS))}')
  return name


def build_keras_model(name: str, input_shape: Optional[Shape] = None,
                      num_classes: Optional[int] = None,
                      seed: Optional[int] = None,
                      vocab_size: Optional[int] = None) -> tf.keras.Model:
  """Builds the zoo model `name` (a key of `MODELS`).

  Args:
    name: one of `MODELS`.
    input_shape: per-example input shape without the batch dimension; defaults to
      `DEFAULT_INPUT_SHAPES[name]`. For 'char_lstm' it is `(seq_length,)`.
    num_classes: number of classes; defaults to `DEFAULT_NUM_CLASSES[name]`. For 'char_lstm' it
      is the vocabulary size.
    seed: int seed for the kernel/embedding initializers (same seed, same initial weights), or
      None for unseeded initialization.
    vocab_size: the token vocabulary of 'sent140_lstm' (default `DEFAULT_VOCAB_SIZES`); the
      character models' vocabulary is their `num_classes`.

  Raises:
    ValueError: unknown `name` (the message lists the valid names) or bad shapes.
  """
  check_model_name(name)
  if input_shape is None:
    input_shape = DEFAULT_INPUT_SHAPES[name]
  if num_classes is None:
    num_classes = DEFAULT_NUM_CLASSES[name]
  if name == 'char_lstm':
    input_shape = tuple(input_shape)
    if len(input_shape) != 1:
      raise ValueError(f"char_lstm expects input_shape (seq_length,), got {input_shape}")
    return char_lstm(vocab_size=num_classes, seq_length=input_shape[0], seed=seed)
  if name in TOKEN_MODELS:
    input_shape = tuple(input_shape)
    if len(input_shape) != 1:
      raise ValueError(f'{name} expects input_shape (seq_length,), got {input_shape}')
    if name == 'leaf_char_lstm':
      return leaf_char_lstm(vocab_size=num_classes, seq_length=input_shape[0], seed=seed)
    return sent140_lstm(vocab_size=vocab_size or DEFAULT_VOCAB_SIZES[name],
                        seq_length=input_shape[0], num_classes=num_classes, seed=seed)
  return MODELS[name](input_shape=tuple(input_shape), num_classes=num_classes, seed=seed)
