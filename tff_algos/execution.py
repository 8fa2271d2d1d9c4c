"""One place that sets TFF's execution context and owns its worker processes.

TFF 0.87 runs every computation in a C++ `worker_binary` child process that inherits
stdout/stderr and is not stopped when Python exits, so `python -m programs.train | tee log`
would never return. `initialize_runtime` makes each worker die with its parent (Linux
PR_SET_PDEATHSIG, which also covers SIGKILL) and stops the workers at interpreter exit.

It also owns the one Python-side cost of a round that is not TFF's: the garbage collector.
After TFF has built and compiled its computations the interpreter tracks about a million
objects, and every round leaves a few thousand in reference cycles, so the collector runs
full passes over that heap (0.5 s each, measured) in the middle of `process.next`. Call
`freeze_long_lived_objects()` once the first round (and first evaluation) has run, and wrap
each TFF call in `collector_paused()`: the round then costs what the runtime costs
(benchmarks/results/RESULTS.md, "garbage collector").

TFF compiles every computation by rewriting protocol buffers in Python, so it needs
protobuf's compiled (upb) implementation: under the pure-Python one (protobuf 3.20 on
Python 3.11 has no other) building a process costs 3x more, its first round 4-5x and the
fixed part of every later round 8-9x (benchmarks/results/RESULTS.md, "protobuf").
`initialize_runtime` warns when that is the case.

And it owns how values are serialised for the worker. Every `process.next` sends the whole
server state, and TFF 0.87 builds a nested value's message bottom-up, passing each finished
sub-message to its parent's constructor, which copies it: a tensor d levels deep is copied
about 3d times (FedCDA's 142 MB cache some ten times, 1.5-1.8 s per round in Python).
`install_value_serialization()` (called by `initialize_runtime` and `distributed_context`)
replaces TFF's `serialize_value` with one that writes every part into its place in a single
message: byte-identical output (tested), 0.12 s for that state.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import ctypes
import functools
import gc
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Optional, Sequence

_WORKER_NAME = 'worker_binary'
_installed = None  # the settings of the context in force
_installed_context = None  # that context (synchronous: local C++ or mergeable)
DEFAULT_WORKER_TIMEOUT_SECONDS = 60.0
SLOW_PROTOBUF_WARNING = (
    "protobuf runs its pure-Python implementation, which makes TFF's builds and rounds 3-9x "
    "slower: install protobuf>=4.21 (upb), e.g. `pip install 'protobuf==4.25.5' "
    "'tensorflow-metadata==1.15.0'` as requirements.txt pins")


def protobuf_implementation() -> str:
  """'upb' or 'cpp' (compiled) or 'python' (pure Python: TFF's compilation crawls)."""
  from google.protobuf.internal import api_implementation  # pylint: disable=g-import-not-at-top
  return api_implementation.Type()


def _set_parent_death_signal():  # runs in the child between fork and exec
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
  except OSError:
    pass


class _PopenDyingWithParent(subprocess.Popen):
  """`subprocess.Popen` whose children are killed when this process dies."""

  def __init__(self, args, **kwargs):
    if sys.platform.startswith('linux') and 'preexec_fn' not in kwargs:
      kwargs['preexec_fn'] = _set_parent_death_signal
    super().__init__(args, **kwargs)


class _SubprocessProxy:
  """Stands in for the `subprocess` module inside TFF's executor factory."""

  Popen = _PopenDyingWithParent

  def __getattr__(self, name):
    return getattr(subprocess, name)


def worker_pids() -> list[int]:
  """Pids of this process's `worker_binary` children."""
  me = os.getpid()
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        stat = f.read().decode(errors='replace')
      ppid = int(stat.rsplit(')', 1)[1].split()[1])
      if ppid != me:
        continue
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        if _WORKER_NAME.encode() in f.read():
          pids.append(int(entry))
    except (OSError, ValueError, IndexError):
      continue
  return pids


def shutdown_workers() -> None:
  """At the end of the program: closes every TFF RemoteExecutor, then stops the workers this
  process started. TFF calls after it need `initialize_runtime` again (a new context and
  workers). Safe to call more than once."""
  global _installed, _installed_context
  _close_remote_executors()
  _installed = _installed_context = None
  for obj in gc.get_objects():
    # TFF's local ServiceManager would try to stop its worker again at interpreter
    # teardown, when `subprocess` is already gone, and print a traceback.
    if type(obj).__name__ == 'ServiceManager' and hasattr(obj, '_process'):
      process = getattr(obj, '_process', None)
      if isinstance(process, subprocess.Popen):
        try:
          process.kill()
          process.wait(timeout=10)
        except Exception:  # pylint: disable=broad-except
          pass
      obj._process = None  # pylint: disable=protected-access
      obj._stub = None  # pylint: disable=protected-access
      type(obj).__del__ = lambda self: None
  for pid in worker_pids():
    try:
      os.kill(pid, signal.SIGKILL)
      os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
      pass


def _close_remote_executors(timeout_seconds: float = 5.0) -> None:
  """Closes every TFF RemoteExecutor alive, within `timeout_seconds` in all.

  TFF disposes of a value still referenced on a worker at interpreter exit, which may come
  after shutdown_workers (atexit runs hooks in reverse order of registration, and weakref's
  may be older): each disposal batch then meets a stopped worker and prints a gRPC
  traceback. A closed executor skips its values' disposals (and frees the worker's memory
  now). A worker service that no longer answers must not hold up the exit: the closing runs
  in a daemon thread that is given up after the timeout.
  """
  remote_executor = sys.modules.get(
      'tensorflow_federated.python.core.impl.executors.remote_executor')
  if remote_executor is None:
    return
  gc.unfreeze()   # frozen objects (freeze_long_lived_objects) are invisible to get_objects
  # type(), not isinstance(): isinstance reads `__class__`, which on lazy proxies (tfds's
  # builders) imports the module behind them and logs a warning for each.
  executors = [o for o in gc.get_objects()
               if issubclass(type(o), remote_executor.RemoteExecutor)]

  def close_all():
    for executor in executors:
      try:
        executor.close()
      except Exception:  # pylint: disable=broad-except
        pass   # a worker already gone: nothing left to free there

  closer = threading.Thread(target=close_all, daemon=True)
  closer.start()
  closer.join(timeout_seconds)


def _on_sigterm(signum, frame):
  """SIGTERM's default meaning, after stopping this process's TFF workers.

  The process ends at once with the signal's status, as without a handler; no exception is
  raised into whatever code was running (a library must not turn a signal into SystemExit
  inside its user's code). The workers also die with their parent (PR_SET_PDEATHSIG); this
  stops them first, so none is left even for a moment.
  """
  del frame
  for pid in worker_pids():
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


# --- Serialising values for the worker ---------------------------------------------------

_tff_serialize_value = None  # TFF's own serialize_value, once replaced


def _serialize_into(dest, value, type_spec) -> None:
  """Writes `value` of `type_spec` into the `executor_pb2.Value` `dest`, as TFF's
  `serialize_value` would build it. Tensors, structs and federated values are written in
  place; anything else (sequences, computations, scalars, strings, values TFF must reject
  with its own error) goes through TFF's function."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.compiler import array  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import array_shape, computation_types, dtype_utils, type_serialization  # pylint: disable=g-import-not-at-top,g-multiple-import
  if isinstance(type_spec, computation_types.TensorType):
    # TFF's `_serialize_tensor_value` with `array.to_proto_content`, for the case it
    # handles that way: a non-scalar, non-string numpy array of a compatible shape and dtype.
    if (isinstance(value, np.ndarray)
        and not array_shape.is_shape_scalar(type_spec.shape)
        and type_spec.dtype.type is not np.str_
        and array.is_compatible_shape(value, type_spec.shape)
        and array.is_compatible_dtype(value, type_spec.dtype.type)):
      dtype = type_spec.dtype.type
      value = np.asarray(value, dtype)
      dest.array.dtype = dtype_utils.to_proto(dtype)
      dest.array.shape.CopyFrom(array_shape.to_proto(value.shape))
      dest.array.content = value.tobytes()
      return
  elif isinstance(type_spec, computation_types.StructType) and not _is_computation(value):
    elements = structure.from_container(value)
    if len(elements) == len(type_spec):
      dest.struct.SetInParent()  # an empty struct is still a struct
      for (name, element_type), (_, element) in zip(structure.iter_elements(type_spec),
                                                    structure.iter_elements(elements)):
        slot = dest.struct.element.add()
        if name:
          slot.name = name
        _serialize_into(slot.value, element, element_type)
      return
  elif isinstance(type_spec, computation_types.FederatedType) and not _is_computation(value):
    members = [value] if type_spec.all_equal else value
    if isinstance(members, list):
      for member in members:
        _serialize_into(dest.federated.value.add(), member, type_spec.member)
      dest.federated.type.CopyFrom(type_serialization.serialize_type(type_spec).federated)
      return
  proto, _ = _tff_serialize(value, type_spec)
  dest.CopyFrom(proto)


def _is_computation(value) -> bool:
  from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  return isinstance(value, (computation_pb2.Computation, computation_impl.ConcreteComputation))


def _data_type(type_spec) -> bool:
  """Only tensors, sequences, structs and federated values (no functions) inside."""
  from tensorflow_federated.python.core.impl.types import computation_types as ct  # pylint: disable=g-import-not-at-top
  if isinstance(type_spec, (ct.TensorType, ct.SequenceType)):
    return True
  if isinstance(type_spec, ct.StructType):
    return all(_data_type(t) for t in type_spec)
  if isinstance(type_spec, ct.FederatedType):
    return _data_type(type_spec.member)
  return False


def _tff_serialize(value, type_spec):
  if _tff_serialize_value is not None:
    return _tff_serialize_value(value, type_spec)
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  return value_serialization.serialize_value(value, type_spec)


def serialize_value(value, type_spec=None):
  """TFF's `value_serialization.serialize_value`, without copying nested messages."""
  if type_spec is None or _is_computation(value) or not _data_type(type_spec):
    return _tff_serialize(value, type_spec)
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top
  dest = executor_pb2.Value()
  _serialize_into(dest, value, type_spec)
  return dest, type_spec


def install_value_serialization() -> None:
  """Makes TFF's remote executors serialise values with `serialize_value` (idempotent)."""
  global _tff_serialize_value
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  if value_serialization.serialize_value is not serialize_value:
    _tff_serialize_value = value_serialization.serialize_value
    value_serialization.serialize_value = serialize_value


def initialize_runtime(
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
    workers: Sequence[str] = (),
    local_workers: int = 0,
    worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
) -> None:
  """Sets TFF's execution context (idempotent).

  Without `workers` and `local_workers`: TFF's local C++ runtime (one worker child).
  Otherwise TFF's mergeable-comp context over several worker services (see
  `distributed_context`): each round's clients are split across them and their partial
  aggregates merged.

  Args:
    max_concurrent_computation_calls: passed to the C++ runtime (-1: no limit, which
      measured fastest on 2 cores).
    default_num_clients: TFF's default client cardinality.
    workers: `host:port` addresses of running worker services (scripts/start_worker.py).
    local_workers: number of worker services to start on this machine (they die with
      this process).
    worker_timeout_seconds: how long a worker may stay unreachable before the call fails.
  """
  global _installed
  settings = (max_concurrent_computation_calls, default_num_clients, tuple(workers),
              local_workers, worker_timeout_seconds)
  if _installed == settings:
    return  # a second local context would start a second worker and can hang
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

  executor_factory.subprocess = _SubprocessProxy()
  install_value_serialization()
  if protobuf_implementation() == 'python':
    warnings.warn(SLOW_PROTOBUF_WARNING, RuntimeWarning, stacklevel=2)
  if workers or local_workers:
    context = distributed_context(
        workers, local_workers, worker_timeout_seconds=worker_timeout_seconds,
        max_concurrent_computation_calls=max_concurrent_computation_calls,
        default_num_clients=default_num_clients)
  else:
    context = tff.backends.native.create_sync_local_cpp_execution_context(
        default_num_clients=default_num_clients,
        max_concurrent_computation_calls=max_concurrent_computation_calls)
  tff.framework.get_context_stack().set_default_context(context)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _on_sigterm)
  global _installed_context
  _installed, _installed_context = settings, context


