"""A LearningProcess whose server state stays inside TFF's worker between rounds.

`process.next(state, data)` on TFF's synchronous context sends the whole server state to the
C++ worker and brings the new one back every round: for FedCDA's cache (4·N·K·D bytes) or
FedCross's K middleware models that transfer, and its serialisation, is most of a round
(benchmarks/results/RESULTS.md, "The state kept in the worker"). `ResidentProcess` runs the
same computations on the same worker through TFF's executor interface (`create_value`,
`create_call`, `create_selection`), keeps the state there as a value reference, and brings
back only what the caller asks for: the round's metrics, the model weights (for evaluation)
or, when a checkpoint needs it, the whole state. Results are those of `process.next` (tested
for every method). Its calls run with Python's garbage collector paused (`collector`).

A value TFF's C++ worker computes keeps the values it was computed from alive (a TF call's
result holds its argument: `detach_computations`), so a state computed round after round
would keep every earlier round and the worker would grow without bound. `next` therefore
detaches each new state: once it is computed, its top-level fields are picked out and zipped
again in the worker, which holds their tensors and nothing else (no copy), and the disposals
of the values Python has dropped are sent at the start of each round rather than in TFF's
batches of 20 (benchmarks/results/RESULTS.md, "The resident state's memory"). `refresh`
(placing the state anew) cuts the history by a write and a read of the whole state;
`refresh_every` does it periodically (by default only for a state `next` cannot detach).

    resident = ResidentProcess(process, clients_per_round=10)
    state = resident.initialize()                    # a ResidentValue, in the worker
    for round_num in ...:
      state, metrics = resident.next(state, client_data)
      weights = resident.get_model_weights(state)    # a tff.learning.models.ModelWeights
    python_state = resident.materialize(state)       # e.g. to checkpoint it
    read = resident.snapshot(state)                  # or: the worker writes it now, and
    python_state = read()                            # read() may run in another thread
    resident.write(state, path, layout, extras)      # or the worker writes a file of its own
    written = resident.write(state, path, layout, extras, wait=False)
    state, metrics = resident.next(state, ...)       # ... while the next round runs
    written.wait()                                   # the file is written
    state = resident.adopt(python_state)             # e.g. after loading a checkpoint

How the state crosses between Python and the worker (`transfer`: files or values) and the
files the worker writes of it (`FileLayout`) are `state_transfer`'s.
`initial_state()` computes `initialize` in the worker and brings back one copy.

It needs TFF's local runtime (the context `execution.initialize_runtime()` installs without
workers): on several worker services each round's state is split and merged by TFF's
mergeable context, which holds no value between calls.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import tempfile
from typing import Any, NamedTuple, Optional
import weakref

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
# TFF's executor-level pieces, as its AsyncExecutionContext uses them (TFF 0.87).
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_algos.runtime import contexts
from tff_algos.runtime.collector import collector_paused
from tff_algos.runtime.state_transfer import (
    CHUNK_BYTES, TRANSFERS, FileLayout, join_computation, chunk_type,
    read_state_file, remove_state_file, restore_computation, save_argument_type,
    save_arguments, save_computation, split_computation, state_file_layout, state_leaves,
    state_chunks, write_state_file)


# The name of the scratch directory transfer='files' makes in its `scratch_dir` (removed
# when the ResidentProcess is; one a kill left behind: `remove_scratch_directories`).
SCRATCH_PREFIX = 'tff_algos_resident_'
# A state `next` cannot detach (`detach_computations`) is placed anew this often by default.
UNDETACHED_REFRESH_ROUNDS = 10


def _paused(method):
  """`method` run with Python's garbage collector paused (`collector_paused`): a round
  runner's calls are the TFF calls of a training loop."""
  @functools.wraps(method)
  def paused(*args, **kwargs):
    with collector_paused():
      return method(*args, **kwargs)
  return paused


