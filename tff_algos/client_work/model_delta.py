"""Client work processes on the shared local-training path.

`build_model_delta_client_work` is FedAvg's / FedProx's / FedSGD's client side (with
`keyed=True`, CADIS's): a `tff.learning.templates.ClientWorkProcess` that plugs into
`compose_learning_process` beside TFF's stock distributor, aggregators and finalizer. Its
plug-ins (FedLEx's guidance, CADIS's KD term) are one `plugins.ClientStages`, as in every
client work here.
"""

from __future__ import annotations

import collections
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.client_work import local_training
from tff_algos.client_work import plugins
from tff_algos.models import model_fns


def keyed_update_type(delta_type: tff.Type) -> tff.Type:
  """The update type of a keyed client work: OrderedDict(client_index=int32, delta=...)."""
  return tff.StructWithPythonType(
      [('client_index', tff.TensorType(np.int32)), ('delta', delta_type)],
      collections.OrderedDict)


def update_type(weights_type: tff.Type) -> tff.Type:
  """The (unkeyed) update of `build_model_delta_client_work` for a model of `weights_type`.

  The trainable delta (a list, TFF's FedAvg convention) when the model has no
  non-trainable weights; otherwise OrderedDict(trainable=<that>, non_trainable=<initial -
  final non-trainable weights>), so that the server averages BatchNorm statistics too
  (`build_update_finalizer` applies the mean) instead of leaving the global model with its
  initial statistics.
  """
  if not weights_type.non_trainable:
    return weights_type.trainable
  return tff.StructWithPythonType(
      [('trainable', weights_type.trainable), ('non_trainable', weights_type.non_trainable)],
      collections.OrderedDict)


def build_update_finalizer(
    server_optimizer_fn: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type) -> tff.learning.templates.FinalizerProcess:
  """The finalizer that applies a mean `update_type(weights_type)` to the global model.

  TFF's apply-optimizer finalizer when the model has only trainable weights; otherwise that
  finalizer on the trainable delta, plus the mean non-trainable delta subtracted from the
  global non-trainable weights: all clients start from the global statistics, so the result
  is their (weighted) mean after local training, what FedAvg does to every weight. Hparams
  are the inner finalizer's.
  """
  inner = tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer_fn,
                                                                 weights_type)
  if not weights_type.non_trainable:
    return inner
  delta_type = update_type(weights_type)

  @tff.tensorflow.computation(delta_type)
  def trainable_part(update):
    return update['trainable']

  @tff.tensorflow.computation(weights_type, delta_type)
  def apply_non_trainable(weights, update):
    return tff.learning.models.ModelWeights(
        trainable=list(weights.trainable),
        non_trainable=[w - d for w, d in zip(weights.non_trainable,
                                             update['non_trainable'])])

  @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(delta_type, tff.SERVER))
  def next_fn(state, weights, update):
    out = inner.next(state, weights, tff.federated_map(trainable_part, update))
    new_weights = tff.federated_map(apply_non_trainable, (out.result, update))
    return tff.templates.MeasuredProcessOutput(out.state, new_weights, out.measurements)

  return tff.learning.templates.FinalizerProcess(
      inner.initialize, next_fn, get_hparams_fn=inner.get_hparams,
      set_hparams_fn=inner.set_hparams)


def model_weights_type(model_fn) -> tff.Type:
  """The `ModelWeights` type of a model_fn's model (built in a throwaway graph)."""
  with tf.Graph().as_default():
    model = model_fns.check_variable_model(model_fn())
    return tff.learning.models.weights_type_from_model(model)


def initial_model_weights_fn(model_fn) -> tff.Computation:
  """A no-arg TF computation returning the model_fn model's initial `ModelWeights`."""

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_weights


def model_input_spec(model_fn):
  """The `input_spec` of the model `model_fn` builds (built in a throwaway graph)."""
  with tf.Graph().as_default():
    return model_fns.check_variable_model(model_fn()).input_spec


def model_metric_finalizers(model_fn) -> collections.OrderedDict:
  """The model's own metric finalizers (its Keras metrics; built in a throwaway graph)."""
  with tf.Graph().as_default():
    return model_fns.check_variable_model(model_fn()).metric_finalizers()


