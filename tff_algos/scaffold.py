"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020, Algorithm 1 with
option II control variates), as a `LearningProcess`.

N clients, P sampled a round. The server state holds the global model x, the server control
variate c and every client's control variate c_i (N rows shaped like the trainable weights,
zeros at the start), dense tensors in the aggregator's state
(`tff_algos.aggregators.control_variates`). A round:

1. distribution: x and c are broadcast; each sampled client receives its own c_i through
   `tff.federated_select` keyed by the client index its input carries (one row down per
   client, whatever N is: `server_state.federated_select_rows`);
2. client work (`tff_algos.client_work.corrected_training`): K_i local SGD steps on
   g + c - c_i (the shared fast loop's gradient hook), then option II's
   c_i+ = c_i - c + (x - y_i) / (K_i · eta_l), eta_l the client learning rate; the client
   uploads x - y_i and c_i+ - c_i keyed by its index and slot;
3. aggregator: the mean model delta over the participants (uniform, as the paper; or by
   example count), c_i <- c_i+ for the participants only, c <- c + (1/N) Σ (c_i+ - c_i);
4. finalizer: TFF's apply-optimizer finalizer with server SGD at rate eta_g
   (`server_learning_rate`): x <- x - eta_g · mean(x - y_i) = x + eta_g · mean(y_i - x).
   With non-trainable weights (BatchNorm statistics) their mean is applied as FedAvg does
   (`model_delta.build_update_finalizer`); control variates cover the trainable weights.

A client that runs no step (no data) or whose update is not finite is left out of the mean
and its c_i stays as it was (the latter counted in `client_work/train/non_finite_clients`).

**Memory**: the control variates take 4·N·D bytes (D = trainable weights; e.g. 100 clients ×
the FedAvg CNN's 1,663,370 weights = 635 MiB), plus 4·D + 4·N; `build_scaffold` refuses a
state above `max_control_gib` (`control_variates.state_size_bytes` is the formula).

The client optimizer must be plain SGD (`corrected_training.check_plain_sgd` says why:
option II's formula divides the model's movement by K_i · eta_l, which measures the steps'
mean gradient only without momentum or adaptive steps).

State: a `tff.learning.templates.LearningAlgorithmState` (global_model_weights,
distributor=(), client_work=<client optimizer hparams>, aggregator=OrderedDict(
server_control, client_controls, client_updates), finalizer=<server SGD state>);
`get_hparams` / `set_hparams` read and change the client learning rate (and with it eta_l
in the formula) and eta_g. Metrics: client_work/train (loss, accuracy, ...), aggregator
(uploads, controlled_clients, server_control_norm, control_delta_norm), finalizer.

Client inputs carry the client's `index` in [0, N) and `slot` in [0, P):
`data.client_selection_fn(client_data, P)(round_num)` builds a round of them from a TFF
ClientData (`data.round_inputs` returns the bare elements: feed `[[x] for x in inputs]`).
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import tensorflow_federated as tff

from tff_algos import learning_process
from tff_algos.aggregators import accumulate_then_step, control_variates, factories
from tff_algos.client_work import corrected_training, local_training, model_delta
from tff_algos.models import model_fns

CLIENT_WEIGHTINGS = model_delta.CLIENT_WEIGHTINGS


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
    guided: bool = False,
    kd_weight: float = 0.0,
    kd_reduction: str = 'sum',
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
    guided: FedLEx's guidance on the clients' gradients, applied before the control-variate
      correction: each step is y -= eta_l * (G * g + c - c_i), so the control variates
      track guided gradients (`corrected_training`'s module doc says why).
    kd_weight: λ of CADIS's KD term on the clients (0 = off), teacher = the global model x.
    kd_reduction: 'sum' or 'mean' (`tff_algos.client_work.distillation`).

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
      guided=guided, kd_weight=kd_weight, kd_reduction=kd_reduction)
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