def remove_scratch_directories(directory: str) -> None:
  """Removes the scratch directories ResidentProcesses made in `directory` (e.g. one a
  killed run left); none may be in use."""
  for entry in os.listdir(directory):
    if entry.startswith(SCRATCH_PREFIX):
      shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def detach_computations(state_type):
  """(split, join) that give a state the worker has computed a value of its own, holding its
  tensors and nothing of the rounds that computed it (`ResidentProcess.next` runs both after
  every round); None for a state that is not a struct of fields.

  TFF 0.87's worker runs each TensorFlow call on a `std::packaged_task`, whose shared state,
  which the result's future shares, keeps the task's lambda and with it the call's argument:
  a state computed round after round keeps every earlier round alive (TFF's
  TensorFlowExecutor::CreateCall and ThreadRun). A struct or a selection the worker makes of
  values already computed is made at once and holds only their tensors. So `split`
  (state@SERVER -> <field_0@SERVER, ..., ready@SERVER>) picks out the state's top-level
  fields, one TF call each that returns its input's tensors (no copy), and `ready` is
  computed once they all are; `join` (<field_0@SERVER, ...> -> state@SERVER) then zips the
  computed fields into the state again.
  """
  try:
    return _detach_computations(state_type)
  except (TypeError, ValueError):   # e.g. fields partly named: nothing to rebuild it from
    return None


def _detach_computations(state_type):
  member = state_type.member
  if not isinstance(member, tff.StructType) or not len(member):
    return None
  names = [name for name, _ in structure.iter_elements(member)]
  field_types = [t for _, t in structure.iter_elements(member)]

  def picker(index):
    @tff.tensorflow.computation(member)
    def pick(state):
      return state[index]
    return pick

  pickers = [picker(i) for i in range(len(field_types))]

  @tff.tensorflow.computation(tff.StructType([(None, t) for t in field_types]))
  def ready(fields):
    del fields   # an argument: computed once every field is
    return tf.constant(True)

  @tff.federated_computation(state_type)
  def split(state):
    fields = [tff.federated_map(pick, state) for pick in pickers]
    return fields + [tff.federated_map(ready, tff.federated_zip(fields))]

  @tff.federated_computation(
      tff.StructType([(None, tff.FederatedType(t, tff.SERVER)) for t in field_types]))
  def join(fields):
    named = structure.Struct(list(zip(names, fields)))
    return tff.federated_zip(type_conversions.type_to_py_container(named, member))

  if not join.type_signature.result.is_equivalent_to(state_type):
    return None   # (containers aside, which `materialize` restores from the state's type)
  return split, join



class ResidentValue:
  """A server state held in the worker by one `ResidentProcess` (opaque to callers)."""

  def __init__(self, value, owner: 'ResidentProcess', python=None):
    self._value = value
    self._owner = owner
    # The Python state it was placed from (`adopt`), shared with the caller, who must not
    # change its arrays in place: `materialize` returns it instead of fetching the value.
    self._python = python
    # What `materialize` brought back of a computed state, kept while the state lives for a
    # `refresh` (or another `materialize`) to use: with transfer='files' its file (a
    # weakref.finalize that removes it), with 'values' the Python copy.
    self._file = None
    self._fetched = None


def _file_of(state: ResidentValue) -> Optional[str]:
  """The file `materialize` left of `state` (transfer='files'), if any is left."""
  kept = state._file.peek() if state._file is not None else None  # pylint: disable=protected-access
  return kept[2][0] if kept else None   # (state, remove_state_file, (path,), {})


class WriteInFlight:
  """A file the worker is writing (`ResidentProcess.write(..., wait=False)`). `wait()`
  returns once it is written, or raises the worker's error (a full disk: a gRPC error
  naming SaveV2); later calls return at once. Call it on the thread that makes the
  ResidentProcess's calls (it uses TFF's executor), before the process is closed."""

  def __init__(self, owner: 'ResidentProcess', written):
    self._owner = owner
    self._written = written   # the save call's value in the worker (until waited for)

  @_paused
  def wait(self):
    """Returns the write's result the first time (with a FileLayout's `cut`, the parts'
    fingerprints), None after."""
    written, self._written = self._written, None
    if written is not None:
      return self._owner._run(written.compute())  # pylint: disable=protected-access
    return None


