"""Client work that uploads the trained model itself, keyed by the client's index and slot.

FedCross (the slot says which middleware model the client trained) and FedCDA (the client
index says whose cache the model enters) aggregate whole models on the server, not deltas.
Each client uploads

    OrderedDict(client_index=int32, slot=int32, model=ModelWeights, last_epoch_loss=float32)

with weight = its example count. A client with no data, or one that does not report (its
input's `work` is 0), trains zero steps; a client whose training went non-finite uploads the
model it received, unchanged and finite, so no NaN reaches a server accumulator. All get
weight 0, which tells the aggregator to ignore the upload; the non-finite ones are counted in
`train/non_finite_clients`, the non-reporting ones in `train/unreported_clients`.

The plug-ins (FedLEx's guidance, CADIS's KD term with the received model as the teacher) are
one `plugins.ClientStages`, as in every client work here.
"""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.client_work import local_training, model_delta, plugins
from tff_algos.models import model_fns


def model_upload_type(weights_type: tff.Type) -> tff.Type:
  """The type of one client's upload for a model of `weights_type` (a ModelWeights type)."""
  return tff.StructWithPythonType(
      [('client_index', tff.TensorType(np.int32)), ('slot', tff.TensorType(np.int32)),
       ('model', weights_type), ('last_epoch_loss', tff.TensorType(np.float32))],
      collections.OrderedDict)


def build_model_upload_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    *,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.ClientWorkProcess:
  """Local training on the shared fast loop that uploads the trained model (see module doc).

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local steps.
    client_batch_size: local batch size.
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term
      (`plugins.ClientStages`; default none).

  Returns:
    A `ClientWorkProcess` whose state is the client optimizer's hparams (TFF's hparams API:
    `get_hparams` / `set_hparams` change the client learning rate; guided: beside the
    guidance, `model_delta.ClientWorkState`);
    `ClientResult(update=<upload>, update_weight=float32)`, measurements `train` (loss,
    accuracy, last_epoch_loss, num_examples, num_clients, non_finite_clients, and the
    model's own metrics).
  """
  model_fn = model_fns.as_model_fn(model_fn)
  local_training.check_client_training(client_optimizer_fn, client_batch_size)
  stages = plugins.ClientStages.of(client_stages)
  weights_type = model_delta.model_weights_type(model_fn)
  data_type = local_training.client_data_type(model_delta.model_input_spec(model_fn))

  work_state = model_delta.build_client_work_state(client_optimizer_fn,
                                                   stages.guidance_type(weights_type))
  state_type = work_state.init_fn.type_signature.result.member
  metric_finalizers = model_delta.model_metric_finalizers(model_fn)

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(state, initial_weights, dataset):
    model = model_fn()
    element = local_training.single_element(dataset)
    hooks = stages.hooks(model, state, initial_weights, element, client_batch_size)
    train = local_training.build_local_training(
        model, client_optimizer_fn, client_batch_size,
        gradient_transform=hooks.gradient_transform, extra_loss=hooks.extra_loss)
    out = train(initial_weights, element, hooks.context,
                work_state.optimizer_hparams(state))
    trained = tff.learning.models.ModelWeights(
        trainable=list(out.model_weights.trainable),
        non_trainable=list(out.model_weights.non_trainable))
    received = tff.learning.models.ModelWeights(
        trainable=list(initial_weights.trainable),
        non_trainable=list(initial_weights.non_trainable))
    _, non_finite = local_training.zero_if_non_finite(
        (trained, out.last_epoch_loss))
    failed = non_finite > 0.0
    model = tf.nest.map_structure(lambda r, t: tf.where(failed, r, t), received, trained)
    upload = collections.OrderedDict(
        client_index=element['index'],
        slot=element['slot'],
        model=model,
        last_epoch_loss=tf.where(failed, 0.0, out.last_epoch_loss))
    weight = local_training.upload_weight(out.num_examples, out, non_finite)
    return (tff.learning.templates.ClientResult(update=upload, update_weight=weight),
            local_training.training_metric_sums(out, non_finite), out.model_metrics)

  return model_delta.build_client_work_process(work_state, client_update, metric_finalizers)
