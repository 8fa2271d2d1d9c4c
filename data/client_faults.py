"""Seeded client faults: which sampled clients drop out and how much of their work the
stragglers run, as each client input's `work` field (`data.round_sampling`).

A client's work in round r is drawn from default_rng([seed, r, client_index, 2]): three
uniforms u_drop, u_straggle, u_share, always all three, so runs differing only in their
fault rates see the same clients drop or lag (a dropout-only and a straggler-only run of one
seed pair up client by client). Then

    work = 0                                  if u_drop < client_dropout (never reports)
         = w + (1 - w) * u_share              elif u_straggle < straggler_fraction
         = 1                                  otherwise

with w = straggler_min_work: a straggler runs the share `work` in [w, 1] of its local steps
(tff_algos/client_work/local_training.py). Standard library and NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ['ClientFaults']


def _number(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
      or not math.isfinite(value):
    raise ValueError(f'{name} must be a finite number, got {value!r}')
  return float(value)


class ClientFaults:
  """The fault rates of a federation; `work(seed, round_num, client_index)` draws one
  client's `work` (see the module doc).

  Args:
    client_dropout: p in [0, 1): the chance a sampled client never reports.
    straggler_fraction: f in [0, 1]: the chance a reporting client is a straggler.
    straggler_min_work: w in (0, 1]: the least share of its steps a straggler runs.
  """

  def __init__(self, client_dropout: float = 0.0, straggler_fraction: float = 0.0,
               straggler_min_work: float = 0.5):
    self.client_dropout = _number('client_dropout', client_dropout)
    self.straggler_fraction = _number('straggler_fraction', straggler_fraction)
    self.straggler_min_work = _number('straggler_min_work', straggler_min_work)
    if not 0.0 <= self.client_dropout < 1.0:
      raise ValueError(f'client_dropout must be in [0, 1) (0 = every client reports; 1 would '
                       f'leave no round with a report), got {client_dropout}')
    if not 0.0 <= self.straggler_fraction <= 1.0:
      raise ValueError(f'straggler_fraction must be in [0, 1] (0 = no straggler), got '
                       f'{straggler_fraction}')
    if not 0.0 < self.straggler_min_work <= 1.0:
      raise ValueError(f'straggler_min_work must be in (0, 1] (the least share of its steps '
                       f'a straggler runs; 0 would be a dropout), got {straggler_min_work}')

  def work(self, seed: int, round_num: int, client_index: int) -> float:
    """Client `client_index`'s work in round `round_num`: 0 (drops), or the share in (0, 1]
    of its local steps it runs."""
    u_drop, u_straggle, u_share = np.random.default_rng(
        [int(seed), int(round_num), int(client_index), 2]).random(3)
    if u_drop < self.client_dropout:
      return 0.0
    if u_straggle < self.straggler_fraction:
      w = self.straggler_min_work
      return float(w + (1.0 - w) * u_share)
    return 1.0

  def __repr__(self) -> str:
    return (f'ClientFaults(client_dropout={self.client_dropout}, straggler_fraction='
            f'{self.straggler_fraction}, straggler_min_work={self.straggler_min_work})')