def installed_context():
  """The execution context `initialize_runtime` installed (None before it ran)."""
  return _installed_context


class _AsyncOverSync:
  """A synchronous execution context seen as an asynchronous one (what TFF programs await).

  Each `invoke` runs the synchronous context's own `invoke` in a thread, so the program's
  calls reach the same worker(s) with the same settings (value serialisation, timeouts,
  the split over worker services) while its event loop stays free.
  """

  def __init__(self, context):
    self._context = context

  async def invoke(self, comp, arg):
    return await asyncio.to_thread(self._context.invoke, comp, arg)


def program_context(context=None):
  """A `tff.program.NativeFederatedContext` for TFF programs, on the runtime in force.

  `tff.learning.programs.train_model` (and any `tff.program` code) needs a federated
  context over an asynchronous execution context; TFF's own
  `create_async_local_cpp_execution_context()` would start a second C++ worker beside the
  one `initialize_runtime` started, and cannot reach worker services. This one runs on
  `context` (default: the context `initialize_runtime` installed, which it calls with its
  defaults if nothing is installed yet): one local worker, or the worker services of
  `--workers` / `--local_workers`, whose round-splitting it keeps.

      with tff.framework.get_context_stack().install(execution.program_context()):
        await tff.learning.programs.train_model(...)

  The context is the one in force when this is called: after `initialize_runtime` with
  other settings, call it again. Cancelling the program does not interrupt a call already
  running in the worker (it finishes in its thread); stopping the process does.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if context is None:
    if _installed_context is None:
      initialize_runtime()
    context = _installed_context
  return tff.program.NativeFederatedContext(_AsyncOverSync(context))


# --- Several worker services -------------------------------------------------------------
#
# TFF 0.87's pieces, used as TFF uses them: a `worker_binary --port=P` per machine (the
# executor service its local runtime also starts), a `RemoteExecutor` per service over a
# gRPC channel, an `AsyncExecutionContext` per service, and the
# `MergeableCompExecutionContext` above them, which compiles each computation to
# (up_to_merge, merge, after_merge), runs `up_to_merge` on a slice of the round's clients
# on each service, merges the partial aggregates and finishes on one service.
#
# Two things differ from TFF's defaults, both about failures and parallelism:
# * TFF's `AsyncExecutionContext.invoke` retries a `RetryableError` (a dead worker answers
#   UNAVAILABLE) forever: a killed remote worker hangs the program. Here a call retries for
#   at most `worker_timeout_seconds`, restarting a dead worker this process started (the
#   subround's result is a function of its arguments, so the retry gives the same value),
#   then raises `WorkerUnavailableError`.
# * TFF's `RemoteExecutor` issues blocking gRPC calls from coroutines, so the subrounds of
#   one round would run one after another; each service's call runs in its own thread.

_GRPC_CHANNEL_OPTIONS = [  # TFF's own local-runtime channel options (2 GB messages)
    ('grpc.max_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_receive_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_send_message_length', 2 * 1000 * 1000 * 1000),
]


class WorkerUnavailableError(RuntimeError):
  """A worker service stopped answering for longer than the timeout."""


class NotMergeableError(ValueError):
  """A computation cannot be split across worker services."""


# The largest value TFF 0.87's runtime moves between Python and a worker: each value crosses
# in one gRPC message, and the worker refuses to send one above this (measured: FedCDA's
# 2.02 GB state at N = 100 with fedavg_cnn failed in `initialize` with "Sent message larger
# than max (2016009763 vs. 1895825408)"). Python's own channel allows 2e9.
MAX_VALUE_BYTES = 1_895_825_408


class ValueTooLargeError(ValueError):
  """A value (e.g. a server state) too large to cross between Python and TFF's worker."""


