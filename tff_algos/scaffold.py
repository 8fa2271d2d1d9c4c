"""SCAFFOLD: stochastic controlled averaging, as a `LearningProcess`.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML
2020, Algorithm 1 with option II control variates. The rule: docs/algorithms.md#scaffold.

Composed from TFF's templates: x and c are broadcast and each client's c_i is sent to it alone
by `tff.federated_select` (`accumulate_then_step.federated_select_rows`); the clients run
`tff_algos.client_work.corrected_training`; `tff_algos.aggregators.control_variates` keeps c
and every c_i (4·N·D bytes, refused above `max_control_gib`) and returns the mean model
delta, which TFF's apply-optimizer finalizer applies with server SGD at eta_g
(`server_learning_rate`). The client optimizer must be plain SGD
(`corrected_training.check_plain_sgd`). Client inputs carry the client's `index` and `slot`:
`data.client_selection_fn(client_data, P)(round_num)`.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import tensorflow_federated as tff

from tff_algos import constants
from tff_algos import learning_process
from tff_algos.aggregators import accumulate_then_step, control_variates, factories
from tff_algos.client_work import corrected_training, local_training, model_delta, plugins
from tff_algos.models import model_fns


def build_scaffold(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    num_clients: int,
    clients_per_round: int,
    *,
    server_learning_rate: float = 1.0,
    client_weighting: str = 'uniform',
    max_control_gib: Optional[float] = 4.0,
    model_aggregator=None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """SCAFFOLD (option II control variates) as a `tff.learning.templates.LearningProcess`.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: plain SGD, `tff.learning.optimizers.build_sgdm(learning_rate=eta_l)`
      without momentum (coupled weight decay, `tff_algos.optimizers.with_weight_decay`, is
      accepted); a momentum or adaptive optimizer is refused (module doc).
    client_batch_size: local batch size.
    num_clients: N; client inputs carry `index` in [0, N), the row of their control variate.
    clients_per_round: P, the most clients of one round; inputs carry `slot` in [0, P).
    server_learning_rate: eta_g (the paper: 1.0, i.e. x becomes the participants' mean).
    client_weighting: the model-delta mean's weights: 'uniform' (the paper) or
      'num_examples' (FedAvg's data-size weights). The control variate c is always
      updated by (1/N) Σ (c_i+ - c_i), as in the paper.
    max_control_gib: refuse a configuration whose control variates (4·N·D bytes plus
      4·D + 4·N) exceed this many GiB (None: no limit).
    model_aggregator: must be None (accepted for TFF-style call sites; a factory is refused
      with the reason, see `tff_algos.aggregators.factories`).
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term
      (`tff_algos.ClientStages`; default none). Guided, each step is
      y -= eta_l * (G * g + c - c_i), so the control variates track guided gradients
      (`corrected_training`'s module doc says why).

  Returns:
    A LearningProcess; `next(state, client_data)` takes the round's clients' one-element
    sequences (`tff_algos.client_work.local_training.client_data_type`).

  Raises:
    ValueError: an argument is out of range, the client optimizer is not plain SGD, or the
      control variates would exceed `max_control_gib`.
  """
  factories.refuse_model_aggregator(
      'SCAFFOLD', model_aggregator,
      'every control delta updates its own client\'s control variate (by client index), so '
      'the server needs each one individually, which a TFF aggregation factory (a sum over '
      'clients) does not deliver; a factory on the model delta alone would leave the control '
      'deltas outside its guarantee (clipping, DP)')
  if isinstance(server_learning_rate, bool) or not server_learning_rate > 0:
    raise ValueError(f'server_learning_rate must be > 0, got {server_learning_rate!r}')
  # The cheap checks first (the client work makes them again as a stage of its own).
  local_training.check_client_training(client_optimizer_fn, client_batch_size)
  corrected_training.check_plain_sgd(client_optimizer_fn)
  model_fn = model_fns.as_model_fn(model_fn)
  initial_weights = model_delta.initial_model_weights_fn(model_fn)
  weights_type = initial_weights.type_signature.result
  aggregator = control_variates.build_control_variate_aggregation(
      weights_type, num_clients, clients_per_round, max_control_gib=max_control_gib)
  client_work = corrected_training.build_corrected_client_work(
      model_fn, client_optimizer_fn, client_batch_size, client_weighting=client_weighting,
      client_stages=client_stages)
  finalizer = model_delta.build_update_finalizer(
      tff.learning.optimizers.build_sgdm(learning_rate=float(server_learning_rate)),
      weights_type)
  n = int(num_clients)
  data_type = local_training.client_data_type(model_delta.model_input_spec(model_fn))
  agg_state_type = aggregator.initialize.type_signature.result.member

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights, tff.SERVER),
        distributor=tff.federated_value((), tff.SERVER),
        client_work=client_work.initialize(),
        aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize()))

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(data_type)
  def index_of(dataset):
    return local_training.single_element(dataset)['index']

  @tff.tensorflow.computation(weights_type, agg_state_type['server_control'],
                              agg_state_type['server_control'])
  def pack(model, server_control, client_control):
    return collections.OrderedDict(model=model, server_control=server_control,
                                   client_control=client_control)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    controls = state.aggregator
    client_control = accumulate_then_step.federated_select_rows(
        tff.federated_map(index_of, client_data), controls.client_controls,
        lambda key: accumulate_then_step.checked_client_index(key, n))
    received = tff.federated_map(pack, (
        tff.federated_broadcast(state.global_model_weights),
        tff.federated_broadcast(controls.server_control), client_control))
    client_out = client_work.next(state.client_work, received, client_data)
    agg_out = aggregator.next(controls, client_out.result.update,
                              client_out.result.update_weight)
    fin_out = finalizer.next(state.finalizer, state.global_model_weights, agg_out.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=fin_out.result,
        distributor=state.distributor,
        client_work=client_out.state,
        aggregator=agg_out.state,
        finalizer=fin_out.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=tff.federated_value((), tff.SERVER),
        client_work=client_out.measurements,
        aggregator=agg_out.measurements,
        finalizer=fin_out.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  # set_model_weights keeps the control variates (the algorithm's state, not the model's);
  # the hparams are the client learning rate (eta_l, also in the formula) and eta_g.
  return learning_process.build_learning_process(init_fn, next_fn, client_work, finalizer)
