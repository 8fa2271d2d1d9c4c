"""tff_algos.optimizers.with_weight_decay against PyTorch's update rules written in numpy."""

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


@pytest.mark.parametrize('seed', [2, 3])
def test_adam_with_weight_decay_is_torch_adam(seed):
  weights, gradients = _random(seed)
  lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.999, 1e-8
  got, _ = _steps(optimizers.with_weight_decay(
      tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=eps), wd), weights, gradients)
  want = [w.astype(np.float64) for w in weights]
  m = [np.zeros_like(w) for w in want]
  v = [np.zeros_like(w) for w in want]
  for t, grads in enumerate(gradients, start=1):   # torch.optim.Adam(weight_decay=wd)
    for i, g in enumerate(grads):
      g = g + wd * want[i]
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
      want[i] = want[i] - step * m[i] / (np.sqrt(v[i]) + eps)
  for a, b in zip(got, want):
    # TFF's Adam adds eps to sqrt(v) before the bias correction (PyTorch: after): at these
    # gradients (~1) the difference is far below the tolerance.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


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
