"""Client work processes on the shared local-training path.

`build_model_delta_client_work` is FedAvg's / FedProx's / FedSGD's client side (and, with
`guided=True`, FedLEx's guided variant of each): a `tff.learning.templates.ClientWorkProcess`
that plugs into `compose_learning_process` beside TFF's stock distributor, aggregators and
finalizer.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.client_work import local_training

CLIENT_WEIGHTINGS = ('num_examples', 'uniform')


def model_weights_type(model_fn) -> tff.Type:
  """The `ModelWeights` type of a model_fn's model (built in a throwaway graph)."""
  with tf.Graph().as_default():
    model = model_fn()
    return tff.learning.models.weights_type_from_model(model)


def initial_model_weights_fn(model_fn) -> tff.Computation:
  """A no-arg TF computation returning the model_fn model's initial `ModelWeights`."""

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_weights


def model_input_spec(model_fn):
  with tf.Graph().as_default():
    return model_fn().input_spec


def sum_and_finalize_training_metrics(metric_sums_at_clients):
  """Federated sum of per-client metric sums, finalised on the server."""
  sums = tff.federated_sum(metric_sums_at_clients)
  sums_type = sums.type_signature.member

  @tff.tensorflow.computation(sums_type)
  def finalize(s):
    return local_training.finalize_training_metrics(s)

  return tff.federated_map(finalize, sums)


def build_model_delta_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer | None,
    client_batch_size: int,
    *,
    proximal_strength: float = 0.0,
    full_gradient: bool = False,
    client_weighting: str = 'num_examples',
    guided: bool = False,
) -> tff.learning.templates.ClientWorkProcess:
  """Local training that uploads the model delta (or FedSGD's mean gradient).

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` (None with full_gradient).
    client_batch_size: local batch size.
    proximal_strength: FedProx's mu (0 = FedAvg).
    full_gradient: FedSGD: upload the mean full-batch gradient at the received weights.
    client_weighting: 'num_examples' (FedAvg) or 'uniform'.
    guided: FedLEx: the process state is a guidance structure shaped like the trainable
      weights (initialised to ones), broadcast each round; every gradient is multiplied by
      it elementwise before the optimiser step (before upload for FedSGD).

  Returns:
    A `ClientWorkProcess` whose update is `initial - final` trainable weights (TFF's
    convention, applied by a server optimiser) and whose weight follows
    `client_weighting`; a client whose update is not finite is zeroed with weight 0 and
    counted in `train/non_finite_clients`.
  """
  if client_weighting not in CLIENT_WEIGHTINGS:
    raise ValueError(f'client_weighting must be one of {CLIENT_WEIGHTINGS}, got {client_weighting!r}')
  if proximal_strength < 0:
    raise ValueError(f'proximal_strength must be >= 0, got {proximal_strength}')
  weights_type = model_weights_type(model_fn)
  data_type = local_training.client_data_type(model_input_spec(model_fn))
  guidance_type = weights_type.trainable

  if guided:
    @tff.tensorflow.computation
    def initial_guidance():
      return [tf.ones(t.shape, t.dtype) for t in guidance_type]

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(initial_guidance, tff.SERVER)
  else:
    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)
  state_type = init_fn.type_signature.result.member

  def multiply_by_guidance(grads, guidance):
    return [g * m for g, m in zip(grads, guidance)]

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(guidance, initial_weights, dataset):
    model = model_fn()
    train = local_training.build_local_training(
        model, client_optimizer_fn, client_batch_size,
        proximal_strength=proximal_strength,
        full_gradient=full_gradient,
        gradient_transform=multiply_by_guidance if guided else None)
    element = local_training.single_element(dataset)
    context = list(guidance) if guided else None
    out = train(initial_weights, element, context)
    if full_gradient:
      update = list(out.full_gradient)
      if guided:
        update = multiply_by_guidance(update, context)
    else:
      update = tf.nest.map_structure(tf.subtract, list(initial_weights.trainable),
                                     list(out.model_weights.trainable))
    update, non_finite = local_training.zero_if_non_finite(update)
    if client_weighting == 'uniform':
      weight = tf.constant(1.0)
    else:
      weight = out.num_examples
    weight = weight * (1.0 - non_finite)
    return (tff.learning.templates.ClientResult(update=update, update_weight=weight),
            local_training.training_metric_sums(out, non_finite))

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    state_at_clients = tff.federated_broadcast(state)
    results, metric_sums = tff.federated_map(
        client_update, (state_at_clients, weights, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(
        train=sum_and_finalize_training_metrics(metric_sums)))
    return tff.templates.MeasuredProcessOutput(state, results, measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)
