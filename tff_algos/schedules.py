"""Learning-rate schedules for the clients' and the server's rates, computed inside the round.

A `Schedule` is a factor on the rate an optimizer was built with, by round (1-based):

* `constant`: 1;
* `exponential`: `decay ** (s - 1)`, as a PyTorch `ExponentialLR(gamma=decay)` stepped once a
  round;
* `step`: `decay ** floor((s - 1) / every)`, `decay` every `every` rounds (`StepLR`);
* `cosine`: from 1 down to `floor` over the run's rounds after the warm-up, the last one
  training at `floor` (half a cosine period); later rounds stay at `floor`;

where `s = t - warmup_rounds` counts the rounds after a linear warm-up: round `t <=
warmup_rounds` trains at `t / (warmup_rounds + 1)` of the rate, so the rate rises in equal
steps to the schedule's first round. `factor(t)` is the TF form, `factor_np(t)` its NumPy
twin (both in float64).

`with_lr_schedules(process, client=..., server=...)` is `process` whose client rate
(`get_hparams(state)['client_work']['learning_rate']`) and server rate
(`['finalizer']['learning_rate']`, a server optimizer's) follow their schedules: the rate of
round t is the built rate times `factor(t)`, rounded to the rate's dtype (float32), written
into the state before round t runs. The round number and the built rates live in the state,
so `get_hparams` reports the rate the next round trains at and a checkpointed state resumes
exactly where it stopped. The round's metrics add the scheduled rates it trained at under
`learning_rate/client` and `learning_rate/server` (metrics.csv's columns).

Where they live: the wrapped state is the process's `LearningAlgorithmState` whose
`distributor` field holds `<distributor=(the process's own distributor state), round_num,
base_rates>`; `get_model_weights`, `set_model_weights`, `get_hparams` and `set_hparams` are
the process's, through that field. A rate put in by `set_hparams` trains the next round only:
the schedule writes its own after it.

A client `exponential` schedule without warm-up and without a server schedule is
`tff_algos.client_lr_decay.with_client_lr_decay` (the rate multiplied in the state each
round, the state's type unchanged), so `--client_lr_decay` runs as before.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Optional

import numpy as np

KINDS = ('constant', 'exponential', 'step', 'cosine')
LEARNING_RATE = 'learning_rate'
# The hparams part whose learning rate each schedule sets.
CLIENT, SERVER = 'client_work', 'finalizer'
# The round's metrics key of the scheduled rates it trained at, 'client' and 'server'.
METRICS_KEY = 'learning_rate'
SIDE = {CLIENT: 'client', SERVER: 'server'}


def _number(value) -> bool:
  return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A rate's factor by round: see the module docstring.

  Attributes:
    kind: one of KINDS.
    decay: the factor of `exponential` (per round) and `step` (per `every` rounds), > 0.
    every: the rounds between `step`'s decays, >= 1.
    floor: `cosine`'s last factor, in [0, 1].
    rounds: the run's rounds, warm-up included (`cosine` only), > warmup_rounds.
    warmup_rounds: rounds of linear warm-up before the schedule, >= 0.
  """

  kind: str = 'constant'
  decay: float = 1.0
  every: int = 1
  floor: float = 0.0
  rounds: int = 0
  warmup_rounds: int = 0

  def __post_init__(self):
    problem = self.problem()
    if problem:
      raise ValueError(problem)

  def problem(self) -> Optional[str]:
    """What is wrong with the schedule, or None."""
    if self.kind not in KINDS:
      return f'kind={self.kind!r} is unknown; choose one of {", ".join(KINDS)}'
    for name in ('every', 'rounds', 'warmup_rounds'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return f'{name} must be a whole number, got {value!r}'
    if not _number(self.decay) or self.decay <= 0:
      return f'decay must be a finite number > 0, got {self.decay!r}'
    if self.every < 1:
      return f'every must be at least 1, got {self.every}'
    if not _number(self.floor) or not 0 <= self.floor <= 1:
      return f'floor must be in [0, 1], got {self.floor!r}'
    if self.warmup_rounds < 0:
      return f'warmup_rounds must be at least 0, got {self.warmup_rounds}'
    if self.kind == 'cosine' and self.rounds <= self.warmup_rounds:
      return (f'a cosine schedule needs rounds > warmup_rounds, got rounds={self.rounds}, '
              f'warmup_rounds={self.warmup_rounds}')
    if self.kind != 'cosine' and self.rounds:
      return f'rounds is read by a cosine schedule only, got kind={self.kind!r}'
    unread = dict(decay=(1.0, ('exponential', 'step')), every=(1, ('step',)),
                  floor=(0.0, ('cosine',)))
    for name, (default, kinds) in unread.items():
      if getattr(self, name) != default and self.kind not in kinds:
        return f'{name} is read by a {" or ".join(kinds)} schedule only, got kind={self.kind!r}'
    return None

  @property
  def is_constant(self) -> bool:
    """True when every round's factor is 1."""
    return self.warmup_rounds == 0 and (
        self.kind == 'constant' or (self.kind in ('exponential', 'step') and self.decay == 1)
        or (self.kind == 'cosine' and self.floor == 1))

  def factor_np(self, round_num: int) -> float:
    """The factor of round `round_num` (1-based), NumPy float64."""
    t, w = int(round_num), self.warmup_rounds
    if t <= w:
      return t / (w + 1)
    s = t - w
    if self.kind == 'exponential':
      return float(np.float64(self.decay) ** (s - 1))
    if self.kind == 'step':
      return float(np.float64(self.decay) ** ((s - 1) // self.every))
    if self.kind == 'cosine':
      progress = min((s - 1) / max(self.rounds - w - 1, 1), 1.0)
      return float(self.floor + (1 - self.floor) * 0.5 * (1 + np.cos(np.pi * progress)))
    return 1.0

  def factor(self, round_num):
    """The factor of round `round_num` (1-based; an integer tensor), a float64 tensor."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    t = tf.cast(round_num, tf.float64)
    w = tf.constant(self.warmup_rounds, tf.float64)
    s = t - w
    if self.kind == 'exponential':
      after = tf.pow(tf.constant(self.decay, tf.float64), s - 1)
    elif self.kind == 'step':
      after = tf.pow(tf.constant(self.decay, tf.float64), tf.math.floordiv(s - 1, float(self.every)))
    elif self.kind == 'cosine':
      span = tf.constant(max(self.rounds - self.warmup_rounds - 1, 1), tf.float64)
      progress = tf.minimum((s - 1) / span, 1.0)
      after = self.floor + (1 - self.floor) * 0.5 * (1 + tf.cos(math.pi * progress))
    else:
      after = tf.constant(1.0, tf.float64)
    return tf.where(t <= w, t / (w + 1), after)


def _rate_parts(hparams_type) -> set:
  """The hparams parts (CLIENT, SERVER) that hold a learning rate."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  names = lambda t: set(dir(t)) if isinstance(t, tff.StructType) else set()  # noqa: E731
  return {part for part in (CLIENT, SERVER)
          if part in names(hparams_type) and LEARNING_RATE in names(hparams_type[part])}


def with_lr_schedules(process, client: Optional[Schedule] = None,
                      server: Optional[Schedule] = None):
  """`process` with its client and server learning rates following `client` and `server`.

  Args:
    process: a `tff.learning.templates.LearningProcess` with TFF's hparams API whose state is
      a `LearningAlgorithmState` (every builder of this package, TFF's own composed
      processes).
    client: the client rate's schedule (`['client_work']['learning_rate']`, the client
      optimizer's: methods with local steps), or None for a constant one.
    server: the server rate's schedule (`['finalizer']['learning_rate']`, the server
      optimizer's), or None for a constant one.

  Returns:
    `process` itself when both schedules are constant; else a `LearningProcess` as described
    in the module docstring.

  Raises:
    ValueError: a schedule for a rate the process does not have (named), or a process without
      the hparams API or a `LearningAlgorithmState`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import client_lr_decay  # pylint: disable=g-import-not-at-top
  if not isinstance(process, tff.learning.templates.LearningProcess):
    raise TypeError('with_lr_schedules wraps a tff.learning.templates.LearningProcess, '
                    f'got {type(process).__name__}')
  for name, schedule in (('client', client), ('server', server)):
    if schedule is not None and not isinstance(schedule, Schedule):
      raise TypeError(f'{name} must be a tff_algos.schedules.Schedule or None, '
                      f'got {type(schedule).__name__}')
  schedules = collections.OrderedDict(
      (part, s) for part, s in ((CLIENT, client), (SERVER, server))
      if s is not None and not s.is_constant)
  if not schedules:
    return process
  if process.get_hparams is None or process.set_hparams is None:
    raise ValueError('a learning-rate schedule needs a process with get_hparams and '
                     'set_hparams (TFF\'s hparams API)')
  hparams_type = process.get_hparams.type_signature.result
  present = _rate_parts(hparams_type)
  if CLIENT in schedules and CLIENT not in present:
    raise ValueError(
        'a client learning-rate schedule needs a client optimizer with a learning rate in the '
        "process's hparams (['client_work']['learning_rate']); this process's hparams are "
        f'{hparams_type} (FedSGD and FedLEx-SGD take no local step, so no client rate)')
  if SERVER in schedules and SERVER not in present:
    raise ValueError(
        'a server learning-rate schedule needs a server optimizer with a learning rate in the '
        "process's hparams (['finalizer']['learning_rate']); this process's hparams are "
        f'{hparams_type} (FedCross and FedCDA take no server step)')
  if (list(schedules) == [CLIENT] and client.kind == 'exponential'
      and client.warmup_rounds == 0):
    return client_lr_decay.with_client_lr_decay(process, float(client.decay))

  inner_type = process.initialize.type_signature.result.member
  if (not isinstance(inner_type, tff.StructWithPythonType)
      or inner_type.python_container is not tff.learning.templates.LearningAlgorithmState):
    raise ValueError('a learning-rate schedule keeps its round number in a '
                     f'LearningAlgorithmState; this process\'s state is {inner_type}')

  def with_distributor(state, distributor):
    return tff.learning.templates.LearningAlgorithmState(
        global_model_weights=state.global_model_weights, distributor=distributor,
        client_work=state.client_work, aggregator=state.aggregator, finalizer=state.finalizer)

  def scheduled_hparams(hparams, base_rates, round_num):
    """`hparams` with each scheduled rate at round `round_num`'s."""
    def rate(part):
      base = base_rates[part]
      return tf.cast(tf.cast(base, tf.float64) * schedules[part].factor(round_num), base.dtype)
    return type(hparams)(
        (part, type(values)((name, rate(part) if name == LEARNING_RATE else value)
                            for name, value in values.items()) if part in schedules else values)
        for part, values in hparams.items())

  def wrapped(state, round_num, base_rates):
    """The process's `state` wrapped, its rates set for round `round_num + 1`."""
    state = process.set_hparams(
        state, scheduled_hparams(process.get_hparams(state), base_rates, round_num + 1))
    return with_distributor(state, collections.OrderedDict(
        distributor=state.distributor, round_num=round_num, base_rates=base_rates))

  @tff.tensorflow.computation(inner_type)
  def first_state(state):
    hparams = process.get_hparams(state)
    base_rates = collections.OrderedDict(
        (part, hparams[part][LEARNING_RATE]) for part in schedules)
    return wrapped(state, tf.constant(0, tf.int32), base_rates)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_map(first_state, process.initialize())

  state_type = initialize_fn.type_signature.result.member

  def unwrapped(state):
    return with_distributor(state, state.distributor['distributor'])

  @tff.tensorflow.computation(state_type)
  def inner_state(state):
    return unwrapped(state)

  @tff.tensorflow.computation(inner_type, state_type)
  def after_round(new_state, old_state):
    schedule = old_state.distributor
    return wrapped(new_state, schedule['round_num'] + 1, schedule['base_rates'])

  @tff.tensorflow.computation(state_type)
  def rates_of(state):
    hparams = process.get_hparams(unwrapped(state))
    return collections.OrderedDict((SIDE[part], hparams[part][LEARNING_RATE])
                                   for part in schedules)

  metrics_type = process.next.type_signature.result.metrics.member

  @tff.tensorflow.computation(metrics_type, rates_of.type_signature.result)
  def with_rates(metrics, rates):
    return collections.OrderedDict(list(metrics.items()) + [(METRICS_KEY, rates)])

  data_type = process.next.type_signature.parameter[1]

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER), data_type)
  def next_fn(state, client_data):
    out = process.next(tff.federated_map(inner_state, state), client_data)
    metrics = tff.federated_map(with_rates, (out.metrics, tff.federated_map(rates_of, state)))
    return tff.learning.templates.LearningProcessOutput(
        tff.federated_map(after_round, (out.state, state)), metrics)

  def rewrapped(new_state, old_state):
    schedule = old_state.distributor
    return with_distributor(new_state, collections.OrderedDict(
        distributor=new_state.distributor, round_num=schedule['round_num'],
        base_rates=schedule['base_rates']))

  weights_type = process.get_model_weights.type_signature.result

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return process.get_model_weights(unwrapped(state))

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    return rewrapped(process.set_model_weights(unwrapped(state), weights), state)

  @tff.tensorflow.computation(state_type)
  def get_hparams(state):
    return process.get_hparams(unwrapped(state))

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams(state, hparams):
    return rewrapped(process.set_hparams(unwrapped(state), hparams), state)

  return tff.learning.templates.LearningProcess(
      initialize_fn, next_fn, get_model_weights, set_model_weights,
      get_hparams_fn=get_hparams, set_hparams_fn=set_hparams)
