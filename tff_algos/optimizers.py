"""Client optimizers the papers train with that `tff.learning.optimizers` lacks.

`build_torch_adam(learning_rate, ...)` is `torch.optim.Adam` (no weight decay, no amsgrad):
the bias-corrected moments `m / (1 - beta_1^t)` and `v / (1 - beta_2^t)`, with epsilon added
to the corrected `sqrt(v_hat)`. `tff.learning.optimizers.build_adam` adds epsilon to the
uncorrected `sqrt(v)`, i.e. it behaves as PyTorch's Adam with epsilon
`sqrt(1 / (1 - beta_2^t))` times larger (31.6x at step 1 with beta_2 = 0.999), which shrinks
the steps of coordinates whose gradients are near epsilon.

`with_weight_decay(optimizer, weight_decay)` is PyTorch's `weight_decay` argument of
`torch.optim.SGD` / `Adam` (what the FedCDA and FedLEx papers set): every step adds
`weight_decay * w` to the gradient before the wrapped optimizer sees it, i.e. an L2 term
`(weight_decay / 2) ||w||^2` added to the loss (coupled; not AdamW's decoupled decay, which
is `tff.learning.optimizers.build_adamw`). It wraps any `tff.learning.optimizers.Optimizer`,
so it works with every builder of this package and with TFF's own;
`with_weight_decay(build_torch_adam(lr), wd)` is `torch.optim.Adam(lr=lr, weight_decay=wd)`.
"""

from __future__ import annotations

import collections
import math

import tensorflow as tf
import tensorflow_federated as tff

WEIGHT_DECAY_KEY = 'weight_decay'
_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
# State and hparams keys as TFF's `build_adam`, so code reading its hparams reads these too.
_BETA_1_KEY = 'beta_1'
_BETA_2_KEY = 'beta_2'
_EPSILON_KEY = 'epsilon'
_STEP_KEY = 'step'
_ACCUMULATOR_KEY = 'accumulator'
_PRECONDITIONER_KEY = 'preconditioner'
_ADAM_HPARAMS_KEYS = (_LEARNING_RATE_KEY, _BETA_1_KEY, _BETA_2_KEY, _EPSILON_KEY)


def _check_hparam(name, value, in_range, wanted):
  """ValueError unless `value` is a finite number with `in_range(value)` (a tensor traced in a
  computation is not checked, as in TFF's optimizers)."""
  if tf.is_symbolic_tensor(value):
    return
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if isinstance(value, (bool, str, bytes)) or not (math.isfinite(number) and in_range(number)):
    raise ValueError(f'build_torch_adam: {name} must be a finite number {wanted}, got {value!r}')


def _constant(value, dtype):
  """`value` in `dtype`; a Python number is converted directly (tf.cast would round it to
  float32 first)."""
  return tf.cast(value, dtype) if tf.is_tensor(value) else tf.constant(value, dtype)


class _TorchAdam(tff.learning.optimizers.Optimizer):
  """PyTorch's Adam (see `build_torch_adam`)."""

  def __init__(self, learning_rate, beta_1, beta_2, epsilon):
    _check_hparam('learning_rate', learning_rate, lambda x: x >= 0, '>= 0')
    _check_hparam('beta_1', beta_1, lambda x: 0 <= x < 1, 'in [0, 1)')
    _check_hparam('beta_2', beta_2, lambda x: 0 <= x < 1, 'in [0, 1)')
    _check_hparam('epsilon', epsilon, lambda x: x >= 0, '>= 0')
    self._hparams = collections.OrderedDict(zip(
        _ADAM_HPARAMS_KEYS, (learning_rate, beta_1, beta_2, epsilon)))

  def initialize(self, specs):
    zeros = lambda: tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)  # noqa: E731
    return collections.OrderedDict(
        self._hparams, **{_STEP_KEY: 0, _ACCUMULATOR_KEY: zeros(), _PRECONDITIONER_KEY: zeros()})

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    for key in (_ACCUMULATOR_KEY, _PRECONDITIONER_KEY):
      try:
        tf.nest.assert_same_structure(weights, state[key], check_types=True)
      except (TypeError, ValueError) as e:
        raise ValueError(f'The optimizer state\'s {key} does not match the weights\' structure: '
                         'was `initialize` given specs of other weights?') from e
    lr, beta_1, beta_2, epsilon = (state[k] for k in _ADAM_HPARAMS_KEYS)
    step = state[_STEP_KEY] + 1
    # Scalars in float64 and then cast to the weights' dtype, as PyTorch computes them in
    # Python floats: with Python-float hparams, float32 weights take the same steps as there.
    t = tf.cast(step, tf.float64)
    b1, b2 = _constant(beta_1, tf.float64), _constant(beta_2, tf.float64)
    step_size = _constant(lr, tf.float64) / (1.0 - tf.math.pow(b1, t))
    bias_2_sqrt = tf.math.sqrt(1.0 - tf.math.pow(b2, t))

    def update(w, m, v, g):
      if g is None:
        return w, m, v
      cast = lambda x: tf.cast(x, w.dtype)  # noqa: E731
      m = m + (g - m) * cast(1.0 - b1)   # torch: exp_avg.lerp_(grad, 1 - beta1)
      v = v * cast(b2) + cast(1.0 - b2) * (g * g)
      denominator = tf.math.sqrt(v) / cast(bias_2_sqrt) + _constant(epsilon, w.dtype)
      return w - cast(step_size) * (m / denominator), m, v

    leaves = [tf.nest.flatten(x) for x in
              (weights, state[_ACCUMULATOR_KEY], state[_PRECONDITIONER_KEY], gradients)]
    updated = [update(*leaf) for leaf in zip(*leaves)]
    new_weights, accumulator, preconditioner = (
        tf.nest.pack_sequence_as(weights, [u[i] for u in updated]) for i in range(3))
    new_state = collections.OrderedDict(
        ((k, state[k]) for k in _ADAM_HPARAMS_KEYS),
        **{_STEP_KEY: step, _ACCUMULATOR_KEY: accumulator, _PRECONDITIONER_KEY: preconditioner})
    return new_state, new_weights

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in _ADAM_HPARAMS_KEYS)

  def set_hparams(self, state, hparams):
    unknown = sorted(set(hparams) - set(_ADAM_HPARAMS_KEYS))
    if unknown:
      raise KeyError(f'build_torch_adam has no hparams {unknown}; it has '
                     f'{list(_ADAM_HPARAMS_KEYS)}')
    updated = collections.OrderedDict(state)
    updated.update(hparams)
    return updated


