"""TFF aggregation factories on our methods: what each method's rule lets them wrap.

One place for the rules (README, "Aggregators"):

* FedAvg family (FedAvg, FedAvgM, FedAdam, FedProx, FedSGD, FedLEx on them): the model
  delta is averaged, so any `tff.aggregators` factory applies, weighted or unweighted, as in
  TFF's `build_weighted_fed_avg` / `build_unweighted_fed_avg` (DP, clipping, zeroing,
  compression, robust wrappers).
* FedCross, FedCDA and CADIS refuse one (`refuse_model_aggregator` says why): their server rule
  needs each client's upload individually, by slot or by client index (CADIS: its weights
  come from clusters computed on the server from the uploads themselves), and an
  aggregation factory only ever delivers a sum over clients. For the same reason TFF's
  wrappers (clipping, zeroing, DP) cannot wrap the keyed `ClusteredAggregator`: TFF refuses
  its value type (`client_index` is int32). Anonymous `ClusteredAggregator(None, C)` is an
  ordinary float-valued factory inside TFF's own builders.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np
import tensorflow_federated as tff

ModelAggregator = Union[tff.aggregators.WeightedAggregationFactory,
                        tff.aggregators.UnweightedAggregationFactory]


def resolve_client_weighting(client_weighting: Optional[str],
                             model_aggregator: Optional[ModelAggregator]) -> str:
  """The client weighting a FedAvg-family builder uses with `model_aggregator`.

  As TFF (`build_weighted_fed_avg` takes weighted factories, `build_unweighted_fed_avg`
  unweighted ones with uniform client weights): an unweighted factory (e.g.
  `tff.learning.dp_aggregator`, `tff.aggregators.DifferentiallyPrivateFactory`) means
  'uniform'; 'num_examples' with it is refused, since an unweighted factory cannot apply
  weights.
  """
  unweighted = isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory)
  if model_aggregator is not None and not unweighted and not isinstance(
      model_aggregator, tff.aggregators.WeightedAggregationFactory):
    raise TypeError('model_aggregator must be a tff.aggregators.WeightedAggregationFactory '
                    'or UnweightedAggregationFactory, got '
                    f'{type(model_aggregator).__name__}')
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
  factory (default `MeanFactory`); unweighted ones ignore the weight, as in TFF."""
  factory = model_aggregator or tff.aggregators.MeanFactory()
  if isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
    factory = tff.aggregators.as_weighted_aggregator(factory)
  return factory.create(value_type, tff.TensorType(np.float32))



def refuse_model_aggregator(method: str, model_aggregator, why: str) -> None:
  """One clear error when a method whose rule cannot take a factory is given one."""
  if model_aggregator is not None:
    raise ValueError(f'{method} cannot take model_aggregator='
                     f'{type(model_aggregator).__name__}: {why}')
