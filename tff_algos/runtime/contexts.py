"""TFF's execution contexts on this package's workers, and the runtime's shutdown.

`initialize_runtime` sets the context every TFF call runs in: the local runtime (one worker
child, isolated from the network: `workers`) or TFF's mergeable-comp context over several
worker services; `program_context` is the same for `tff.program` code; `worker_devices`
probes where TF runs inside the workers.
`shutdown_workers` runs at exit (registered on import) and on SIGTERM.

TFF compiles every computation by rewriting protocol buffers in Python, so it needs
protobuf's compiled (upb) implementation: under the pure-Python one (protobuf 3.20 on
Python 3.11 has no other) builds and rounds are several times slower
(benchmarks/results/RESULTS.md, "protobuf"). `initialize_runtime` warns when that is the case.

Several worker services use TFF 0.87's pieces as TFF uses them: a `worker_binary` per
machine (the executor service its local runtime also starts), a `RemoteExecutor` per service
over a gRPC channel, an `AsyncExecutionContext` per service, and the
`MergeableCompExecutionContext` above them, which compiles each computation to
(up_to_merge, merge, after_merge), runs `up_to_merge` on a slice of the round's clients on
each service, merges the partial aggregates and finishes on one service. Two things differ
from TFF's defaults, both about failures and parallelism:
* TFF's `AsyncExecutionContext.invoke` retries a `RetryableError` (a dead worker answers
  UNAVAILABLE) forever: a killed remote worker hangs the program. Here a call retries for
  at most `worker_timeout_seconds`, restarting a dead worker this process started (the
  subround's result is a function of its arguments, so the retry gives the same value),
  then raises `WorkerUnavailableError`.
* TFF's `RemoteExecutor` issues blocking gRPC calls from coroutines, so the subrounds of
  one round would run one after another; each service's call runs in its own thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import gc
import os
import signal
import sys
import threading
import time
import warnings
from typing import Optional, Sequence

from tff_algos.runtime import serialization as _serialization
from tff_algos.runtime import workers as _workers
from tff_algos.runtime.workers import WorkerService, WorkerUnavailableError

_installed = None  # the settings of the context in force
_installed_context = None  # that context (synchronous: local C++ or mergeable)
DEFAULT_WORKER_TIMEOUT_SECONDS = 60.0
SLOW_PROTOBUF_WARNING = (
    "protobuf runs its pure-Python implementation, which makes TFF's builds and rounds 3-9x "
    "slower: install protobuf>=4.21 (upb), e.g. `pip install 'protobuf==4.25.5' "
    "'tensorflow-metadata==1.15.0'` as requirements.txt pins")


class NotMergeableError(ValueError):
  """A computation cannot be split across worker services."""


def protobuf_implementation() -> str:
  """'upb' or 'cpp' (compiled) or 'python' (pure Python: TFF's compilation crawls)."""
  from google.protobuf.internal import api_implementation  # pylint: disable=g-import-not-at-top
  return api_implementation.Type()


def shutdown_workers() -> None:
  """At the end of the program: closes every TFF RemoteExecutor, then stops the workers this
  process started. TFF calls after it need `initialize_runtime` again (a new context and
  workers). Safe to call more than once."""
  global _installed, _installed_context
  _close_remote_executors()
  _installed = _installed_context = None
  _workers.stop_workers()


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
  _workers.kill_workers()
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def initialize_runtime(
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
    workers: Sequence[str] = (),
    local_workers: int = 0,
    worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
    require_isolated_worker: bool = False,
) -> None:
  """Sets TFF's execution context (idempotent).

  Without `workers` and `local_workers`: TFF's local C++ runtime (one worker child,
  `local_context`).
  Otherwise TFF's mergeable-comp context over several worker services (see
  `distributed_context`): each round's clients are split across them and their partial
  aggregates merged.

  Args:
    max_concurrent_computation_calls: passed to the C++ runtime (-1: no limit).
    default_num_clients: TFF's default client cardinality.
    workers: `host:port` or `unix:/path` addresses of running worker services
      (scripts/start_worker.py).
    local_workers: number of worker services to start on this machine (they die with
      this process).
    worker_timeout_seconds: how long a worker may stay unreachable before the call fails.
    require_isolated_worker: raise WorkerNotIsolatedError where the workers this process
      starts cannot run isolated from the network, instead of saying so and going on.
  """
  global _installed
  settings = (max_concurrent_computation_calls, default_num_clients, tuple(workers),
              local_workers, worker_timeout_seconds, require_isolated_worker)
  if _installed == settings:
    return  # a second local context would start a second worker and can hang
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

  executor_factory.subprocess = _workers.SubprocessProxy()
  _serialization.install_value_serialization()
  if protobuf_implementation() == 'python':
    warnings.warn(SLOW_PROTOBUF_WARNING, RuntimeWarning, stacklevel=2)
  isolate = True if require_isolated_worker else None
  if workers or local_workers:
    context = distributed_context(
        workers, local_workers, worker_timeout_seconds=worker_timeout_seconds,
        max_concurrent_computation_calls=max_concurrent_computation_calls,
        default_num_clients=default_num_clients, isolate=isolate)
  else:
    context = local_context(
        default_num_clients=default_num_clients,
        max_concurrent_computation_calls=max_concurrent_computation_calls,
        worker_timeout_seconds=worker_timeout_seconds, isolate=isolate)
  tff.framework.get_context_stack().set_default_context(context)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _on_sigterm)
  global _installed_context
  _installed, _installed_context = settings, context


