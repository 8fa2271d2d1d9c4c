"""FedLEx's exploration within a run: the explorer clients, the exploration computation, the
guidance G a guided run starts from (explored, explored in place, or a placeholder installed
after round 1) and its refresh each round (--fedlex_refresh)."""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from programs import user_code
from programs.methods import registry
from programs.computations import check_distributable, client_optimizer
from programs.experiment_config import ExperimentConfig, ExperimentError, client_faults


class Guidance:
  """The exploration of one guided run (`is_guided`), between its rounds.

  `exploration` is None when the run explores nothing (--fedlex_guidance=placeholder without
  --fedlex_explore_in_place); `placeholder` is the all-ones G installed after round 1, set by
  `initial_state` for --fedlex_guidance=placeholder.
  """

  def __init__(self, config: ExperimentConfig, fed, process, model_fn, num_clients: int):
    self._c, self._fed, self._process = config, fed, process
    self.exploration = None
    self.explorers = np.zeros([0], np.int64)
    self.placeholder = None
    # The run's exploration bytes so far (every explorer's download, the reporting ones'
    # upload); `traffic`: one explorer's (`communication.ClientTraffic` of the exploration
    # computation).
    self.bytes = collections.OrderedDict(exploration_bytes_down=0, exploration_bytes_up=0)
    self.traffic = None
    if config.fedlex_guidance == 'exploration' or config.fedlex_explore_in_place:
      from tff_algos import communication  # pylint: disable=g-import-not-at-top
      self.exploration, self.explorers = exploration_computation(config, model_fn, num_clients)
      check_distributable(config, [self.exploration])
      self.traffic = communication.computation_traffic(
          self.exploration, self.exploration.type_signature.parameter[0].member)

  def _count_bytes(self, explorers, round_num: int) -> None:
    """Adds the bytes `explorers` move exploring at `round_num` (their inputs' draw: seed + 1,
    as `_explore`'s): each downloads, those whose draw lets them report upload."""
    faults = client_faults(self._c)
    reporting = sum(faults.work(self._c.seed + 1, round_num, int(n)) > 0 for n in explorers)
    moved = self.traffic.round_bytes(len(explorers), reporting)
    for direction in ('down', 'up'):
      self.bytes[f'exploration_bytes_{direction}'] += (
          moved[f'bytes_{direction}_payload'] + moved[f'bytes_{direction}_overhead'])

  def resume_bytes(self, last_row: Optional[dict]) -> None:
    """Takes up the exploration bytes where a resumed run's last kept row left them."""
    for key in self.bytes:
      if last_row and last_row.get(key) not in (None, ''):
        self.bytes[key] = int(float(last_row[key]))

  def initial_state(self, state):
    """(state, exploration metrics) round 1 starts from, for a run starting afresh."""
    c = self._c
    if self.exploration is not None:   # every explorer explores once (in place or not)
      self._count_bytes(self.explorers, 0)
    state, metrics, placeholder = _initial_state(c, self._fed, self._process,
                                                 self.exploration, self.explorers, state)
    if c.fedlex_guidance == 'placeholder':
      from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
      self.placeholder = placeholder if placeholder is not None else \
          fedlex.placeholder_guidance(self._process.get_model_weights(state).trainable,
                                      c.fedlex_guidance_floor)
    return state, metrics

  def after_round(self, round_num: int, sampled, runner, held):
    """(held, the refresh's client-epochs or None): the state after `round_num`'s training
    with the placeholder G installed (after round 1) or G refreshed by the round's sampled
    explorers (--fedlex_refresh)."""
    epochs = None
    if self.placeholder is not None and round_num == 1:
      from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
      state = fedlex.set_guidance(self._process, runner.materialize(held), self.placeholder)
      held = runner.adopt(state)
    if self.exploration is not None and self._c.fedlex_refresh:
      refreshing = np.intersect1d(sampled, self.explorers)
      self._count_bytes(refreshing, round_num)
      state, refresh_metrics = _explore(self._c, self._fed, self._process, self.exploration,
                                        refreshing, runner.materialize(held), round_num)
      held = runner.adopt(state)
      epochs = refresh_metrics['exploration_client_epochs']
    return held, epochs


