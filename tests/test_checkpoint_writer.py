"""Checkpoints off the critical path and their faults (programs/checkpoint_writer.py,
run_directory.load_checkpoint): the next round starts while a checkpoint is written, a write
that fails stops the run in one line with the previous checkpoint intact and --resume
continuing it, an unreadable newest checkpoint makes --resume fall back to the newest
readable one, the directory stays tff.program's, and SIGKILLs at random moments (mid-write
among them) resume bit-exact."""

import asyncio
import collections
import csv
import dataclasses
import errno
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from programs import checkpoint_writer
from programs import experiment
from programs import experiment_config
from programs import run_directory
from programs import run_results
from programs.experiment_config import ExperimentError
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = experiment_config.ExperimentConfig(
    dataset='digits', num_clients=8, clients_per_round=3, batch_size=16, client_lr=0.1,
    local_epochs=1, rounds=4, progress=False, checkpoint_every=1)
FLAGS = ['--dataset=digits', '--num_clients=8', '--clients_per_round=3', '--batch_size=16',
         '--client_lr=0.1', '--local_epochs=1', '--progress=false']


def _quiet(_):
  pass


def _weights(directory):
  return run_results.load_final_weights(directory)


def _rows(directory):
  """metrics.csv's rows without the timing columns."""
  with open(os.path.join(directory, 'metrics.csv'), newline='') as f:
    return [{k: v for k, v in row.items() if k not in run_directory.TIMING_COLUMNS}
            for row in csv.DictReader(f)]


def _assert_same_run(a, b):
  for w_a, w_b in zip(_weights(a), _weights(b), strict=True):
    np.testing.assert_array_equal(w_a, w_b)
  assert _rows(a) == _rows(b)


def _resume_ends_as(unbroken, config, after):
  """`--resume` of the run `config` made continues after round `after` and ends as the
  unbroken run."""
  messages = []
  experiment.run_experiment(dataclasses.replace(config, resume=True), messages.append)
  assert messages == [f'resuming {config.experiment_dir} after round {after}'], messages
  _assert_same_run(unbroken, config.experiment_dir)


@pytest.fixture(scope='module')
def unbroken(tmp_path_factory):
  """A 4-round run checkpointed every round, uninterrupted: what every broken run must equal."""
  root = tmp_path_factory.mktemp('unbroken')
  config = dataclasses.replace(BASE, root_output_dir=str(root), experiment_name='a')
  experiment.run_experiment(config, _quiet)
  return config.experiment_dir


def _program_state_structure(monkeypatch):
  """Records the structure the program loads its checkpoints as (into the list returned)."""
  seen = []
  load = run_directory.load_checkpoint

  def recording(loop, manager, program_state, *args, **kwargs):
    seen.append(program_state)
    return load(loop, manager, program_state, *args, **kwargs)
  monkeypatch.setattr(run_directory, 'load_checkpoint', recording)
  return seen


def _tff_load(ckpt_dir, version, structure):
  """The version as tff.program's own FileProgramStateManager loads it."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  manager = tff.program.FileProgramStateManager(ckpt_dir)
  return helpers.run_async(manager.load(version, structure))


def _version_of(path):
  """The version a temp directory of the writer's is for."""
  return int(re.search(r'program_state_(\d+)_temp', path).group(1))


