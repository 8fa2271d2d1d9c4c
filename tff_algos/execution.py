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
(benchmarks/RESULTS.md, "garbage collector").
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import os
import signal
import subprocess
import sys

_WORKER_NAME = 'worker_binary'
_installed = None  # the settings of the context in force


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
  """Stops the workers this process started; safe to call more than once."""
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


def _on_sigterm(signum, frame):
  del frame
  raise SystemExit(128 + signum)


def initialize_runtime(
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
) -> None:
  """Sets TFF's execution context (idempotent).

  Args:
    max_concurrent_computation_calls: passed to the local C++ runtime (-1: no limit,
      which measured fastest on 2 cores).
    default_num_clients: TFF's default client cardinality.
  """
  global _installed
  settings = (max_concurrent_computation_calls, default_num_clients)
  if _installed == settings:
    return  # a second local context would start a second worker and can hang
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top

  executor_factory.subprocess = _SubprocessProxy()
  tff.backends.native.set_sync_local_cpp_execution_context(
      default_num_clients=default_num_clients,
      max_concurrent_computation_calls=max_concurrent_computation_calls)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _on_sigterm)
  _installed = settings


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
