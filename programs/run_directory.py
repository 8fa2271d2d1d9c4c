"""The experiment directory: making and locking it, its files (metrics.csv, config.json,
summary.json), its checkpoints and their clean-up, where a resumed run starts and the
TensorBoard scalars it would repeat.

Checkpoints are TFF's FileProgramStateManager's, written by programs/checkpoint_writer.py:
each version is written to a temp directory and renamed, so a kill mid-write leaves the
previous one intact; a resume loads the newest version that reads (`load_checkpoint`).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import re
import shutil
from typing import Callable

from programs.experiment_config import ExperimentConfig, ExperimentError, settings_changed

# metrics.csv's timing columns: the only ones that differ between two makings of a run.
TIMING_COLUMNS = ('seconds', 'round_seconds')

# Written into a run whose training diverged (while the run is still held, so a process
# waiting for it reads it): the error's first clause, one line.
DIVERGED = 'diverged.txt'


class RunDirectoryBusy(ExperimentError):
  """Another live process is running the same experiment directory."""


def csv_rows(path) -> list[dict]:
  """A CSV's rows as dicts (metrics.csv's), none if it does not exist."""
  if not os.path.exists(path):
    return []
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def write_csv(path, rows: list[dict]) -> None:
  """Rewrites the CSV atomically (the column set may grow between rounds)."""
  columns = []
  for row in rows:
    columns += [k for k in row if k not in columns]
  tmp = path + '.tmp'
  with open(tmp, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(tmp, path)


def write_json(path, value) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def write_diverged(exp_dir: str, diverged: str) -> None:
  """Records in DIVERGED why the run's training diverged (one line)."""
  tmp = os.path.join(exp_dir, DIVERGED + '.tmp')
  with open(tmp, 'w') as f:
    f.write(diverged + '\n')
  os.replace(tmp, os.path.join(exp_dir, DIVERGED))


_VERSION_DIR = re.compile(r'^program_state_(\d+)$')
_TEMP_VERSION_DIR = re.compile(r'^program_state_\d+_temp\d+$')  # TFF's file_utils naming


def checkpointed_rounds(ckpt_dir: str) -> list[int]:
  """Versions FileProgramStateManager has finished writing (renamed from their temp dir)."""
  if not os.path.isdir(ckpt_dir):
    return []
  return sorted(int(m.group(1)) for m in map(_VERSION_DIR.match, os.listdir(ckpt_dir)) if m)


def remove_unfinished_checkpoints(ckpt_dir: str) -> None:
  """Deletes the temp directories of checkpoint writes that a kill interrupted."""
  if os.path.isdir(ckpt_dir):
    for entry in os.listdir(ckpt_dir):
      if _TEMP_VERSION_DIR.match(entry):
        shutil.rmtree(os.path.join(ckpt_dir, entry), ignore_errors=True)


def make_output_dir(exp_dir: str) -> list[str]:
  """Makes `exp_dir`; returns the directories it created, deepest first."""
  made, path = [], os.path.abspath(exp_dir)
  while not os.path.exists(path):
    made.append(path)
    path = os.path.dirname(path)
  try:
    os.makedirs(exp_dir, exist_ok=True)
  except OSError as e:
    raise ExperimentError(f'cannot create the experiment directory {exp_dir}: {e.strerror}; '
                          'choose a writable --root_output_dir') from None
  if not os.access(exp_dir, os.W_OK | os.X_OK):
    raise ExperimentError(f'{exp_dir} is not writable; choose a writable --root_output_dir')
  return made


def remove_empty(directories: list[str]) -> None:
  """Removes those of `directories` (deepest first) that are still empty: a run stopped by a
  check (bad data, impossible partition) leaves no trace of its own."""
  for path in directories:
    try:
      os.rmdir(path)
    except OSError:   # not empty (or gone): it and its parents stay
      return