def test_the_next_round_runs_while_a_checkpoint_is_written(tmp_path, monkeypatch):
  """The worker's write of each version is waited for only after the next round has run
  (at the next checkpoint, the last one at the end of the run), and the writer's thread
  completes a version while the round after runs (a synchronous checkpoint would time out
  here); the versions are written whole, in order, the state's tensors by the worker
  (nothing through FileProgramStateManager.save)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  rounds_started = [0]
  started = threading.Condition()
  next_round = resident_state.ResidentProcess.next

  def counting_next(self, *args, **kwargs):
    with started:
      rounds_started[0] += 1
      started.notify_all()
    return next_round(self, *args, **kwargs)

  waited = {}   # version -> the rounds started when its worker's write was waited for
  write = resident_state.ResidentProcess.write

  def recording_write(self, state, path, *args, **kwargs):
    written = write(self, state, path, *args, **kwargs)

    class Recorded:
      def wait(self):
        waited[_version_of(path)] = rounds_started[0]
        return written.wait()
    return Recorded()

  overlapped = {}
  publish = checkpoint_writer.CheckpointWriter._publish   # (the writer's thread)

  def slow_publish(self, temp, version, *links):
    if version < BASE.rounds - 1:
      with started:   # the round after the next one starts before this version is complete
        overlapped[version] = started.wait_for(lambda: rounds_started[0] > version + 1, 60)
    return publish(self, temp, version, *links)

  def no_save(*args):
    raise AssertionError('the state went through Python (FileProgramStateManager.save)')

  monkeypatch.setattr(resident_state.ResidentProcess, 'next', counting_next)
  monkeypatch.setattr(resident_state.ResidentProcess, 'write', recording_write)
  monkeypatch.setattr(checkpoint_writer.CheckpointWriter, '_publish', slow_publish)
  monkeypatch.setattr(tff.program.FileProgramStateManager, 'save', no_save)
  monkeypatch.setattr(resident_state.ResidentProcess, 'snapshot', no_save)
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='r')
  experiment.run_experiment(config, _quiet)
  assert waited == {1: 2, 2: 3, 3: 4, 4: 4}
  assert overlapped == {1: True, 2: True}
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  assert run_directory.checkpointed_rounds(ckpt_dir) == [2, 3, 4]   # KEEP_VERSIONS of them


class _EagerWorker:
  """A runner whose "worker" writes a version's tensors as `save_computation` does, at once
  and in this process; each write's `wait()` is recorded in `events`, after ('start', v)."""

  writes_files = True

  def __init__(self, state_type):
    self.state_type = state_type
    self.events = []

  def write(self, held, path, layout, extras=(), wait=True, previous=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tff_algos.runtime import state_transfer  # pylint: disable=g-import-not-at-top
    assert not wait
    tensors = ([tf.constant(x) for x in state_transfer.state_leaves(held, self.state_type)] +
               [tf.constant(x) for x in extras] +
               [tf.constant(value, tf.string) for _, value in layout.constants])
    names = (list(layout.state) + [name for name, _ in layout.extras] +
             [name for name, _ in layout.constants])
    tf.raw_ops.SaveV2(prefix=path, tensor_names=names, shape_and_slices=[''] * len(names),
                      tensors=tensors)
    version = _version_of(path)
    self.events.append(('start', version))
    events = self.events

    class Written:
      def wait(self):
        events.append(('wait', version))
    return Written()


def _small_state(value):
  return collections.OrderedDict(w=np.full([2, 3], value, np.float32), n=np.int32(value))


def _figures(version):
  return collections.OrderedDict(round=version, best_accuracy=version / 10,
                                 exploration_client_epochs=0.0)


def test_a_checkpoint_returns_before_the_workers_write_is_waited_for(tmp_path):
  """`checkpoint(v)` starts the worker's write and returns: the write is waited for at the
  next checkpoint, which then completes v (v - 1 is the newest complete version after it),
  or at `wait()`; every version then loads through FileProgramStateManager as its state."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state_type = tff.StructWithPythonType([('w', tff.TensorType(np.float32, [2, 3])),
                                         ('n', tff.TensorType(np.int32))],
                                        collections.OrderedDict)
  runner = _EagerWorker(state_type)
  ckpt_dir = str(tmp_path / 'checkpoints')
  writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
  writer.prepare(runner, checkpoint_writer.program_state(_small_state(0), _figures(0)),
                 scratch_dir=str(tmp_path))
  writer.checkpoint(runner, _small_state(1), _figures(1), 1)
  assert runner.events == [('start', 1)]
  assert writer.checkpointed == 0 and not run_directory.checkpointed_rounds(ckpt_dir)
  writer.checkpoint(runner, _small_state(2), _figures(2), 2)
  assert runner.events == [('start', 1), ('wait', 1), ('start', 2)]
  writer.checkpoint(runner, _small_state(3), _figures(3), 3)
  assert runner.events[3:] == [('wait', 2), ('start', 3)]
  assert writer.checkpointed == 1   # (2 is being completed by the thread)
  writer.wait()
  assert runner.events[5:] == [('wait', 3)]
  assert writer.checkpointed == 3
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1, 2, 3]
  structure = checkpoint_writer.program_state(_small_state(0), _figures(0))
  for version in (1, 2, 3):
    loaded = _tff_load(ckpt_dir, version, structure)
    expected = checkpoint_writer.program_state(_small_state(version), _figures(version))
    assert list(loaded) == list(expected)
    np.testing.assert_array_equal(loaded['state']['w'], expected['state']['w'])
    assert loaded['state']['n'] == version and int(loaded['round']) == version
    assert np.float32(loaded['best_accuracy']) == np.float32(version / 10)


def _small_state_type():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.StructWithPythonType([('w', tff.TensorType(np.float32, [2, 3])),
                                   ('n', tff.TensorType(np.int32))], collections.OrderedDict)


def test_a_checkpoints_directory_removed_mid_run_is_said_to_start_afresh(tmp_path):
  """The checkpoints directory is deleted while version 2 is being written: the write fails
  in one line saying that --resume starts the run afresh (no version is left), not that it
  continues after the last version written."""
  runner = _EagerWorker(_small_state_type())
  ckpt_dir = str(tmp_path / 'checkpoints')
  writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
  writer.prepare(runner, checkpoint_writer.program_state(_small_state(0), _figures(0)),
                 scratch_dir=str(tmp_path))
  writer.checkpoint(runner, _small_state(1), _figures(1), 1)
  writer.checkpoint(runner, _small_state(2), _figures(2), 2)
  writer._join_thread()  # pylint: disable=protected-access  (version 1 complete)
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1]
  shutil.rmtree(ckpt_dir)
  writer.checkpoint(runner, _small_state(3), _figures(3), 3)
  with pytest.raises(ExperimentError) as raised:
    writer.wait()
  assert str(raised.value) == (
      f'cannot write the checkpoint of round 2 in {ckpt_dir}: its checkpoints were removed '
      'while the run went on; rerun with --resume: it starts the run afresh (no checkpoint is '
      'left)')


def test_the_oldest_version_is_removed_as_the_workers_next_write_starts(tmp_path):
  """Each worker write starts with KEEP_VERSIONS - 1 complete versions older than the one
  being completed (the oldest renamed as unfinished, the thread removing it), so that its
  files take the memory the removal frees; `wait()` leaves the newest KEEP_VERSIONS and
  nothing else, each loading on its own."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state_type = tff.StructWithPythonType([('w', tff.TensorType(np.float32, [2, 3])),
                                         ('n', tff.TensorType(np.int32))],
                                        collections.OrderedDict)
  keep = checkpoint_writer.KEEP_VERSIONS
  ckpt_dir = str(tmp_path / 'checkpoints')
  on_disk = {}

  class Recording(_EagerWorker):
    def write(self, held, path, layout, extras=(), wait=True, previous=None):
      version = _version_of(path)
      on_disk[version] = (
          [v for v in run_directory.checkpointed_rounds(ckpt_dir) if v < version - 1],
          sorted(int(re.match(r'program_state_(\d+)_temp', e).group(1))
                 for e in os.listdir(ckpt_dir) if '_temp' in e))
      return super().write(held, path, layout, extras, wait, previous)

  runner = Recording(state_type)
  writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
  writer.prepare(runner, checkpoint_writer.program_state(_small_state(0), _figures(0)),
                 scratch_dir=str(tmp_path))
  last = keep + 4
  for version in range(1, last + 1):
    writer.checkpoint(runner, _small_state(version), _figures(version), version)
  writer.wait()
  for version, (complete, temps) in on_disk.items():
    assert complete == list(range(max(1, version - keep), version - 1)), (version, on_disk)
    # Unfinished: this one, the one being completed, the oldest being removed.
    assert set(temps) <= {version, version - 1, version - keep - 1}, (version, temps)
    assert version in temps
  newest = list(range(last - keep + 1, last + 1))
  assert run_directory.checkpointed_rounds(ckpt_dir) == newest
  assert sorted(os.listdir(ckpt_dir)) == [f'program_state_{v}' for v in newest]
  structure = checkpoint_writer.program_state(_small_state(0), _figures(0))
  for version in newest:
    assert int(_tff_load(ckpt_dir, version, structure)['round']) == version


