"""TFF's C++ worker processes: their lifecycle (started, reached, found, stopped).

TFF 0.87 runs every computation in a `worker_binary` child process that inherits
stdout/stderr and is not stopped when Python exits, so `python -m programs.train | tee log`
would never return. Every worker started here dies with its parent (Linux
PR_SET_PDEATHSIG, which also covers SIGKILL) and is stopped at exit (`stop_workers`, which
`contexts.shutdown_workers` calls).

A worker this process starts runs isolated from the network where it can (`isolation`: a
network namespace of its own, reached through a relay at a Unix socket in a 0700 directory).

grpc and TFF are imported inside the functions that talk to a worker, so importing this
module does not import TensorFlow.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from tff_algos.runtime.isolation import (
    NAMESPACE_PORT, WORKER_NAME, isolated, relay_command, set_parent_death_signal,
    worker_command)

GRPC_CHANNEL_OPTIONS = [  # TFF's own local-runtime channel options (2 GB messages)
    ('grpc.max_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_receive_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_send_message_length', 2 * 1000 * 1000 * 1000),
]


class WorkerUnavailableError(RuntimeError):
  """A worker service stopped answering for longer than the timeout."""


class PopenDyingWithParent(subprocess.Popen):
  """`subprocess.Popen` whose children are killed when this process dies."""

  def __init__(self, args, **kwargs):
    if sys.platform.startswith('linux') and 'preexec_fn' not in kwargs:
      kwargs['preexec_fn'] = set_parent_death_signal
    super().__init__(args, **kwargs)


class SubprocessProxy:
  """Stands in for the `subprocess` module inside TFF's executor factory."""

  Popen = PopenDyingWithParent

  def __getattr__(self, name):
    return getattr(subprocess, name)


def descendant_pids(pid: Optional[int] = None) -> list[int]:
  """Pids of the processes below `pid` (default: this process), children first."""
  children = {}
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        stat = f.read().decode(errors='replace')
      children.setdefault(int(stat.rsplit(')', 1)[1].split()[1]), []).append(int(entry))
    except (OSError, ValueError, IndexError):
      continue
  found, queue = [], [os.getpid() if pid is None else pid]
  while queue:
    below = children.get(queue.pop(0), [])
    found += below
    queue += below
  return found


def worker_pids() -> list[int]:
  """Pids of the `worker_binary` processes this process started (its children, or theirs
  when a relay runs them isolated)."""
  pids = []
  for pid in descendant_pids():
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        program = f.read().split(b'\0', 1)[0]
    except OSError:
      continue
    if os.path.basename(program) == WORKER_NAME.encode():
      pids.append(pid)
  return pids


def stop_workers() -> None:
  """Stops every worker this process started: its own services, those of TFF's local
  factory, and any other `worker_binary` child. Safe to call more than once."""
  for service in _owned_services:
    service.stop()
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
  kill_workers(wait=True)


def kill_workers(wait: bool = False) -> None:
  """SIGKILL to this process's workers (`worker_pids`); `wait`: reap them too."""
  for pid in worker_pids():
    try:
      os.kill(pid, signal.SIGKILL)
      if wait:
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
      pass


def parse_worker_addresses(text: str) -> list[str]:
  """`'host:port,unix:/path,...'` -> addresses; ValueError names the bad entry (no TF import)."""
  addresses = [a.strip() for a in text.split(',') if a.strip()]
  for address in addresses:
    if address.startswith('unix:'):
      if not os.path.isabs(address[len('unix:'):]):
        raise ValueError(f'{address!r} is not unix:/absolute/path')
      continue
    host, sep, port = address.rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f'{address!r} is not host:port (port 1-65535) or unix:/path')
  duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
  if duplicates:
    raise ValueError(f'{", ".join(duplicates)} listed twice')
  return addresses


def unused_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class WorkerService:
  """One executor service: an address, and the process when this program started it.

  A service this program starts (`address` None) is owned: it runs isolated from the
  network where it can (`isolate`, as `isolated` takes it), reached at a Unix socket in a
  0700 directory of its own; it dies with this process, is stopped at exit, and is
  restarted when found dead.
  """

  def __init__(self, address: Optional[str] = None, max_concurrent_computation_calls: int = -1,
               isolate: Optional[bool] = None):
    self._max_calls = max_concurrent_computation_calls
    self.owned = address is None
    self.address = address
    self.isolated = False
    self.process = None
    self._socket_dir = None
    self._stub = None
    self._lock = threading.Lock()
    if self.owned:
      self.isolated = isolated(isolate)
      _owned_services.append(self)
      self._start()

  def _start(self):
    if self.isolated:
      if self._socket_dir is None or not os.path.isdir(self._socket_dir):
        self._socket_dir = _socket_directory()   # (its relay removes it when it ends)
      self.address = 'unix:' + os.path.join(self._socket_dir, 'worker.sock')
      command = relay_command(self.address, worker_command(NAMESPACE_PORT, self._max_calls))
    else:
      port = unused_port()
      self.address = f'127.0.0.1:{port}'
      command = worker_command(port, self._max_calls)
    self.process = PopenDyingWithParent(command, stdout=subprocess.DEVNULL)
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
          channel = grpc.insecure_channel(self.address, GRPC_CHANNEL_OPTIONS)
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
            'the address and its tunnel), then rerun (a training run continues with --resume)')

  def stop(self):
    """Stops the worker (an isolated one through its relay, which stops it and removes its
    socket)."""
    if self.process is not None and self.process.poll() is None:
      if self.isolated:
        self.process.terminate()
        try:
          self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
          pass
      if self.process.poll() is None:
        self.process.kill()
        self.process.wait(timeout=10)
    if self._socket_dir is not None:
      shutil.rmtree(self._socket_dir, ignore_errors=True)
      self._socket_dir = None


def _socket_directory() -> str:
  """A new 0700 directory for a worker's socket, with a path short enough for AF_UNIX."""
  directory = tempfile.mkdtemp(prefix='tff_algos_worker_')
  if len(directory) > 90:
    os.rmdir(directory)
    directory = tempfile.mkdtemp(prefix='tff_algos_worker_', dir='/tmp')
  return directory


_owned_services: list[WorkerService] = []


