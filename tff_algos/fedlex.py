"""FedLEx: federated loss exploration, its exploration phase and the guided base algorithms.

"Federated Loss Exploration for Improved Convergence on Non-IID Data", IJCNN 2024. The rule,
its defaults and options: docs/algorithms.md#fedlex.

`build_fedlex_exploration` is a `tff.federated_computation` running the exploration on the
explorer clients it is given and returning the guidance matrix G and the cost in
client-epochs; `build_fedlex(base='avgm'|'sgd'|'opt'|'prox')` is the base of
`tff_algos.baselines` with `client_stages=ClientStages(guided=True)` (the plug-in of
`tff_algos.client_work.plugins`, which every builder takes). G lives in `state.client_work`, all ones at first (bit for bit
the unguided base); `set_guidance`, `explore_and_initialize` and `refresh_guidance` install
an explored one, so `tff.program` checkpoints it with the model. Early stopping
(`exploration_patience`) runs one epoch at a time, the explorer's optimizer state running on
across its epochs. `placeholder_guidance` and `explore_in_place` are diagnosis options: what
the authors' code does, not what the paper says.
"""

from __future__ import annotations

import collections
import collections.abc
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos import baselines
from tff_algos.client_work import local_training
from tff_algos.client_work import model_delta
from tff_algos.client_work import plugins
from tff_algos.models import model_fns

BASES = ('avgm', 'sgd', 'opt', 'prox')


# ------------------------------------------------------------------------------------------
# Pure TF pieces (usable inside TFF computations; tested against numpy).
# ------------------------------------------------------------------------------------------


def deviations(initial_trainable, final_trainable) -> list:
  """D = (w_0 - w_final)^2, elementwise, for every tensor."""
  return [tf.square(tf.cast(a, tf.float32) - tf.cast(b, tf.float32))
          for a, b in zip(initial_trainable, final_trainable)]


def normalize_tensor(t: tf.Tensor) -> tf.Tensor:
  """Min-max normalisation of one tensor to [0, 1]; ones when max == min (or empty)."""
  t = tf.convert_to_tensor(t)
  if t.shape.num_elements() == 0:
    return tf.ones_like(t)
  lo = tf.reduce_min(t)
  hi = tf.reduce_max(t)
  span = hi - lo
  has_span = span > 0
  scaled = (t - lo) / tf.where(has_span, span, tf.ones_like(span))
  return tf.where(has_span, scaled, tf.ones_like(t))


def normalize_deviations(deviation_tensors) -> list:
  """Per-tensor min-max normalisation of a list of deviation tensors."""
  return [normalize_tensor(d) for d in deviation_tensors]


def apply_floor(guidance, floor: float) -> list:
  """max(G, floor) elementwise."""
  if floor == 0.0:
    return list(guidance)
  return [tf.maximum(g, tf.cast(floor, g.dtype)) for g in guidance]


def global_guidance_matrix(client_deviations: Sequence[Sequence[Any]],
                           normalize: str = 'per_client',
                           floor: float = 0.0) -> list:
  """G from a list (over explorers) of deviation lists (over tensors), in plain TF.

  The reference formula the federated computation implements (there split between
  clients and server): uniform mean over explorers, normalisation per `normalize`,
  then the floor.
  """
  _check_normalize(normalize)
  _check_floor(floor)
  if not client_deviations:
    raise ValueError('at least one explorer deviation is needed')
  per_client = [[tf.convert_to_tensor(d, tf.float32) for d in devs]
                for devs in client_deviations]
  if normalize == 'per_client':
    per_client = [normalize_deviations(devs) for devs in per_client]
  mean = [tf.add_n(list(ts)) / float(len(per_client)) for ts in zip(*per_client)]
  if normalize == 'after_mean':
    mean = normalize_deviations(mean)
  return apply_floor(mean, floor)


def _check_normalize(normalize):
  if normalize not in constants.FEDLEX_NORMALIZATIONS:
    raise ValueError(f'normalize must be one of {constants.FEDLEX_NORMALIZATIONS}, '
                     f'got {normalize!r}')


def _check_floor(floor):
  if not 0.0 <= float(floor) <= 1.0:
    raise ValueError(f'guidance_floor must be in [0, 1], got {floor}')


# ------------------------------------------------------------------------------------------
# Exploration phase.
# ------------------------------------------------------------------------------------------


