"""A client learning rate that decays by a constant factor every round, on any LearningProcess.

`with_client_lr_decay(process, decay)` is `process` whose `next` multiplies the client
learning rate held in its state (TFF's hparams API: `get_hparams(state)['client_work']
['learning_rate']`) by `decay` at the end of every round, inside the round's federated
computation. Round t (1-based) therefore trains its clients at `lr * decay**(t - 1)`, as a
PyTorch `ExponentialLR(gamma=decay)` stepped once a round does (the FedLEx reference code's
0.99 a round). The rate in use lives in the state, so:

* `process.get_hparams(state)` reports the rate the next round trains at;
* a checkpointed state resumes at exactly the rate it stopped at (nothing is recomputed
  from a round number outside the state, and nothing leaves TFF's runtime);
* the state's type is the wrapped process's: checkpoints, `ResidentProcess`, evaluation
  and `set_model_weights` work unchanged, on this package's processes and TFF's own.

The product is formed in the state's dtype (float32): after 200 rounds it differs from
`lr * decay**200` in float64 by a few parts in 1e6 at most.
"""

from __future__ import annotations

import math

import tensorflow as tf
import tensorflow_federated as tff

LEARNING_RATE = 'learning_rate'


def _has_client_learning_rate(hparams_type: tff.Type) -> bool:
  names = lambda t: set(dir(t)) if isinstance(t, tff.StructType) else set()  # noqa: E731
  return ('client_work' in names(hparams_type)
          and LEARNING_RATE in names(hparams_type['client_work']))


def with_client_lr_decay(process: tff.learning.templates.LearningProcess,
                         decay: float) -> tff.learning.templates.LearningProcess:
  """`process` with its client learning rate multiplied by `decay` after every round.

  Args:
    process: a `tff.learning.templates.LearningProcess` with `get_hparams` /
      `set_hparams` whose hparams hold `['client_work']['learning_rate']` (every builder of
      this package with local steps, and TFF's `build_weighted_fed_avg` and friends).
    decay: the factor per round, a finite number > 0; 1 returns `process` itself.

  Returns:
    A `LearningProcess` with the same state type, `initialize`, `get_model_weights`,
    `set_model_weights`, `get_hparams` and `set_hparams` as `process`.
  """
  if (isinstance(decay, bool) or not isinstance(decay, (int, float))
      or not math.isfinite(decay) or decay <= 0):
    raise ValueError(f'decay must be a finite number > 0, got {decay!r}')
  if not isinstance(process, tff.learning.templates.LearningProcess):
    raise TypeError('with_client_lr_decay wraps a tff.learning.templates.LearningProcess, '
                    f'got {type(process).__name__}')
  if process.get_hparams is None or process.set_hparams is None:
    raise ValueError('client learning-rate decay needs a process with get_hparams and '
                     'set_hparams (TFF\'s hparams API)')
  hparams_type = process.get_hparams.type_signature.result
  if not _has_client_learning_rate(hparams_type):
    raise ValueError(
        'client learning-rate decay needs a client optimizer with a learning rate in the '
        "process's hparams (get_hparams(state)['client_work']['learning_rate']); this "
        f'process\'s hparams are {hparams_type} (FedSGD and FedLEx-SGD take no local step, '
        'so no client rate)')
  if decay == 1:
    return process

  @tff.tensorflow.computation(hparams_type)
  def decayed(hparams):
    client = hparams['client_work']
    rate = client[LEARNING_RATE]
    new_client = type(client)(
        (name, rate * tf.cast(decay, rate.dtype) if name == LEARNING_RATE else value)
        for name, value in client.items())
    return type(hparams)((name, new_client if name == 'client_work' else value)
                         for name, value in hparams.items())

  state_type = process.initialize.type_signature.result
  data_type = process.next.type_signature.parameter[1]

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, client_data):
    out = process.next(state, client_data)
    hparams = tff.federated_map(process.get_hparams, out.state)
    new_state = tff.federated_map(process.set_hparams,
                                  (out.state, tff.federated_map(decayed, hparams)))
    return tff.learning.templates.LearningProcessOutput(new_state, out.metrics)

  return tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=process.get_hparams, set_hparams_fn=process.set_hparams)