def _resident_runner(algorithm, tmp_path):
  """(config, a ResidentProcess) of `algorithm` on BASE's digits with the tiny CNN (FedCDA:
  K = 2, selecting after one round)."""
  from programs import computations  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  config = dataclasses.replace(BASE, algorithm=algorithm, fedcda_warmup_rounds=1,
                               fedcda_batches=1, fedcda_cache_size=2)
  process = computations.build_process(
      config, models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0), config.num_clients)
  return config, resident_state.ResidentProcess(process, config.clients_per_round,
                                                scratch_dir=str(tmp_path))


def test_a_started_write_is_complete_and_the_state_once_waited_for(tmp_path):
  """The worker's write of version 1, started by `checkpoint`, goes on while the next rounds
  run and Python drops the state it writes; once waited for, the version is complete and
  loads through FileProgramStateManager as that state, to the bit."""
  from tensorflow_federated.python.program import structure_utils  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  config, runner = _resident_runner('fedcda', tmp_path)
  fed = experiment.load_federated_data(config)

  def inputs(round_num):
    _, round_inputs = data.round_inputs(fed, round_num, config.clients_per_round, 1, 0)
    return [[x] for x in round_inputs]
  try:
    held, initial = runner.initial_state()
    structure = checkpoint_writer.program_state(initial, _figures(0))
    ckpt_dir = str(tmp_path / 'checkpoints')
    writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
    writer.prepare(runner, structure, scratch_dir=str(tmp_path))
    held, _ = runner.next(held, inputs(1))
    expected = runner.materialize(held)
    writer.checkpoint(runner, held, _figures(1), 1)
    dropped = held._value.reference  # pylint: disable=protected-access
    stub = runner._executor._stub  # pylint: disable=protected-access
    disposed, dispose = [], stub.dispose

    def recording_dispose(request):
      disposed.extend(request.value_ref)
      return dispose(request)
    stub.dispose = recording_dispose
    try:
      for round_num in (2, 3):   # (the second one's start sends the state's disposal)
        held, _ = runner.next(held, inputs(round_num))
    finally:
      stub.dispose = dispose
    assert dropped in disposed
    assert not run_directory.checkpointed_rounds(ckpt_dir)
    writer.wait()
  finally:
    runner.close()
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1]
  loaded = _tff_load(ckpt_dir, 1, structure)
  assert int(loaded['round']) == 1
  ours = structure_utils.flatten(loaded['state'])
  theirs = structure_utils.flatten(expected)
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs, strict=True):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_stop_with_a_write_in_flight_completes_it_then_the_last_round(
    unbroken, tmp_path, monkeypatch):
  """A SIGTERM during round 3 (checkpoints every 2 rounds): round 2's write, still in flight
  while round 3 ran, is waited for and its version completed, then round 3 is checkpointed
  and completed before the run stops; --resume then ends as the unbroken run."""
  from programs import stopping  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  events = []
  next_round, write = resident_state.ResidentProcess.next, resident_state.ResidentProcess.write
  publish = checkpoint_writer.CheckpointWriter._publish

  def signalling_next(self, *args, **kwargs):
    events.append('round')
    if events.count('round') == 3:
      os.kill(os.getpid(), signal.SIGTERM)   # (recorded: the run stops after this round)
    return next_round(self, *args, **kwargs)

  def recording_write(self, state, path, *args, **kwargs):
    written = write(self, state, path, *args, **kwargs)
    events.append(('start', _version_of(path)))

    class Recorded:
      def wait(self):
        events.append(('wait', _version_of(path)))
        return written.wait()
    return Recorded()

  def recording_publish(self, temp, version, *links):
    publish(self, temp, version, *links)
    events.append(('complete', version))

  monkeypatch.setattr(resident_state.ResidentProcess, 'next', signalling_next)
  monkeypatch.setattr(resident_state.ResidentProcess, 'write', recording_write)
  monkeypatch.setattr(checkpoint_writer.CheckpointWriter, '_publish', recording_publish)
  config = dataclasses.replace(BASE, checkpoint_every=2, root_output_dir=str(tmp_path),
                               experiment_name='t')
  with stopping.StopRequests() as stop:
    with pytest.raises(stopping.Interrupted) as info:
      experiment.run_experiment(config, _quiet, stop=stop)
  assert info.value.last_round == 3
  # (the thread completes version 2 while the worker writes 3: those two in either order)
  assert [e for e in events if e[0] != 'complete'] == [
      'round', 'round', ('start', 2), 'round', ('wait', 2), ('start', 3), ('wait', 3)]
  assert events[-1] == ('complete', 3)
  assert events.index(('wait', 2)) < events.index(('complete', 2)) < events.index(('wait', 3))
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  assert run_directory.checkpointed_rounds(ckpt_dir) == [2, 3]
  assert sorted(os.listdir(ckpt_dir)) == ['program_state_2', 'program_state_3']
  monkeypatch.undo()
  _resume_ends_as(unbroken, config, after=3)


