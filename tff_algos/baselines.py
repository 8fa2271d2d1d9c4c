"""The baselines the papers compare against, on the project's fast client-training path.

FedAvg, FedAvgM, FedAdam, FedProx and FedSGD (docs/algorithms.md#baselines), each composed
with `compose_learning_process` from TFF's broadcast, `tff.aggregators.MeanFactory` and
apply-optimizer finalizer around the shared client work, so every comparison trains clients
as the new methods do. Results equal TFF's own builders (tests/test_baselines.py), except
FedProx, whose proximal term has the paper's sign (see `build_fedprox`).
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow_federated as tff

from tff_algos.aggregators import factories, reporting
from tff_algos.client_work import model_delta, plugins
from tff_algos.models import model_fns

ModelAggregator = factories.ModelAggregator

BASELINES = ('fedavg', 'fedavgm', 'fedadam', 'fedprox', 'fedsgd')


def compose_with_client_work(
    model_fn,
    client_work: tff.learning.templates.ClientWorkProcess,
    server_optimizer_fn: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[ModelAggregator] = None,
) -> tff.learning.templates.LearningProcess:
  """Broadcast -> `client_work` -> (weighted) mean of the reporters' updates -> server
  optimiser step, skipped in a round nobody reported (`tff_algos.aggregators.reporting`)."""
  model_fn = model_fns.as_model_fn(model_fn)
  initial_weights = model_delta.initial_model_weights_fn(model_fn)
  weights_type = initial_weights.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  aggregator = factories.create_model_aggregator(model_aggregator,
                                                 model_delta.update_type(weights_type))
  finalizer = reporting.keep_unless_reported(
      model_delta.build_update_finalizer(server_optimizer_fn, weights_type))
  return tff.learning.templates.compose_learning_process(
      initial_weights, distributor, client_work, aggregator, finalizer)


def build_fedavg(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    client_weighting: Optional[str] = None,
    model_aggregator: Optional[ModelAggregator] = None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """FedAvg (McMahan et al. 2017): server SGD with learning rate 1.0 by default.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local steps.
    client_batch_size: local batch size.
    server_optimizer_fn: applied to the weighted mean update (default SGD, lr 1.0).
    client_weighting: 'num_examples' (default with a weighted aggregator) or 'uniform'
      (default, and the only choice, with an unweighted one); TFF's
      `tff.learning.ClientWeighting` values are taken too.
    model_aggregator: a `tff.aggregators` weighted or unweighted aggregation factory
      (default `MeanFactory`): TFF's DP, clipping, zeroing, compression and robust
      wrappers apply to the averaged model deltas as in TFF's FedAvg builders.
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term
      (`tff_algos.ClientStages`; default none).
  """
  client_work = model_delta.build_model_delta_client_work(
      model_fn, client_optimizer_fn, client_batch_size,
      client_weighting=factories.resolve_client_weighting(client_weighting, model_aggregator),
      client_stages=client_stages)
  return compose_with_client_work(
      model_fn, client_work,
      server_optimizer_fn or tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      model_aggregator)


def build_fedavgm(model_fn, client_optimizer_fn, client_batch_size, *,
                  server_learning_rate: float = 1.0, server_momentum: float = 0.9,
                  client_stages: plugins.ClientStages = plugins.ClientStages(),
                  **kwargs) -> tff.learning.templates.LearningProcess:
  """FedAvgM (Hsu et al. 2019): FedAvg with server SGD momentum (default lr 1.0, m 0.9).

  `client_stages`: the plug-ins, as `build_fedavg` (`tff_algos.ClientStages`). `**kwargs`
  go to `build_fedavg`: client_weighting, model_aggregator.
  """
  return build_fedavg(
      model_fn, client_optimizer_fn, client_batch_size,
      tff.learning.optimizers.build_sgdm(learning_rate=server_learning_rate,
                                         momentum=server_momentum),
      client_stages=client_stages, **kwargs)


def build_fedadam(model_fn, client_optimizer_fn, client_batch_size, *,
                  server_learning_rate: float = 1e-2, beta_1: float = 0.9,
                  beta_2: float = 0.99, epsilon: float = 1e-3,
                  client_stages: plugins.ClientStages = plugins.ClientStages(),
                  **kwargs) -> tff.learning.templates.LearningProcess:
  """FedAdam / FedOpt (Reddi et al. 2021): FedAvg with a server Adam optimiser.

  `client_stages`: the plug-ins, as `build_fedavg` (`tff_algos.ClientStages`). `**kwargs`
  go to `build_fedavg`: client_weighting, model_aggregator.
  """
  return build_fedavg(
      model_fn, client_optimizer_fn, client_batch_size,
      tff.learning.optimizers.build_adam(learning_rate=server_learning_rate,
                                         beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
      client_stages=client_stages, **kwargs)


def build_fedprox(
    model_fn, client_optimizer_fn, client_batch_size, proximal_strength: float = 0.01,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
    client_weighting: Optional[str] = None,
    model_aggregator: Optional[ModelAggregator] = None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """FedProx (Li et al. 2020): local loss + (mu/2)||w - w_t||^2 (plug-ins as `build_fedavg`).

  Note: TFF 0.87's `build_weighted_fed_prox` adds mu * (w_t - w) to the gradient, the
  negative of the proximal term's gradient, so it pushes clients away from the global
  model. This builder uses the paper's sign; tests/test_baselines.py shows both facts.
  """
  if proximal_strength < 0:
    raise ValueError(f'proximal_strength must be >= 0, got {proximal_strength}')
  client_work = model_delta.build_model_delta_client_work(
      model_fn, client_optimizer_fn, client_batch_size,
      proximal_strength=proximal_strength,
      client_weighting=factories.resolve_client_weighting(client_weighting, model_aggregator),
      client_stages=client_stages)
  return compose_with_client_work(
      model_fn, client_work,
      server_optimizer_fn or tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      model_aggregator)


def build_fedsgd(
    model_fn, server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    client_batch_size: int = 256, *,
    client_weighting: Optional[str] = None,
    model_aggregator: Optional[ModelAggregator] = None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """FedSGD: each client uploads its full-batch mean gradient; server SGD (lr 0.1 default,
  as `tff.learning.algorithms.build_fed_sgd`). `client_batch_size` only bounds memory.
  `client_stages` as `build_fedavg` (`tff_algos.ClientStages`): guided, the upload is G*g;
  `kd_weight` > 0 is refused with the reason (no local step, so no KD term)."""
  client_work = model_delta.build_model_delta_client_work(
      model_fn, None, client_batch_size, full_gradient=True,
      client_weighting=factories.resolve_client_weighting(client_weighting, model_aggregator),
      client_stages=client_stages)
  return compose_with_client_work(
      model_fn, client_work,
      server_optimizer_fn or tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      model_aggregator)


def build_baseline(name: str, model_fn, client_optimizer_fn, client_batch_size: int,
                   **kwargs) -> tff.learning.templates.LearningProcess:
  """`build_<name>` by name ('fedavg', 'fedavgm', 'fedadam', 'fedprox', 'fedsgd'), as the
  programs choose a baseline from a flag; `**kwargs` go to that builder (for 'fedsgd',
  whose clients take no optimizer, `client_optimizer_fn` is ignored)."""
  if name == 'fedsgd':
    return build_fedsgd(model_fn, client_batch_size=client_batch_size, **kwargs)
  builders = dict(fedavg=build_fedavg, fedavgm=build_fedavgm, fedadam=build_fedadam,
                  fedprox=build_fedprox)
  if name not in builders:
    raise ValueError(f'unknown baseline {name!r}; choose one of {BASELINES}')
  return builders[name](model_fn, client_optimizer_fn, client_batch_size, **kwargs)
