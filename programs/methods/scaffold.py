"""--algorithm=scaffold (Karimireddy et al. 2020, option II; docs/algorithms.md#scaffold): its
flags, their checks, its summary entries and its builder, `tff_algos.scaffold.build_scaffold`."""

from __future__ import annotations

from typing import Optional

from programs.methods import registry
from programs.methods.registry import Flag, one_of, positive
from tff_algos import constants

FLAGS = (
    Flag('scaffold_server_lr', 1.0, 'SCAFFOLD: global learning rate eta_g (x += eta_g * mean '
         'of y_i - x).', positive, kwarg='server_learning_rate'),
    Flag('scaffold_client_weighting', 'uniform',
         'SCAFFOLD: weights of the model-delta mean: uniform (the paper) or num_examples.',
         one_of(constants.CLIENT_WEIGHTINGS), kwarg='client_weighting'),
    Flag('scaffold_max_control_gib', 4.0,
         'SCAFFOLD: refuse control variates (4*N*D bytes) above this many GiB.', positive,
         kwarg='max_control_gib'),
)


def _check(config) -> Optional[str]:
  if config.client_optimizer != 'sgdm' or config.client_momentum != 0:
    return ('--algorithm=scaffold needs plain client SGD (option II\'s control variate '
            '(x - y_i) / (K_i * lr) is the mean gradient of the local steps only without '
            'momentum or Adam): add --client_momentum=0 (and --client_optimizer=sgdm)')
  return None


def _summary(run: registry.RunRecord) -> dict:
  """The control variates' size: the formula's bytes beside the measured aggregator state."""
  from tff_algos.aggregators import control_variates  # pylint: disable=g-import-not-at-top
  d = registry.num_weights(run.model_weights.trainable)
  return dict(
      scaffold_state_formula_bytes=control_variates.state_size_bytes(run.num_clients, d),
      scaffold_control_formula=(f'4*N*D = 4*{run.num_clients}*{d} bytes of client control '
                                'variates + 4*D (c) + 4*N (update counts)'))


def build_scaffold(*args, **kwargs):
  """`tff_algos.scaffold.build_scaffold`, imported when a process is built (importing this
  file starts no TensorFlow: flags are checked first)."""
  from tff_algos import scaffold  # pylint: disable=g-import-not-at-top
  return scaffold.build_scaffold(*args, **kwargs)


METHOD = registry.Method(
    'scaffold', build_scaffold,
    lambda config, i: (registry.head(config, i) + (i.num_clients, config.clients_per_round), {}),
    flags=FLAGS, check=_check, errors=(ValueError,), error_prefix='--algorithm=scaffold: ',
    summary=_summary)
