"""Checkpoints written off the training's critical path, and the write faults they meet.

A checkpoint is a version of tff.program's `FileProgramStateManager`: a SavedModel of the
program state (the server state and the run's figures) written to a temp directory and
renamed, so the checkpoint directory stays TFF's and a kill mid-write leaves the previous
version intact. When the server state is resident in TFF's worker (`ResidentProcess`,
transfer='files'), the worker writes the version's tensors itself, under the SavedModel's
own names (`tff_algos/runtime/saved_model_template.py`, prepared once per run from the
initial program state), and nothing of the state passes through Python: the round loop
only starts that write (`ResidentProcess.write(..., wait=False)`), which the worker runs
while the next round does; the next checkpoint (or a stop, or the end of the run) waits for
it, and the writer's thread then adds saved_model.pb and fingerprint.pb and renames the
directory, after removing the oldest version as the worker starts the next write, whose
files then take the memory it frees. So the newest complete version
is the one asked for before the last checkpoint call, one round behind it with the default
--checkpoint_every=1 (and, for the moment the thread takes to complete it, the one before
that): a kill loses the rounds after the newest complete version, never more, and leaves
that version intact; a stop (SIGTERM, SIGINT) and the end of the run complete every version
asked for. Otherwise (worker services, where the state is in Python each round, or
transfer='values') the round loop snapshots the state (`runner.snapshot`) and the writer's
thread writes it through the manager's own `save`. At most one version is being written by
the worker and one completed by the thread. A write that fails (a full disk, an unwritable directory) leaves no partial
version and stops the run with one line naming the directory and the fix
(`ExperimentError`, exit 2) where it is waited for: at the next checkpoint, a stop or the
end of the run.

A state tensor too large to rewrite every round (FedCDA's cache) is written in parts
(`tff_algos/runtime/bundle_parts.py`: its cached models, parts of at least 1 MiB): the worker
writes only the parts whose bytes changed since the version before, and the thread links
the others' files from that version before merging the version's bundle. Every version is
a whole SavedModel of its own, so each kept version loads on its own (removing one leaves
the others whole); the writer keeps KEEP_VERSIONS of them (one fewer while the next is
written), so a newest version that cannot be read costs a resume --checkpoint_every rounds
(`run_directory.load_checkpoint`). A file shared by hard link, damaged in place, damages
every version that shares it, so: each version records its parts' fingerprints and sizes
(`bundle_parts.write_record`); once a version is complete the thread reads its parts back
against that record, and a version whose unwritten parts would be linked from a damaged
file is dropped (one `warning:` line naming the file) and the next written whole; one
version in every WHOLE_EVERY is written whole, sharing nothing, and the newest KEEP_WHOLE
such versions are kept beside the newest KEEP_VERSIONS, so that damage to one file leaves
a version whose every part matches its record, which a resume restores from.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import os
import random
import shutil
import sys
import threading
from typing import Any, Callable, Optional

from programs import run_directory
from programs.experiment_config import ExperimentError

# Finished versions kept: the newest and two before it, should the newest be unreadable.
KEEP_VERSIONS = 3
# With a state in parts: one version in this many is written whole (sharing no file with
# the versions before it), and the newest KEEP_WHOLE of those are kept too. Its cost and
# choice: docs/training_program.md, "Checkpoints".
WHOLE_EVERY = 10
KEEP_WHOLE = 2
# In a version being written in parts, where the worker writes them (`bundle_parts`).
_WRITTEN = 'written'

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
                last_checkpointed: int, gone: bool = False) -> ExperimentError:
  """The one-line error ending a run whose write of `what` in `directory` failed; `gone`:
  every version written was removed from outside (the directory deleted mid-run)."""
  if gone:
    return ExperimentError(
        f'cannot write {what} in {directory}: its checkpoints were removed while the run went '
        'on; rerun with --resume: it starts the run afresh (no checkpoint is left)')
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


def program_state(state, figures) -> collections.OrderedDict:
  """The program state a checkpoint saves: the server state and the run's `figures` (an
  OrderedDict of scalars: round, best_accuracy, exploration_client_epochs)."""
  return collections.OrderedDict(state=state, **figures)


class CheckpointWriter:
  """Writes checkpoint versions off the round loop's critical path.

  `prepare(runner, program_state)` (once per run, before its first checkpoint) lets the
  runner's worker write the versions' tensors when it can. `checkpoint(runner, held,
  figures, version)` checkpoints `held` (the runner's state) with `figures` as `version`
  and returns while the version is written; `wait()` returns once every version asked
  for is complete, or raises ExperimentError if one's write failed; `close()` waits too.
  `checkpointed` is the newest version written whole. Use from one thread (the round
  loop's: it waits for the worker's writes through TFF's executor).

  Prepared, a version is written in two steps, each overlapping a round: the worker writes
  its tensors (`ResidentProcess.write(..., wait=False)`) while the next round runs; the
  next `checkpoint` call (or `wait()`) waits for that write, then the writer's thread
  completes the version while the worker writes the new one. So after `checkpoint(v)`, the
  newest complete version is the one asked for before v (for the moment its completion
  takes, the one before that): with a checkpoint every round, one round behind; a kill loses
  the rounds after it, and leaves it intact. Unprepared, the state is snapshotted at the
  call and the writer's thread writes the version, the next call waiting for it.
  """

  def __init__(self, ckpt_dir: str, checkpointed: int = 0, keep_total: int = KEEP_VERSIONS,
               min_part_bytes: Optional[int] = None, whole_every: Optional[int] = None,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self.ckpt_dir = ckpt_dir
    self.manager = tff.program.FileProgramStateManager(ckpt_dir, keep_total=keep_total,
                                                       keep_first=False)
    self.checkpointed = checkpointed
    self._keep = keep_total
    self._template = self._layout = None   # (prepare: the worker writes the versions)
    self._min_part_bytes = min_part_bytes
    # The worker's write in flight: (its WriteInFlight, its temp directory, its version,
    # the version whose parts it links, if any).
    self._in_worker: Optional[tuple] = None
    # The parts' fingerprints of the last version the worker wrote, and that version.
    self._fingerprints, self._fingerprinted = None, None
    # Each part's (name, slice, dtype) (`bundle_parts.part_slices`); the versions written
    # since the last one written whole; the whole-every period; the last version the thread
    # read back against its record, and its damaged parts ({data file: what differs}).
    self._slices = None
    self._since_whole = 0
    self._whole_every = WHOLE_EVERY if whole_every is None else whole_every
    self._verified: Optional[tuple] = None
    self._log = log
    self._thread: Optional[threading.Thread] = None
    # The thread's function and outcome; the function is dropped by the round loop's thread
    # (it may hold TFF's values of the worker, released on that thread).
    self._pending: Optional[Callable[[], Any]] = None
    self._version = 0
    self._error: Optional[BaseException] = None

  def prepare(self, runner, initial_program_state, scratch_dir: Optional[str] = None) -> None:
    """With a runner whose worker writes files (`runner.writes_files`: a ResidentProcess,
    transfer='files'), the template of the run's program state (`program_state`: its
    structure, shapes and dtypes never change; written once under `scratch_dir`, then
    removed) and the layout in which the worker writes each version's tensors. A program
    state the template cannot name leaf by leaf (a leaf TFF keeps in saved_model.pb rather
    than as a variable; a tensor the worker holds in another dtype) is left to the manager's
    own `save`, with a warning saying why."""
    if not runner.writes_files:
      return
    from tff_algos.runtime import saved_model_template  # pylint: disable=g-import-not-at-top
    try:
      template = saved_model_template.SavedModelTemplate(initial_program_state,
                                                         scratch_dir=scratch_dir)
      from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
      self._layout = template.worker_layout(
          runner.state_type, bundle_parts.MIN_PART_BYTES if self._min_part_bytes is None
          else self._min_part_bytes)
    except saved_model_template.TemplateMismatch as e:
      from absl import logging  # pylint: disable=g-import-not-at-top
      logging.warning('checkpoints are written through TFF\'s FileProgramStateManager, the '
                      'state brought back each time: %s', e)
      return
    except Exception as e:  # pylint: disable=broad-except
      if not is_write_failure(e):
        raise
      raise write_error('the checkpoints\' template', scratch_dir or 'the temp directory', e,
                        self.checkpointed) from None
    self._template = template
    if self._layout.cut:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
      types = structure.flatten(runner.state_type)
      self._slices = bundle_parts.part_slices(
          self._layout.cut, self._layout.state, [t.shape for t in types],
          [tf.as_dtype(t.dtype).name for t in types])

  @property
  def worker_writes(self) -> bool:
    """Whether the worker writes each version's tensors (`prepare` found a layout)."""
    return self._layout is not None

  def checkpoint(self, runner, held, figures, version: int) -> None:
    """Checkpoints `held` (the state `runner` holds) with `figures` (an OrderedDict of the
    program state's other entries) as `version`. First the earlier writes move on: the
    thread's is waited for, then the worker's, whose version the thread then completes.
    Prepared, the worker starts writing this version's tensors; otherwise the state is
    snapshotted now and the thread writes it. Raises ExperimentError (one line) if the file
    system refused a write waited for here (the versions in flight are then abandoned)."""
    self._join_thread()
    written = self._usable(self._wait_for_worker())
    try:
      if self._layout is not None:
        # The version the worker wrote (if any) counts among those kept; the thread removes
        # the oldest while the worker writes this one, then completes that version.
        doomed = self._doom_oldest(self._keep - 1, below=written[1] if written else None)
        self._start_thread(lambda: self._complete(doomed, written),
                           written[1] if written else self.checkpointed)
        self._start_in_worker(runner, held, figures, version)
        return
      write = self._snapshot(runner, held, figures, version)
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(e, version) from None
    self._start_thread(write, version)

  def _snapshot(self, runner, held, figures, version: int) -> Callable[[], None]:
    """Snapshots the state (`runner.snapshot`, which pauses the collector); returns what
    writes the version through the manager."""
    read_state = runner.snapshot(held)

    def write():
      asyncio.run(self.manager.save(program_state(read_state(), figures), version))
    return write

  def _doom_oldest(self, keep: int, below: Optional[int] = None) -> list[str]:
    """Renames the complete versions (those older than `below`, if given) beyond the newest
    `keep` as unfinished ones, so that no reader sees part of one while it is removed (and a
    resume removes what a kill leaves of it); returns their new paths. They are removed as
    the worker starts the next write, so that its files take the memory they free: on
    machines that hand freed memory back to their host a while after (virtual ones), memory
    freed a round earlier costs the write several times more system time
    (benchmarks/version_writes.py)."""
    from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
    versions = [v for v in run_directory.checkpointed_rounds(self.ckpt_dir)
                if below is None or v < below]
    whole = [v for v in versions if (bundle_parts.read_record(
        os.path.join(self.ckpt_dir, f'program_state_{v}')) or {}).get('whole')][-KEEP_WHOLE:]
    doomed = []
    for old in versions[:max(len(versions) - keep, 0)]:
      if old in whole:
        continue
      doomed.append(os.path.join(self.ckpt_dir,
                                 f'program_state_{old}_temp{random.randint(1000, 9999)}'))
      os.rename(os.path.join(self.ckpt_dir, f'program_state_{old}'), doomed[-1])
    return doomed

  def _complete(self, doomed: list[str], written: Optional[tuple]) -> None:
    """The thread's part: removes the `doomed` versions, then completes the version the
    worker has `written` ((its temp directory, its version), if any)."""
    for path in doomed:
      shutil.rmtree(path)
    if written is not None:
      self._publish(*written)
      if self._layout.cut:
        from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
        path = os.path.join(self.ckpt_dir, f'program_state_{written[1]}')
        self._verified = (written[1], bundle_parts.damaged_parts(path))

  def _start_in_worker(self, runner, held, figures, version: int) -> None:
    """The worker starts writing the version's tensors into a temp directory named as TFF
    names its own (`run_directory.remove_unfinished_checkpoints` knows it)."""
    from tff_algos.runtime import saved_model_template  # pylint: disable=g-import-not-at-top
    temp = os.path.join(self.ckpt_dir,
                        f'program_state_{version}_temp{random.randint(1000, 9999)}')
    os.makedirs(os.path.join(temp, 'variables'))
    path = os.path.join(temp, saved_model_template.VARIABLES_PREFIX)
    whole = (self._fingerprints is None or self._since_whole + 1 >= self._whole_every)
    if self._layout.cut:
      path = os.path.join(temp, _WRITTEN)
      os.makedirs(path)
    written = runner.write(held, path, self._layout, self._template.extras(figures),
                           wait=False, previous=None if whole else self._fingerprints)
    self._since_whole = 0 if whole else self._since_whole + 1
    self._in_worker = (written, temp, version, None if whole else self._fingerprinted)

  def _wait_for_worker(self) -> Optional[tuple]:
    """Waits for the worker's write in flight, if any; returns its (temp directory,
    version, the version whose parts it links, and with a layout in parts their
    fingerprints), which the thread is to complete."""
    if self._in_worker is None:
      return None
    written, temp, version, links = self._in_worker
    self._in_worker = None
    try:
      result = written.wait()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(e, version) from None
    if not self._layout.cut:
      return temp, version, links
    self._fingerprints, self._fingerprinted = result, version
    return temp, version, links, result

  def _usable(self, written: Optional[tuple]) -> Optional[tuple]:
    """`written` (what `_wait_for_worker` returned), or None if it is dropped: when the
    version it links its unwritten parts from has a damaged part among those (found by the
    thread reading that version back), it cannot be completed whole, and the next version
    is written whole. Each damaged file is named in one `warning:` line."""
    verified, self._verified = self._verified, None
    if written is None or verified is None or not verified[1]:
      return written
    temp, done, links = written[:3]
    unwritten = lambda path: not os.path.exists(os.path.join(
        temp, _WRITTEN, os.path.basename(path)))
    dropped = links == verified[0] and any(unwritten(path) for path in verified[1])
    for path, what in sorted(verified[1].items()):
      self._log(f'warning: checkpoint part {path} is damaged ({what} differs from its '
                'record); ' + (f'round {done}\'s checkpoint, which would share it, is dropped '
                               'and the next one is written whole' if dropped else
                               f'round {done}\'s checkpoint holds it written anew'))
    if not dropped:
      return written
    shutil.rmtree(temp, ignore_errors=True)
    self._fingerprints = self._fingerprinted = None
    return None

  def _publish(self, temp: str, version: int, links: Optional[int],
               fingerprints=None) -> None:
    """Completes the SavedModel in `temp` (with a layout in parts, first its bundle, whose
    unwritten parts it links from version `links`, and the record of its parts'
    `fingerprints`) and renames it to the version (atomic, as TFF's write_saved_model
    does)."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
    from tff_algos.runtime import saved_model_template  # pylint: disable=g-import-not-at-top
    if self._layout.cut:
      bundle_parts.assemble(
          os.path.join(temp, _WRITTEN), temp,
          os.path.join(temp, saved_model_template.VARIABLES_PREFIX), self._layout.num_parts,
          None if links is None else os.path.join(self.ckpt_dir, f'program_state_{links}'))
      bundle_parts.write_record(temp, self._slices, fingerprints, whole=links is None)
    self._template.write_graph(temp)
    path = os.path.join(self.ckpt_dir, f'program_state_{version}')
    if os.path.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self.ckpt_dir)
    os.rename(temp, path)

  def _start_thread(self, write: Callable[[], None], version: int) -> None:
    self._pending, self._version, self._error = write, version, None
    self._thread = threading.Thread(target=self._write, name=f'checkpoint {version}',
                                    daemon=True)
    self._thread.start()

  def _write(self) -> None:
    try:
      self._pending()
    except BaseException as e:  # pylint: disable=broad-except  (reported by _join_thread)
      self._error = e

  def _join_thread(self) -> None:
    """Waits for the thread's write; raises (as `_failed`) if it failed."""
    if self._thread is None:
      return
    self._thread.join()
    self._thread, self._pending = None, None
    error, self._error = self._error, None
    if error is not None:
      raise self._failed(error, self._version) from None
    self.checkpointed = self._version

  def _failed(self, error: BaseException, version: int) -> BaseException:
    """After `version`'s write failed with `error`: waits for the other write in flight
    (kept if it completes a version), removes every unfinished version and returns what
    to raise: ExperimentError (one line) if the file system refused the write, else
    `error`."""
    if self._thread is not None:
      self._thread.join()
      if self._error is None:
        self.checkpointed = self._version
      self._thread = self._pending = self._error = None
    self._fingerprints = self._fingerprinted = None
    if self._in_worker is not None:
      written, self._in_worker = self._in_worker[0], None
      try:
        written.wait()
      except Exception:  # pylint: disable=broad-except  (its version is abandoned)
        pass
    run_directory.remove_unfinished_checkpoints(self.ckpt_dir)
    # What a resume finds, not what was written: versions removed from outside are gone.
    left = max(run_directory.checkpointed_rounds(self.ckpt_dir), default=0)
    if self.checkpointed and not left:
      return write_error(f'the checkpoint of round {version}', self.ckpt_dir, error, 0,
                         gone=True)
    if not is_write_failure(error):
      return error
    return write_error(f'the checkpoint of round {version}', self.ckpt_dir, error, left)

  def wait(self, raise_error: bool = True) -> None:
    """Waits until every version asked for is complete; raises ExperimentError (one line)
    if a write failed, or its error if it failed otherwise (with `raise_error`; else the
    failure is dropped, e.g. while another error ends the run)."""
    try:
      self._join_thread()
      written = self._usable(self._wait_for_worker())
      if written is not None:
        self._start_thread(lambda: self._complete([], written), written[1])
      self._join_thread()
      if self._layout is not None:
        try:
          for path in self._doom_oldest(self._keep):
            shutil.rmtree(path)
        except Exception as e:  # pylint: disable=broad-except
          raise self._failed(e, self.checkpointed) from None
    except Exception:  # pylint: disable=broad-except
      if raise_error:
        raise

  def close(self, raise_error: bool = True) -> None:
    self.wait(raise_error)
