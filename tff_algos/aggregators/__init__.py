"""Aggregation processes with server state (FedCross cross-aggregation, FedCDA's cross-round
cache, CADIS's similarity-matrix clustered weighting, SCAFFOLD's control variates), and the
mean over the clients that reported."""
from tff_algos.aggregators.cross_aggregation import build_cross_aggregation_process
from tff_algos.aggregators.cross_round_cache import (build_cross_round_cache_process,
                                                     build_replace_finalizer)
from tff_algos.aggregators.control_variates import build_control_variate_aggregation
from tff_algos.aggregators.clustered_aggregation import ClusteredAggregator
from tff_algos.aggregators.reporting import ReportingFactory, keep_unless_reported
