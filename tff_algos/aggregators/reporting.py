"""The mean over the clients that reported, and a finalizer that skips a round nobody did.

A sampled client that never reports (dropped out, or its update was not finite) reaches the
server as an upload of weight 0 (docs/methods.md, "When clients do not report").
`ReportingFactory` wraps a `tff.aggregators` factory so that its mean is over the reporters
(weight > 0) whatever the factory: a weighted one already gives them weight 0; an unweighted
one (TFF's DP, robust or compression factories) averages all P clients uniformly, so a
non-reporter's upload is zeroed on its client and the factory's result is multiplied by P/R
(R reporters) on the server. That is post-processing of the factory's output (a DP
guarantee holds; the noise grows by P/R) and exact for linear factories; a non-linear one
(a median, adaptive clipping's norm estimate) still sees the P - R zeros. P and R come
from a federated sum beside the factory's aggregation, not before it, so a round stays one
aggregation deep (mergeable across worker services).

The result is `OrderedDict(update=<the mean>, has_result=float32)`, has_result 0 when
nobody reported; `keep_unless_reported` wraps a finalizer so that such a round leaves the
global model and the finalizer's state (server momentum, Adam's moments) as they were, where
a zero update would still move them. State and measurements are the inner factory's.
"""

from __future__ import annotations

import collections
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

Factory = Union[tff.aggregators.WeightedAggregationFactory,
                tff.aggregators.UnweightedAggregationFactory]


def reported_type(update_type: tff.Type) -> tff.Type:
  """The type `ReportingFactory`'s processes return for updates of `update_type`."""
  return tff.StructWithPythonType(
      [('update', update_type), ('has_result', tff.TensorType(np.float32))],
      collections.OrderedDict)


def _scale(structure, factor):
  return tf.nest.map_structure(lambda t: t * tf.cast(factor, t.dtype), structure)


class ReportingFactory(tff.aggregators.WeightedAggregationFactory):
  """A weighted factory: `inner`'s mean over the clients with weight > 0 (module doc).

  `inner` is a weighted or unweighted `tff.aggregators` factory (default `MeanFactory`);
  an unweighted one needs float values (they are scaled).
  """

  def __init__(self, inner: Optional[Factory] = None):
    inner = inner or tff.aggregators.MeanFactory()
    if not isinstance(inner, (tff.aggregators.WeightedAggregationFactory,
                              tff.aggregators.UnweightedAggregationFactory)):
      raise TypeError('inner must be a tff.aggregators.WeightedAggregationFactory or '
                      f'UnweightedAggregationFactory, got {type(inner).__name__}')
    self._inner = inner

  def create(self, value_type: tff.Type,
             weight_type: tff.Type) -> tff.templates.AggregationProcess:
    unweighted = isinstance(self._inner, tff.aggregators.UnweightedAggregationFactory)
    inner = (self._inner.create(value_type) if unweighted
             else self._inner.create(value_type, weight_type))

    @tff.tensorflow.computation(weight_type)
    def counts(weight):
      return collections.OrderedDict(
          reported=tf.cast(weight > 0, tf.float32), clients=tf.constant(1.0))

    @tff.tensorflow.computation(value_type, weight_type)
    def zero_unless_reported(value, weight):
      return tf.nest.map_structure(lambda t: tf.where(weight > 0, t, tf.zeros_like(t)), value)

    result_type = inner.next.type_signature.result.result.member

    @tff.tensorflow.computation(result_type, counts.type_signature.result)
    def reporters_mean(result, totals):
      reported = totals['reported']
      if unweighted:  # the factory divided by all P clients; the reporters are R of them
        result = _scale(result, tf.math.divide_no_nan(totals['clients'], reported))
      # Nobody reported: a weighted mean is 0/0; hand on zeros, never NaN.
      result = tf.nest.map_structure(
          lambda t: tf.where(reported > 0, t, tf.zeros_like(t)), result)
      return collections.OrderedDict(update=result,
                                     has_result=tf.cast(reported > 0, tf.float32))

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      totals = tff.federated_sum(tff.federated_map(counts, weight))
      if unweighted:
        out = inner.next(state, tff.federated_map(zero_unless_reported, (value, weight)))
      else:
        out = inner.next(state, value, weight)
      result = tff.federated_map(reporters_mean, (out.result, totals))
      return tff.templates.MeasuredProcessOutput(out.state, result, out.measurements)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def keep_unless_reported(
    finalizer: tff.learning.templates.FinalizerProcess
) -> tff.learning.templates.FinalizerProcess:
  """`finalizer` taking `ReportingFactory`'s result: with has_result 0 the weights and the
  finalizer's state stay as they were (module doc); hparams are `finalizer`'s."""
  state_type, weights_type, update_type = (
      t.member for t in finalizer.next.type_signature.parameter)

  @tff.tensorflow.computation(tff.TensorType(np.float32), state_type, weights_type,
                              state_type, weights_type)
  def choose(has_result, new_state, new_weights, old_state, old_weights):
    keep_new = has_result > 0

    def pick(new, old):
      return tf.nest.map_structure(lambda n, o: tf.where(keep_new, n, o), new, old)

    weights = pick(new_weights, old_weights)
    return pick(new_state, old_state), tff.learning.models.ModelWeights(
        trainable=list(weights.trainable), non_trainable=list(weights.non_trainable))

  @tff.tensorflow.computation(reported_type(update_type))
  def update_of(reported):
    return reported['update']

  @tff.tensorflow.computation(reported_type(update_type))
  def has_result_of(reported):
    return reported['has_result']

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(reported_type(update_type), tff.SERVER))
  def next_fn(state, weights, reported):
    out = finalizer.next(state, weights, tff.federated_map(update_of, reported))
    new_state, new_weights = tff.federated_map(
        choose, (tff.federated_map(has_result_of, reported), out.state, out.result, state,
                 weights))
    return tff.templates.MeasuredProcessOutput(new_state, new_weights, out.measurements)

  return tff.learning.templates.FinalizerProcess(
      finalizer.initialize, next_fn, get_hparams_fn=finalizer.get_hparams,
      set_hparams_fn=finalizer.set_hparams)
