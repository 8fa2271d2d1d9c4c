"""Aggregation processes with server state (FedCross cross-aggregation, ...)."""
from tff_algos.aggregators.cross_aggregation import build_cross_aggregation_process