def _explore_fn(train, optimizer, batch_size: int, patience: Optional[int]):
  """(final ModelWeights, epochs run as float32, reported as float32) for one explorer, as
  a tf.function. With patience it trains one epoch per `train` call, handing each call the
  optimizer state the previous one ended with: one continuous optimizer (Adam's moments and
  step count), as the same epochs in one call. A straggling explorer (`work` < 1) runs the
  same ceil(work x K) steps either way, its last epoch partial."""

  @tf.function
  def explore(initial_weights, element):
    order = element['order']
    total = tf.shape(order)[0]
    if patience is None:
      out = train(initial_weights, element)
      return out.model_weights, out.epochs_trained, out.reported

    weights = tff.learning.models.ModelWeights(
        trainable=[tf.identity(t) for t in initial_weights.trainable],
        non_trainable=[tf.identity(t) for t in initial_weights.non_trainable])
    opt_state = optimizer.initialize(
        tuple(tf.TensorSpec(t.shape, t.dtype) for t in weights.trainable))
    batches_per_epoch = (tf.shape(order)[1] + batch_size - 1) // batch_size
    budget = local_training.work_share(element['work'], total * batches_per_epoch)
    best = tf.constant(np.inf, tf.float32)
    since_best = tf.constant(0)
    epoch = tf.constant(0)
    epochs_run = tf.constant(0.0)
    while epoch < total and since_best < patience and epoch * batches_per_epoch < budget:
      one_epoch = collections.OrderedDict(element)
      one_epoch['order'] = order[epoch:epoch + 1]
      one_epoch['work'] = tf.constant(1.0)   # the budget's rest, by max_steps
      out = train(weights, one_epoch, optimizer_state=opt_state,
                  max_steps=budget - epoch * batches_per_epoch)
      epochs_run += out.epochs_trained
      opt_state = out.optimizer_state
      weights = tff.learning.models.ModelWeights(
          trainable=list(out.model_weights.trainable),
          non_trainable=list(out.model_weights.non_trainable))
      loss = out.last_epoch_loss
      improved = loss < best
      best = tf.where(improved, loss, best)
      since_best = tf.where(improved, 0, since_best + 1)
      epoch += 1
    return weights, epochs_run, tf.cast(element['work'] > 0.0, tf.float32)

  return explore