def value_bytes(type_spec) -> int:
  """Bytes of a value of TFF type `type_spec` (tensors only; placements are looked through).

  Computed from the type alone, before anything runs."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if isinstance(type_spec, tff.FederatedType):
    return value_bytes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(value_bytes(t) for _, t in tff.structure.iter_elements(type_spec))
  if isinstance(type_spec, tff.TensorType):
    return int(np.prod(type_spec.shape, dtype=np.int64)) * np.dtype(type_spec.dtype).itemsize
  return 0


def check_value_fits(type_spec, what: str, fixes: str) -> None:
  """Raises ValueTooLargeError (one line: '<what> is X GB, above ...; <fixes>') when a value
  of `type_spec` cannot cross between Python and TFF's worker (`MAX_VALUE_BYTES`)."""
  size = value_bytes(type_spec)
  if size > MAX_VALUE_BYTES:
    raise ValueTooLargeError(
        f'{what} is {size / 1e9:.2f} GB, above the {MAX_VALUE_BYTES / 1e9:.2f} GB a value can '
        f'have in TFF 0.87\'s runtime (it crosses to and from the worker as one gRPC message); '
        f'{fixes}')


def parse_worker_addresses(text: str) -> list[str]:
  """`'host:port,host:port'` -> addresses; ValueError names the bad entry (no TF import)."""
  addresses = [a.strip() for a in text.split(',') if a.strip()]
  for address in addresses:
    host, sep, port = address.rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f'{address!r} is not host:port (port 1-65535)')
  duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
  if duplicates:
    raise ValueError(f'{", ".join(duplicates)} listed twice')
  return addresses


