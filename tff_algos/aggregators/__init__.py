"""Aggregation processes with server state (FedCross cross-aggregation, FedCDA's cross-round
cache, CADIS's similarity-matrix clustered weighting, SCAFFOLD's control variates), and the
mean over the clients that reported.

Modules (docs/architecture.md has the whole map):

* `accumulate_then_step`: the template they share (accumulate, then one server step): keyed
  uploads into a dense accumulator, client-keyed rows, state size limits.
* `cache_selection`: the cache's layout (clients' models in chunks) and one round's
  divergence-aware selection, as pure TF functions.
* `clustered_aggregation`: CADIS's `ClusteredAggregator`: the factory, its keyed and
  anonymous modes, the upload accumulator.
* `clustering`: CADIS's clustering maths as pure TF functions (similarity matrix, clusters,
  weights, τ schedule, the reference code's quirks).
* `control_variates`: SCAFFOLD's server and per-client control variates.
* `cross_aggregation`: FedCross's collaborator choice and cross-aggregation over K
  middleware models.
* `cross_round_cache`: FedCDA's per-client cache as an AggregationProcess: its options and
  their checks, the state's size, the upload accumulator.
* `factories`: which TFF aggregation factories each method can wrap.
* `reporting`: the mean over the clients that reported (any TFF factory), and the finalizer
  that skips a round nobody reported in.
"""
from tff_algos.aggregators.cross_aggregation import build_cross_aggregation_process
from tff_algos.aggregators.cross_round_cache import (build_cross_round_cache_process,
                                                     build_replace_finalizer)
from tff_algos.aggregators.control_variates import build_control_variate_aggregation
from tff_algos.aggregators.clustered_aggregation import ClusteredAggregator
from tff_algos.aggregators.reporting import ReportingFactory, keep_unless_reported
