"""FedAvg with server-side clipping: the mean client update is clipped to a global L2 norm
of at most `clip_norm` before the server optimizer applies it.

  PYTHONPATH=examples/my_method python -m programs.train --dataset=digits \
      --algorithm=my_fl.fedclip:build_fedclip --method_kwargs='{"clip_norm": 0.5}'
"""

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import baselines
from tff_algos.client_work import model_delta


class ClippedOptimizer(tff.learning.optimizers.Optimizer):
  """`inner`, stepping with the update clipped to global norm `clip_norm`."""

  def __init__(self, inner, clip_norm):
    self._inner, self._clip_norm = inner, clip_norm

  def initialize(self, specs):
    return self._inner.initialize(specs)

  def next(self, state, weights, gradients):
    flat, _ = tf.clip_by_global_norm(tf.nest.flatten(gradients), self._clip_norm)
    return self._inner.next(state, weights, tf.nest.pack_sequence_as(gradients, flat))

  def get_hparams(self, state):
    return self._inner.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self._inner.set_hparams(state, hparams)


def build_fedclip(model_fn, client_optimizer_fn, client_batch_size,
                  server_optimizer_fn=None, *, clip_norm=1.0):
  """The program hands model_fn, the optimizers and --batch_size; clip_norm comes from
  --method_kwargs (a study: method_kwargs = {clip_norm = ...})."""
  if not clip_norm > 0:
    raise ValueError(f'clip_norm must be > 0, got {clip_norm}')
  server = server_optimizer_fn or tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  # The project's client work: whole-client inputs, local epochs, and `work` (faults).
  client_work = model_delta.build_model_delta_client_work(
      model_fn, client_optimizer_fn, client_batch_size)
  # Broadcast -> client work -> weighted mean -> our clipped server step (TFF's templates).
  return baselines.compose_with_client_work(
      model_fn, client_work, ClippedOptimizer(server, clip_norm))
