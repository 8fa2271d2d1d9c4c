"""FedCross: multi-model cross-aggregation, as a `LearningProcess`.

Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model Cross-Aggregation".
The rule, its defaults and options: docs/algorithms.md#fedcross.

A hand-written process: each sampled client receives middleware model `slot` through
`tff.federated_select`, trains it (`tff_algos.client_work.model_upload`) and uploads it keyed
by slot to the cross-aggregation stage (`tff_algos.aggregators.cross_aggregation`), which
holds the K models as dense `[K, ...]` tensors. `get_model_weights` is their uniform mean;
`set_model_weights` sets all K. State: `LearningAlgorithmState` with
aggregator=OrderedDict(models, round_num); `get_hparams` / `set_hparams` change the client
learning rate. Clients must come in the round's sample order with slots 0..K-1
(`data.client_selection_fn(client_data, K)(round_num)`); a slot with no client, or whose client
did not report, keeps its model.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import learning_process
from tff_algos.aggregators import accumulate_then_step, cross_aggregation, factories
from tff_algos.client_work import local_training, model_delta, model_upload, plugins
from tff_algos.models import model_fns


def build_fedcross(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    num_models: int,
    *,
    alpha: float = 0.99,
    selection: str = 'lowest_similarity',
    similarity: str = 'model',
    alpha_schedule: bool = False,
    num_propellers: int = 1,
    accel_rounds: int = 0,
    model_aggregator=None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """FedCross (multi-model cross-aggregation) as a `tff.learning.templates.LearningProcess`.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local steps.
    client_batch_size: local batch size.
    num_models: K, the number of middleware models = clients per round. Client inputs
      (`data.round_inputs`) carry `slot` in [0, K): the middleware model that client trains.
    alpha: CrossAggr weight of a model's own upload, in [0.5, 1) in the paper (0.99).
    selection: 'lowest_similarity' (default), 'highest_similarity' or 'in_order'.
    similarity: what the similarity rules compare: 'model' (default), the cosine of whole
      flattened models (the paper's), or 'layerwise', the sum of per-layer cosines the
      authors' code computes (`cross_aggregation.layerwise_similarity_matrix`). 'in_order'
      does not read it, so 'layerwise' with it is refused (ValueError); the `similarity`
      measurement reports it under every rule.
    alpha_schedule: alpha rises linearly from 0.5 to `alpha` over `accel_rounds` rounds.
    num_propellers: > 1: during the first `accel_rounds` rounds each model is fused with
      the mean of this many in-order collaborators (see cross_aggregation's module doc).
    accel_rounds: length of the acceleration phase (0 = off).
    model_aggregator: must be None (accepted for TFF-style call sites; a factory is refused
      with the reason, see `tff_algos.aggregators.factories`).
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term (its teacher: the
      middleware model the client received) (`tff_algos.ClientStages`; default none).

  Returns:
    A LearningProcess; `next(state, client_data)` takes the K clients' one-element
    sequences (`tff_algos.client_work.local_training.client_data_type`).
  """
  factories.refuse_model_aggregator(
      'FedCross', model_aggregator,
      'nothing is averaged over clients: each upload replaces its own middleware model '
      '(by slot) and is then fused with one collaborator chosen by similarity, so the '
      'server needs every upload individually, which a TFF aggregation factory (a sum over '
      'clients) does not deliver')
  model_fn = model_fns.as_model_fn(model_fn)
  cross_aggregation.validate_options(num_models, alpha, selection, num_propellers,
                                     accel_rounds, similarity)
  k = int(num_models)
  initial_weights = model_delta.initial_model_weights_fn(model_fn)
  weights_type = initial_weights.type_signature.result
  data_type = local_training.client_data_type(model_delta.model_input_spec(model_fn))
  client_work = model_upload.build_model_upload_client_work(
      model_fn, client_optimizer_fn, client_batch_size, client_stages=client_stages)
  aggregator = cross_aggregation.build_cross_aggregation_process(
      weights_type, k, alpha=alpha, selection=selection, alpha_schedule=alpha_schedule,
      num_propellers=num_propellers, accel_rounds=accel_rounds,
      initial_weights_fn=initial_weights, similarity=similarity)
  agg_state_type = aggregator.initialize.type_signature.result.member
  agg_measurements_type = aggregator.next.type_signature.result.measurements.member

  @tff.tensorflow.computation(agg_state_type)
  def global_from_aggregator(agg_state):
    return cross_aggregation.mean_model(agg_state['models'])

  @tff.federated_computation
  def init_fn():
    agg_state = aggregator.initialize()
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_map(global_from_aggregator, agg_state),
        distributor=tff.federated_value((), tff.SERVER),
        client_work=client_work.initialize(),
        aggregator=agg_state,
        finalizer=tff.federated_value((), tff.SERVER)))

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(data_type)
  def slot_of(dataset):
    return local_training.single_element(dataset)['slot']

  @tff.tensorflow.computation(weights_type, weights_type, agg_measurements_type)
  def global_model(old, new, measurements):
    # Nobody reported: every middleware model kept its weights, and so does the global
    # model, exactly (their mean need not round to it after `set_model_weights`).
    reported = tf.reduce_any(measurements['eligible'] > 0.0)
    return tf.nest.map_structure(lambda n, o: tf.where(reported, n, o), new, old)

  @tff.tensorflow.computation
  def dispatch_metrics():
    return collections.OrderedDict(dispatch_select=tf.constant(1.0))

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    agg_state = state.aggregator
    weights_at_clients = accumulate_then_step.federated_select_rows(
        tff.federated_map(slot_of, client_data), agg_state.models,
        lambda key: accumulate_then_step.checked_slot(key, k, 'num_models'))
    client_out = client_work.next(state.client_work, weights_at_clients, client_data)
    agg_out = aggregator.next(agg_state, client_out.result.update,
                              client_out.result.update_weight)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_map(
            global_model, (state.global_model_weights, agg_out.result, agg_out.measurements)),
        distributor=state.distributor,
        client_work=client_out.state,
        aggregator=agg_out.state,
        finalizer=state.finalizer))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=tff.federated_eval(dispatch_metrics, tff.SERVER),
        client_work=client_out.measurements,
        aggregator=agg_out.measurements,
        finalizer=tff.federated_value((), tff.SERVER)))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  # compose_learning_process's hparams keys, so that code written for TFF's processes (and
  # ours) finds both: FedCross has no finalizer (the server keeps K models), hence none of its.
  return learning_process.build_learning_process(
      init_fn, next_fn, client_work,
      aggregator_with_weights=lambda agg, weights: collections.OrderedDict(
          models=cross_aggregation.stack_model(weights, k), round_num=agg['round_num']))
