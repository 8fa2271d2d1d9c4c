"""The learning-rate schedule flags of programs/train.py (and study files): the clients' and
the server's rate each follow `tff_algos.schedules.Schedule`, computed inside the round.

  --client_lr_schedule / --server_lr_schedule     constant | exponential | step | cosine
  --client_lr_decay / --server_lr_decay           the factor (exponential: per round; step:
                                                  per --*_lr_decay_every rounds); given alone
                                                  (schedule constant) it means exponential
  --client_lr_decay_every / --server_lr_decay_every   rounds between step's decays
  --client_lr_floor / --server_lr_floor           cosine's last rate, a fraction of the rate
  --client_lr_warmup_rounds / --server_lr_warmup_rounds   linear warm-up before any of them

(--client_lr_decay is a general flag of its own, older than the others; its twins are here.)
Imports neither TensorFlow nor TFF: a flag error costs no TF start-up.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from programs import user_code

SIDES = ('client', 'server')
KINDS = ('constant', 'exponential', 'step', 'cosine')


@dataclasses.dataclass(frozen=True)
class _Flag:
  suffix: str     # the flag is --{side}_lr_{suffix}
  default: object
  help: str


_FLAGS = (
    _Flag('schedule', 'constant', 'The {side} learning rate\'s schedule: constant, exponential '
          '(times --{side}_lr_decay every round), step (times --{side}_lr_decay every '
          '--{side}_lr_decay_every rounds) or cosine (down to --{side}_lr_floor over --rounds); '
          'computed inside the round from the state, exact on resume.'),
    _Flag('decay', 1.0, 'The factor of --server_lr_schedule=exponential (per round) and step '
          '(per --server_lr_decay_every rounds); given alone it means exponential.'),
    _Flag('decay_every', 1, 'Rounds between the decays of --{side}_lr_schedule=step.'),
    _Flag('floor', 0.0, 'The last rate of --{side}_lr_schedule=cosine, as a fraction of the '
          '{side} learning rate, in [0, 1].'),
    _Flag('warmup_rounds', 0, 'Rounds of linear warm-up before the {side} schedule: round t <= '
          'this trains at t / (this + 1) of the rate.'),
)


def _name(side: str, suffix: str) -> str:
  return f'{side}_lr_{suffix}'


# --client_lr_decay is declared with the general flags (programs/train.py).
FLAGS = tuple((_name(side, f.suffix), f) for side in SIDES for f in _FLAGS
              if _name(side, f.suffix) != 'client_lr_decay')
FLAG_NAMES = tuple(name for name, _ in FLAGS)


def config_fields() -> list:
  """(name, type, dataclasses.field) of every flag declared here, for ExperimentConfig."""
  return [(name, type(f.default), dataclasses.field(default=f.default)) for name, f in FLAGS]


def define_absl_flags() -> dict:
  """Defines every flag declared here with absl; returns {name: FlagHolder}."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}
  return {name: define[type(f.default)](name, f.default, f.help.format(side=name.split('_')[0]))
          for name, f in FLAGS}


def _values(config, side: str) -> dict:
  return {f.suffix: getattr(config, _name(side, f.suffix)) for f in _FLAGS}


def _kind(v: dict) -> str:
  # --*_lr_decay alone: the exponential schedule (what --client_lr_decay always meant).
  return 'exponential' if v['schedule'] == 'constant' and v['decay'] != 1 else v['schedule']


def _problem(config, side: str) -> Optional[str]:
  v, flag = _values(config, side), lambda suffix: f'--{_name(side, suffix)}'  # noqa: E731
  if v['schedule'] not in KINDS:
    return f'{flag("schedule")}={v["schedule"]!r} is unknown; choose one of {", ".join(KINDS)}'
  if not 0 < v['decay'] < math.inf:
    return f'{flag("decay")} must be a number > 0 (1 = no decay), got {v["decay"]}'
  if v['decay_every'] < 1:
    return f'{flag("decay_every")} must be at least 1, got {v["decay_every"]}'
  if not 0 <= v['floor'] <= 1:
    return f'{flag("floor")} must be in [0, 1], got {v["floor"]}'
  if v['warmup_rounds'] < 0:
    return f'{flag("warmup_rounds")} must be at least 0, got {v["warmup_rounds"]}'
  kind = _kind(v)
  if kind in ('exponential', 'step') and v['decay'] == 1:
    return (f'{flag("schedule")}={kind} needs {flag("decay")} (its factor) other than 1; add '
            'it or drop the schedule')
  if v['decay'] != 1 and kind == 'cosine':
    return f'{flag("decay")} is not used by {flag("schedule")}=cosine; drop it'
  if v['decay_every'] != 1 and kind != 'step':
    return f'{flag("decay_every")} is used only with {flag("schedule")}=step; add that or drop it'
  if v['floor'] != 0 and kind != 'cosine':
    return f'{flag("floor")} is used only with {flag("schedule")}=cosine; add that or drop it'
  if kind == 'cosine' and v['warmup_rounds'] >= config.rounds:
    return (f'{flag("warmup_rounds")}={v["warmup_rounds"]} leaves no round of the cosine in '
            f'--rounds={config.rounds}; lower it')
  return None


def problem(config) -> Optional[str]:
  """The one-line error of the first bad schedule flag of `config` (ExperimentConfig), or
  None; a schedule of a rate the method does not have is one."""
  method = user_code.method(config.algorithm)   # the registry's, or the user's builder
  for side in SIDES:
    error = _problem(config, side)
    if error:
      return error
  try:
    client, server = schedules(config)
  except ValueError as e:   # e.g. a whole number given as 2.5 in a study file
    return f'the learning-rate schedule flags: {e}'
  if not client.is_constant and not method.local_steps:
    return (f'--client_lr_schedule: {config.algorithm} takes no local step (one full-batch '
            'gradient per client), so it has no client learning rate to schedule; drop the '
            'client schedule flags or use --server_lr_schedule')
  if not server.is_constant and not method.server_rate:
    return (f'--server_lr_schedule: {config.algorithm} takes no server optimizer step, so it '
            'has no server learning rate to schedule; drop the server schedule flags')
  return None


def schedules(config):
  """(client, server) `tff_algos.schedules.Schedule` of a valid `config`."""
  from tff_algos import schedules as lib  # pylint: disable=g-import-not-at-top  (no TF import)
  out = []
  for side in SIDES:
    v = _values(config, side)
    kind = _kind(v)
    out.append(lib.Schedule(
        kind, decay=float(v['decay']), every=int(v['decay_every']), floor=float(v['floor']),
        rounds=int(config.rounds) if kind == 'cosine' else 0,
        warmup_rounds=int(v['warmup_rounds'])))
  return tuple(out)


def uses_rounds(config) -> bool:
  """True when a schedule of `config` depends on --rounds (a cosine one): then --rounds
  defines the run (a resume may not change it)."""
  return any(s.kind == 'cosine' and not s.is_constant for s in schedules(config))