def worker_binary_path() -> str:
  """The `worker_binary` shipped in the installed TFF wheel (found without importing TFF)."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow_federated is not installed')
  return os.path.join(list(spec.submodule_search_locations)[0], 'data', _WORKER_NAME)


def worker_command(port: int, max_concurrent_computation_calls: int = -1) -> list[str]:
  """The command line TFF's local runtime uses to start its worker service."""
  return [worker_binary_path(), f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_computation_calls}']


def _unused_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class WorkerService:
  """One executor service: an address, and the process when this program started it."""

  def __init__(self, address: Optional[str] = None, max_concurrent_computation_calls: int = -1):
    self._max_calls = max_concurrent_computation_calls
    self.owned = address is None
    self.address = address
    self.process = None
    self._stub = None
    self._lock = threading.Lock()
    if self.owned:
      self._start()

  def _start(self):
    port = _unused_port()
    self.address = f'127.0.0.1:{port}'
    self.process = _PopenDyingWithParent(worker_command(port, self._max_calls),
                                         stdout=subprocess.DEVNULL)
    self._stub = None

  def stub(self, timeout_seconds: float):
    """A ready gRPC stub; restarts a dead owned worker; WorkerUnavailableError on timeout."""
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top
    import grpc  # pylint: disable=g-import-not-at-top
    deadline = time.monotonic() + timeout_seconds
    while True:
      with self._lock:
        if self.owned and self.process.poll() is not None:
          self._start()  # died (or lost its port to another process): a new one
        if self._stub is None:
          channel = grpc.insecure_channel(self.address, _GRPC_CHANNEL_OPTIONS)
          self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
        stub = self._stub
      if stub.is_ready:
        return stub
      if time.monotonic() > deadline:
        raise WorkerUnavailableError(self.unavailable_message(timeout_seconds))
      time.sleep(0.05)

  def forget_channel(self):
    """After a failure: the next `stub()` opens a fresh channel (a broken one backs off)."""
    with self._lock:
      self._stub = None

  def unavailable_message(self, timeout_seconds: float) -> str:
    if self.owned:
      return (f'the local worker service {self.address} did not answer within '
              f'{timeout_seconds:.0f} s (restarted after each failure)')
    return (f'worker service {self.address} did not answer within {timeout_seconds:.0f} s; '
            'start it there with `python scripts/start_worker.py --port=PORT` (or check '
            'the host and port), then rerun (a training run continues with --resume)')

  def stop(self):
    if self.process is not None and self.process.poll() is None:
      self.process.kill()
      self.process.wait(timeout=10)