def test_write_failures_are_named_in_a_few_words():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  full = tf.errors.ResourceExhaustedError(None, None, 'x.tempstate; No space left on device')
  assert checkpoint_writer.write_failure(full) == 'the disk is full'
  assert checkpoint_writer.write_failure(OSError(errno.ENOSPC, 'No space left on device')) == (
      'the disk is full')
  assert checkpoint_writer.write_failure(OSError(errno.EROFS, 'Read-only file system')) == (
      'the directory is not writable')
  denied = tf.errors.PermissionDeniedError(None, None, 'x; Permission denied')
  assert checkpoint_writer.write_failure(denied) == 'the directory is not writable'
  assert checkpoint_writer.write_failure(OSError(errno.EIO, 'Input/output error')) == (
      'OSError: Input/output error')


# The worker's SaveV2 refused by the disk, as its error comes back through gRPC.
WORKER_FULL = ('<_InactiveRpcError of RPC that terminated with: status = StatusCode.INTERNAL '
               'details = "Failed to run computation: {path}.data-00000-of-00001.tempstate1; '
               'No space left on device [[{{{{node SaveV2}}}}]]">')


@pytest.mark.parametrize('failure', ['full', 'unwritable'])
def test_a_failed_write_stops_the_run_in_one_line_and_resume_continues(
    failure, unbroken, tmp_path, monkeypatch):
  """The write of round 3 fails after leaving a half-written temp directory: the worker's
  write of the state (a full disk, reported when the write is waited for, at round 4's
  checkpoint) or the writer's thread completing the version (an unwritable directory). The
  run stops with one line naming the directory and the fix; round 2's checkpoint is intact
  and --resume, once the disk takes writes again, ends as the unbroken run."""
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  write = resident_state.ResidentProcess.write
  publish = checkpoint_writer.CheckpointWriter._publish

  class Refused:   # the worker's SaveV2 refused by the disk
    def __init__(self, path):
      self.path = path

    def wait(self):
      open(self.path + '.data-00000-of-00001.tempstate1', 'wb').close()
      raise RuntimeError(WORKER_FULL.format(path=self.path))

  def failing_write(self, state, path, *args, **kwargs):
    if failure == 'full' and 'program_state_3_temp' in path:
      assert kwargs == dict(wait=False, previous=None)   # (no state in parts here)
      return Refused(path)
    return write(self, state, path, *args, **kwargs)

  def failing_publish(self, temp, version, *links):
    if failure == 'unwritable' and version == 3:
      open(os.path.join(temp, 'saved_model.pb'), 'wb').close()
      raise PermissionError(errno.EACCES, 'Permission denied',
                            os.path.join(temp, 'fingerprint.pb'))
    return publish(self, temp, version, *links)

  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='f')
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  monkeypatch.setattr(resident_state.ResidentProcess, 'write', failing_write)
  monkeypatch.setattr(checkpoint_writer.CheckpointWriter, '_publish', failing_publish)
  with pytest.raises(ExperimentError) as raised:
    experiment.run_experiment(config, _quiet)
  message = str(raised.value)
  assert '\n' not in message
  what = 'the disk is full' if failure == 'full' else 'the directory is not writable'
  assert message == (f'cannot write the checkpoint of round 3 in {ckpt_dir}: {what}; free '
                     'space there or make it writable, then rerun with --resume: it continues '
                     'after round 2, the last one checkpointed')
  assert sorted(os.listdir(ckpt_dir)) == ['program_state_1', 'program_state_2']
  monkeypatch.undo()
  _resume_ends_as(unbroken, config, after=2)


@pytest.mark.parametrize('when', ['start', 'wait'])
def test_a_worker_write_that_fails_otherwise_is_not_dressed_up(when, tmp_path, monkeypatch):
  """The worker's write of round 3 fails for another reason than the file system's, when it
  starts or when it is waited for: its error ends the run as it is, and no partial version
  is left."""
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  write = resident_state.ResidentProcess.write

  class Crashed:
    def wait(self):
      raise RuntimeError('the worker crashed')

  def failing_write(self, state, path, *args, **kwargs):
    if 'program_state_3_temp' in path:
      if when == 'start':
        raise RuntimeError('the worker crashed')
      return Crashed()
    return write(self, state, path, *args, **kwargs)
  monkeypatch.setattr(resident_state.ResidentProcess, 'write', failing_write)
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='s')
  with pytest.raises(RuntimeError, match='^the worker crashed$'):
    experiment.run_experiment(config, _quiet)
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  assert sorted(os.listdir(ckpt_dir)) == ['program_state_1', 'program_state_2']


