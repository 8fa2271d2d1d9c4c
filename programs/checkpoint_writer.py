"""Checkpoints written off the training's critical path, and the write faults they meet.

At a checkpoint the round loop only snapshots the state (`ResidentProcess.snapshot`: the
worker writes its resident state to a file) and goes on; a background thread reads the
snapshot and writes the version through tff.program's `FileProgramStateManager`, a
SavedModel written to a temp directory and renamed, so the checkpoint directory stays TFF's
and a kill mid-write leaves the previous version intact. At most one write is in flight:
the next checkpoint, a stop and the end of the run wait for it. A write that fails (a full
disk, an unwritable directory) leaves no partial version and stops the run at the next wait
with one line naming the directory and the fix (`ExperimentError`, exit 2).

Every version is written whole (no increments), so each kept version loads on its own; the
writer keeps KEEP_VERSIONS of them, so a newest version that cannot be read costs a resume
--checkpoint_every rounds (`run_directory.load_checkpoint`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from typing import Any, Callable, Optional

from programs import run_directory
from programs.experiment_config import ExperimentError

# Finished versions kept: the newest and two before it, should the newest be unreadable.
KEEP_VERSIONS = 3

# errno values meaning the file system refuses the write, with what the user does about it.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)
FULL, REFUSED = 'the disk is full', 'the directory is not writable'


def write_failure(error: BaseException) -> str:
  """What stopped a write, in a few words (a full disk, no permission, else the error)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  code = getattr(error, 'errno', None)
  text = str(error)
  if code in _FULL or isinstance(error, tf.errors.ResourceExhaustedError) or (
      'No space left' in text or 'quota exceeded' in text.lower()):
    return FULL
  if code in _REFUSED or isinstance(error, tf.errors.PermissionDeniedError) or (
      'Read-only file system' in text or 'Permission denied' in text):
    return REFUSED
  first = (getattr(error, 'strerror', None) or getattr(error, 'message', None) or text or
           type(error).__name__).strip().splitlines()[0]
  return f'{type(error).__name__}: {first[:200]}'


def write_error(what: str, directory: str, error: BaseException,
                last_checkpointed: int) -> ExperimentError:
  """The one-line error ending a run whose write of `what` in `directory` failed."""
  resume = (f'continues after round {last_checkpointed}, the last one checkpointed'
            if last_checkpointed else 'starts the run again (no round was checkpointed)')
  return ExperimentError(
      f'cannot write {what} in {directory}: {write_failure(error)}; free space there or make '
      f'it writable, then rerun with --resume: it {resume}')


def is_write_failure(error: BaseException) -> bool:
  """Whether `error` is a file system's refusal, which the program reports in one line
  rather than as a bug: an OSError, TensorFlow's error of a file operation, or an error of
  TFF's worker (a gRPC error) whose write was refused."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return isinstance(error, (OSError, tf.errors.OpError)) or write_failure(error) in (
      FULL, REFUSED)


class CheckpointWriter:
  """Writes checkpoint versions in a background thread, at most one in flight.

  `save(read_state, version)` waits for the write in flight, then starts writing
  `read_state()` (a function returning the program state, run in the writer's thread) as
  `version`. `wait()` waits for the write in flight and raises ExperimentError if it
  failed; `close()` waits too. `checkpointed` is the newest version written whole. Use from
  one thread (the round loop's).
  """

  def __init__(self, ckpt_dir: str, checkpointed: int = 0, keep_total: int = KEEP_VERSIONS):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self.ckpt_dir = ckpt_dir
    self.manager = tff.program.FileProgramStateManager(ckpt_dir, keep_total=keep_total,
                                                       keep_first=False)
    self.checkpointed = checkpointed
    self._thread: Optional[threading.Thread] = None
    # The write in flight's function and outcome; the function is dropped by the round
    # loop's thread (it may hold TFF's values of the worker, released on that thread).
    self._pending: Optional[Callable[[], Any]] = None
    self._version = 0
    self._error: Optional[BaseException] = None

  def save(self, read_state: Callable[[], Any], version: int) -> None:
    self.wait()
    self._pending, self._version, self._error = read_state, version, None
    self._thread = threading.Thread(target=self._write, name=f'checkpoint {version}',
                                    daemon=True)
    self._thread.start()

  def _write(self) -> None:
    try:
      program_state = self._pending()
      asyncio.run(self.manager.save(program_state, self._version))
    except BaseException as e:  # pylint: disable=broad-except  (reported by wait())
      self._error = e
      run_directory.remove_unfinished_checkpoints(self.ckpt_dir)

  def wait(self, raise_error: bool = True) -> None:
    """Waits for the write in flight; raises ExperimentError if it failed (with
    `raise_error`; else the failure is dropped, e.g. while another error ends the run)."""
    if self._thread is None:
      return
    self._thread.join()
    self._thread, self._pending = None, None
    error, self._error = self._error, None
    if error is None:
      self.checkpointed = self._version
      return
    if not raise_error:
      return
    if is_write_failure(error):
      raise write_error(f'the checkpoint of round {self._version}', self.ckpt_dir, error,
                        self.checkpointed) from None
    raise error

  def close(self, raise_error: bool = True) -> None:
    self.wait(raise_error)
