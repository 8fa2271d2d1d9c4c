"""The one fast local-training path every method trains its clients through.

Client input (what `tff_algos.data.client_input` builds): a TFF sequence holding ONE
element, a structure of whole-client tensors

    x      the client's features  [n, ...]
    y      its labels             [n] (or [n, T] for sequence models)
    order  int32 [E, n]: one permutation of range(n) per local epoch
    index  int32 scalar: the client's index in [0, N)
    slot   int32 scalar: its position in this round's sample, in [0, P)
    work   float32 scalar: 0 = the client never reports (it trains nothing, its upload
           weighs 0); else the share in (0, 1] of its local steps it runs
           (`tff_algos.data.ClientFaults`; 1 for a client that does all its work)

Batches are gathered in-graph from `order` inside one `tf.function` loop. Feeding
whole-client tensors instead of a `tf.data` pipeline of batches is what makes a round cost
about what a tight plain-TF loop costs (see benchmarks/round_overhead.py); wrapping them in a
one-element sequence keeps the data a `tff.SequenceType`, so TFF's own templates
(`ClientWorkProcess`, `compose_learning_process`) accept it. The number of epochs and the
batch order live in the data, so a resumed run replays them exactly.
"""

from __future__ import annotations

import collections
import collections.abc
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants


def input_xy_specs(model_input_spec) -> tuple:
  """(x spec, y spec) of a model's input_spec: a mapping with 'x' and 'y' or an (x, y)
  tuple/list of TensorSpecs (the two forms `from_keras_model` takes), else one TypeError."""
  if isinstance(model_input_spec, collections.abc.Mapping) and set(model_input_spec) == {
      'x', 'y'}:
    specs = (model_input_spec['x'], model_input_spec['y'])
  elif isinstance(model_input_spec, (tuple, list)) and len(model_input_spec) == 2:
    specs = tuple(model_input_spec)
  else:
    specs = ()
  if len(specs) != 2 or not all(isinstance(s, tf.TensorSpec) for s in specs):
    raise TypeError(
        'the model\'s input_spec must be OrderedDict(x=TensorSpec, y=TensorSpec) or a '
        f'(x, y) tuple of TensorSpecs (one input tensor, one label tensor); got '
        f'{model_input_spec}')
  return specs


def client_element_type(model_input_spec) -> tff.StructType:
  """The type of the one element of a client's input sequence, from a model's input_spec
  (either form of `input_xy_specs`; the element always names its parts x and y)."""
  x_spec, y_spec = input_xy_specs(model_input_spec)
  return tff.StructType([
      ('x', tff.TensorType(x_spec.dtype.as_numpy_dtype, x_spec.shape)),
      ('y', tff.TensorType(y_spec.dtype.as_numpy_dtype, y_spec.shape)),
  ] + [(name, tff.TensorType(np.dtype(dtype), shape))
       for name, dtype, shape in constants.CLIENT_INPUT_FIELDS])


def client_data_type(model_input_spec) -> tff.SequenceType:
  """The type of one client's data in `process.next`: a sequence of one element of
  `client_element_type` (the whole client at once: x, y, batch orders, index, slot, work)."""
  return tff.SequenceType(client_element_type(model_input_spec))


def single_element(dataset) -> Any:
  """The whole-client structure out of its one-element sequence."""
  return dataset.get_single_element()