@pytest.mark.parametrize('algorithm', ['fedavg', 'fedcda'])
def test_a_version_the_worker_writes_is_the_managers_own(algorithm, tmp_path):
  """A version whose tensors the worker wrote (the default with a resident state) loads
  through tff.program's FileProgramStateManager (tf.saved_model.load, our fingerprint.pb
  among the files) as the same program state written by the manager's own `save`: the
  same leaves, to the bit and in the same dtypes (FedCDA's state: float32, float64 and
  int32 tensors), in the same files."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  config, runner = _resident_runner(algorithm, tmp_path)
  try:
    held, initial = runner.initial_state()
    figures = collections.OrderedDict(round=0, best_accuracy=-1.0,
                                      exploration_client_epochs=0.0)
    structure = checkpoint_writer.program_state(initial, figures)
    fed = experiment.load_federated_data(config)
    for round_num in (1, 2):
      _, inputs = data.round_inputs(fed, round_num, config.clients_per_round, 1, 0)
      held, _ = runner.next(held, [[x] for x in inputs])
    # Figures no float32 holds exactly: both ways round them alike.
    figures = collections.OrderedDict(round=2, best_accuracy=0.7,
                                      exploration_client_epochs=1 / 3)
    ours, theirs = str(tmp_path / 'ours'), str(tmp_path / 'theirs')
    writer = checkpoint_writer.CheckpointWriter(ours)
    writer.prepare(runner, structure, scratch_dir=str(tmp_path))
    with pytest.MonkeyPatch.context() as patch:   # nothing through Python here
      patch.setattr(resident_state.ResidentProcess, 'snapshot', None)
      writer.checkpoint(runner, held, figures, 2)
      writer.close()
    assert writer.checkpointed == 2
    reference = checkpoint_writer.CheckpointWriter(theirs)   # not prepared: the manager's save
    reference.checkpoint(runner, held, figures, 2)
    reference.close()
  finally:
    runner.close()
  from tensorflow_federated.python.program import structure_utils  # pylint: disable=g-import-not-at-top
  loaded = [_tff_load(directory, 2, structure) for directory in (ours, theirs)]
  assert [type(x) for x in loaded[0].values()] == [type(x) for x in loaded[1].values()]
  leaves = [structure_utils.flatten(x) for x in loaded]
  assert len(leaves[0]) == len(leaves[1]) == len(structure_utils.flatten(structure))
  for a, b in zip(*leaves, strict=True):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  if algorithm == 'fedcda':
    assert {np.asarray(x).dtype.name for x in leaves[0]} >= {'float32', 'float64', 'int32'}
  ours_files, their_files = (
      sorted((os.path.relpath(d, version), sorted(names)) for d, _, names in os.walk(version))
      for version in (os.path.join(ours, 'program_state_2'),
                      os.path.join(theirs, 'program_state_2')))
  assert ours_files == their_files


def test_fedcdas_cache_is_written_in_parts_and_unchanged_parts_are_shared(tmp_path):
  """With FedCDA's cache cut into its cached models (`min_part_bytes` small enough for the
  tiny CNN's), the worker writes each version's changed models only: a part of version v
  is version v - 1's file (the same inode) exactly when its bytes did not change between
  the two states (computed here from the states brought back), and every version loads
  through FileProgramStateManager as its state, to the bit, also once the versions it
  shares files with are removed."""
  from tensorflow_federated.python.program import structure_utils  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import state_transfer  # pylint: disable=g-import-not-at-top
  config, runner = _resident_runner('fedcda', tmp_path)
  fed = experiment.load_federated_data(config)
  ckpt_dir = str(tmp_path / 'checkpoints')
  expected = {}
  try:
    held, initial = runner.initial_state()
    structure = checkpoint_writer.program_state(initial, _figures(0))
    writer = checkpoint_writer.CheckpointWriter(ckpt_dir, min_part_bytes=1024)
    writer.prepare(runner, structure, scratch_dir=str(tmp_path))
    cut = writer._layout.cut  # pylint: disable=protected-access
    with pytest.MonkeyPatch.context() as patch:   # nothing through Python here
      patch.setattr(resident_state.ResidentProcess, 'snapshot', None)
      for version in range(1, 5):
        _, inputs = data.round_inputs(fed, version, config.clients_per_round, 1, 0)
        held, _ = runner.next(held, [[x] for x in inputs])
        writer.checkpoint(runner, held, _figures(version), version)
        expected[version] = runner.materialize(held)
      writer.close()
  finally:
    runner.close()
  # The newest three and version 1, written whole (WHOLE_EVERY, KEEP_WHOLE).
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1, 2, 3, 4]

  def parts(state):
    leaves = state_transfer.state_leaves(state, runner.state_type)
    return [row.tobytes() for i, axes, n in cut
            for row in np.asarray(leaves[i]).reshape(n, -1)]

  def inode(version, part):
    return os.stat(os.path.join(ckpt_dir, f'program_state_{version}', bundle_parts.PARTS_DIR,
                                f'part_{part}{bundle_parts.DATA_SUFFIX}')).st_ino
  # The cache's chunks are cut into their cached models (K = 2 per client).
  assert cut and sum(n for _, _, n in cut) >= 2 * config.num_clients
  for version in (3, 4):
    before, after = parts(expected[version - 1]), parts(expected[version])
    same = [a == b for a, b in zip(before, after, strict=True)]
    assert 0 < sum(same) < len(same)   # some clients' models changed, others did not
    assert [inode(version, p) == inode(version - 1, p) for p in range(len(same))] == same

  def assert_loads(version):
    loaded = structure_utils.flatten(_tff_load(ckpt_dir, version, structure)['state'])
    for a, b in zip(loaded, structure_utils.flatten(expected[version]), strict=True):
      assert np.asarray(a).dtype == np.asarray(b).dtype
      assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  for version in (2, 3, 4):
    assert_loads(version)
  for version in (2, 3):
    shutil.rmtree(os.path.join(ckpt_dir, f'program_state_{version}'))
  assert_loads(4)


def test_a_state_held_in_python_is_written_through_the_managers_save(tmp_path):
  """A runner whose worker holds no state (worker services: DirectProcess) is not prepared
  and its versions go through FileProgramStateManager.save, as before."""
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  runner = resident_state.DirectProcess(process=None)
  state = collections.OrderedDict(w=np.arange(6, dtype=np.float32).reshape(2, 3),
                                  n=np.int64(7))
  figures = collections.OrderedDict(round=1, best_accuracy=0.5, exploration_client_epochs=0.0)
  writer = checkpoint_writer.CheckpointWriter(str(tmp_path))
  writer.prepare(runner, checkpoint_writer.program_state(state, figures))
  writer.checkpoint(runner, state, figures, 1)
  writer.close()
  loaded = _tff_load(str(tmp_path), 1, checkpoint_writer.program_state(state, figures))
  np.testing.assert_array_equal(loaded['state']['w'], state['w'])
  assert loaded['state']['n'] == 7 and int(loaded['round']) == 1


def test_a_state_the_worker_holds_otherwise_is_left_to_the_manager_with_a_warning(
    tmp_path, caplog):
  """A worker whose state's dtype differs from the program state's (here float64 against
  float32) cannot write the versions leaf by leaf: `prepare` says so in a warning and leaves
  them to FileProgramStateManager; a matching one is prepared."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  initial = checkpoint_writer.program_state(_small_state(0), _figures(0))
  writers = {}
  for dtype in (np.float32, np.float64):
    state_type = tff.StructWithPythonType([('w', tff.TensorType(dtype, [2, 3])),
                                           ('n', tff.TensorType(np.int32))],
                                          collections.OrderedDict)
    writers[dtype] = checkpoint_writer.CheckpointWriter(str(tmp_path / dtype.__name__))
    with caplog.at_level('WARNING'):
      writers[dtype].prepare(_EagerWorker(state_type), initial, scratch_dir=str(tmp_path))
  assert writers[np.float32].worker_writes and not writers[np.float64].worker_writes
  [warning] = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert 'FileProgramStateManager' in warning and 'float64' in warning


