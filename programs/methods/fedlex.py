"""FedLEx's four variants (docs/algorithms.md#fedlex): --algorithm=fedlex_avgm, fedlex_sgd,
fedlex_opt and fedlex_prox, guided presets of one builder, `tff_algos.fedlex.build_fedlex`.
Their exploration flags are general (any --guided run reads them): programs/methods/registry.py.
"""

from __future__ import annotations

from typing import Callable

from programs.methods import registry


def build_fedlex(*args, **kwargs):
  """`tff_algos.fedlex.build_fedlex`, imported when a process is built (importing this file
  starts no TensorFlow: flags are checked first)."""
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  return fedlex.build_fedlex(*args, **kwargs)


def _variant(base: str, reads: tuple, kwargs: Callable) -> registry.Method:
  def arguments(config, i):
    if base == 'sgd':
      return (i.model_fn, None, registry.fedsgd_batch(config), base), kwargs(config, i)
    return (i.model_fn, i.client_optimizer, config.batch_size, base), kwargs(config, i)
  return registry.Method(f'fedlex_{base}', build_fedlex, arguments, reads=reads, guided=True,
                         local_steps=base != 'sgd')


METHODS = (
    _variant('avgm', ('server_lr', 'server_momentum'),
             lambda config, i: dict(server_learning_rate=registry.lr_or(1.0)(config),
                               server_momentum=config.server_momentum)),
    _variant('sgd', registry.OPTIMIZER_FLAGS,
             lambda config, i: dict(server_optimizer_fn=i.server_optimizer)),
    _variant('opt', ('server_lr',),
             lambda config, i: dict(server_learning_rate=registry.lr_or(1e-2)(config))),
    _variant('prox', registry.SERVER_FLAGS,
             lambda config, i: dict(proximal_strength=config.proximal_strength,
                               server_optimizer_fn=i.server_optimizer)),
)
