"""tff_algos: FedCross, FedCDA, CADIS and FedLEx for TensorFlow Federated, with their baselines.

Every method is built by a `build_<method>` function returning a
`tff.learning.templates.LearningProcess`; see README.md.
"""
from tff_algos import execution
from tff_algos.baselines import (
    BASELINES, build_baseline, build_fedadam, build_fedavg, build_fedavgm, build_fedprox,
    build_fedsgd)
from tff_algos.cadis import build_cadis
from tff_algos.fedcda import build_fedcda
from tff_algos.fedcross import build_fedcross
from tff_algos.fedlex import build_fedlex, build_fedlex_exploration
