"""When a run stops early: stop signals (StopRequests, Interrupted), diverged training and
blown-up local training (BLOWN_UP_LOSS, --blown_up_rounds), with the messages they print."""

from __future__ import annotations

import math
import os
import signal
from typing import Optional

from programs.experiment_config import ExperimentError

# A round's mean client training loss above this (cross-entropy starts near ln 10 = 2.3) means
# local training blew up without overflowing. Such a model often stays at chance (a FedLEx-Prox
# suite run lost its seed so: benchmarks/results/fedlex/diagnosis.md), so each such round is
# announced and --blown_up_rounds of them in a row stop the run, checkpointed.
BLOWN_UP_LOSS = 1e4


def blew_up(train_loss: float) -> bool:
  return math.isfinite(train_loss) and train_loss > BLOWN_UP_LOSS


def blown_up_warning(round_num: int, train_loss: float, client_lr: float, in_a_row: int = 1,
                     stop_after: int = 0) -> str | None:
  """The warning for a finite round loss above BLOWN_UP_LOSS, else None; `in_a_row` counts
  this round among the consecutive blown-up ones, `stop_after` is --blown_up_rounds."""
  if not blew_up(train_loss):
    return None
  persists = f' ({in_a_row} rounds in a row)' if in_a_row > 1 else ''
  stops = (f'; the run stops after {stop_after} such rounds in a row (--blown_up_rounds=0 goes '
           'on)' if stop_after else '')
  return (f'warning: round {round_num}: the clients\' training loss is {train_loss:.2g}{persists}: '
          'local training blew up, and the model may not recover (test accuracy at chance); '
          f'consider a lower --client_lr (now {client_lr:g}) or server learning rate{stops}')


def blown_up_rounds_in_a_row(rows: list) -> int:
  """How many of metrics.csv's last rows (dicts) had a blown-up client training loss (rows
  of rounds nobody reported in are passed over, as the training loop does)."""
  count = 0
  for row in reversed(rows):
    if row.get('reported_clients') not in (None, '') and not float(row['reported_clients']):
      continue
    loss = float(row.get('client_work/train/loss') or 'nan')
    if not blew_up(loss):
      break
    count += 1
  return count


class Interrupted(Exception):
  """A stop signal reached the training loop, which stopped at a safe point.

  Attributes: signum (the signal), last_round (the last finished and checkpointed round,
  0 if none), experiment_dir.
  """

  def __init__(self, signum: int, last_round: int, experiment_dir: str):
    self.signum, self.last_round, self.experiment_dir = signum, last_round, experiment_dir
    name = signal.Signals(signum).name
    if last_round:
      message = (f'interrupted by {name}: round {last_round} is the last finished and '
                 f'checkpointed round; rerun with --resume to continue')
    else:
      message = f'interrupted by {name} before any round finished; nothing was checkpointed'
    super().__init__(message)

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


class StopRequests:
  """Turns SIGINT/SIGTERM into a request the training loop honours at its next safe point.

  The handler only records the signal: raising from it (as KeyboardInterrupt does) can land
  inside a callback where Python ignores exceptions (TF's garbage-collector callback), and
  the signal is lost. `run_experiment` checks `signum` between rounds, after the checkpoint,
  so a stop never leaves a half-written round. A second signal exits at once (exit code
  128 + signal; the worker dies with the process and the last checkpoint is intact).

  Use as a context manager in the main thread; the previous handlers come back on exit.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      os.write(2, f'\n{signal.Signals(signum).name} again: stopping now\n'.encode())
      os._exit(128 + signum)  # pylint: disable=protected-access
    self.signum = signum
    # os.write: print() is not reentrant and the handler may interrupt a print.
    os.write(2, f'\n{signal.Signals(signum).name}: stopping after the current round '
                '(send it again to stop now)\n'.encode())

  def __enter__(self) -> 'StopRequests':
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


def _client_count(metrics: dict, name: str) -> int:
  """The round's client-work count `name` (a flattened metric ending in it)."""
  return int(round(sum(v for k, v in metrics.items()
                       if k.split('/')[-1] == name and isinstance(v, (int, float)))))


def dropped_clients(metrics: dict) -> int:
  """Clients whose non-finite update the round left out (client work's non_finite_clients)."""
  return _client_count(metrics, 'non_finite_clients')


def dropped_warning(round_num: int, dropped: int, reported: int) -> str:
  """The warning for a round that left out non-finite updates of its `reported` reporting
  clients."""
  return (f'warning: round {round_num}: {dropped} of {reported} clients '
          'had non-finite updates and were left out; consider a lower --client_lr')


def nobody_reported_warning(round_num: int, clients_per_round: int) -> str:
  """The note for a round none of whose sampled clients reported (--client_dropout)."""
  return (f'warning: round {round_num}: none of the {clients_per_round} sampled clients '
          'reported (--client_dropout); the round trained nothing')


def divergence(round_num: int, train_loss: float, dropped: int, reported: int) -> str:
  """'' or, when every reporting client's update was non-finite or the round's loss is, the
  one line saying so ('training diverged at round N (why)'; the run records it too). A round
  nobody reported in (reported 0, loss 0) has not diverged."""
  if (reported and dropped >= reported) or not math.isfinite(train_loss):
    why = (f'all {dropped} reporting clients\' updates were non-finite'
           if reported and dropped >= reported else f'train loss {train_loss}')
    return f'training diverged at round {round_num} ({why})'
  return ''


def diverged_error(diverged: str, checkpointed: int, ckpt_dir: str,
                   client_lr: float) -> ExperimentError:
  """The error ending a run whose training diverged (`diverged`: `divergence`'s line)."""
  again = ('start a new run (another --experiment_name: rounds up to '
           f'{checkpointed} are checkpointed in {ckpt_dir})' if checkpointed
           else 'start again')
  return ExperimentError(
      f'{diverged}; {again} with a lower --client_lr (now {client_lr}) or server '
      'learning rate')


def blown_up_error(round_num: int, in_a_row: int, last_round: int, ckpt_dir: str,
                   client_lr: float) -> ExperimentError:
  """The error ending a run after --blown_up_rounds blown-up rounds in a row (checkpointed
  up to `last_round`)."""
  return ExperimentError(
      f'the clients\' training loss stayed above {BLOWN_UP_LOSS:g} for {in_a_row} rounds '
      f'in a row (rounds {round_num - in_a_row + 1}-{round_num}): local training blew up; '
      f'start a new run with a lower --client_lr (now {client_lr:g}) or server learning '
      f'rate, or go on with --resume --blown_up_rounds=0 (rounds up to {last_round} are '
      f'checkpointed in {ckpt_dir})')