def test_the_template_leaves_the_threads_event_loop_as_it_was(tmp_path):
  """Making the template (in the round loop's thread, at a run's start) neither replaces nor
  unsets that thread's current event loop, which TFF's program code in it reads."""
  from tff_algos.runtime import saved_model_template  # pylint: disable=g-import-not-at-top
  previous = asyncio.get_event_loop()
  loop = asyncio.new_event_loop()
  asyncio.set_event_loop(loop)
  try:
    saved_model_template.SavedModelTemplate(
        checkpoint_writer.program_state(
            collections.OrderedDict(w=np.ones([2], np.float32)),
            collections.OrderedDict(round=0, best_accuracy=-1.0, exploration_client_epochs=0.0)),
        scratch_dir=str(tmp_path))
    assert asyncio.get_event_loop() is loop
  finally:
    asyncio.set_event_loop(previous)
    loop.close()


def _damage(path):
  """Flips bytes in the middle of a file (a checksum no longer matches)."""
  with open(path, 'r+b') as f:
    data = bytearray(f.read())
    middle = len(data) // 2
    data[middle:middle + 32] = bytes(b ^ 0xff for b in data[middle:middle + 32])
    f.seek(0)
    f.write(data)


def _tensorboard_steps(directory):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  steps = collections.Counter()
  for name in os.listdir(directory):
    for record in tf.data.TFRecordDataset(os.path.join(directory, name)):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag == 'test_accuracy':
          steps[event.step] += 1
  return steps


def test_resume_falls_back_past_unreadable_checkpoints(unbroken, tmp_path, monkeypatch):
  """Rounds 3 and 4's checkpoints are damaged (a flipped tensor, a cut-off graph): --resume
  warns once, removes them, cuts metrics.csv and TensorBoard back to round 2, resumes from
  round 2's and ends as the unbroken run; every kept version then loads through
  tff.program's FileProgramStateManager."""
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='d')
  experiment.run_experiment(config, _quiet)
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  assert run_directory.checkpointed_rounds(ckpt_dir) == [2, 3, 4]
  _damage(os.path.join(ckpt_dir, 'program_state_4', 'variables',
                       'variables.data-00000-of-00001'))
  graph = os.path.join(ckpt_dir, 'program_state_3', 'saved_model.pb')
  with open(graph, 'r+b') as f:
    f.truncate(os.path.getsize(graph) // 2)
  cut = []
  truncate = run_directory.truncate_tensorboard

  def recording_truncate(directory, last_round):
    cut.append((len(_rows(config.experiment_dir)), last_round))
    truncate(directory, last_round)
  monkeypatch.setattr(run_directory, 'truncate_tensorboard', recording_truncate)
  structure = _program_state_structure(monkeypatch)
  messages = []
  experiment.run_experiment(dataclasses.replace(config, resume=True), messages.append)
  warnings = [m for m in messages if m.startswith('warning:')]
  assert warnings == [
      f'warning: the checkpoints of rounds 3, 4 in {ckpt_dir} cannot be read '
      f'({warnings[0].split("(")[1].split(")")[0]}) and are removed: resuming after round 2, '
      'so rounds 3-4 are recomputed'], messages
  assert f'resuming {config.experiment_dir} after round 2' in messages
  assert cut == [(2, 2)]   # metrics.csv held rounds 1-2 when TensorBoard was cut to round 2
  _assert_same_run(unbroken, config.experiment_dir)
  assert _tensorboard_steps(os.path.join(config.experiment_dir, 'tensorboard')) == {
      1: 1, 2: 1, 3: 1, 4: 1}
  versions = run_directory.checkpointed_rounds(ckpt_dir)
  assert versions == [2, 3, 4]
  for version in versions:
    loaded = _tff_load(ckpt_dir, version, structure[0])
    assert int(loaded['round']) == version


def test_a_checkpoint_of_another_program_is_still_refused(tmp_path):
  """No version loads (another program's state): the resume is refused and nothing removed."""
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='o',
                               rounds=2)
  experiment.run_experiment(config, _quiet)
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  loop = asyncio.new_event_loop()
  try:
    writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
    with pytest.raises(ExperimentError, match='does not match this program'):
      run_directory.load_checkpoint(loop, writer.manager, {'other': np.zeros(3)},
                                    config.experiment_dir, _quiet)
  finally:
    loop.close()
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1, 2]


# -- the training program as a process: SIGKILL at random moments, a full disk ---------------

# programs.train with its checkpoints' tensors cut into parts of this many bytes at least.
_TRAIN_IN_PARTS = ('from absl import app\n'
                   'from tff_algos.runtime import bundle_parts\n'
                   'bundle_parts.MIN_PART_BYTES = {}\n'
                   'from programs import train\n'
                   'app.run(train.main)')


def _train(args, part_bytes=None, **kwargs):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  program = (['-m', 'programs.train'] if part_bytes is None else
             ['-c', _TRAIN_IN_PARTS.format(part_bytes)])
  return subprocess.Popen([sys.executable, *program, *FLAGS, *args], cwd=ROOT, env=env,
                          **kwargs)


def _versions_and_writes(ckpt_dir):
  entries = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
  return (run_directory.checkpointed_rounds(ckpt_dir),
          any('_temp' in entry for entry in entries))


# FedCDA's checkpoints written in parts (its cached models: bundle_parts), each version
# sharing its unchanged models' files with the one before.
_FEDCDA = dict(algorithm='fedcda', fedcda_cache_size=2, fedcda_warmup_rounds=1)