@contextlib.contextmanager
def exclusive_run_directory(exp_dir: str, wait: bool = False):
  """Holds `exp_dir` for this process alone (RunDirectoryBusy if another holds it).

  Two processes on one run would interleave their checkpoints and metrics.csv. The lock is
  an flock on the directory itself: nothing is written, and it is released when the
  process ends however it ends. With `wait`, blocks until the other process lets go. An
  flock keeps apart the processes of one machine (on a network file system, not those of
  two machines sharing the directory). A second lock on the same directory by the same
  process is refused too (flock belongs to the open file).
  """
  while True:
    try:
      fd = os.open(exp_dir, os.O_RDONLY)
    except OSError as e:
      raise ExperimentError(f'cannot open the experiment directory {exp_dir}: {e.strerror}; '
                            'choose a writable --root_output_dir') from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
      os.close(fd)
      raise RunDirectoryBusy(
          f'{exp_dir} is being run by another process; wait for it to end (--resume then '
          'continues it if it stopped early) or choose another --experiment_name') from None
    except OSError as e:   # e.g. ENOLCK: a file system without locks
      os.close(fd)
      raise ExperimentError(f'cannot lock the experiment directory {exp_dir}: {e.strerror}; '
                            'choose a --root_output_dir on a local disk') from None
    # The directory may have been replaced (removed and made again) while this process
    # opened or waited for it: the lock would then hold a directory no longer at the path.
    try:
      current = os.stat(exp_dir)
    except OSError:
      current = None
    held = os.fstat(fd)
    if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
      break
    os.close(fd)
  try:
    yield
  finally:
    os.close(fd)


