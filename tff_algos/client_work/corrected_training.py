"""SCAFFOLD's client side: local SGD corrected by control variates (Karimireddy et al. 2020,
Algorithm 1, option II), on the shared fast loop (docs/algorithms.md#scaffold, steps 1-2).

Each client receives OrderedDict(model=x, server_control=c, client_control=c_i), takes K_i
steps y <- y - eta_l (g + c - c_i) through the loop's `gradient_transform`, and uploads
OrderedDict(client_index, slot, model_delta=x - y_i, control_delta=c_i+ - c_i), eta_l read
from the client work's hparams each round. Weight 0 (no step, or a non-finite update) leaves
the client out. Only plain SGD is accepted (`check_plain_sgd`): with momentum the model moves
about 1/(1 - beta) times what the gradients say and option II's c_i+ drifts. With guidance
the step is y <- y - eta_l (G*g + c - c_i): guiding the corrected direction instead would
make c_i+ = G*mean(g) + (1 - G)(c_i - c), no client's mean gradient.
"""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos import optimizers
from tff_algos.client_work import local_training, model_delta, plugins
from tff_algos.models import model_fns

# The hparams of plain SGD (`tff.learning.optimizers.build_sgdm` without momentum), with or
# without coupled weight decay: the optimizers option II's formula holds for.
PLAIN_SGD_HPARAMS = ('learning_rate', optimizers.WEIGHT_DECAY_KEY)


def check_plain_sgd(optimizer: tff.learning.optimizers.Optimizer) -> float:
  """The learning rate of `optimizer` if it is plain SGD (see the module doc), else one
  ValueError saying why and what to pass instead."""
  hparams = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec((), tf.float32)))
  others = sorted(set(hparams) - set(PLAIN_SGD_HPARAMS))
  if 'learning_rate' not in hparams or others:
    raise ValueError(
        'SCAFFOLD needs a plain SGD client optimizer (tff.learning.optimizers.build_sgdm('
        f'learning_rate=...) without momentum); got one with hparams {sorted(hparams)}: '
        'option II\'s control variate (x - y_i) / (K_i * lr) is the mean gradient of the local '
        'steps only under plain SGD (with momentum beta it is about 1/(1 - beta) times that, '
        'and Adam has no single rate)')
  return float(hparams['learning_rate'])


def received_type(weights_type: tff.Type) -> tff.Type:
  """What a client receives for a model of `weights_type` (a ModelWeights type)."""
  return tff.StructWithPythonType(
      [('model', weights_type), ('server_control', weights_type.trainable),
       ('client_control', weights_type.trainable)], collections.OrderedDict)


def upload_type(weights_type: tff.Type) -> tff.Type:
  """What a client uploads for a model of `weights_type` (see the module doc)."""
  return tff.StructWithPythonType(
      [('client_index', tff.TensorType(np.int32)), ('slot', tff.TensorType(np.int32)),
       ('model_delta', model_delta.update_type(weights_type)),
       ('control_delta', weights_type.trainable)], collections.OrderedDict)


def build_corrected_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    *,
    client_weighting: str = 'uniform',
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.ClientWorkProcess:
  """SCAFFOLD's client work (see the module doc).

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: plain SGD, `tff.learning.optimizers.build_sgdm(learning_rate=...)`
      (optionally with `tff_algos.optimizers.with_weight_decay`); anything else is refused.
    client_batch_size: local batch size.
    client_weighting: 'uniform' (the paper) or 'num_examples': the upload's weight.
    client_stages: the plug-ins, FedLEx's guidance (applied before the correction, module
      doc) and CADIS's KD term (`plugins.ClientStages`; default none).

  Returns:
    A `ClientWorkProcess` whose state is the client optimizer's hparams (TFF's hparams API),
    whose `next(state, received@CLIENTS, data@CLIENTS)` takes `received_type` values, and
    whose `ClientResult(update=<upload_type>, update_weight=float32)`; measurements `train`
    (loss, accuracy, last_epoch_loss, num_examples, num_clients, non_finite_clients, costs
    and the model's own metrics).
  """
  model_fn = model_fns.as_model_fn(model_fn)
  local_training.check_client_training(client_optimizer_fn, client_batch_size)
  check_plain_sgd(client_optimizer_fn)
  if client_weighting not in constants.CLIENT_WEIGHTINGS:
    raise ValueError(f'client_weighting must be one of {constants.CLIENT_WEIGHTINGS}, '
                     f'got {client_weighting!r}')
  stages = plugins.ClientStages.of(client_stages)
  weights_type = model_delta.model_weights_type(model_fn)
  with_non_trainable = bool(weights_type.non_trainable)
  data_type = local_training.client_data_type(model_delta.model_input_spec(model_fn))
  work_state = model_delta.build_client_work_state(client_optimizer_fn,
                                                   stages.guidance_type(weights_type))
  state_type = work_state.init_fn.type_signature.result.member
  metric_finalizers = model_delta.model_metric_finalizers(model_fn)

  def corrected(grads, context):
    return [g + d for g, d in zip(grads, context['correction'])]

  @tff.tensorflow.computation(state_type, received_type(weights_type), data_type)
  def client_update(state, received, dataset):
    element = local_training.single_element(dataset)
    initial = received['model']
    server_control = list(received['server_control'])
    # c - c_i: the same every step of this round.
    correction = [c - ci for c, ci in zip(server_control, received['client_control'])]
    model = model_fn()
    hooks = stages.hooks(model, state, initial, element, client_batch_size,
                         context=collections.OrderedDict(correction=correction),
                         gradient_transform=corrected)
    train = local_training.build_local_training(
        model, client_optimizer_fn, client_batch_size,
        gradient_transform=hooks.gradient_transform, extra_loss=hooks.extra_loss)
    hparams = work_state.optimizer_hparams(state)
    out = train(initial, element, hooks.context, hparams)
    delta = [w0 - w for w0, w in zip(initial.trainable, out.model_weights.trainable)]
    # Option II: c_i+ - c_i = (x - y_i) / (K_i * eta_l) - c.
    steps_times_lr = out.steps_trained * tf.cast(hparams['learning_rate'], tf.float32)
    control_delta = [tf.math.divide_no_nan(d, steps_times_lr) - c
                     for d, c in zip(delta, server_control)]
    update = delta
    if with_non_trainable:  # model_delta.update_type
      update = collections.OrderedDict(
          trainable=delta,
          non_trainable=[w0 - w for w0, w in zip(initial.non_trainable,
                                                 out.model_weights.non_trainable)])
    (update, control_delta), non_finite = local_training.zero_if_non_finite(
        (update, control_delta))
    weight = tf.constant(1.0) if client_weighting == 'uniform' else out.num_examples
    trained = tf.cast(out.steps_trained > 0.0, tf.float32)
    upload = collections.OrderedDict(client_index=element['index'], slot=element['slot'],
                                     model_delta=update, control_delta=control_delta)
    return (tff.learning.templates.ClientResult(
        update=upload, update_weight=local_training.upload_weight(weight * trained, out,
                                                                  non_finite)),
            local_training.training_metric_sums(out, non_finite), out.model_metrics)

  return model_delta.build_client_work_process(work_state, client_update, metric_finalizers)
