"""Tests for tff_algos.models: the Keras zoo, representation access and TFF model_fns."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import models

# TFF warns about BatchNormalization (ResNet-20, VGG-16) in from_keras_model: expected here.
pytestmark = pytest.mark.filterwarnings('ignore:Batch Normalization:UserWarning')

# name -> (input_shape, num_classes, exact parameter count incl. BatchNorm statistics)
EXPECTED = {
    'fedavg_cnn': ((28, 28, 1), 10, 1_663_370),
    'simple_cnn': ((28, 28, 1), 10, 582_026),
    'mlp_2nn': ((28, 28, 1), 10, 199_210),
    'mlp_2nn_dropout': ((28, 28, 1), 10, 199_210),
    'resnet20': ((32, 32, 3), 10, 271_098),
    'vgg16': ((32, 32, 3), 10, 15_257_802),
    'char_lstm': ((80,), 86, 819_462),
    'tiny_cnn': ((8, 8, 1), 10, 9_658),
    'leaf_char_lstm': ((80,), 81, 818_137),
    'sent140_lstm': ((25,), 2, 273_986),
}
BATCH = 2


def _random_x(name, input_shape, batch=BATCH, seed=0):
  rng = np.random.default_rng(seed)
  if name in models.SEQUENCE_MODELS or name in models.TOKEN_MODELS:
    vocab = models.DEFAULT_VOCAB_SIZES.get(name, EXPECTED[name][1])
    # Mostly real ids, with trailing padding (id 0) in the first example.
    x = rng.integers(1, vocab, size=(batch, *input_shape)).astype(np.int32)
    x[0, -5:] = 0
    return x
  return rng.standard_normal((batch, *input_shape)).astype(np.float32)


def _random_y(name, input_shape, num_classes, batch=BATCH, seed=1):
  rng = np.random.default_rng(seed)
  shape = (batch, *input_shape) if name in models.SEQUENCE_MODELS else (batch,)
  return rng.integers(0, num_classes, size=shape).astype(np.int32)


@pytest.fixture(scope='module')
def built():
  """Each zoo model built once (seed 0) and shared by the read-only tests."""
  return {name: models.build_keras_model(name, shape, classes, seed=0)
          for name, (shape, classes, _) in EXPECTED.items()}


def test_registry_lists_every_builder():
  from tff_algos.models import catalog  # pylint: disable=g-import-not-at-top
  assert tuple(models.MODELS) == catalog.MODEL_NAMES  # the TF-free names are the builders'
  assert set(models.MODELS) == set(EXPECTED)
  assert set(models.DEFAULT_INPUT_SHAPES) == set(EXPECTED)
  for name, (shape, classes, _) in EXPECTED.items():
    assert models.DEFAULT_INPUT_SHAPES[name] == shape
    assert models.DEFAULT_NUM_CLASSES[name] == classes
  assert models.CLASSIFIER_LAYER == 'classifier'


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_builder_output_shape_classifier_and_param_count(built, name):
  input_shape, num_classes, params = EXPECTED[name]
  model = built[name]
  assert model.count_params() == params
  last = model.layers[-1]
  assert last.name == models.CLASSIFIER_LAYER
  assert isinstance(last, tf.keras.layers.Dense)
  assert last.activation is tf.keras.activations.linear  # logits, no softmax
  assert models.classifier_layer(model) is last

  logits = model(_random_x(name, input_shape), training=False)
  if name in models.SEQUENCE_MODELS:
    assert logits.shape == (BATCH, input_shape[0], num_classes)
  else:
    assert logits.shape == (BATCH, num_classes)
  assert np.all(np.isfinite(logits.numpy()))


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_representation_model_is_penultimate_activation(built, name):
  input_shape, _, _ = EXPECTED[name]
  model = built[name]
  clf = models.classifier_layer(model)
  rep_model = models.representation_model(model)
  feature_dim = clf.kernel.shape[0]
  assert rep_model.output_shape[-1] == feature_dim

  x = _random_x(name, input_shape)
  rep = rep_model(x, training=False).numpy()
  # Independent path: the output of the layer just before the classifier.
  penultimate = tf.keras.Model(model.inputs, model.layers[-2].output)(x, training=False).numpy()
  np.testing.assert_allclose(rep, penultimate, rtol=1e-6, atol=1e-6)
  # Manual classifier: logits = rep @ W + b.
  w, b = clf.get_weights()
  np.testing.assert_allclose(rep @ w + b, model(x, training=False).numpy(),
                             rtol=1e-4, atol=1e-4)

  # The representation shares its variables with the full model (minus the classifier).
  model_refs = {v.ref() for v in model.weights}
  rep_refs = {v.ref() for v in rep_model.weights}
  assert rep_refs <= model_refs
  assert rep_refs == model_refs - {v.ref() for v in clf.weights}


def test_representation_dims():
  assert models.representation_model(models.fedavg_cnn()).output_shape == (None, 512)
  assert models.representation_model(models.mlp_2nn()).output_shape == (None, 200)
  assert models.representation_model(models.tiny_cnn()).output_shape == (None, 32)


def test_fedavg_cnn_layers_and_simple_cnn_padding():
  model = models.fedavg_cnn()
  assert model.count_params() == 1_663_370
  convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
  assert [(c.filters, c.kernel_size, c.padding) for c in convs] == [
      (32, (5, 5), 'same'), (64, (5, 5), 'same')]
  simple = models.simple_cnn()
  assert [l.padding for l in simple.layers if isinstance(l, tf.keras.layers.Conv2D)] == [
      'valid', 'valid']
  assert simple.get_layer('flatten').output_shape == (None, 4 * 4 * 64)


def test_resnet20_structure_and_shortcut_b():
  model = models.resnet20()
  convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
  assert len(convs) == 19  # 1 stem + 3 stages x 3 blocks x 2; option A adds none
  assert len([l for l in model.layers if isinstance(l, models.ShortcutA)]) == 2
  model_b = models.resnet20(shortcut='B')
  assert len([l for l in model_b.layers if isinstance(l, tf.keras.layers.Conv2D)]) == 21
  assert model_b.count_params() == 274_042
  # The custom layer clones (from config) for code that copies models.
  clone = tf.keras.models.clone_model(model)
  assert clone.count_params() == model.count_params()
  with pytest.raises(ValueError, match='shortcut'):
    models.resnet20(shortcut='C')


def test_vgg16_structure_and_head():
  model = models.build_keras_model('vgg16', seed=0)
  convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
  bns = [l for l in model.layers if isinstance(l, tf.keras.layers.BatchNormalization)]
  dense = [l for l in model.layers if isinstance(l, tf.keras.layers.Dense)]
  assert len(convs) == 13 and len(bns) == 13 and len(dense) == 3
  assert models.vgg16(head_units=()).count_params() == 14_732_490
  with pytest.raises(ValueError, match='>= 32'):
    models.vgg16(input_shape=(28, 28, 1))


def test_char_lstm_structure_and_masking(built):
  model = built['char_lstm']
  assert model.input.dtype == tf.int32
  lstms = [l for l in model.layers if isinstance(l, tf.keras.layers.LSTM)]
  assert [(l.units, l.return_sequences) for l in lstms] == [(256, True), (256, True)]
  assert model.get_layer('embedding').output_dim == 8
  # Padding (id 0) is masked: the loss ignores padded positions.
  x = _random_x('char_lstm', (80,))
  y = _random_y('char_lstm', (80,), 86)
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  masked = float(loss(y, model(x)))
  manual = tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
  keep = (x != 0).astype(np.float32)
  np.testing.assert_allclose(masked, float(np.sum(manual * keep) / keep.sum()), rtol=1e-5)


def _lstm_params(inputs, units):
  return 4 * units * (inputs + units + 1)


def test_leaf_models_have_leafs_layers():
  """Parameter counts from LEAF's layer sizes: Shakespeare embedding 8, 2 x LSTM(256), dense
  over 81 ids on the last step; Sent140 embedding = LSTM width 100, 2 x LSTM(100), linear
  dense 128, 2 classes."""
  char = models.leaf_char_lstm(seed=0)
  assert char.count_params() == (81 * 8 + _lstm_params(8, 256) + _lstm_params(256, 256)
                                 + 256 * 81 + 81)
  assert [l.return_sequences for l in char.layers if isinstance(l, tf.keras.layers.LSTM)] == [
      True, False]
  assert char.get_layer('embedding').mask_zero is False  # LEAF's id 0 is a newline
  sent = models.sent140_lstm(vocab_size=50, seed=0)
  assert sent.count_params() == (50 * 100 + 2 * _lstm_params(100, 100) + 100 * 128 + 128
                                 + 128 * 2 + 2)
  assert sent.get_layer('fc1').activation is tf.keras.activations.linear
  # Padding (id 0) is masked: trailing padding does not change the prediction.
  x = np.zeros([1, 25], np.int32)
  x[0, :5] = [3, 7, 9, 2, 4]
  longer = np.zeros([1, 30], np.int32)
  longer[0, :5] = x[0, :5]
  sent30 = models.sent140_lstm(vocab_size=50, seq_length=30, seed=0)
  np.testing.assert_allclose(sent(x).numpy(), sent30(longer).numpy(), rtol=1e-5, atol=1e-6)


def test_token_model_input_spec_has_one_label_per_example():
  for name, length in (('leaf_char_lstm', 80), ('sent140_lstm', 25)):
    spec = models.input_spec_for(name)
    assert spec['x'] == tf.TensorSpec([None, length], tf.int32)
    assert spec['y'] == tf.TensorSpec([None], tf.int32)


def _weights(model):
  return [w.copy() for w in model.get_weights()]


def _same(a, b):
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


_SEEDED_BUILDERS = {
    'tiny_cnn': lambda seed: models.build_keras_model('tiny_cnn', seed=seed),
    'resnet20': lambda seed: models.build_keras_model('resnet20', seed=seed),
    # A small unmasked LSTM keeps the test fast (masking only slows graph construction); it
    # exercises the same seeding (embedding, kernel, orthogonal recurrent kernel).
    'char_lstm': lambda seed: models.char_lstm(vocab_size=12, seq_length=6, units=8,
                                               mask_zero=False, seed=seed),
}


@pytest.mark.parametrize('name', sorted(_SEEDED_BUILDERS))
def test_seed_determinism(name):
  build = _SEEDED_BUILDERS[name]
  first = _weights(build(7))
  again = _weights(build(7))
  other = _weights(build(8))
  assert _same(first, again)
  assert not _same(first, other)
  # Every kernel differs under another seed (no layer left with a shared seed).
  kernels = [i for i, w in enumerate(first) if w.ndim >= 2]
  assert kernels and all(not np.array_equal(first[i], other[i]) for i in kernels)
  # Unseeded builds differ from each other.
  assert not _same(_weights(build(None)), _weights(build(None)))


def test_seeded_initial_values_match_inside_a_graph():
  """TFF traces model_fn in a graph: the seeded initial values must be the eager ones."""
  eager = _weights(models.build_keras_model('tiny_cnn', seed=3))
  graph = tf.Graph()
  with graph.as_default():
    model = models.build_keras_model('tiny_cnn', seed=3)
    initial = [v.initial_value for v in model.weights]
    with tf.compat.v1.Session(graph=graph) as sess:
      in_graph = sess.run(initial)
  assert _same(eager, in_graph)


def test_unknown_name_raises_value_error_listing_names():
  for fn in (lambda: models.build_keras_model('resnet18'),
             lambda: models.make_model_fn('resnet18'),
             lambda: models.input_spec_for('resnet18')):
    with pytest.raises(ValueError, match='valid names are: .*fedavg_cnn'):
      fn()


def test_input_spec_for():
  spec = models.input_spec_for('fedavg_cnn', (28, 28, 1))
  assert isinstance(spec, collections.OrderedDict) and list(spec) == ['x', 'y']
  assert spec['x'] == tf.TensorSpec([None, 28, 28, 1], tf.float32)
  assert spec['y'] == tf.TensorSpec([None], tf.int32)
  assert models.input_spec_for('tiny_cnn')['x'] == tf.TensorSpec([None, 8, 8, 1], tf.float32)
  seq = models.input_spec_for('char_lstm')
  assert seq['x'] == tf.TensorSpec([None, 80], tf.int32)
  assert seq['y'] == tf.TensorSpec([None, 80], tf.int32)
  with pytest.raises(ValueError, match='seq_length'):
    models.input_spec_for('char_lstm', (8, 8, 1))


@pytest.mark.parametrize('name', ['tiny_cnn', 'resnet20', 'char_lstm'])
def test_make_model_fn_forward_pass(name):
  shape, classes, params = EXPECTED[name]
  model_fn = models.make_model_fn(name, shape, classes, seed=0)
  model = model_fn()
  assert isinstance(model, tff.learning.models.VariableModel)
  assert model.input_spec == models.input_spec_for(name, shape)
  batch = collections.OrderedDict(x=_random_x(name, shape), y=_random_y(name, shape, classes))
  out = model.forward_pass(batch, training=False)
  assert np.isfinite(float(out.loss))
  assert int(out.num_examples) == BATCH
  keras_model = models.keras_model_of(model)
  assert keras_model.count_params() == params
  np.testing.assert_allclose(out.predictions.numpy(),
                             keras_model(batch['x'], training=False).numpy(),
                             rtol=1e-5, atol=1e-5)
  metrics = model.report_local_unfinalized_metrics()
  assert {'sparse_categorical_accuracy', 'loss', 'num_examples', 'num_batches'} <= set(metrics)
  assert set(model.metric_finalizers()) == set(metrics)
  # A fresh call builds a fresh model (own variables, own metrics) with the same weights.
  second = model_fn()
  assert models.keras_model_of(second) is not keras_model
  assert second.get_metrics()[0] is not model.get_metrics()[0]
  assert _same(_weights(models.keras_model_of(second)), _weights(keras_model))


def test_make_model_fn_is_usable_by_tff_learning():
  """The model_fn plugs into a tff.learning builder (construction only: no runtime started)."""
  model_fn = models.make_model_fn('tiny_cnn', seed=0)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1))
  assert process.initialize.type_signature.result.member.global_model_weights is not None


def test_keras_model_of_and_errors():
  keras_model = models.tiny_cnn(seed=0)
  wrapped = tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=models.input_spec_for('tiny_cnn'))
  assert models.keras_model_of(wrapped) is keras_model
  assert models.keras_model_of(keras_model) is keras_model  # already Keras: unchanged

  class NotKeras(tff.learning.models.VariableModel):
    pass

  NotKeras.__abstractmethods__ = frozenset()
  for bad in (NotKeras(), object(), 'tiny_cnn', None):
    with pytest.raises(TypeError, match='not Keras-backed'):
      models.keras_model_of(bad)


def test_classifier_and_representation_errors():
  inputs = tf.keras.Input((4,))
  no_classifier = tf.keras.Model(inputs, tf.keras.layers.Dense(3, name='head')(inputs))
  with pytest.raises(ValueError, match='classifier'):
    models.classifier_layer(no_classifier)
  with pytest.raises(ValueError, match='classifier'):
    models.representation_model(no_classifier)
  with pytest.raises(TypeError):
    models.classifier_layer(tf.keras.layers.Dense(3))


def test_seed_validation():
  with pytest.raises(TypeError):
    models.tiny_cnn(seed=1.5)
  with pytest.raises(ValueError):
    models.tiny_cnn(seed=-1)


def test_mlp_2nn_dropout_layers():
  """Flatten, fc1 ReLU, dropout1, fc2 ReLU, dropout2, classifier; 0.1 dropout, same weights."""
  model = models.build_keras_model('mlp_2nn_dropout', (28, 28, 1), 10, seed=0)
  assert [type(l).__name__ for l in model.layers[1:]] == [
      'Flatten', 'Dense', 'Dropout', 'Dense', 'Dropout', 'Dense']
  assert [l.name for l in model.layers[1:]] == [
      'flatten', 'fc1', 'dropout1', 'fc2', 'dropout2', 'classifier']
  assert [l.rate for l in model.layers if isinstance(l, tf.keras.layers.Dropout)] == [0.1, 0.1]
  assert all(l.activation is tf.keras.activations.relu for l in (model.layers[2], model.layers[4]))
  plain = models.mlp_2nn(seed=0)   # dropout=0.0: no Dropout layer, unchanged builder
  assert not any(isinstance(l, tf.keras.layers.Dropout) for l in plain.layers)
  with pytest.raises(ValueError, match='dropout'):
    models.mlp_2nn(dropout=1.0)


def test_mlp_2nn_dropout_training_and_evaluation_numpy():
  """Through the TFF model: training=True zeroes ~the rate of the hidden activations (scaled
  by 1/(1 - rate) otherwise); training=False is the NumPy forward pass of the weights."""
  rate = models.zoo.MLP_2NN_DROPOUT
  model_fn = models.make_model_fn('mlp_2nn_dropout', (8, 8, 1), 4, seed=3)
  model = model_fn()
  keras = models.keras_model_of(model)
  x = np.random.default_rng(0).standard_normal((4000, 8, 8, 1)).astype(np.float32)
  y = np.zeros([4000], np.int32)
  w1, b1, w2, b2, w3, b3 = [v.numpy() for v in model.trainable_variables]
  relu = lambda a: np.maximum(a, 0.0)
  h1 = relu(x.reshape(4000, -1) @ w1 + b1)
  h2 = relu(h1 @ w2 + b2)
  evaluated = model.forward_pass(collections.OrderedDict(x=x, y=y), training=False)
  np.testing.assert_allclose(evaluated.predictions.numpy(), h2 @ w3 + b3, rtol=1e-4, atol=1e-4)

  dropped = tf.keras.Model(keras.inputs, keras.get_layer('dropout1').output)(x, training=True)
  dropped = dropped.numpy()
  live = h1 > 0
  zeroed = np.mean(dropped[live] == 0.0)
  assert abs(zeroed - rate) < 0.01, zeroed
  kept = live & (dropped != 0.0)
  # (atol: NumPy's and TensorFlow's float32 sums of 64 products differ by an ulp or so,
  # a large relative difference where an activation is near 0.)
  np.testing.assert_allclose(dropped[kept], h1[kept] / (1.0 - rate), rtol=1e-5, atol=1e-5)
  trained = model.forward_pass(collections.OrderedDict(x=x, y=y), training=True)
  assert not np.allclose(trained.predictions.numpy(), h2 @ w3 + b3, atol=1e-3)