class LocalTrainingOutput(NamedTuple):
  """What one client's local training produces (all tensors)."""
  model_weights: Any        # tff.learning.models.ModelWeights after training
  num_examples: tf.Tensor   # float32, examples in one epoch (n)
  loss_sum: tf.Tensor       # float32, sum over all steps of batch loss x batch size
  correct: tf.Tensor        # float32, correct predictions over all steps
  seen: tf.Tensor           # float32, predictions scored for accuracy (examples or tokens)
  examples_trained: tf.Tensor  # float32, examples over the steps run (n x epochs for a
                               # client doing all its work)
  epochs_trained: tf.Tensor  # float32, steps run / batches per epoch: a partial last epoch
                             # counts its share of batches (0 for FedSGD's one gradient
                             # pass, for a client without data and for one not reporting)
  steps_trained: tf.Tensor  # float32, optimizer steps run: ceil(work x epochs x batches per
                            # epoch) (0 for FedSGD, for a client without data or not
                            # reporting; SCAFFOLD's K_i)
  last_epoch_loss: tf.Tensor  # float32, mean training loss over the batches run of the last
                              # epoch that ran (0 when none ran)
  reported: tf.Tensor       # float32, 1 if the client reports (work > 0) else 0: every
                            # client work multiplies its upload's weight by it
  full_gradient: Any        # full-batch mean gradient at the initial weights (FedSGD) or ()
  model_metrics: Any        # the model's own unfinalized metrics over all steps
                            # (`report_local_unfinalized_metrics`, e.g. its Keras metrics)
  extra_loss_sum: Any = ()  # float32, sum over all steps of the extra loss (e.g. CADIS's
                            # λ·KD) x batch size, when the loop has one; else ()
  proximal_loss_sum: Any = ()  # float32, sum over all steps of FedProx's (mu/2)||w - w_t||^2
                               # (at the step's weights) x batch size, when mu != 0; else ()
  optimizer_state: Any = ()  # the client optimiser's state after the last step (() for
                             # FedSGD): continues training where this call stopped


# Hooks a method adds to the shared loop, all optional:
#   gradient_transform(grads, context) -> grads      (FedLEx guidance)
#   extra_loss(batch, output, context) -> scalar     (CADIS knowledge distillation;
#                                                     batch = OrderedDict(x, y, index))
GradientTransform = Callable[[list, Any], list]
ExtraLoss = Callable[[Any, Any, Any], tf.Tensor]


def counted_labels(labels):
  """float32 weights of the labels a metric counts: all of them for classification; for
  sequences (labels of rank > 1), every position whose label is not padding id 0."""
  if labels.shape.rank is not None and labels.shape.rank > 1:
    return tf.cast(tf.not_equal(labels, 0), tf.float32)
  return tf.ones_like(labels, tf.float32)


def aligned_labels(predictions, labels):
  """`labels` with one entry per row of `predictions`' last axis: Keras's class-label layout
  [n, 1] (as in TFF's image tutorials) becomes [n], so it is not taken for a sequence."""
  if (labels.shape.rank is not None and predictions.shape.rank is not None
      and labels.shape.rank == predictions.shape.rank):
    return tf.squeeze(labels, axis=-1)
  return labels


def accuracy_terms(predictions, labels):
  """(correct, counted) for classification; padding label 0 is skipped for sequences."""
  labels = aligned_labels(predictions, labels)
  pred = tf.argmax(predictions, axis=-1, output_type=labels.dtype)
  hit = tf.cast(tf.equal(pred, labels), tf.float32)
  weights = counted_labels(labels)
  return tf.reduce_sum(hit * weights), tf.reduce_sum(weights)


def check_client_training(optimizer, batch_size, *, needs_optimizer: bool = True):
  """One clear error for the client arguments every builder takes, before anything is
  traced. The builders' order is (model_fn, client_optimizer_fn, client_batch_size, ...),
  which is not TFF's (model_fn, client_optimizer_fn, server_optimizer_fn): a server
  optimizer passed third lands on the batch size, so the message says so."""
  if isinstance(batch_size, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'client_batch_size (the third argument) must be a positive integer, got an optimizer: '
        "unlike TFF's build_weighted_fed_avg, these builders take (model_fn, "
        'client_optimizer_fn, client_batch_size, ...); pass the server optimizer as '
        'server_optimizer_fn=...')
  if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
      or batch_size <= 0:
    raise ValueError(f'client_batch_size must be a positive integer, got {batch_size!r}')
  if needs_optimizer and not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'client_optimizer_fn must be a tff.learning.optimizers.Optimizer (e.g. '
        'tff.learning.optimizers.build_sgdm(learning_rate=0.1)), not a Keras optimizer or a '
        f'function returning one; got {type(optimizer).__name__}')


# work x count is rounded up after shrinking it by this relative amount, so that a work
# stored as float32 (0.3 as 0.30000001) does not add a step to ceil(0.3 x 10) = 3.
WORK_ROUNDING = 1e-6