def _worker_context(service: WorkerService, timeout_seconds: float, default_num_clients: int,
                    pool: concurrent.futures.Executor):
  """An AsyncExecutionContext on `service` with bounded retries and a thread per call."""
  from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import executors_errors  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import remote_executor  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top
  import grpc  # pylint: disable=g-import-not-at-top

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = default_num_clients
    executor = remote_executor.RemoteExecutor(service.stub(timeout_seconds))
    executor.set_cardinalities(cardinalities)
    return executor

  # `invoke` without TFF's unbounded retry decorator (functools.wraps keeps the original).
  invoke_once = async_execution_context.AsyncExecutionContext.invoke.__wrapped__
  lost_connection = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)

  class WorkerContext(async_execution_context.AsyncExecutionContext):
    """Runs each call in a thread of its own; retries a lost worker until the timeout."""

    worker = service

    async def invoke(self, comp, arg):
      if asyncio.iscoroutine(arg):
        arg = await arg
      loop = asyncio.get_running_loop()
      return await loop.run_in_executor(pool, self._invoke_blocking, comp, arg)

    def _invoke_blocking(self, comp, arg):
      deadline = None  # counted from the first failure: a long round is not a lost worker
      while True:
        try:
          return asyncio.run(invoke_once(self, comp, arg))
        except (executors_errors.RetryableError, grpc.RpcError) as e:
          if isinstance(e, grpc.RpcError) and e.code() not in lost_connection:
            raise
          deadline = deadline or time.monotonic() + timeout_seconds
          if time.monotonic() > deadline:
            raise WorkerUnavailableError(service.unavailable_message(timeout_seconds)) from None
          service.forget_channel()
          time.sleep(0.2)

  return WorkerContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(stack_fn),
      compiler_fn=_shared_compiler(compiler.desugar_and_transform_to_native),
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def distributed_context(
    workers: Sequence[str] = (),
    local_workers: int = 0,
    worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
):
  """TFF's mergeable-comp context over the services at `workers` plus `local_workers` new ones.

  Use it as the default (`initialize_runtime(workers=...)`) or for a block:
  `with tff.framework.get_context_stack().install(distributed_context(...)):`. Every
  service must answer within `worker_timeout_seconds` (else WorkerUnavailableError). The
  services this call starts die with this process (and at `shutdown_workers`).
  """
  from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # pylint: disable=g-import-not-at-top
  if not workers and local_workers < 1:
    raise ValueError('give worker addresses or local_workers >= 1')
  install_value_serialization()
  services = [WorkerService(a, max_concurrent_computation_calls) for a in workers]
  services += [WorkerService(None, max_concurrent_computation_calls) for _ in range(local_workers)]
  _owned_services.extend(s for s in services if s.owned)
  for service in services:
    service.stub(worker_timeout_seconds)  # fail now, with the address, not mid-round
  pool = concurrent.futures.ThreadPoolExecutor(len(services), thread_name_prefix='tff-worker')
  contexts = [_worker_context(s, worker_timeout_seconds, default_num_clients, pool)
              for s in services]
  return _distributed_context_class()(
      async_contexts=contexts,
      compiler_fn=_shared_compiler(mergeable_comp_compiler.compile_to_mergeable_comp_form))


