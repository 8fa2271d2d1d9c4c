"""Client optimizers the papers train with that `tff.learning.optimizers` lacks.

`with_weight_decay(optimizer, weight_decay)` is PyTorch's `weight_decay` argument of
`torch.optim.SGD` / `Adam` (what the FedCDA and FedLEx papers set): every step adds
`weight_decay * w` to the gradient before the wrapped optimizer sees it, i.e. an L2 term
`(weight_decay / 2) ||w||^2` added to the loss (coupled; not AdamW's decoupled decay, which
is `tff.learning.optimizers.build_adamw`). It wraps any `tff.learning.optimizers.Optimizer`,
so it works with every builder of this package and with TFF's own.
"""

from __future__ import annotations

import collections

import tensorflow as tf
import tensorflow_federated as tff

WEIGHT_DECAY_KEY = 'weight_decay'


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
