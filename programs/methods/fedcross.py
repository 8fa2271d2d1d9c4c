"""--algorithm=fedcross (docs/algorithms.md#fedcross): its flags, their checks and its
builder, `tff_algos.fedcross.build_fedcross`."""

from __future__ import annotations

from typing import Optional

from programs.methods import registry
from programs.methods.registry import Flag, in_interval, one_of, non_negative
from tff_algos import constants

FLAGS = (
    Flag('fedcross_alpha', 0.99, f'FedCross alpha in {constants.FEDCROSS_ALPHA_INTERVAL}.',
         in_interval(constants.FEDCROSS_ALPHA_INTERVAL, constants.fedcross_alpha_is_valid),
         kwarg='alpha'),
    Flag('fedcross_selection', 'lowest_similarity',
         'FedCross collaborator rule: lowest_similarity, highest_similarity, in_order.',
         one_of(constants.FEDCROSS_SELECTIONS), kwarg='selection'),
    Flag('fedcross_similarity', 'model',
         'FedCross similarity of the similarity rules: model (cosine of whole models, the '
         'paper) or layerwise (sum of per-layer cosines, the authors\' code).',
         one_of(constants.FEDCROSS_SIMILARITIES), kwarg='similarity'),
    Flag('fedcross_alpha_schedule', False,
         'FedCross dynamic alpha: 0.5 -> alpha over accel rounds.', kwarg='alpha_schedule'),
    Flag('fedcross_num_propellers', 1,
         'FedCross propeller models during the accel rounds (1 .. clients_per_round - 1).',
         kwarg='num_propellers'),
    Flag('fedcross_accel_rounds', 0, 'FedCross acceleration rounds.', non_negative,
         kwarg='accel_rounds'),
)


def _check(config) -> Optional[str]:
  if not 1 <= config.fedcross_num_propellers < max(config.clients_per_round, 2):
    return (f'--fedcross_num_propellers must be in [1, clients_per_round - 1], got '
            f'{config.fedcross_num_propellers}')
  if config.fedcross_similarity != 'model' and config.fedcross_selection == 'in_order':
    return (f'--fedcross_similarity={config.fedcross_similarity} is read only by the similarity '
            'rules, not by --fedcross_selection=in_order; drop it or choose lowest_similarity '
            'or highest_similarity')
  return None


def build_fedcross(*args, **kwargs):
  """`tff_algos.fedcross.build_fedcross`, imported when a process is built (importing this
  file starts no TensorFlow: flags are checked first)."""
  from tff_algos import fedcross  # pylint: disable=g-import-not-at-top
  return fedcross.build_fedcross(*args, **kwargs)


METHOD = registry.Method(
    'fedcross', build_fedcross,
    lambda config, i: (registry.head(config, i) + (config.clients_per_round,), {}),
    flags=FLAGS, check=_check, server_rate=False)
