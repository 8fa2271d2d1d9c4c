"""The parts every hand-written `LearningProcess` of this package shares.

FedCross and SCAFFOLD write their own `next` (a per-client `tff.federated_select` needs the
clients' data, which `compose_learning_process`'s distributor never sees); everything else
follows `compose_learning_process`: a `LearningAlgorithmState` whose `global_model_weights`
`get_model_weights` returns, and hparams keyed `client_work` / `finalizer` (TFF's hparams
API), so code written for TFF's processes finds them in both.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional

import tensorflow_federated as tff


def build_learning_process(
    init_fn: tff.Computation,
    next_fn: tff.Computation,
    client_work: tff.learning.templates.ClientWorkProcess,
    finalizer: Optional[tff.learning.templates.FinalizerProcess] = None,
    aggregator_with_weights: Optional[Callable[[Any, Any], Any]] = None,
) -> tff.learning.templates.LearningProcess:
  """A LearningProcess from `init_fn` / `next_fn` over a `LearningAlgorithmState`.

  Args:
    init_fn: a federated computation returning the state @SERVER.
    next_fn: (state@SERVER, client data@CLIENTS) -> `LearningProcessOutput`.
    client_work: the process's client work; its hparams are `get_hparams()['client_work']`.
    finalizer: the process's finalizer (its hparams are `['finalizer']`), or None for a
      process without one (empty finalizer hparams; `state.finalizer` is kept as it is).
    aggregator_with_weights: (aggregator state, model weights) -> the aggregator state that
      `set_model_weights` leaves (a TF function; FedCross sets its K models to the weights);
      None keeps the aggregator state.

  Returns:
    `tff.learning.templates.LearningProcess(init_fn, next_fn, get_model_weights,
    set_model_weights, get_hparams, set_hparams)`.
  """
  state_type = init_fn.type_signature.result.member
  weights_type = state_type.global_model_weights

  def with_parts(state, **parts):
    fields = collections.OrderedDict(
        (name, getattr(state, name)) for name in (
            'global_model_weights', 'distributor', 'client_work', 'aggregator', 'finalizer'))
    fields.update(parts)
    return tff.learning.templates.LearningAlgorithmState(**fields)

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    aggregator = (state.aggregator if aggregator_with_weights is None
                  else aggregator_with_weights(state.aggregator, weights))
    return with_parts(state, global_model_weights=weights, aggregator=aggregator)

  @tff.tensorflow.computation(state_type)
  def get_hparams(state):
    return collections.OrderedDict(
        client_work=client_work.get_hparams(state.client_work),
        finalizer=(collections.OrderedDict() if finalizer is None
                   else finalizer.get_hparams(state.finalizer)))

  @tff.tensorflow.computation(state_type, get_hparams.type_signature.result)
  def set_hparams(state, hparams):
    new_finalizer = (state.finalizer if finalizer is None
                     else finalizer.set_hparams(state.finalizer, hparams['finalizer']))
    return with_parts(
        state, client_work=client_work.set_hparams(state.client_work, hparams['client_work']),
        finalizer=new_finalizer)

  return tff.learning.templates.LearningProcess(
      init_fn, next_fn, get_model_weights, set_model_weights, get_hparams_fn=get_hparams,
      set_hparams_fn=set_hparams)