_shared_compilers = {}


def _shared_compiler(compiler_fn):
  """`compiler_fn` with one cache for every context of the process: TFF caches per context,
  so N services (and each new distributed context) would repeat the same Python-side
  compilation of every computation (seconds each for the methods' rounds)."""
  if compiler_fn not in _shared_compilers:
    _shared_compilers[compiler_fn] = functools.lru_cache(maxsize=256)(compiler_fn)
  return _shared_compilers[compiler_fn]


def _distributed_context_class():
  from tensorflow_federated.python.core.impl.computation import computation_base  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import computation_types  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import type_analysis  # pylint: disable=g-import-not-at-top

  def takes_client_values(comp) -> bool:
    parameter = comp.type_signature.parameter
    return parameter is not None and type_analysis.contains(
        parameter, lambda t: isinstance(t, computation_types.FederatedType)
        and t.placement is placements.CLIENTS)

  class DistributedContext(mergeable_comp_execution_context.MergeableCompExecutionContext):
    """Splits calls that take client values; runs the others whole on the first service.

    TFF's context would replicate a call without client values (initialize,
    get_model_weights, central evaluation) to every service and run it on each: the same
    result at N times the cost. Run whole on one service it is exactly the local call.
    """

    @property
    def worker_contexts(self):
      return self._async_execution_contexts

    def invoke(self, comp, arg=None):
      if isinstance(comp, computation_base.Computation) and not takes_client_values(comp):
        return self._async_runner.run_coro_and_return_result(
            self._async_execution_contexts[0].invoke(comp, arg))
      return super().invoke(comp, arg)

  return DistributedContext