def build_fedlex_exploration(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    *,
    normalize: str = 'per_client',
    guidance_floor: float = 0.0,
    exploration_patience: Optional[int] = None,
) -> tff.Computation:
  """The FedLEx exploration phase as a federated computation.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for the explorers' local steps.
    client_batch_size: local batch size.
    normalize: 'per_client' (paper, default) or 'after_mean' (reference code).
    guidance_floor: lower bound of every guidance entry, in [0, 1] (0 = paper).
    exploration_patience: None (run every epoch in `order`) or a positive int: stop an
      explorer once its epoch loss has not improved for that many epochs.

  Returns:
    A `tff.federated_computation` (initial ModelWeights@SERVER, explorer inputs@CLIENTS)
    -> OrderedDict(guidance=<list shaped like the trainable weights>, client_epochs=float32,
    finite_explorers=float32, reported_explorers=float32, final_weights=<ModelWeights: the
    reporting finite explorers' mean; with one explorer, its weights at the stop>)@SERVER.
    The explorer inputs are the project's client inputs (one-element sequences,
    `data.client_input`) whose `order` has shape [exploration_epochs, n]; an explorer's
    `work` cuts its training as any client's (`local_training`), and client_epochs counts
    the epochs run (a partial one by its share of batches). An explorer whose deviation is
    not finite (diverged training) is left out of the mean (its epochs still count), and so
    is one that does not report (work 0: it adds nothing to G); with none left, G is all
    ones (no guidance) and final_weights is NaN.
  """
  _check_normalize(normalize)
  _check_floor(guidance_floor)
  if exploration_patience is not None:
    if isinstance(exploration_patience, bool) or int(exploration_patience) != \
        exploration_patience or exploration_patience < 1:
      raise ValueError(
          f'exploration_patience must be None or a positive int, got {exploration_patience!r}')
    exploration_patience = int(exploration_patience)
  guidance_floor = float(guidance_floor)

  model_fn = model_fns.as_model_fn(model_fn)
  weights_type = model_delta.model_weights_type(model_fn)
  data_type = local_training.client_data_type(model_delta.model_input_spec(model_fn))

  @tff.tensorflow.computation(weights_type, data_type)
  def client_explore(initial_weights, dataset):
    model = model_fn()
    train = local_training.build_local_training(model, client_optimizer_fn,
                                                client_batch_size)
    explore = _explore_fn(train, client_optimizer_fn, client_batch_size,
                          exploration_patience)
    element = local_training.single_element(dataset)
    final_weights, epochs, reported = explore(initial_weights, element)
    devs = deviations(initial_weights.trainable, final_weights.trainable)
    devs, non_finite = local_training.zero_if_non_finite(devs)
    if normalize == 'per_client':
      devs = normalize_deviations(devs)
    return devs, 1.0 - non_finite, epochs, final_weights, reported

  deviation_type = client_explore.type_signature.result[0]

  @tff.tensorflow.computation(np.float32, np.float32)
  def times(a, b):
    return a * b

  @tff.tensorflow.computation(deviation_type)
  def server_finish(mean_deviation):
    guidance = list(mean_deviation)
    if normalize == 'after_mean':
      guidance = normalize_deviations(guidance)
    # No finite explorer at all (0/0 mean): no guidance, i.e. ones.
    guidance = [tf.where(tf.math.is_finite(g), g, tf.ones_like(g)) for g in guidance]
    return apply_floor(guidance, guidance_floor)

  @tff.federated_computation(tff.FederatedType(weights_type, tff.SERVER),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def exploration(initial_weights, explorer_data):
    weights_at_clients = tff.federated_broadcast(initial_weights)
    devs, finite, epochs, final_weights, reported = tff.federated_map(
        client_explore, (weights_at_clients, explorer_data))
    kept = tff.federated_map(times, (finite, reported))
    guidance = tff.federated_map(server_finish, tff.federated_mean(devs, kept))
    return tff.federated_zip(collections.OrderedDict(
        guidance=guidance, client_epochs=tff.federated_sum(epochs),
        finite_explorers=tff.federated_sum(finite),
        reported_explorers=tff.federated_sum(reported),
        final_weights=tff.federated_mean(final_weights, kept)))

  return exploration


# ------------------------------------------------------------------------------------------
# Guided learning processes.
# ------------------------------------------------------------------------------------------


def build_fedlex(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: Optional[tff.learning.optimizers.Optimizer],
    client_batch_size: int,
    base: str = 'avgm',
    *,
    client_stages: plugins.ClientStages = plugins.ClientStages(guided=True),
    **base_kwargs,
) -> tff.learning.templates.LearningProcess:
  """FedLEx on a base algorithm: FedLExAvgM / FedLExSgd / FedLExOpt / FedLExProx.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: the client optimiser (ignored, may be None, for base='sgd').
    client_batch_size: local batch size (for 'sgd' it only bounds memory).
    base: 'avgm' (`baselines.build_fedavgm`: server SGD lr 1.0 momentum 0.9), 'sgd'
      (`build_fedsgd`), 'opt' (`build_fedadam`: server Adam), 'prox' (`build_fedprox`;
      G multiplies the whole gradient of its local objective, so the step is
      lr G (g + mu (w - w_t)): the proximal pull is guided too).
    client_stages: the plug-ins (`tff_algos.ClientStages`); default FedLEx's guidance
      alone, `ClientStages(guided=True)`; unguided, the plain base (same builder, no
      guidance state), for baselines.
    **base_kwargs: passed to the base builder (server_learning_rate, server_momentum,
      proximal_strength, server_optimizer_fn, client_weighting, model_aggregator, ...).

  Returns:
    A `LearningProcess`; when guided, `state.client_work['guidance']` is the guidance (all ones after
    `initialize`, i.e. exactly the base) -- see `set_guidance`, `explore_and_initialize`.
  """
  if base not in BASES:
    raise ValueError(f'base must be one of {BASES}, got {base!r}')
  if base == 'sgd':
    return baselines.build_fedsgd(model_fn, client_batch_size=client_batch_size,
                                  client_stages=client_stages, **base_kwargs)
  builder = dict(avgm=baselines.build_fedavgm, opt=baselines.build_fedadam,
                 prox=baselines.build_fedprox)[base]
  return builder(model_fn, client_optimizer_fn, client_batch_size,
                 client_stages=client_stages, **base_kwargs)


def _guidance_of(state) -> list:
  work = state.client_work
  if not isinstance(work, collections.abc.Mapping) or 'guidance' not in work:
    raise ValueError('state carries no guidance: build the process with '
                     'client_stages=ClientStages(guided=True) (build_fedlex\'s default, or '
                     'any builder)')
  return list(work['guidance'])


def get_guidance(state) -> list:
  """The guidance matrix held by a FedLEx process state (list of arrays); the client work
  state is `OrderedDict(guidance, optimizer_hparams)` (`model_delta.ClientWorkState`)."""
  return _guidance_of(state)


def set_guidance(process: tff.learning.templates.LearningProcess, state, guidance):
  """A copy of a FedLEx `process` state whose guidance is `guidance` (a list like the
  trainable weights, e.g. the exploration's `guidance` output). Shapes are checked."""
  del process  # the state carries everything needed; kept for a uniform signature
  current = _guidance_of(state)
  guidance = [np.asarray(g, dtype=np.asarray(c).dtype) for g, c in
              zip(guidance, current)] if len(guidance) == len(current) else None
  if guidance is None or any(g.shape != np.shape(c) for g, c in zip(guidance, current)):
    raise ValueError('guidance must match the trainable weights: shapes '
                     f'{[np.shape(c) for c in current]}')
  return state._replace(client_work=collections.OrderedDict(
      state.client_work, guidance=guidance))


def guidance_statistics(guidance) -> collections.OrderedDict:
  """Python floats summarising a guidance matrix (for metrics)."""
  flat = np.concatenate([np.asarray(g, np.float64).ravel() for g in guidance])
  return collections.OrderedDict(
      guidance_mean=float(flat.mean()), guidance_min=float(flat.min()),
      guidance_max=float(flat.max()), guidance_median=float(np.median(flat)),
      guidance_zero_fraction=float(np.mean(flat == 0.0)),
      # G multiplies every gradient: the share far below 1 says how much it slows training.
      # Compared in each tensor's dtype: a G floored at 0.01 holds float32(0.01), not below.
      guidance_below_0_01=float(np.mean(np.concatenate(
          [(np.asarray(g) < np.asarray(0.01, np.asarray(g).dtype)).ravel()
           for g in guidance]))))


def explore_and_initialize(process: tff.learning.templates.LearningProcess,
                           exploration: tff.Computation,
                           explorer_inputs: Sequence[Any],
                           initial_state=None):
  """Runs the exploration from the state's global model and installs its guidance.

  Args:
    process: a guided process from `build_fedlex`.
    exploration: the computation from `build_fedlex_exploration` (same model_fn).
    explorer_inputs: the explorers' client inputs (each a one-element sequence, i.e. a list
      holding one `data.client_input` structure; a bare structure is wrapped).
    initial_state: defaults to `process.initialize()`.

  Returns:
    (state with the guidance, OrderedDict of exploration metrics: exploration_client_epochs,
    num_explorers and `guidance_statistics`).
  """
  if initial_state is None:
    initial_state = process.initialize()
  inputs = [x if isinstance(x, (list, tuple)) else [x] for x in explorer_inputs]
  if not inputs:
    raise ValueError('at least one explorer is needed')
  result = exploration(process.get_model_weights(initial_state), inputs)
  state = set_guidance(process, initial_state, result['guidance'])
  metrics = collections.OrderedDict(
      exploration_client_epochs=float(result['client_epochs']),
      num_explorers=len(inputs),
      finite_explorers=int(result['finite_explorers']),
      reported_explorers=int(result['reported_explorers']))
  metrics.update(guidance_statistics(result['guidance']))
  return state, metrics


def refresh_guidance(process: tff.learning.templates.LearningProcess,
                     exploration: tff.Computation,
                     state,
                     explorer_inputs: Sequence[Any]):
  """Refresh during training (paper section III-E), at program level.

  Call after a round with the inputs of the explorers that took part in it (pass an empty
  list to keep G). They re-explore from the current global model and G is recomputed from
  their fresh deviations only (the explorers absent from the round are not remembered:
  keeping every explorer's last deviation would need an [explorers, D] server store).
  The extra cost is reported as `exploration_client_epochs` like the initial exploration.

  Returns (state, metrics); with no explorers the state is returned unchanged and the
  metrics report 0 client-epochs.
  """
  inputs = list(explorer_inputs)
  if not inputs:
    metrics = collections.OrderedDict(exploration_client_epochs=0.0, num_explorers=0,
                                      finite_explorers=0, reported_explorers=0)
    metrics.update(guidance_statistics(get_guidance(state)))
    return state, metrics
  return explore_and_initialize(process, exploration, inputs, state)


# ------------------------------------------------------------------------------------------
# Diagnosis options: what the authors' code does, not what the paper says.
# ------------------------------------------------------------------------------------------


def placeholder_guidance(trainable, floor: float = 0.0) -> list:
  """G = minmax((1 - w)^2) per tensor, then the floor: the reference code's guidance at its
  HEAD (docs/algorithms.md#fedlex), where each explorer's "scout" is an all-ones placeholder.

  There the server's `create_mask` takes, per tensor, the mean over that round's
  participants' scouts of (scout - w_ref)^2 and min-max normalises it; every scout is ones,
  so the participants drop out and G = minmax((1 - w_ref)^2) every round. w_ref is the
  `tl_base` checkpoint, the global model the explorers trained in place, saved after the
  last explorer's first epoch (`explore_in_place` passes it); when nothing explores the
  program passes the model round 1 starts from. Its first mask is written after round 1's
  local training, so round 1 is unguided (the program installs G after round 1). A constant
  tensor normalises to ones here (the reference divides 0 by 0).
  """
  _check_floor(floor)
  guidance = [normalize_tensor(tf.square(1.0 - tf.cast(w, tf.float32))) for w in trainable]
  return [g.numpy() for g in apply_floor(guidance, float(floor))]


def explore_in_place(exploration: tff.Computation, initial_weights,
                     explorer_inputs: Sequence[Any], normalize: str = 'per_client',
                     floor: float = 0.0, guidance: str = 'exploration'):
  """The explorers train one global model in place, one after another, in the reference
  code's order (docs/algorithms.md#fedlex): its server hands its own model to every
  explorer, so explorer i starts from explorer i - 1's result and round 1 starts from the
  last one's.

  Each explorer first trains one epoch with a fresh optimizer (the reference's `tl_base`
  epoch; it saves that model as its `tl_base` checkpoint), then its exploration epochs with
  another fresh optimizer. Its input's `order` holds both: row 0 is the `tl_base` epoch, the
  rest the exploration epochs; its `work` cuts each of the two as any client's. `guidance`
  says which G is returned: 'exploration', `global_guidance_matrix` (with `normalize` and
  `floor`) of the deviations D_i = (tl_base_i - w_i)^2, each explorer's exploration epochs
  measured from its own `tl_base`; 'placeholder', `placeholder_guidance` of the last
  reporting explorer's `tl_base` (the checkpoint the reference's mask reads: each explorer
  overwrites it). An explorer that does not report (work 0) leaves the model as it found it
  and adds nothing.

  Returns (final ModelWeights, guidance list, OrderedDict(exploration_client_epochs, every
  epoch run including the `tl_base` ones, num_explorers, finite_explorers,
  reported_explorers)); with no explorer reporting, the initial weights and G all ones
  ('exploration') or the placeholder of the initial weights. Raises ValueError when an
  explorer diverges (its weights would be the run's) or an input has fewer than 2 epochs.
  """
  if guidance not in ('exploration', 'placeholder'):
    raise ValueError(f"guidance must be 'exploration' or 'placeholder', got {guidance!r}")
  explorer_inputs = [inp if isinstance(inp, (list, tuple)) else [inp]
                     for inp in explorer_inputs]
  if not explorer_inputs:
    raise ValueError('at least one explorer is needed')
  weights, reference = initial_weights, initial_weights
  devs, epochs = [], 0.0
  for [element] in explorer_inputs:
    if np.shape(element['order'])[0] < 2:
      raise ValueError('an explorer training in place needs its tl_base epoch and at least '
                       f"one exploration epoch in its order, got {np.shape(element['order'])[0]}")
    base, explore = (collections.OrderedDict(element, order=rows)
                     for rows in (element['order'][:1], element['order'][1:]))
    starts = []
    for part in (base, explore):   # each call: a fresh optimizer
      starts.append(weights)
      result = exploration(weights, [[part]])
      epochs += float(result['client_epochs'])
      if not float(result['reported_explorers']):
        break
      if not float(result['finite_explorers']):
        raise ValueError('an explorer training in place diverged (non-finite weights)')
      final = result['final_weights']
      weights = tff.learning.models.ModelWeights(trainable=list(final.trainable),
                                                 non_trainable=list(final.non_trainable))
    else:
      reference = starts[1]
      devs.append([np.square(np.asarray(a, np.float32) - np.asarray(b, np.float32))
                   for a, b in zip(reference.trainable, weights.trainable)])
  if guidance == 'placeholder':
    g = placeholder_guidance(reference.trainable, floor)
  elif devs:
    g = [t.numpy() for t in global_guidance_matrix(devs, normalize, floor)]
  else:  # none reported: the model as it was and no guidance, as `build_fedlex_exploration`
    g = [np.ones(np.shape(t), np.float32) for t in weights.trainable]
  metrics = collections.OrderedDict(exploration_client_epochs=epochs,
                                    num_explorers=len(explorer_inputs),
                                    finite_explorers=len(devs), reported_explorers=len(devs))
  return weights, g, metrics