def sum_and_finalize_training_metrics(metric_sums_at_clients, model_metrics_at_clients=None,
                                      metric_finalizers=None):
  """Federated sum of per-client metric sums, finalised on the server.

  With `model_metrics_at_clients` (each client's `report_local_unfinalized_metrics`) and the
  model's `metric_finalizers`, the model's own metrics are summed and finalised as TFF's
  `sum_then_finalize` does and reported beside ours (e.g. `sparse_categorical_accuracy`,
  `num_batches`, a user's custom metric); where a name is in both, ours is kept.
  """
  sums = tff.federated_sum(metric_sums_at_clients)
  sums_type = sums.type_signature.member

  @tff.tensorflow.computation(sums_type)
  def finalize(s):
    return local_training.finalize_training_metrics(s)

  ours = tff.federated_map(finalize, sums)
  if model_metrics_at_clients is None or not metric_finalizers:
    return ours
  theirs = tff.learning.metrics.sum_then_finalize(
      metric_finalizers, model_metrics_at_clients.type_signature.member)(
          model_metrics_at_clients)

  @tff.tensorflow.computation(ours.type_signature.member, theirs.type_signature.member)
  def merge(own, model_metrics):
    merged = collections.OrderedDict(own)
    for name, value in model_metrics.items():
      merged.setdefault(name, value)
    return merged

  return tff.federated_map(merge, (ours, theirs))


class ClientWorkState(NamedTuple):
  """The state of our client works, as TFF's: the client optimizer's hyperparameters
  (`OrderedDict(learning_rate=..., ...)`, `()` without an optimizer), so
  `process.get_hparams(state)` / `set_hparams` read and change the client learning rate;
  with FedLEx guidance, `OrderedDict(guidance=[...], optimizer_hparams=<those>)` (no
  `optimizer_hparams` entry without an optimizer)."""
  init_fn: tff.Computation
  get_hparams_fn: Optional[tff.Computation]
  set_hparams_fn: Optional[tff.Computation]
  guided: bool
  has_hparams: bool

  def optimizer_hparams(self, state):
    """The optimizer hparams inside a client work state (for the client computation), or
    None when there are none (FedSGD)."""
    if not self.has_hparams:
      return None
    return state['optimizer_hparams'] if self.guided else state