def work_share(work, count):
  """int32 ceil(work x count): 0 for work 0, else in [min(1, count), count] (a reporting
  client runs at least one step, or example, when it has any); see WORK_ROUNDING."""
  count = tf.convert_to_tensor(count, tf.int32)
  work = tf.cast(work, tf.float64)
  share = tf.math.ceil(work * tf.cast(count, tf.float64) * (1.0 - WORK_ROUNDING))
  share = tf.minimum(tf.cast(share, tf.int32), count)
  return tf.where(work > 0.0, tf.maximum(share, tf.minimum(1, count)), 0)


def build_local_training(
    model: tff.learning.models.VariableModel,
    optimizer: Optional[tff.learning.optimizers.Optimizer],
    batch_size: int,
    *,
    proximal_strength: float = 0.0,
    full_gradient: bool = False,
    gradient_transform: Optional[GradientTransform] = None,
    extra_loss: Optional[ExtraLoss] = None,
) -> Callable[..., LocalTrainingOutput]:
  """Returns `train(initial_weights, element, context=None, optimizer_hparams=None,
  optimizer_state=None, max_steps=None)` as a `tf.function` (`optimizer_hparams`: set on the
  optimizer after its initialisation; `optimizer_state`, e.g. an earlier call's output,
  replaces that initialisation, so consecutive calls train as one run: FedLEx's
  early-stopped explorers; `max_steps`: at most that many steps).

  The element's `work` sets how much runs: ceil(work x K) of the K = epochs x ceil(n / B)
  local steps, in order (a straggler stops part-way, possibly inside an epoch; work 0 runs
  none); with `full_gradient`, the gradient over the first ceil(work x n) examples of the
  first epoch's order. `reported` (work > 0) says whether the client reports at all.

  Call inside a `tff.tensorflow.computation`, with `model` built there too.

  Args:
    model: the client's `tff.learning.models.VariableModel`.
    optimizer: a `tff.learning.optimizers.Optimizer`, re-initialised for every client and
      round as in `tff.learning`; unused when `full_gradient`.
    batch_size: examples per local step (the last batch of an epoch may be smaller).
    proximal_strength: FedProx's mu: adds mu * (w - w_t) to every gradient, the gradient of
      (mu/2)||w - w_t||^2.
    full_gradient: FedSGD: no local step; accumulate the example-weighted mean gradient over
      the first epoch's batches at the initial weights.
    gradient_transform: applied to the gradients before the optimiser step.
    extra_loss: added to the model's batch loss inside the tape; its `batch` argument also
      holds `index`, the batch's rows in the client's `x` / `y` (int32 [b]).
  """
  check_client_training(optimizer, batch_size, needs_optimizer=not full_gradient)

  @tf.function
  def train(initial_weights, element, context=None, optimizer_hparams=None,
            optimizer_state=None, max_steps=None):
    weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
    trainable = list(weights.trainable)
    initial_trainable = [tf.identity(t) for t in initial_weights.trainable]
    x, y, order = element['x'], element['y'], element['order']
    epochs = tf.shape(order)[0]
    work = tf.cast(element['work'], tf.float32)
    if full_gradient:
      # FedSGD: one pass over the first ceil(work x n) examples of epoch 0's order.
      epochs = tf.minimum(epochs, 1)
      n = work_share(work, tf.shape(order)[1])
    else:
      n = tf.shape(order)[1]
    batches_per_epoch = (n + batch_size - 1) // batch_size
    num_steps = (epochs * batches_per_epoch if full_gradient else
                 work_share(work, epochs * batches_per_epoch))
    if max_steps is not None:
      num_steps = tf.minimum(num_steps, tf.cast(max_steps, tf.int32))
    last_epoch = (num_steps - 1) // tf.maximum(batches_per_epoch, 1)

    if full_gradient:
      opt_state = ()
    elif optimizer_state is not None:
      opt_state = optimizer_state
    else:
      specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
      opt_state = optimizer.initialize(specs)
      if optimizer_hparams is not None:  # the client work state's (TFF's hparams API)
        opt_state = optimizer.set_hparams(opt_state, optimizer_hparams)
    grad_sum = [tf.zeros_like(v) for v in trainable] if full_gradient else []
    loss_sum = tf.constant(0.0)
    correct = tf.constant(0.0)
    seen = tf.constant(0.0)
    examples_trained = tf.constant(0.0)
    last_loss = tf.constant(0.0)
    last_count = tf.constant(0.0)
    extra_sum = tf.constant(0.0)
    extra = tf.constant(0.0)  # this step's extra loss (autograph: defined before the loop)
    proximal_sum = tf.constant(0.0)
    proximal = tf.constant(0.0)  # this step's proximal term (as `extra`)

    for step in tf.range(num_steps):
      epoch = step // batches_per_epoch
      start = (step % batches_per_epoch) * batch_size
      end = tf.minimum(start + batch_size, n)
      idx = order[epoch, start:end]
      batch = collections.OrderedDict(x=tf.gather(x, idx), y=tf.gather(y, idx))
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=not full_gradient)
        loss = output.loss
        if extra_loss is not None:
          extra = tf.cast(
              extra_loss(collections.OrderedDict(batch, index=idx), output, context),
              tf.float32)
          loss = loss + extra
      grads = tape.gradient(loss, trainable,
                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
      if proximal_strength:
        drift = [v - v0 for v, v0 in zip(trainable, initial_trainable)]
        grads = [g + proximal_strength * d for g, d in zip(grads, drift)]
        # The term whose gradient that is, recorded so its size can be read beside the loss.
        proximal = 0.5 * proximal_strength * tf.add_n([tf.reduce_sum(tf.square(d))
                                                       for d in drift])
      if gradient_transform is not None:
        grads = list(gradient_transform(grads, context))
      count = tf.cast(end - start, tf.float32)
      if full_gradient:
        grad_sum = [s + count * g for s, g in zip(grad_sum, grads)]
      else:
        opt_state, updated = optimizer.next(opt_state, tuple(trainable), tuple(grads))
        for v, u in zip(trainable, updated):
          v.assign(u)
      batch_loss = tf.cast(output.loss, tf.float32)
      loss_sum += batch_loss * count
      if extra_loss is not None:
        extra_sum += extra * count
      if proximal_strength:
        proximal_sum += proximal * count
      examples_trained += count
      hits, counted = accuracy_terms(output.predictions, batch['y'])
      correct += hits
      seen += counted
      in_last_epoch = tf.cast(tf.equal(epoch, last_epoch), tf.float32)
      last_loss += in_last_epoch * batch_loss * count
      last_count += in_last_epoch * count

    # The client's examples, whatever share of them its work ran (its upload's weight).
    num_examples = tf.cast(tf.shape(order)[1], tf.float32)
    # Counted from what ran: a full-gradient client took no local step.
    steps_trained = (tf.constant(0.0) if full_gradient else tf.cast(num_steps, tf.float32))
    epochs_trained = (tf.constant(0.0) if full_gradient else tf.math.divide_no_nan(
        steps_trained, tf.cast(batches_per_epoch, tf.float32)))
    if full_gradient:  # the mean over the examples it ran
      full = tuple(s / tf.maximum(tf.cast(n, tf.float32), 1.0) for s in grad_sum)
    else:
      full = ()
    return LocalTrainingOutput(
        model_weights=tff.learning.models.ModelWeights(
            trainable=[tf.identity(v) for v in weights.trainable],
            non_trainable=[tf.identity(v) for v in weights.non_trainable]),
        num_examples=num_examples,
        loss_sum=loss_sum,
        correct=correct,
        seen=seen,
        examples_trained=examples_trained,
        epochs_trained=epochs_trained,
        steps_trained=steps_trained,
        last_epoch_loss=tf.math.divide_no_nan(last_loss, last_count),
        reported=tf.cast(work > 0.0, tf.float32),
        full_gradient=full,
        # forward_pass updated the model's metric variables at every step; read them
        # here, after the loop (a fresh model per client starts them at zero).
        model_metrics=model.report_local_unfinalized_metrics(),
        extra_loss_sum=extra_sum if extra_loss is not None else (),
        proximal_loss_sum=proximal_sum if proximal_strength else (),
        optimizer_state=opt_state)

  return train


def zero_if_non_finite(structure):
  """(structure zeroed if any entry is NaN/Inf, 1.0 if it was non-finite else 0.0)."""
  flat = tf.nest.flatten(structure)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  zeroed = tf.nest.map_structure(
      lambda t: tf.where(finite, t, tf.zeros_like(t)), structure)
  return zeroed, tf.cast(tf.logical_not(finite), tf.float32)


def upload_weight(weight, out: LocalTrainingOutput, non_finite):
  """A client's upload weight as the server takes it: `weight`, or 0 for a client that does
  not report (work 0) or whose update was not finite (`zero_if_non_finite`); weight 0 is
  how every aggregator here tells an upload to leave out."""
  return weight * out.reported * (1.0 - non_finite)


def training_metric_sums(out: LocalTrainingOutput, non_finite) -> collections.OrderedDict:
  """Per-client sums that `finalize_training_metrics` turns into round metrics.

  A client whose update was not finite contributes only its count in
  `non_finite_clients`, so one diverged client does not turn the round's loss into NaN; its
  work is still counted in the costs (`cost_client_epochs`, `cost_examples`). A client that
  does not report (work 0) contributes only its count in `unreported_clients`; a reporting
  one counts in `reported_clients`, its loss and accuracy over the steps it ran.
  """
  keep = tf.logical_and(tf.equal(non_finite, 0.0), out.reported > 0.0)
  kept = lambda t: tf.where(keep, t, tf.zeros_like(t))  # noqa: E731
  extra = {name: kept(value) for name, value in (('extra_loss_sum', out.extra_loss_sum),
                                                 ('proximal_loss_sum', out.proximal_loss_sum))
           if not isinstance(value, tuple)}
  return collections.OrderedDict(
      loss_sum=kept(out.loss_sum),
      **extra,
      examples_trained=kept(out.examples_trained),
      correct=kept(out.correct),
      seen=kept(out.seen),
      num_examples=kept(out.num_examples),
      last_epoch_loss_sum=kept(out.last_epoch_loss * out.num_examples),
      num_clients=tf.constant(1.0),
      non_finite_clients=non_finite,
      reported_clients=out.reported,
      unreported_clients=1.0 - out.reported,
      cost_client_epochs=out.epochs_trained,
      cost_examples=out.examples_trained)


def finalize_training_metrics(sums) -> collections.OrderedDict:
  """Round metrics from the federated sum of `training_metric_sums` (a TF function body).
  With no reporting client, the means (loss, accuracy, ...) are 0, not NaN.

  `loss` is the model's own loss (cross-entropy); with an extra loss in the loop (CADIS's
  λ·KD), `extra_loss` is its mean over the same examples, and with FedProx's proximal term
  (mu != 0), `proximal_loss` is (mu/2)||w - w_t||^2's, so each can be compared with it.
  """
  extra = {name: tf.math.divide_no_nan(sums[f'{name}_sum'], sums['examples_trained'])
           for name in ('extra_loss', 'proximal_loss') if f'{name}_sum' in sums}
  return collections.OrderedDict(
      loss=tf.math.divide_no_nan(sums['loss_sum'], sums['examples_trained']),
      **extra,
      accuracy=tf.math.divide_no_nan(sums['correct'], sums['seen']),
      last_epoch_loss=tf.math.divide_no_nan(sums['last_epoch_loss_sum'], sums['num_examples']),
      num_examples=sums['num_examples'],
      num_clients=sums['num_clients'],
      non_finite_clients=sums['non_finite_clients'],
      # Of the num_clients sampled: those that reported (work > 0) and those that did not.
      reported_clients=sums['reported_clients'],
      unreported_clients=sums['unreported_clients'],
      # Costs, counted by the clients: local epochs of optimizer steps and examples passed
      # through the model (FedSGD: 0 epochs, one pass over its data).
      client_epochs=sums['cost_client_epochs'],
      examples_trained=sums['cost_examples'])
