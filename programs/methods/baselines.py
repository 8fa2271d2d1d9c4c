"""The baselines (docs/algorithms.md#baselines): --algorithm=fedavg, fedavgm, fedadam, fedprox
and fedsgd, which read only general flags, and their builders in `tff_algos.baselines`."""

from __future__ import annotations

from programs.methods import registry

# Each builder is imported when a process is built (importing this file starts no
# TensorFlow: flags are checked first).


def build_fedavg(*args, **kwargs):
  """`tff_algos.baselines.build_fedavg`."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  return baselines.build_fedavg(*args, **kwargs)


def build_fedavgm(*args, **kwargs):
  """`tff_algos.baselines.build_fedavgm`."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  return baselines.build_fedavgm(*args, **kwargs)


def build_fedadam(*args, **kwargs):
  """`tff_algos.baselines.build_fedadam`."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  return baselines.build_fedadam(*args, **kwargs)


def build_fedprox(*args, **kwargs):
  """`tff_algos.baselines.build_fedprox`."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  return baselines.build_fedprox(*args, **kwargs)


def build_fedsgd(*args, **kwargs):
  """`tff_algos.baselines.build_fedsgd`."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  return baselines.build_fedsgd(*args, **kwargs)


METHODS = (
    registry.Method('fedavg', build_fedavg,
                    lambda config, i: (registry.head(config, i),
                                  dict(server_optimizer_fn=i.server_optimizer)),
                    reads=registry.OPTIMIZER_FLAGS),
    registry.Method('fedavgm', build_fedavgm,
                    lambda config, i: (registry.head(config, i),
                                  dict(server_learning_rate=registry.lr_or(1.0)(config),
                                       server_momentum=config.server_momentum)),
                    reads=('server_lr', 'server_momentum')),
    registry.Method('fedadam', build_fedadam,
                    lambda config, i: (registry.head(config, i),
                                  dict(server_learning_rate=registry.lr_or(1e-2)(config))),
                    reads=('server_lr',)),
    registry.Method('fedprox', build_fedprox,
                    lambda config, i: (registry.head(config, i),
                                  dict(proximal_strength=config.proximal_strength,
                                       server_optimizer_fn=i.server_optimizer)),
                    reads=registry.SERVER_FLAGS),
    registry.Method('fedsgd', build_fedsgd,
                    lambda config, i: ((i.model_fn,),
                                  dict(server_optimizer_fn=i.server_optimizer,
                                       client_batch_size=registry.fedsgd_batch(config))),
                    reads=registry.OPTIMIZER_FLAGS, local_steps=False),
)
