"""tff_algos.optimizers (build_torch_adam, with_weight_decay) against PyTorch's update rules
written in numpy."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import optimizers


def _steps(optimizer, weights, gradients):
  """Applies `optimizer` over the list of per-step gradients, from `weights`."""
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights)
  state = optimizer.initialize(specs)
  current = tuple(tf.constant(w, tf.float32) for w in weights)
  for grads in gradients:
    state, current = optimizer.next(state, current,
                                    tuple(tf.constant(g, tf.float32) for g in grads))
  return [np.asarray(w) for w in current], state


def _random(seed, steps=4):
  rng = np.random.default_rng(seed)
  shapes = [(3, 2), (5,)]
  weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
  gradients = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(steps)]
  return weights, gradients


@pytest.mark.parametrize('seed', [0, 1])
def test_sgd_with_weight_decay_is_torch_sgd(seed):
  weights, gradients = _random(seed)
  lr, wd = 0.1, 0.05
  got, _ = _steps(optimizers.with_weight_decay(
      tff.learning.optimizers.build_sgdm(learning_rate=lr), wd), weights, gradients)
  want = [w.astype(np.float64) for w in weights]
  for grads in gradients:   # torch.optim.SGD(weight_decay=wd): g + wd * w, then the step
    want = [w - lr * (g + wd * w) for w, g in zip(want, grads)]
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _torch_adam(weights, gradients, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
  """torch.optim.Adam(lr, betas=(b1, b2), eps, weight_decay=wd) from `weights` over the list of
  per-step gradients, in float64 (torch/optim/adam.py, _single_tensor_adam without amsgrad)."""
  w = [x.astype(np.float64) for x in weights]
  m = [np.zeros_like(x) for x in w]
  v = [np.zeros_like(x) for x in w]
  for t, grads in enumerate(gradients, start=1):
    for i, g in enumerate(grads):
      g = g + wd * w[i]
      m[i] = m[i] + (g - m[i]) * (1 - b1)
      v[i] = v[i] * b2 + (1 - b2) * g * g
      denominator = np.sqrt(v[i]) / np.sqrt(1 - b2 ** t) + eps
      w[i] = w[i] - lr / (1 - b1 ** t) * m[i] / denominator
  return w


# Per-coordinate gradient scales of `_spanning`: 1e-9, 1e-8, 1e-7 (near or below eps = 1e-8
# after the bias correction), then up to 1.
_SCALES = np.concatenate([[1e-9, 1e-8, 1e-7], np.logspace(-6, 0, 15)])
_TINY = _SCALES <= 1e-7


def _spanning(seed, steps=50):
  """Zero weights (Adam without decay does not read them, so the result is the summed steps,
  at float32's relative precision) and `steps` gradients whose coordinates keep their sign and
  scale (`_SCALES`), as a ((3, 4), (6,)) pair; also the scale of each flattened coordinate."""
  rng = np.random.default_rng(seed)
  scales = rng.permutation(_SCALES) * rng.choice([-1.0, 1.0], _SCALES.size)
  gradients = []
  for _ in range(steps):
    g = (scales * rng.uniform(0.5, 1.5, scales.size)).astype(np.float32)
    gradients.append([g[:12].reshape(3, 4), g[12:]])
  return [np.zeros((3, 4), np.float32), np.zeros(6, np.float32)], gradients, np.abs(scales)


@pytest.mark.parametrize('seed', [0, 1])
def test_torch_adam_is_torch_adam_down_to_tiny_gradients(seed):
  weights, gradients, _ = _spanning(seed)
  got, state = _steps(optimizers.build_torch_adam(learning_rate=1e-3), weights, gradients)
  want = _torch_adam(weights, gradients, lr=1e-3)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5)
  assert int(state['step']) == 50


@pytest.mark.parametrize('seed', [0, 1])
def test_tff_adam_is_not_torch_adam_on_tiny_gradients(seed):
  """The comparison above refuses TFF's build_adam (eps on the uncorrected sqrt(v)): its steps
  on the tiny-gradient coordinates are several times smaller, the others nearly equal."""
  weights, gradients, scales = _spanning(seed)
  got, _ = _steps(tff.learning.optimizers.build_adam(learning_rate=1e-3, epsilon=1e-8),
                  weights, gradients)
  want = _torch_adam(weights, gradients, lr=1e-3)
  with pytest.raises(AssertionError):
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5)
  ratio = np.concatenate([b.ravel() for b in want]) / np.concatenate([a.ravel() for a in got])
  order = np.argsort(scales)
  assert np.all(ratio[order][:3] > [5.0, 2.5, 1.3]), ratio[order][:3]   # 1e-9, 1e-8, 1e-7
  np.testing.assert_allclose(ratio[scales >= 1e-3], 1.0, rtol=1e-3)


def test_torch_adam_in_float64_and_on_nested_weights():
  rng = np.random.default_rng(5)
  weights = collections.OrderedDict(
      dense=[rng.normal(size=(2, 3)), rng.normal(size=3)], scale=rng.normal(size=()))
  steps = [tf.nest.map_structure(lambda w: w * 10.0 ** rng.uniform(-9, 0, np.shape(w)), weights)
           for _ in range(20)]
  opt = optimizers.build_torch_adam(learning_rate=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6)
  state = opt.initialize(tf.nest.map_structure(lambda w: tf.TensorSpec(np.shape(w), tf.float64),
                                               weights))
  current = tf.nest.map_structure(tf.constant, weights)
  for grads in steps:
    state, current = opt.next(state, current, tf.nest.map_structure(tf.constant, grads))
  flat = tf.nest.flatten
  want = _torch_adam(flat(weights), [flat(g) for g in steps], lr=0.01, b1=0.8, b2=0.99,
                     eps=1e-6)
  assert tf.nest.map_structure(lambda w: w.dtype, current) == tf.nest.map_structure(
      lambda w: tf.float64, weights)
  for a, b in zip(flat(current), want):
    np.testing.assert_allclose(a, b, rtol=1e-12)
  # A None gradient leaves its weight and moments alone.
  grads = collections.OrderedDict(dense=[tf.ones([2, 3], tf.float64), None],
                                  scale=tf.constant(1.0, tf.float64))
  new_state, new = opt.next(state, current, grads)
  np.testing.assert_array_equal(new['dense'][1], current['dense'][1])
  np.testing.assert_array_equal(new_state['accumulator']['dense'][1],
                                state['accumulator']['dense'][1])
  assert not np.allclose(new['scale'], current['scale'])


def test_torch_adam_inside_a_tff_computation_takes_the_same_steps():
  """As the client work runs it: hparams and step become float32 / int32 tensors."""
  weights, gradients, _ = _spanning(2, steps=10)
  opt = optimizers.build_torch_adam(learning_rate=1e-3)
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights)
  weights_type = tff.StructWithPythonType(
      [tff.TensorType(np.float32, w.shape) for w in weights], tuple)

  @tff.tensorflow.computation
  def initialize():
    return opt.initialize(specs)

  @tff.tensorflow.computation(initialize.type_signature.result, weights_type, weights_type)
  def step(state, w, g):
    return opt.next(state, tuple(w), tuple(g))

  state, current = initialize(), tuple(weights)
  for grads in gradients:
    state, current = step(state, current, tuple(grads))
  for a, b in zip(current, _torch_adam(weights, gradients, lr=1e-3)):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_torch_adam_hparams_round_trip_and_set_the_step():
  opt = optimizers.build_torch_adam(learning_rate=0.1)
  state = opt.initialize((tf.TensorSpec([2], tf.float32),))
  hparams = opt.get_hparams(state)
  assert {k: float(v) for k, v in hparams.items()} == dict(
      learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
  w, g = (tf.constant([1.0, -2.0]),), (tf.constant([0.5, -3.0]),)
  _, base = opt.next(state, w, g)
  doubled = opt.set_hparams(state, collections.OrderedDict(hparams, learning_rate=0.2))
  assert float(opt.get_hparams(doubled)['learning_rate']) == 0.2
  _, faster = opt.next(doubled, w, g)
  # Adam's first step is lr * g / (|g| + eps): here lr * sign(g).
  np.testing.assert_allclose(base[0], [0.9, -1.9], rtol=1e-6)
  np.testing.assert_allclose(faster[0] - w[0], 2 * (base[0] - w[0]), rtol=1e-6)
  with pytest.raises(KeyError, match='no hparams'):
    opt.set_hparams(state, dict(momentum=0.9))


@pytest.mark.parametrize('seed', [2, 3])
def test_torch_adam_with_weight_decay_is_torch_adam_with_weight_decay(seed):
  weights, gradients = _random(seed)
  lr, wd = 0.01, 0.1
  opt = optimizers.with_weight_decay(optimizers.build_torch_adam(learning_rate=lr), wd)
  got, _ = _steps(opt, weights, gradients)
  for a, b in zip(got, _torch_adam(weights, gradients, lr=lr, wd=wd)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  state = opt.initialize(tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights))
  assert list(opt.get_hparams(state)) == ['learning_rate', 'beta_1', 'beta_2', 'epsilon',
                                          'weight_decay']
  changed = opt.set_hparams(state, collections.OrderedDict(opt.get_hparams(state),
                                                           learning_rate=0.5))
  assert float(opt.get_hparams(changed)['learning_rate']) == 0.5


@pytest.mark.parametrize('seed', [2, 3])
def test_tff_adam_with_weight_decay_is_torch_adam_at_unit_gradients(seed):
  weights, gradients = _random(seed)
  lr, wd, eps = 0.01, 0.1, 1e-8
  got, _ = _steps(optimizers.with_weight_decay(
      tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=eps), wd), weights, gradients)
  want = _torch_adam(weights, gradients, lr=lr, eps=eps, wd=wd)
  for a, b in zip(got, want):
    # TFF's Adam adds eps to sqrt(v) before the bias correction (PyTorch: after): at these
    # gradients (~1) the difference is far below the tolerance.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('keyword, bad, message', [
    ('learning_rate', -1e-3, 'learning_rate must be a finite number >= 0'),
    ('learning_rate', float('nan'), 'learning_rate must be a finite number >= 0'),
    ('learning_rate', float('inf'), 'learning_rate must be a finite number >= 0'),
    ('learning_rate', True, 'learning_rate must be a finite number >= 0'),
    ('learning_rate', '0.1', 'learning_rate must be a finite number >= 0'),
    ('beta_1', 1.0, r'beta_1 must be a finite number in \[0, 1\)'),
    ('beta_1', -0.1, r'beta_1 must be a finite number in \[0, 1\)'),
    ('beta_2', 1.0, r'beta_2 must be a finite number in \[0, 1\)'),
    ('epsilon', -1e-8, 'epsilon must be a finite number >= 0'),
])
def test_torch_adam_refuses_bad_arguments(keyword, bad, message):
  kwargs = dict(learning_rate=1e-3)
  kwargs[keyword] = bad
  with pytest.raises(ValueError, match='build_torch_adam: ' + message):
    optimizers.build_torch_adam(**kwargs)
  # The edges PyTorch accepts.
  optimizers.build_torch_adam(learning_rate=0.0, beta_1=0.0, beta_2=0.0, epsilon=0.0)


def test_hparams_hold_the_wrapped_ones_and_the_decay():
  opt = optimizers.with_weight_decay(
      tff.learning.optimizers.build_sgdm(learning_rate=0.1, momentum=0.9), 1e-3)
  state = opt.initialize((tf.TensorSpec([2], tf.float32),))
  hparams = opt.get_hparams(state)
  assert list(hparams) == ['learning_rate', 'momentum', 'weight_decay']
  changed = opt.set_hparams(state, collections.OrderedDict(learning_rate=0.5, momentum=0.0,
                                                           weight_decay=0.0))
  got = {k: float(v) for k, v in opt.get_hparams(changed).items()}
  assert got == dict(learning_rate=0.5, momentum=0.0, weight_decay=0.0)
  # Decay 0 set through the hparams: plain momentum SGD.
  w = (tf.constant([1.0, -2.0]),)
  _, updated = opt.next(changed, w, (tf.constant([0.0, 0.0]),))
  np.testing.assert_allclose(updated[0], [1.0, -2.0])


def test_zero_decay_is_the_optimizer_itself_and_bad_values_are_refused():
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  assert optimizers.with_weight_decay(sgd, 0.0) is sgd
  for bad in (-1e-3, float('nan'), float('inf'), True):
    with pytest.raises(ValueError, match='weight_decay must be a finite number >= 0'):
      optimizers.with_weight_decay(sgd, bad)
  with pytest.raises(TypeError, match='wraps a tff.learning.optimizers.Optimizer'):
    optimizers.with_weight_decay(tf.keras.optimizers.SGD(), 1e-3)