class ResidentOutput(NamedTuple):
  state: ResidentValue
  metrics: Any


class ResidentProcess:
  """Runs `process` with its server state resident in TFF's local worker.

  Args:
    process: a `tff.learning.templates.LearningProcess` (any of this package's methods,
      or TFF's own).
    clients_per_round: the number of clients of every `next` call (the worker's executor
      is created for that cardinality once).
    context: TFF's local synchronous execution context (default: the one
      `execution.initialize_runtime()` installed).
    refresh_every: every this many rounds of this process, `next` places the new state in
      the worker anew (`refresh`; 0 = never). Default: never, since `next` detaches every new
      state (module doc); 10 for a state it cannot detach (not a struct of fields).
    transfer: how the state crosses between Python and the worker (`materialize`, `adopt`)
      and is placed anew (`refresh`): 'files' (default): as a TensorFlow checkpoint in
      `scratch_dir` that one side writes and the other reads (a refresh never leaves the
      worker); 'values': as TFF values through the worker's gRPC interface.
    chunk_bytes: with transfer='values', a state larger than this crosses in chunks of about
      this size, its tensors grouped in order (a tensor larger than it goes alone), instead
      of as one message (0 = always whole).
    scratch_dir: where transfer='files' makes its directory, at the first transfer (default:
      the system's temp directory); the worker must see the same file system (TFF's local
      runtime does). A state's file lives as long as the state (or until it is refreshed);
      `close()` removes the directory.
  """

  def __init__(self, process: tff.learning.templates.LearningProcess, clients_per_round: int,
               context: Optional[sync_execution_context.SyncExecutionContext] = None,
               refresh_every: Optional[int] = None, chunk_bytes: int = CHUNK_BYTES,
               transfer: str = 'files', scratch_dir: Optional[str] = None):
    if context is None:   # the run's own context: another one would start another worker
      if contexts.installed_context() is None:
        contexts.initialize_runtime()
      context = contexts.installed_context()
    if not isinstance(context, sync_execution_context.SyncExecutionContext):
      raise TypeError(
          'ResidentProcess needs TFF\'s local runtime (execution.initialize_runtime() without '
          f'workers); got {type(context).__name__}: on worker services each round is split '
          'and merged by TFF\'s mergeable context, which holds no value between calls')
    if clients_per_round < 1:
      raise ValueError(f'clients_per_round must be >= 1, got {clients_per_round}')
    if refresh_every is not None and refresh_every < 0:
      raise ValueError(f'refresh_every must be >= 0, got {refresh_every}')
    if chunk_bytes < 0:
      raise ValueError(f'chunk_bytes must be >= 0, got {chunk_bytes}')
    if transfer not in TRANSFERS:
      raise ValueError(f'transfer must be one of {TRANSFERS}, got {transfer!r}')
    self._transfer = transfer
    self._rounds = 0
    self._process = process
    self._clients_per_round = int(clients_per_round)
    async_context = context._async_context  # pylint: disable=protected-access
    self._runner = context._async_runner  # pylint: disable=protected-access
    self._compile = async_context._compiler_pipeline.compile  # pylint: disable=protected-access
    self._transform_args = async_context._transform_args  # pylint: disable=protected-access
    self._transform_result = async_context._transform_result  # pylint: disable=protected-access
    self._executor = async_context.executor_factory.create_executor(
        {tff.CLIENTS: self._clients_per_round})
    self._state_type = process.initialize.type_signature.result   # <...>@SERVER
    get_weights = process.get_model_weights

    # get_model_weights takes the unplaced state; the resident state is placed at SERVER.
    @tff.federated_computation(self._state_type)
    def weights_at_server(state):
      return tff.federated_map(get_weights, state)

    self._computations = dict(initialize=process.initialize, next=process.next,
                              get_model_weights=weights_at_server)
    detach = detach_computations(self._state_type)
    self._detached_fields = 0 if detach is None else len(self._state_type.member)
    if detach is not None:
      self._computations.update(detach_split=detach[0], detach_join=detach[1])
    if refresh_every is None:
      refresh_every = 0 if detach is not None else UNDETACHED_REFRESH_ROUNDS
    self._refresh_every = int(refresh_every)
    self._embedded = {}
    self._scratch_dir = os.path.abspath(scratch_dir or tempfile.gettempdir())
    self._scratch = None        # made at the first transfer
    self._remove_scratch = None
    self._closed = False
    self._layouts = {}   # the FileLayout of each save computation, by its name
    if transfer == 'files':
      self._computations.update(save=save_computation(self._state_type),
                                restore=restore_computation(self._state_type))
      self._layouts['save'] = state_file_layout(self._state_type.member)
      self._file_names = itertools.count()
    self._chunks = (state_chunks(self._state_type.member, chunk_bytes)
                    if chunk_bytes and transfer == 'values' else None)
    if self._chunks is not None:
      self._computations.update(split=split_computation(self._state_type, self._chunks),
                                join=join_computation(self._state_type, self._chunks))

  # -- helpers ------------------------------------------------------------------------------

  def _run(self, coroutine):
    return self._runner.run_coro_and_return_result(coroutine)

  async def _function(self, name: str):
    """The computation `name`, compiled and embedded in the worker once."""
    if name not in self._embedded:
      compiled = self._compile(self._computations[name])
      self._embedded[name] = await self._executor.create_value(compiled,
                                                               compiled.type_signature)
    return self._embedded[name]

  def _python(self, value, type_spec):
    value = type_conversions.type_to_py_container(value, type_spec)
    return self._transform_result(value) if self._transform_result is not None else value

  async def _ingest(self, value, type_spec):
    if self._transform_args is not None:
      value = self._transform_args(value)
    return await async_execution_context._ingest(self._executor, value, type_spec)  # pylint: disable=protected-access

  def _flush_disposals(self) -> None:
    """Sends now the disposals of the worker's values Python has dropped, which TFF's
    RemoteExecutor sends in batches of 20: the states of earlier rounds are among them.
    (Runs on the runner's thread, as TFF's own executor calls do.)"""
    executor = self._executor
    pending = getattr(executor, '_dispose_request', None)
    if pending is None or not len(pending.value_ref):
      return
    executor._dispose_request = executor_pb2.DisposeRequest(executor=executor._executor_id)  # pylint: disable=protected-access
    try:
      executor._stub.dispose(pending)  # pylint: disable=protected-access
    except Exception:  # pylint: disable=broad-except
      # Not fatal here: TFF sends them again with its next batch (the round itself will
      # report a worker that does not answer).
      executor._dispose_request.value_ref.extend(pending.value_ref)  # pylint: disable=protected-access

  async def _detached(self, value):
    """`value` (a state the worker has computed) as a value holding only its tensors
    (`detach_computations`); as it is if the state has no fields to detach."""
    if not self._detached_fields:
      return value
    executor = self._executor
    split = await executor.create_call(await self._function('detach_split'), value)
    await (await executor.create_selection(split, self._detached_fields)).compute()
    fields = [await executor.create_selection(split, i) for i in range(self._detached_fields)]
    return await executor.create_call(await self._function('detach_join'),
                                      await executor.create_struct(structure.Struct.unnamed(*fields)))

  def _resident_check(self, state: ResidentValue) -> None:
    if state._owner is not self:  # pylint: disable=protected-access
      raise ValueError('this state is held by another ResidentProcess (another executor); '
                       'materialize it there and adopt it here')

  async def _resident(self, state):
    """The worker's reference to `state` (a ResidentValue of this process, or a value)."""
    if isinstance(state, ResidentValue):
      self._resident_check(state)
      return state._value  # pylint: disable=protected-access
    return await self._ingest(state, self._state_type)

  # -- the state's files (transfer='files') -------------------------------------------------

  def _new_file(self) -> str:
    if self._closed:
      raise ValueError('this ResidentProcess is closed')
    if self._scratch is None:
      self._scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self._scratch_dir)
      self._remove_scratch = weakref.finalize(self, shutil.rmtree, self._scratch, True)
    return os.path.join(self._scratch, f'state_{next(self._file_names)}')

  def _write_in_worker(self, state: ResidentValue) -> str:
    """A new file the worker has written `state` to (removed if the write fails)."""
    path = self._new_file()
    try:
      self._run(self._save(state._value, path))  # pylint: disable=protected-access
    except BaseException:
      remove_state_file(path)
      raise
    return path

  async def _server_path(self, path: str):
    return await self._ingest(path, tff.FederatedType(np.str_, tff.SERVER))

  async def _start_save(self, value, path: str, save: Any = 'save', extras=(),
                        previous=None):
    """Has the worker start writing `value` (the state) at `path` with the computation
    `save` (of a FileLayout: `extras` are its extras' values, `previous` the fingerprints
    of its parts' last write); returns the call's value, computed once the file is
    written."""
    layout = self._layouts[save]
    others = await self._ingest(
        save_arguments(layout, path, extras, previous),
        tff.FederatedType(save_argument_type(layout), tff.SERVER))
    argument = await self._executor.create_struct(structure.Struct.unnamed(value, others))
    return await self._executor.create_call(await self._function(save), argument)

  async def _save(self, value, path: str, save: Any = 'save', extras=()) -> None:
    """`_start_save`, returning once the file is written."""
    await (await self._start_save(value, path, save, extras)).compute()

  async def _restore(self, path: str):
    """The state the worker reads from `path`, once it has read it."""
    output = await self._executor.create_call(await self._function('restore'),
                                              await self._server_path(path))
    state = await self._executor.create_selection(output, 0)
    await (await self._executor.create_selection(output, 1)).compute()
    return state

  # -- the LearningProcess's calls ----------------------------------------------------------

  @_paused
  def initialize(self) -> ResidentValue:
    async def run():
      return await self._executor.create_call(await self._function('initialize'))
    return ResidentValue(self._run(run()), self)

  @_paused
  def initial_state(self) -> tuple:
    """(the initial state in the worker, its copy in Python): `initialize` computed in the
    worker and brought back once (never sent to it)."""
    held = self.initialize()
    python = self.materialize(held)
    return ResidentValue(held._value, self, python=python), python  # pylint: disable=protected-access

  @_paused
  def next(self, state, client_data) -> ResidentOutput:
    """One round: `process.next(state, client_data)`, the new state left in the worker."""
    if len(client_data) != self._clients_per_round:
      raise ValueError(f'this ResidentProcess runs rounds of {self._clients_per_round} '
                       f'clients; got {len(client_data)}')
    signature = self._process.next.type_signature

    async def run():
      self._flush_disposals()
      function = await self._function('next')
      state_value = await self._resident(state)
      data_value = await self._ingest(client_data, signature.parameter[1])
      names = [name for name, _ in structure.iter_elements(signature.parameter)]
      argument = await self._executor.create_struct(
          structure.Struct([(names[0], state_value), (names[1], data_value)]))
      output = await self._executor.create_call(function, argument)
      new_state = await self._executor.create_selection(output, 0)
      metrics = await (await self._executor.create_selection(output, 1)).compute()
      return await self._detached(new_state), self._python(metrics, signature.result[1])

    new_state, metrics = self._run(run())
    held = ResidentValue(new_state, self)
    self._rounds += 1
    if self._refresh_every and self._rounds % self._refresh_every == 0:
      held = self.refresh(held)   # frees the earlier rounds in the worker
    return ResidentOutput(held, metrics)

  @_paused
  def get_model_weights(self, state):
    """`process.get_model_weights(state)`: only the model weights leave the worker."""
    async def run():
      weights = await self._executor.create_call(await self._function('get_model_weights'),
                                                 await self._resident(state))
      return await weights.compute()
    return self._python(self._run(run()),
                        self._computations['get_model_weights'].type_signature.result.member)

  @_paused
  def materialize(self, state):
    """The whole state as `process.next` would have returned it (e.g. to checkpoint it)."""
    if not isinstance(state, ResidentValue):
      return state   # a Python state: nothing to bring back
    self._resident_check(state)
    if state._python is not None:  # pylint: disable=protected-access
      return state._python  # pylint: disable=protected-access  (placed from it: no transfer)
    member = self._state_type.member
    if self._transfer == 'files':
      path = _file_of(state)
      if path is None:
        path = self._write_in_worker(state)
        state._file = weakref.finalize(state, remove_state_file, path)  # pylint: disable=protected-access
      return self._python(structure.pack_sequence_as(member, read_state_file(path, member)),
                          member)
    if state._fetched is not None:  # pylint: disable=protected-access
      return state._fetched  # pylint: disable=protected-access

    async def run_chunks():
      split = await self._executor.create_call(await self._function('split'),
                                               await self._resident(state))
      leaves = []
      for i in range(len(self._chunks)):
        chunk = await (await self._executor.create_selection(split, i)).compute()
        leaves.extend(structure.flatten(chunk))
      return structure.pack_sequence_as(member, leaves)

    async def run_whole():
      return await (await self._resident(state)).compute()

    state._fetched = self._python(  # pylint: disable=protected-access
        self._run(run_chunks() if self._chunks is not None else run_whole()), member)
    return state._fetched  # pylint: disable=protected-access

  @_paused
  def snapshot(self, state):
    """`materialize(state)` in two halves: the worker's half now, and a function that
    returns the state as `materialize` would. With transfer='files' the worker writes the
    state's file now and the function reads it, without touching the executor, so it may
    run in another thread while rounds go on (a checkpoint written off the critical path);
    the function keeps the file, and `state` in the worker, alive. Otherwise the state is
    brought back now. Call the function before `close()`."""
    if (self._transfer != 'files' or not isinstance(state, ResidentValue)
        or state._python is not None):  # pylint: disable=protected-access
      value = self.materialize(state)
      return lambda: value
    self._resident_check(state)
    path = _file_of(state)
    if path is None:
      path = self._write_in_worker(state)
      state._file = weakref.finalize(state, remove_state_file, path)  # pylint: disable=protected-access
    member = self._state_type.member

    def read(keep=state):
      del keep  # (held by the default argument: the file lives as long as `state`)
      return self._python(structure.pack_sequence_as(member, read_state_file(path, member)),
                          member)
    return read

  @property
  def state_type(self):
    """The TFF type of the state (unplaced)."""
    return self._state_type.member

  @property
  def writes_files(self) -> bool:
    """Whether the worker writes files of the state (transfer='files'): `write`."""
    return self._transfer == 'files'

  @_paused
  def write(self, state: ResidentValue, path: str, layout: FileLayout, extras=(),
            wait: bool = True, previous=None) -> Optional['WriteInFlight']:
    """The worker writes `state` as one TensorFlow checkpoint at `path` (its .index and
    .data files; the directory must exist), its tensors named by `layout`, with `extras`
    (one value for each of `layout.extras`, sent from Python) and `layout.constants`;
    nothing of the state passes through Python. transfer='files' only. With `layout.cut`,
    `path` is the directory of `bundle_parts.write_parts`, which writes only the parts whose
    fingerprints differ from `previous` (the last write's; None: every part).

    With `wait`, returns once the file is written. Otherwise returns at once a
    `WriteInFlight` whose `wait()` returns once it is (or raises the worker's error): the
    worker runs the write on a thread of its own while this process's next calls run, and
    the write keeps the state's tensors alive in the worker until it is waited for, even
    if `state` is dropped (TFF's TensorFlowExecutor::CreateCall holds its argument)."""
    if not self.writes_files:
      raise ValueError('write needs transfer=\'files\' (the worker writes the file)')
    if self._closed:
      raise ValueError('this ResidentProcess is closed')
    if not isinstance(state, ResidentValue):
      raise TypeError(f'write takes a ResidentValue, got {type(state).__name__}')
    self._resident_check(state)
    name = ('save', layout)
    if name not in self._computations:
      self._computations[name] = save_computation(self._state_type, layout)
      self._layouts[name] = layout
    written = WriteInFlight(self, self._run(self._start_save(
        state._value, path, name, extras, previous)))  # pylint: disable=protected-access
    if not wait:
      return written
    written.wait()
    return None

  @_paused
  def adopt(self, state) -> ResidentValue:
    """A state held in Python (e.g. loaded from a checkpoint) placed in the worker."""
    if isinstance(state, ResidentValue):
      self._resident_check(state)
      return state
    if self._transfer == 'files':
      member = self._state_type.member
      value = self._transform_args(state) if self._transform_args is not None else state
      path = self._new_file()
      write_state_file(path, state_leaves(value, member), member)
      try:
        return ResidentValue(self._run(self._restore(path)), self, python=state)
      finally:
        remove_state_file(path)
    if self._chunks is not None:
      async def run_chunks():
        value = self._transform_args(state) if self._transform_args is not None else state
        leaves = state_leaves(value, self._state_type.member)
        join = await self._function('join')
        chunks = []
        for start, stop in self._chunks:
          chunks.append(await self._ingest(
              structure.Struct.unnamed(*leaves[start:stop]),
              tff.FederatedType(chunk_type(self._state_type.member, start, stop), tff.SERVER)))
        return await self._executor.create_call(
            join, await self._executor.create_struct(structure.Struct.unnamed(*chunks)))
      return ResidentValue(self._run(run_chunks()), self, python=state)

    async def run():
      return await self._resident(state)
    return ResidentValue(self._run(run()), self, python=state)

  def close(self) -> None:
    """Removes the scratch directory (also done when this object is collected, or at exit);
    states already fetched stay valid, no transfer may follow."""
    self._closed = True
    if self._remove_scratch is not None:
      self._remove_scratch()

  @_paused
  def refresh(self, state: ResidentValue) -> ResidentValue:
    """`state` placed in the worker anew, so that the worker can free the values it was
    computed from (the module doc): with transfer='files' the worker writes it and reads it
    back, with 'values' it makes a round trip through Python; of a state `materialize` has
    brought back, the file (or copy) is only placed again. A state placed from Python has
    nothing to free."""
    self._resident_check(state)
    if state._python is not None:  # pylint: disable=protected-access
      return state
    if self._transfer == 'values':
      return self.adopt(self.materialize(state))
    path = _file_of(state)
    if path is None:
      path = self._write_in_worker(state)
    try:
      return ResidentValue(self._run(self._restore(path)), self)
    finally:
      remove_state_file(path)
      if state._file is not None:  # pylint: disable=protected-access
        state._file.detach()  # pylint: disable=protected-access


class DirectProcess:
  """`ResidentProcess`'s interface over plain `process.next` (the state held in Python), so
  that a loop written for one runs either way (e.g. on worker services, where no value is
  kept between calls)."""

  def __init__(self, process: tff.learning.templates.LearningProcess):
    self._process = process

  @_paused
  def initialize(self):
    return self._process.initialize()

  @_paused
  def initial_state(self):
    state = self._process.initialize()
    return state, state

  @_paused
  def next(self, state, client_data) -> ResidentOutput:
    output = self._process.next(state, client_data)
    return ResidentOutput(output.state, output.metrics)

  @_paused
  def get_model_weights(self, state):
    return self._process.get_model_weights(state)

  def materialize(self, state):
    return state

  def snapshot(self, state):
    return lambda: state

  writes_files = False   # (ResidentProcess.write: there is no worker holding the state)

  def adopt(self, state):
    return state

  def refresh(self, state):
    return state

  def close(self):
    pass