def build_client_work_state(optimizer: Optional[tff.learning.optimizers.Optimizer],
                            guidance_type: Optional[tff.Type] = None) -> ClientWorkState:
  """init / get_hparams / set_hparams of a client work state (see `ClientWorkState`)."""
  if optimizer is None:
    hparams = ()
  else:  # as TFF's model_delta_client_work: hparams of a state for a whimsy spec
    hparams = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec((), tf.float32)))
  guided = guidance_type is not None

  if guided:
    @tff.tensorflow.computation
    def initial_state():
      state = collections.OrderedDict(
          guidance=[tf.ones(t.shape, t.dtype) for t in guidance_type])
      if hparams:  # no empty nested structure for FedLEx-SGD (no client optimizer)
        state['optimizer_hparams'] = hparams
      return state

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(initial_state, tff.SERVER)
  else:
    @tff.federated_computation
    def init_fn():  # as TFF's model_delta_client_work
      return tff.federated_value(hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member
  if not hparams:
    return ClientWorkState(init_fn, None, None, guided, False)
  hparams_type = state_type['optimizer_hparams'] if guided else state_type

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state['optimizer_hparams'] if guided else state

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    if not guided:
      return new_hparams
    return collections.OrderedDict(guidance=state['guidance'], optimizer_hparams=new_hparams)

  return ClientWorkState(init_fn, get_hparams_fn, set_hparams_fn, guided, True)


def build_client_work_process(work_state: ClientWorkState, client_update: tff.Computation,
                              metric_finalizers) -> tff.learning.templates.ClientWorkProcess:
  """The ClientWorkProcess that maps `client_update` over the clients.

  `client_update(state, received, data)` is a TF computation returning (ClientResult,
  `local_training.training_metric_sums`, the model's unfinalized metrics); every client
  gets the work state (`work_state`: the optimizer hparams, TFF's hparams API) by broadcast,
  and the round's `train` measurements are the summed and finalised metrics.
  """
  init_fn = work_state.init_fn
  received_type = client_update.type_signature.parameter[1]
  data_type = client_update.type_signature.parameter[2]

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(received_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, received, client_data):
    results, metric_sums, model_metrics = tff.federated_map(
        client_update, (tff.federated_broadcast(state), received, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(
        train=sum_and_finalize_training_metrics(metric_sums, model_metrics,
                                                metric_finalizers)))
    return tff.templates.MeasuredProcessOutput(state, results, measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn, get_hparams_fn=work_state.get_hparams_fn,
      set_hparams_fn=work_state.set_hparams_fn)


def build_model_delta_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer | None,
    client_batch_size: int,
    *,
    proximal_strength: float = 0.0,
    full_gradient: bool = False,
    client_weighting: str = 'num_examples',
    keyed: bool = False,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.ClientWorkProcess:
  """Local training that uploads the model delta (or FedSGD's mean gradient).

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` (None with full_gradient).
    client_batch_size: local batch size.
    proximal_strength: FedProx's mu (0 = FedAvg).
    full_gradient: FedSGD: upload the mean full-batch gradient at the received weights.
    client_weighting: 'num_examples' (FedAvg) or 'uniform'.
    keyed: upload `OrderedDict(client_index=int32, delta=<the update>)`, the client's index
      from its input travelling with its update (for aggregators with per-client state,
      e.g. `tff_algos.aggregators.clustered_aggregation`).
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term
      (`plugins.ClientStages`; default none); guided, the state holds G (`ClientWorkState`).

  Returns:
    A `ClientWorkProcess` whose update is `initial - final` trainable weights (TFF's
    convention, applied by a server optimiser; with non-trainable weights such as
    BatchNorm statistics, also their `initial - final`, see `update_type`), keyed when
    `keyed` (refused for models with non-trainable weights), and whose weight
    follows `client_weighting`; a client whose update is not finite is zeroed with weight
    0 and counted in `train/non_finite_clients`; one that does not report (`work` 0)
    uploads a zero update with weight 0, counted in `train/unreported_clients`.
  """
  model_fn = model_fns.as_model_fn(model_fn)
  local_training.check_client_training(client_optimizer_fn, client_batch_size,
                                       needs_optimizer=not full_gradient)
  if client_weighting not in constants.CLIENT_WEIGHTINGS:
    raise ValueError(f'client_weighting must be one of {constants.CLIENT_WEIGHTINGS}, got {client_weighting!r}')
  if proximal_strength < 0:
    raise ValueError(f'proximal_strength must be >= 0, got {proximal_strength}')
  stages = plugins.ClientStages.of(client_stages)
  stages.check_local_steps(full_gradient)
  weights_type = model_weights_type(model_fn)
  if keyed and weights_type.non_trainable:
    raise ValueError(
        'keyed=True (CADIS) uploads the trainable delta only, and this model has '
        f'{len(weights_type.non_trainable)} non-trainable weights (e.g. BatchNorm '
        'statistics) that would then keep their initial values in the global model; use a '
        'model without them (e.g. LayerNormalization or GroupNormalization instead of '
        'BatchNormalization)')
  with_non_trainable = bool(weights_type.non_trainable)
  data_type = local_training.client_data_type(model_input_spec(model_fn))
  work_state = build_client_work_state(
      None if full_gradient else client_optimizer_fn,
      stages.guidance_type(weights_type))
  state_type = work_state.init_fn.type_signature.result.member
  metric_finalizers = model_metric_finalizers(model_fn)

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(state, initial_weights, dataset):
    model = model_fn()
    element = local_training.single_element(dataset)
    hooks = stages.hooks(model, state, initial_weights, element, client_batch_size)
    train = local_training.build_local_training(
        model, client_optimizer_fn, client_batch_size,
        proximal_strength=proximal_strength,
        full_gradient=full_gradient,
        gradient_transform=hooks.gradient_transform,
        extra_loss=hooks.extra_loss)
    out = train(initial_weights, element, hooks.context,
                work_state.optimizer_hparams(state))
    if full_gradient:
      # The per-batch gradients were already multiplied by G inside the loop: G·g, once.
      update = list(out.full_gradient)
    else:
      update = tf.nest.map_structure(tf.subtract, list(initial_weights.trainable),
                                     list(out.model_weights.trainable))
    if with_non_trainable:  # see update_type
      update = collections.OrderedDict(
          trainable=update,
          non_trainable=tf.nest.map_structure(tf.subtract, list(initial_weights.non_trainable),
                                              list(out.model_weights.non_trainable)))
    update, non_finite = local_training.zero_if_non_finite(update)
    if client_weighting == 'uniform':
      weight = tf.constant(1.0)
    else:
      weight = out.num_examples
    weight = local_training.upload_weight(weight, out, non_finite)
    if keyed:
      update = collections.OrderedDict(client_index=element['index'], delta=update)
    return (tff.learning.templates.ClientResult(update=update, update_weight=weight),
            local_training.training_metric_sums(out, non_finite), out.model_metrics)

  return build_client_work_process(work_state, client_update, metric_finalizers)