@pytest.mark.slow
@pytest.mark.parametrize('method', ['fedavg', 'fedcda_in_parts'])
def test_sigkill_at_random_moments_resumes_bit_exact(method, tmp_path, monkeypatch):
  """20 rounds checkpointed every round, killed (SIGKILL) again and again at random moments,
  half of them while a version is being written, and resumed each time: no kill loses a
  finished checkpoint or leaves one that does not load, and the run ends as the unbroken
  one. FedCDA's versions are written in parts (each sharing what did not change)."""
  rounds = 20
  in_parts = method == 'fedcda_in_parts'
  config = dataclasses.replace(BASE, rounds=rounds, root_output_dir=str(tmp_path),
                               experiment_name='unbroken', **(_FEDCDA if in_parts else {}))
  part_bytes = 1024 if in_parts else None
  method_flags = [f'--{k}={v}' for k, v in _FEDCDA.items()] if in_parts else []
  experiment.run_experiment(config, _quiet)
  structure = _program_state_structure(monkeypatch)
  name = 'killed'
  exp_dir = os.path.join(tmp_path, name)
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  rng = random.Random(0)
  kills = 0
  for attempt in range(5):
    proc = _train([*method_flags, f'--rounds={rounds}', '--resume',
                   f'--root_output_dir={tmp_path}', f'--experiment_name={name}'],
                  part_bytes, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = max(run_directory.checkpointed_rounds(ckpt_dir), default=0)
    mid_write = attempt % 2 == 0
    delay = rng.uniform(0.0, 0.3)   # (a few rounds here: each attempt leaves rounds to run)
    deadline = time.time() + 600
    seen = start
    while proc.poll() is None and time.time() < deadline:
      versions, writing = _versions_and_writes(ckpt_dir)
      newest = max(versions, default=0)
      seen = max(seen, newest)
      if newest > start and (writing if mid_write else True):
        if not mid_write:
          time.sleep(delay)
        break
      time.sleep(0.002)
    if proc.poll() is not None:
      break   # the run finished before this kill
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kills += 1
    versions = run_directory.checkpointed_rounds(ckpt_dir)
    assert max(versions) >= seen, (versions, seen)   # no finished checkpoint lost
  assert kills >= 3
  finished = _train([*method_flags, f'--rounds={rounds}', '--resume',
                     f'--root_output_dir={tmp_path}', f'--experiment_name={name}'],
                    part_bytes, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  _, err = finished.communicate(timeout=900)
  assert finished.returncode == 0, err
  assert 'warning:' not in err
  _assert_same_run(os.path.join(tmp_path, 'unbroken'), exp_dir)
  # The structure the program loads its checkpoints as, from an in-process resume.
  experiment.run_experiment(dataclasses.replace(config, resume=True), _quiet)
  for version in run_directory.checkpointed_rounds(ckpt_dir):
    assert int(_tff_load(ckpt_dir, version, structure[0])['round']) == version
    parts = os.path.join(ckpt_dir, f'program_state_{version}', 'parts')
    assert os.path.isdir(parts) == in_parts


@pytest.fixture
def small_disk(tmp_path):
  """A 16 MiB tmpfs (needs the right to mount: root); unmounted afterwards."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', str(disk)],
                           capture_output=True)
  if mounted.returncode:
    pytest.skip('cannot mount a tmpfs here (not root?)')
  try:
    yield disk
  finally:
    subprocess.run(['umount', '-l', str(disk)], check=False)


def _fill(path):
  """Fills the file system of `path` with a file at `path` until it refuses a byte."""
  with open(path, 'wb', buffering=0) as f:
    for size in (1 << 20, 1 << 12, 1):
      try:
        while True:
          f.write(b'\0' * size)
      except OSError as e:
        assert e.errno == errno.ENOSPC, e


@pytest.mark.slow
def test_a_full_disk_stops_the_program_in_one_line_and_resume_continues(small_disk, tmp_path):
  """The disk fills up after round 2's checkpoint: the program stops with one `error:` line
  naming the directory and the fix (exit 2), its newest checkpoint loads, and once space is
  free --resume ends as the unbroken run."""
  rounds = 8
  reference = dataclasses.replace(BASE, rounds=rounds, root_output_dir=str(tmp_path),
                                  experiment_name='unbroken')
  experiment.run_experiment(reference, _quiet)
  exp_dir = os.path.join(small_disk, 'full')
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  proc = _train([f'--rounds={rounds}', f'--root_output_dir={small_disk}',
                 '--experiment_name=full'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
  deadline = time.time() + 600
  while (max(run_directory.checkpointed_rounds(ckpt_dir), default=0) < 2
         and proc.poll() is None and time.time() < deadline):
    time.sleep(0.002)
  assert proc.poll() is None, proc.communicate()
  filler = os.path.join(small_disk, 'filler')
  _fill(filler)
  _, err = proc.communicate(timeout=600)
  lines = [line for line in err.splitlines() if line.strip()]
  assert proc.returncode == 2, err
  assert len(lines) == 1 and lines[0].startswith('error: cannot write '), err
  assert 'the disk is full; free space there' in lines[0] and exp_dir in lines[0], err
  assert 'rerun with --resume' in lines[0], err
  kept = run_directory.checkpointed_rounds(ckpt_dir)
  assert kept and not _versions_and_writes(ckpt_dir)[1], os.listdir(ckpt_dir)
  os.remove(filler)
  resumed = _train([f'--rounds={rounds}', '--resume', f'--root_output_dir={small_disk}',
                    '--experiment_name=full'], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True)
  _, err = resumed.communicate(timeout=900)
  assert resumed.returncode == 0, err
  assert f'resuming {exp_dir} after round {max(kept)}' in err, err
  _assert_same_run(reference.experiment_dir, exp_dir)


# -- damage to a part shared by hard link (FedCDA's cache in parts, the real worker) ---------

_FEDCDA_CONFIG = dict(algorithm='fedcda', fedcda_cache_size=2, fedcda_warmup_rounds=1,
                      fedcda_batches=1)


@pytest.fixture(scope='module')
def unbroken_fedcda(tmp_path_factory):
  """BASE's 4 rounds of FedCDA, uninterrupted."""
  root = tmp_path_factory.mktemp('unbroken_fedcda')
  config = dataclasses.replace(BASE, root_output_dir=str(root), experiment_name='a',
                               **_FEDCDA_CONFIG)
  experiment.run_experiment(config, _quiet)
  return config.experiment_dir


@pytest.fixture
def in_parts(monkeypatch):
  """The program's checkpoints of FedCDA's cache in parts of at least 1 KiB (its cached
  models of the tiny CNN)."""
  from tff_algos.runtime import bundle_parts  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bundle_parts, 'MIN_PART_BYTES', 1024)
  return bundle_parts


def _part_files(ckpt_dir, version, bundle_parts):
  parts = os.path.join(ckpt_dir, f'program_state_{version}', bundle_parts.PARTS_DIR)
  return sorted(os.path.join(parts, name) for name in os.listdir(parts)
                if name.endswith(bundle_parts.DATA_SUFFIX))


def test_a_damaged_shared_part_is_named_and_resume_restores_the_newest_whole_version(
    unbroken_fedcda, in_parts, tmp_path, monkeypatch):
  """One version in two written whole (1 and 3); a part of version 3 that version 4 shares
  is truncated: --resume names the file as damaged, removes the two versions holding it and
  resumes from version 2 (sharing only version 1's files), ending as the unbroken run."""
  monkeypatch.setattr(checkpoint_writer, 'WHOLE_EVERY', 2)
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='d',
                               **_FEDCDA_CONFIG)
  experiment.run_experiment(config, _quiet)
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1, 2, 3, 4]
  assert [in_parts.read_record(os.path.join(ckpt_dir, f'program_state_{v}'))['whole']
          for v in (1, 2, 3, 4)] == [True, False, True, False]
  shared = [path for path in _part_files(ckpt_dir, 3, in_parts)
            if os.path.samefile(path, path.replace('program_state_3', 'program_state_4'))]
  assert shared   # (FedCDA's round 4 leaves some clients' cached models as they were)
  with open(shared[0], 'r+b') as f:
    f.truncate(os.path.getsize(shared[0]) // 2)
  messages = []
  experiment.run_experiment(dataclasses.replace(config, resume=True), messages.append)
  assert messages == [
      f'warning: checkpoint part {shared[0]} is damaged (size differs from its record); '
      'resuming from version 2',
      f'warning: the checkpoints of rounds 3, 4 in {ckpt_dir} share a damaged part or cannot '
      'be read and are removed: resuming after round 2, so rounds 3-4 are recomputed',
      f'resuming {config.experiment_dir} after round 2'], messages
  _assert_same_run(unbroken_fedcda, config.experiment_dir)
  # Every version damaged: the resume is refused in one line naming the damage, not as a
  # checkpoint of another program, and nothing is removed.
  versions = run_directory.checkpointed_rounds(ckpt_dir)
  for version in versions:
    for path in _part_files(ckpt_dir, version, in_parts):
      _damage(path)
  loop = asyncio.new_event_loop()
  try:
    with pytest.raises(ExperimentError) as raised:
      run_directory.load_checkpoint(loop, checkpoint_writer.CheckpointWriter(ckpt_dir).manager,
                                    {'unused': np.zeros(1)}, config.experiment_dir, _quiet)
  finally:
    loop.close()
  assert re.fullmatch(
      f'cannot resume {re.escape(config.experiment_dir)}: checkpoint part \\S+ is damaged '
      r'\(fingerprint differs from its record\) and no version of it is whole; start the run '
      r'afresh \(another --experiment_name\)', str(raised.value)), str(raised.value)
  assert run_directory.checkpointed_rounds(ckpt_dir) == versions


def test_a_part_damaged_during_the_run_is_written_anew_and_the_run_stays_resumable(
    unbroken_fedcda, in_parts, tmp_path, monkeypatch):
  """Every part file of version 2 (files version 1 shares) has bytes flipped as soon as the
  version is complete: the writer reads version 2 back, names each file in a warning, drops
  version 3 (which would link some of them) and writes version 4 whole, sharing nothing;
  the run ends as the unbroken one and --resume restores version 4 without a warning."""
  publish = checkpoint_writer.CheckpointWriter._publish
  ckpt_dir = os.path.join(tmp_path, 'l', 'checkpoints')
  flipped = []

  def damaging_publish(self, temp, version, *rest):
    publish(self, temp, version, *rest)
    if version == 2:
      flipped.extend(_part_files(ckpt_dir, 2, in_parts))
      for path in flipped:
        _damage(path)
  monkeypatch.setattr(checkpoint_writer.CheckpointWriter, '_publish', damaging_publish)
  config = dataclasses.replace(BASE, root_output_dir=str(tmp_path), experiment_name='l',
                               **_FEDCDA_CONFIG)
  messages = []
  experiment.run_experiment(config, messages.append)
  assert flipped and messages == [
      f'warning: checkpoint part {path} is damaged (fingerprint differs from its record); '
      'round 3\'s checkpoint, which would share it, is dropped and the next one is written '
      'whole' for path in flipped], messages
  assert run_directory.checkpointed_rounds(ckpt_dir) == [1, 2, 4]
  assert in_parts.read_record(os.path.join(ckpt_dir, 'program_state_4'))['whole']
  assert not in_parts.damaged_parts(os.path.join(ckpt_dir, 'program_state_4'))
  older = {os.stat(p).st_ino for v in (1, 2) for p in _part_files(ckpt_dir, v, in_parts)}
  assert not older & {os.stat(p).st_ino for p in _part_files(ckpt_dir, 4, in_parts)}
  _assert_same_run(unbroken_fedcda, config.experiment_dir)
  monkeypatch.undo()
  _resume_ends_as(unbroken_fedcda, config, after=4)