def build_torch_adam(learning_rate: float, beta_1: float = 0.9, beta_2: float = 0.999,
                     epsilon: float = 1e-8) -> tff.learning.optimizers.Optimizer:
  """`torch.optim.Adam(lr=learning_rate, betas=(beta_1, beta_2), eps=epsilon)` (its defaults).

  With step `t`, gradient `g`, weights `w`:

  ```
  m = beta_1 * m + (1 - beta_1) * g
  v = beta_2 * v + (1 - beta_2) * g**2
  w = w - learning_rate / (1 - beta_1**t) * m / (sqrt(v) / sqrt(1 - beta_2**t) + epsilon)
  ```

  (TFF's `build_adam` has `sqrt(v) + epsilon` in the denominator, see the module docstring.)
  Weight decay is `with_weight_decay(build_torch_adam(...), weight_decay)`.

  Args:
    learning_rate: the step size (>= 0); the hparam 'learning_rate', as TFF's Adam.
    beta_1: decay of the first moment, in [0, 1).
    beta_2: decay of the second moment, in [0, 1).
    epsilon: added to the bias-corrected sqrt(v) (>= 0).

  Returns:
    A `tff.learning.optimizers.Optimizer` with hparams learning_rate, beta_1, beta_2, epsilon
    and TFF's Adam's state layout (step, accumulator m, preconditioner v).

  Raises:
    ValueError: for an argument out of its range (tensors traced in a computation are not
      checked).
  """
  return _TorchAdam(learning_rate, beta_1, beta_2, epsilon)


class _WeightDecay(tff.learning.optimizers.Optimizer):
  """`optimizer` on gradients plus `weight_decay * weights` (see the module docstring)."""

  def __init__(self, optimizer: tff.learning.optimizers.Optimizer, weight_decay: float):
    self._optimizer = optimizer
    self._weight_decay = weight_decay

  def initialize(self, specs):
    return collections.OrderedDict(
        optimizer=self._optimizer.initialize(specs),
        **{WEIGHT_DECAY_KEY: self._weight_decay})

  def next(self, state, weights, gradients):
    decay = state[WEIGHT_DECAY_KEY]
    decayed = tf.nest.map_structure(
        lambda g, w: g + tf.cast(decay, g.dtype) * w, gradients, weights)
    inner, updated = self._optimizer.next(state['optimizer'], weights, decayed)
    return collections.OrderedDict(optimizer=inner, **{WEIGHT_DECAY_KEY: decay}), updated

  def get_hparams(self, state):
    # Flat, so the wrapped optimizer's learning rate stays where TFF's hparams API looks.
    return collections.OrderedDict(self._optimizer.get_hparams(state['optimizer']),
                                   **{WEIGHT_DECAY_KEY: state[WEIGHT_DECAY_KEY]})

  def set_hparams(self, state, hparams):
    inner = collections.OrderedDict((k, v) for k, v in hparams.items() if k != WEIGHT_DECAY_KEY)
    return collections.OrderedDict(
        optimizer=self._optimizer.set_hparams(state['optimizer'], inner),
        **{WEIGHT_DECAY_KEY: hparams[WEIGHT_DECAY_KEY]})


def with_weight_decay(optimizer: tff.learning.optimizers.Optimizer,
                      weight_decay: float) -> tff.learning.optimizers.Optimizer:
  """`optimizer` with coupled (L2) weight decay, as PyTorch's `weight_decay` argument.

  Args:
    optimizer: a `tff.learning.optimizers.Optimizer`, e.g. `build_sgdm(learning_rate=1e-3)`.
    weight_decay: the L2 coefficient (>= 0); 0 returns `optimizer` unchanged.

  Returns:
    A `tff.learning.optimizers.Optimizer` whose hparams are the wrapped optimizer's plus
    `weight_decay`.
  """
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError('with_weight_decay wraps a tff.learning.optimizers.Optimizer, got '
                    f'{type(optimizer).__name__}')
  if isinstance(weight_decay, bool) or not weight_decay >= 0 or weight_decay == float('inf'):
    raise ValueError(f'weight_decay must be a finite number >= 0, got {weight_decay!r}')
  if weight_decay == 0:
    return optimizer
  return _WeightDecay(optimizer, float(weight_decay))