def local_context(default_num_clients: int = 0, max_concurrent_computation_calls: int = -1,
                  worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
                  isolate: Optional[bool] = None):
  """TFF's local C++ runtime (`create_sync_local_cpp_execution_context`) on a worker this
  process starts, isolated from the network where it can be (`isolate`, as
  `isolation.isolated` takes it); TFF's own would serve on every interface. Its `worker` is
  that `WorkerService`: restarted when found dead, as TFF restarts its own."""
  from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context  # pylint: disable=g-import-not-at-top

  service = WorkerService(None, max_concurrent_computation_calls, isolate=isolate)

  class LocalContext(sync_execution_context.SyncExecutionContext):
    worker = service

  return LocalContext(
      executor_fn=_executor_factory(service, worker_timeout_seconds, default_num_clients),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def _executor_factory(service: WorkerService, timeout_seconds: float, default_num_clients: int):
  """TFF's executor factory over `service`: a RemoteExecutor on its stub per cardinality."""
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import remote_executor  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = default_num_clients
    executor = remote_executor.RemoteExecutor(service.stub(timeout_seconds))
    executor.set_cardinalities(cardinalities)
    return executor

  return python_executor_stacks.ResourceManagingExecutorFactory(stack_fn)


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


def _worker_context(service: WorkerService, timeout_seconds: float, default_num_clients: int,
                    pool: concurrent.futures.Executor):
  """An AsyncExecutionContext on `service` with bounded retries and a thread per call."""
  from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import executors_errors  # pylint: disable=g-import-not-at-top
  import grpc  # pylint: disable=g-import-not-at-top

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
      executor_fn=_executor_factory(service, timeout_seconds, default_num_clients),
      compiler_fn=_shared_compiler(compiler.desugar_and_transform_to_native),
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def distributed_context(
    workers: Sequence[str] = (),
    local_workers: int = 0,
    worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
    isolate: Optional[bool] = None,
):
  """TFF's mergeable-comp context over the services at `workers` plus `local_workers` new ones.

  Use it as the default (`initialize_runtime(workers=...)`) or for a block:
  `with tff.framework.get_context_stack().install(distributed_context(...)):`. Every
  service must answer within `worker_timeout_seconds` (else WorkerUnavailableError). The
  services this call starts run isolated from the network where they can (`isolate`, as
  `isolation.isolated` takes it) and die with this process (and at `shutdown_workers`).
  """
  from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # pylint: disable=g-import-not-at-top
  if not workers and local_workers < 1:
    raise ValueError('give worker addresses or local_workers >= 1')
  _serialization.install_value_serialization()
  services = [WorkerService(a, max_concurrent_computation_calls) for a in workers]
  services += [WorkerService(None, max_concurrent_computation_calls, isolate=isolate)
               for _ in range(local_workers)]
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
  compilation of every computation."""
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


# Registered on import, so a process that imports tff_algos stops its TFF workers (and
# avoids TFF's teardown traceback) even if it never called initialize_runtime.
atexit.register(shutdown_workers)