_owned_services: list[WorkerService] = []


def check_mergeable(computation, what: str) -> None:
  """Raises NotMergeableError (one line, naming `what`) if TFF cannot split `computation`
  across worker services: the mergeable form needs one aggregation per call (parallel
  aggregations are fine, an aggregation feeding another is not)."""
  from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # pylint: disable=g-import-not-at-top
  try:  # the shared cache: the distributed context will not compile it again
    _shared_compiler(mergeable_comp_compiler.compile_to_mergeable_comp_form)(computation)
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    # TFF appends the offending building blocks ("Examples are: [...]", pages long).
    reason = reason.split(' Examples are:')[0].rstrip('.') or type(e).__name__
    raise NotMergeableError(
        f'{what} cannot be split across worker services (TFF mergeable form: {reason})'
    ) from None


def _device_probe():
  """A TF computation run inside a worker: where TF places an unconstrained op, and where an
  op asked for `/GPU:0` lands (soft placement falls back to CPU when the worker has no usable
  GPU, e.g. TFF 0.87's wheel binary, built without CUDA). `DeviceIndex` is the op TF itself
  uses to branch on the device it runs on."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.tensorflow.computation
  def probe():
    default = tf.raw_ops.DeviceIndex(device_names=list(_DEVICE_TYPES))
    with tf.device('/device:GPU:0'):
      asked_gpu = tf.raw_ops.DeviceIndex(device_names=list(_DEVICE_TYPES))
    return default, asked_gpu

  return probe


_DEVICE_TYPES = ('CPU', 'GPU', 'TPU')


def worker_devices(context=None) -> dict:
  """{worker: {'default_device', 'gpu_usable'}} measured inside each worker service of
  `context` (default: the context in force; 'local' for TFF's local runtime). Not
  `tf.config` of this Python process, which the workers do not share."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  probe = _device_probe()
  context = context or tff.framework.get_context_stack().current
  worker_contexts = getattr(context, 'worker_contexts', None)
  if worker_contexts is None:
    with tff.framework.get_context_stack().install(context):
      answers = {'local': probe()}
  else:
    loop = asyncio.new_event_loop()
    try:
      answers = {c.worker.address: loop.run_until_complete(c.invoke(probe, None))
                 for c in worker_contexts}
    finally:
      loop.close()
  name = lambda i: _DEVICE_TYPES[int(i)] if 0 <= int(i) < len(_DEVICE_TYPES) else 'unknown'
  return {worker: {'default_device': name(default), 'gpu_usable': name(asked) == 'GPU'}
          for worker, (default, asked) in answers.items()}


def freeze_long_lived_objects() -> int:
  """Collects, then moves every object alive now out of the collector's sight.

  Call once the processes are built and their first calls compiled (everything alive then
  lives as long as the program). Returns the number of objects frozen.
  """
  gc.collect()
  gc.freeze()
  return gc.get_freeze_count()


@contextlib.contextmanager
def collector_paused():
  """No garbage collection during the block; a collection right after it.

  Cheap after `freeze_long_lived_objects` (only the young objects are traversed); without
  the freeze it still keeps the pause out of the TFF call itself.
  """
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was_enabled:
      gc.enable()
      gc.collect()


# Registered on import, so a process that imports tff_algos stops its TFF workers (and
# avoids TFF's teardown traceback) even if it never called initialize_runtime.
atexit.register(shutdown_workers)