def guidance(config: ExperimentConfig, fed, process, model_fn, num_clients: int) -> Optional[Guidance]:
  """The run's Guidance, None for a run FedLEx does not guide."""
  if not user_code.method(config.algorithm).is_guided(config):
    return None
  return Guidance(config, fed, process, model_fn, num_clients)


def fedlex_explorer_lr(config: ExperimentConfig) -> float:
  """The rate FedLEx's explorers train at: --fedlex_exploration_lr, or (0) --client_lr."""
  return config.fedlex_exploration_lr or config.client_lr



def exploration_computation(config: ExperimentConfig, model_fn, num_clients: int):
  """FedLEx's exploration computation and its (seeded, fixed) explorer clients."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  # Explorers train unguided: their rate is the base's, not a guided variant's raised one.
  client_opt = client_optimizer(config, fedlex_explorer_lr(config))
  exploration = fedlex.build_fedlex_exploration(
      model_fn, client_opt, config.batch_size, **registry.exploration_kwargs(config))
  return exploration, fedlex_explorers(config, num_clients)


def explored_initial_state(config: ExperimentConfig, fed, process, model_fn, num_clients: int):
  """(state, exploration metrics): `process.initialize()` with FedLEx's guidance explored as
  a run does before its first round (process and model_fn from `build_computations`)."""
  exploration, explorers = exploration_computation(config, model_fn, num_clients)
  return _explore(config, fed, process, exploration, explorers, process.initialize(), 0)


def fedlex_explorers(config: ExperimentConfig, num_clients: int) -> np.ndarray:
  """FedLEx's explorer clients: --fedlex_explorer_fraction of them, fixed by the seed."""
  count = max(1, int(round(config.fedlex_explorer_fraction * num_clients)))
  return np.sort(np.random.default_rng([config.seed, 7]).choice(num_clients, count, replace=False))


def _initial_state(config: ExperimentConfig, fed, process, exploration, explorers, state):
  """(state, exploration metrics, placeholder G or None) a guided run starts round 1 from:
  G explored (--fedlex_guidance=exploration) or not yet (placeholder: all ones), from the
  initial model or, with --fedlex_explore_in_place, the explorers' in-place training of it
  (each input one `tl_base` epoch, then the exploration epochs; the placeholder G then comes
  from the last explorer's `tl_base`, as the reference's)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  if not config.fedlex_explore_in_place:
    if exploration is None:
      return state, collections.OrderedDict(exploration_client_epochs=0.0), None
    return _explore(config, fed, process, exploration, explorers, state, 0) + (None,)
  _, inputs = data.round_inputs(fed, 0, len(explorers), 1 + config.fedlex_exploration_epochs,
                                config.seed + 1, client_ids=explorers, faults=client_faults(config))
  kwargs = registry.exploration_kwargs(config)
  try:
    weights, guidance, metrics = fedlex.explore_in_place(
        exploration, process.get_model_weights(state), [[x] for x in inputs],
        kwargs['normalize'], kwargs['guidance_floor'], config.fedlex_guidance)
  except ValueError as e:
    raise ExperimentError(f'--fedlex_explore_in_place: {e}; try a lower '
                          '--fedlex_exploration_lr') from None
  state = process.set_model_weights(state, weights)
  if config.fedlex_guidance == 'exploration':
    return fedlex.set_guidance(process, state, guidance), metrics, None
  return state, metrics, guidance


def _explore(config: ExperimentConfig, fed, process, exploration, explorers, state, round_num):
  """Runs FedLEx exploration on `explorers` from the state's global model."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  if len(explorers) == 0:
    return fedlex.refresh_guidance(process, exploration, state, [])
  _, inputs = data.round_inputs(fed, round_num, len(explorers), config.fedlex_exploration_epochs,
                                config.seed + 1, client_ids=explorers, faults=client_faults(config))
  return fedlex.explore_and_initialize(process, exploration, [[x] for x in inputs], state)
