"""TFF aggregation factories on our methods: what each method's rule lets them wrap.

One place for the rules (docs/tff_integration.md, "Models and aggregators"):

* FedAvg family (FedAvg, FedAvgM, FedAdam, FedProx, FedSGD, FedLEx on them): the model
  delta is averaged, so any `tff.aggregators` factory applies, weighted or unweighted, as in
  TFF's `build_weighted_fed_avg` / `build_unweighted_fed_avg` (DP, clipping, zeroing,
  compression, robust wrappers).
* CADIS: the factory aggregates the deltas with CADIS's eq. 1 weights p_i, which the
  server computes from this round's uploads in a first aggregation and hands back to each
  client (`ClusteredAggregator(delta_aggregator=...)`, whose module doc has the rule): a
  weighted factory gets p_i as the client weight, an unweighted one (e.g. DP) gets K·p_i·Δ_i
  (K = the round's uploads), so that its uniform mean is Σ p_i Δ_i. The keyed
  `ClusteredAggregator` itself cannot be wrapped by TFF's wrappers (clipping, zeroing, DP):
  TFF refuses its value type (`client_index` is int32). Anonymous
  `ClusteredAggregator(None, C)` is an ordinary float-valued factory inside TFF's own
  builders.
* FedCross, FedCDA and SCAFFOLD refuse one (`refuse_model_aggregator` says why): their
  server rule needs each client's upload (SCAFFOLD: its control delta) individually, by slot
  or by client index, and an aggregation factory only ever delivers a sum over clients.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np
import tensorflow_federated as tff

from tff_algos.aggregators import reporting

ModelAggregator = Union[tff.aggregators.WeightedAggregationFactory,
                        tff.aggregators.UnweightedAggregationFactory]


def check_model_aggregator(model_aggregator, name: str = 'model_aggregator') -> None:
  """TypeError unless `model_aggregator` is None or a TFF aggregation factory."""
  if model_aggregator is not None and not isinstance(
      model_aggregator, (tff.aggregators.WeightedAggregationFactory,
                         tff.aggregators.UnweightedAggregationFactory)):
    raise TypeError(f'{name} must be a tff.aggregators.WeightedAggregationFactory or '
                    f'UnweightedAggregationFactory, got {type(model_aggregator).__name__}')


def resolve_client_weighting(client_weighting,
                             model_aggregator: Optional[ModelAggregator]) -> str:
  """The client weighting a FedAvg-family builder uses with `model_aggregator`.

  As TFF (`build_weighted_fed_avg` takes weighted factories, `build_unweighted_fed_avg`
  unweighted ones with uniform client weights): an unweighted factory (e.g.
  `tff.learning.dp_aggregator`, `tff.aggregators.DifferentiallyPrivateFactory`) means
  'uniform'; 'num_examples' with it is refused, since an unweighted factory cannot apply
  weights.
  """
  check_model_aggregator(model_aggregator)
  if isinstance(client_weighting, tff.learning.ClientWeighting):  # TFF's enum, as its builders
    client_weighting = {tff.learning.ClientWeighting.NUM_EXAMPLES: 'num_examples',
                        tff.learning.ClientWeighting.UNIFORM: 'uniform'}[client_weighting]
  unweighted = isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory)
  if client_weighting is None:
    return 'uniform' if unweighted else 'num_examples'
  if unweighted and client_weighting != 'uniform':
    raise ValueError(
        f'client_weighting={client_weighting!r} needs a weighted aggregator, but '
        f'{type(model_aggregator).__name__} is unweighted (it averages clients uniformly, '
        "like TFF's build_unweighted_fed_avg); use client_weighting='uniform'")
  return client_weighting


def create_model_aggregator(model_aggregator: Optional[ModelAggregator],
                            value_type: tff.Type) -> tff.templates.AggregationProcess:
  """A weighted aggregation process over `value_type` from a weighted or unweighted
  factory (default `MeanFactory`), averaging over the clients that reported (weight > 0)
  either way; its result is `reporting.reported_type(value_type)`, for a finalizer wrapped
  by `reporting.keep_unless_reported` (`tff_algos.aggregators.reporting`)."""
  return reporting.ReportingFactory(model_aggregator).create(
      value_type, tff.TensorType(np.float32))


def refuse_model_aggregator(method: str, model_aggregator, why: str) -> None:
  """One clear error when a method whose rule cannot take a factory is given one."""
  if model_aggregator is not None:
    raise ValueError(f'{method} cannot take model_aggregator='
                     f'{type(model_aggregator).__name__}: {why}')