def resume_point(config: ExperimentConfig, log: Callable[[str], None] = lambda _: None) -> int:
  """Checks the experiment directory before anything is loaded or written (it reads only).

  Returns the round to resume after (0 = a fresh run). Refuses to start over an existing
  run without --resume, and to resume a run recorded with different run-defining flags
  (everything but RESUMABLE_CHANGES) or fewer --rounds than it already finished.
  """
  exp_dir = config.experiment_dir
  last = max(checkpointed_rounds(os.path.join(exp_dir, 'checkpoints')), default=0)
  if not config.resume:
    if last:
      raise ExperimentError(
          f'{exp_dir} already holds a run; pass --resume to continue it or choose another '
          '--experiment_name')
    return 0
  if not last:
    log(f'note: nothing to resume in {exp_dir} (no finished round checkpointed): starting '
        'a fresh run')
    return 0
  if os.path.exists(os.path.join(exp_dir, DIVERGED)):
    with open(os.path.join(exp_dir, DIVERGED)) as f:
      what = f.read().strip()
    raise ExperimentError(f'cannot resume {exp_dir}: its {what} and would again (runs are '
                          'deterministic); start a new run (another --experiment_name) with a '
                          'lower --client_lr or server learning rate')
  config_path = os.path.join(exp_dir, 'config.json')
  try:
    with open(config_path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ExperimentError(f'cannot resume {exp_dir}: its config.json is unreadable ({e}); '
                          'choose another --experiment_name') from None
  differing = settings_changed(saved, config)
  if differing:
    raise ExperimentError(f'cannot resume {exp_dir}: {differing}; pass the same values or '
                          'choose another --experiment_name')
  if config.rounds < last:
    raise ExperimentError(f'cannot resume {exp_dir} with --rounds={config.rounds}: it already '
                          f'finished round {last}; pass --rounds={last} or more')
  # The checkpoint and metrics.csv must tell the same story: a record replaced by an older
  # copy (e.g. a checkout) would lose the rounds in between from every page built on it.
  logged = {int(r['round']) for r in csv_rows(os.path.join(exp_dir, 'metrics.csv'))}
  missing = sorted(set(range(1, last + 1)) - logged)
  if missing:
    raise ExperimentError(
        f'cannot resume {exp_dir}: it is checkpointed after round {last} but its metrics.csv '
        f'lacks {len(missing)} of those rounds (from round {missing[0]}): the record was '
        'replaced or truncated; restore metrics.csv or choose another --experiment_name')
  return last


def truncate_tensorboard(directory: str, last_round: int) -> None:
  """Drops the scalars of rounds after `last_round` from the event files in `directory`.

  A run killed after logging rounds it had not checkpointed (up to --checkpoint_every - 1
  of them) repeats those rounds when resumed; without this TensorBoard would show them
  twice.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(directory):
    return
  for name in sorted(os.listdir(directory)):
    if 'tfevents' not in name:
      continue
    path = os.path.join(directory, name)
    kept, dropped = [], False
    try:
      for record in tf.data.TFRecordDataset(path):
        raw = record.numpy()
        event = tf.compat.v1.Event.FromString(raw)
        if event.HasField('summary') and event.step > last_round:
          dropped = True
        else:
          kept.append(raw)
    except tf.errors.DataLossError:  # the last record of a killed write: drop it
      dropped = True
    if dropped:
      with tf.io.TFRecordWriter(path + '.tmp') as writer:
        for raw in kept:
          writer.write(raw)
      os.replace(path + '.tmp', path)


def _damage(version_dir: str) -> dict[str, str]:
  """{file: what differs} for a version written in parts whose parts no longer match their
  record (`bundle_parts.damaged_parts`); {} for one that matches or has no parts."""
  if not os.path.isdir(os.path.join(version_dir, 'parts')):
    return {}
  from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
  return bundle_parts.damaged_parts(version_dir)


def load_checkpoint(loop, manager, program_state, exp_dir: str,
                    log: Callable[[str], None]):
  """(the newest checkpoint that loads as `program_state`'s structure, its round).

  A version written in parts loads only if every part matches its record (`_damage`); a
  newer version that does not, or cannot be read (damaged files), is removed, with one
  warning naming the damaged files, or saying which rounds the run recomputes, and
  metrics.csv and TensorBoard are cut back to the round resumed (TensorBoard by the run
  directory's preparation, which truncates to the round the run starts from). Raises
  ExperimentError if no version loads: naming the damage if every version is damaged
  (TensorFlow's checksums, a part that differs from its record), else saying that the
  checkpoints are not this program's state; nothing is removed then.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  unreadable, damaged = [], {}
  for version in reversed(checkpointed_rounds(ckpt_dir)):
    path = os.path.join(ckpt_dir, f'program_state_{version}')
    parts = _damage(path)
    if parts:
      unreadable.append((version, None))
      for file, what in parts.items():   # a file shared by hard link: named where written
        try:
          key = os.stat(file).st_ino
        except OSError:
          key = file
        damaged[key] = (file, what)
      continue
    try:
      restored = loop.run_until_complete(manager.load(version, program_state))
    except Exception as e:  # pylint: disable=broad-except
      unreadable.append((version, e))
      continue
    if unreadable:
      newest = unreadable[0][0]
      rounds = (f'rounds {version + 1}-{newest} are' if newest > version + 1
                else f'round {newest} is')
      for file, what in sorted(damaged.values()):
        log(f'warning: checkpoint part {file} is damaged ({what} differs from its record); '
            f'resuming from version {version}')
      errors = [(v, e) for v, e in unreadable if e is not None]
      names = ', '.join(str(v) for v, _ in reversed(errors if not damaged else unreadable))
      several = len(errors if not damaged else unreadable) > 1
      why = (f'cannot be read ({type(errors[0][1]).__name__})' if not damaged else
             'share a damaged part or cannot be read' if several else
             'shares a damaged part or cannot be read')
      log(f'warning: the checkpoint{"s" if several else ""} of round{"s" if several else ""} '
          f'{names} in {ckpt_dir} {why} and {"are" if several else "is"} removed: resuming '
          f'after round {version}, so {rounds} recomputed')
      for bad, _ in unreadable:
        shutil.rmtree(os.path.join(ckpt_dir, f'program_state_{bad}'), ignore_errors=True)
      csv_path = os.path.join(exp_dir, 'metrics.csv')
      rows = csv_rows(csv_path)
      write_csv(csv_path, [r for r in rows if int(r['round']) <= version])
    return restored, version
  errors = [e for _, e in unreadable if e is not None]
  if unreadable and all(isinstance(e, (tf.errors.DataLossError, tf.errors.OutOfRangeError))
                        for e in errors):
    file, differs = min(damaged.values()) if damaged else (None, None)
    what = (f'checkpoint part {file} is damaged ({differs} differs from its record)'
            if damaged else f'its checkpoints are damaged ({type(errors[0]).__name__})')
    raise ExperimentError(
        f'cannot resume {exp_dir}: {what} and no version of it is whole; start the run afresh '
        '(another --experiment_name)')
  error = errors[0] if errors else None
  raise ExperimentError(
      f'cannot resume {exp_dir}: its checkpoint does not match this program\'s state '
      f'({type(error).__name__}); choose another --experiment_name')
