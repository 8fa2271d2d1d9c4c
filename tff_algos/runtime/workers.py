"""TFF's C++ worker processes: how they are started and reached, and their lifecycle.

TFF 0.87 runs every computation in a `worker_binary` child process that inherits
stdout/stderr and is not stopped when Python exits, so `python -m programs.train | tee log`
would never return. Every worker started here dies with its parent (Linux
PR_SET_PDEATHSIG, which also covers SIGKILL) and is stopped at exit (`stop_workers`, which
`contexts.shutdown_workers` calls).

The binary serves plain, unauthenticated gRPC on every interface (`--port=N` is its only
address setting): whoever reaches the port can have it run any TensorFlow computation (read
and write files, start processes) as the training user. So a worker started here runs
isolated: in a network namespace of its own, where only its own loopback exists, with a
relay (this file, run as a script) that carries bytes between that loopback and a socket
opened before the namespace was entered: a Unix socket in a 0700 directory for the local
runtime (no other host, no other user reaches it), or the address `start_worker.py --bind`
names. The namespace needs root or unprivileged user namespaces (`--user --map-root-user`
in unshare(1)'s terms); the mount namespace is shared, so the worker reads and writes the
same files (the resident state's scratch directory). Where that is unavailable the worker
runs exposed, with one line on stderr saying so (`isolation_unavailable`).

Standard library only (grpc and TFF are imported inside the functions that talk to a
worker): scripts/start_worker.py loads this file alone, by path, and it runs as the relay.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import gc
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

WORKER_NAME = 'worker_binary'
GRPC_CHANNEL_OPTIONS = [  # TFF's own local-runtime channel options (2 GB messages)
    ('grpc.max_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_receive_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_send_message_length', 2 * 1000 * 1000 * 1000),
]


# The port the worker serves on inside its own network namespace (nothing else is there).
NAMESPACE_PORT = 8000
EXPOSURE = ('TFF\'s worker_binary serves unauthenticated gRPC on every network interface: '
            'anyone who can reach its port can run code as this user')
ISOLATION_FIX = ('run on Linux as root or with unprivileged user namespaces enabled '
                 '(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0; '
                 'Ubuntu: kernel.apparmor_restrict_unprivileged_userns=0; in a container, '
                 'allow unshare(2))')


class WorkerUnavailableError(RuntimeError):
  """A worker service stopped answering for longer than the timeout."""


class WorkerNotIsolatedError(RuntimeError):
  """A worker was required to run isolated from the network where it cannot be."""


def _set_parent_death_signal(signum: int = signal.SIGKILL):
  """`signum` to this process when its parent dies (in a child between fork and exec)."""
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(1, signum)  # PR_SET_PDEATHSIG = 1
  except OSError:
    pass


class PopenDyingWithParent(subprocess.Popen):
  """`subprocess.Popen` whose children are killed when this process dies."""

  def __init__(self, args, **kwargs):
    if sys.platform.startswith('linux') and 'preexec_fn' not in kwargs:
      kwargs['preexec_fn'] = _set_parent_death_signal
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


def worker_binary_path() -> str:
  """The `worker_binary` shipped in the installed TFF wheel (found without importing TFF)."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow_federated is not installed')
  return os.path.join(list(spec.submodule_search_locations)[0], 'data', WORKER_NAME)


def worker_command(port: int, max_concurrent_computation_calls: int = -1) -> list[str]:
  """The command line TFF's local runtime uses to start its worker service."""
  return [worker_binary_path(), f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_computation_calls}']


def unused_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# --- Isolation: a private network namespace, reached through a relay --------------------

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_isolation_probe = None  # (None or why not) once probed
_exposure_told = False


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def enter_private_network() -> None:
  """Moves this (single-threaded) process into a new network namespace whose one interface,
  its loopback, is up; through a user namespace of its own when not root. Sockets opened
  before keep their namespace. OSError says why not."""
  if not sys.platform.startswith('linux'):
    raise OSError(errno.ENOSYS, 'network namespaces are Linux only')
  uid, gid = os.geteuid(), os.getegid()
  flags = _CLONE_NEWNET | (_CLONE_NEWUSER if uid != 0 else 0)
  if _libc().unshare(flags) != 0:
    code = ctypes.get_errno()
    what = 'a network namespace' if uid == 0 else 'a user and network namespace'
    raise OSError(code, f'cannot create {what}: {os.strerror(code)}')
  if uid != 0:  # root of the new user namespace is this user: files keep their owner
    for name, text in (('setgroups', 'deny'), ('uid_map', f'0 {uid} 1'),
                       ('gid_map', f'0 {gid} 1')):
      with open(f'/proc/self/{name}', 'w') as f:
        f.write(text)
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack('16sH22x', b'lo', 0)
    current = struct.unpack('16sH22x', fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack('16sH22x', b'lo', current | _IFF_UP))


def isolation_unavailable() -> Optional[str]:
  """None when workers can run isolated here; else why not, in a few words (probed once, in
  a child process)."""
  global _isolation_probe
  if _isolation_probe is None:
    try:
      probe = subprocess.run([sys.executable, '-I', '-S', os.path.abspath(__file__), 'probe'],
                             capture_output=True, text=True, timeout=60)
      reason = None if probe.returncode == 0 else (
          probe.stderr.strip().splitlines() or ['the namespace probe failed'])[-1]
    except (OSError, subprocess.SubprocessError) as e:
      reason = f'the namespace probe failed: {e}'
    _isolation_probe = (reason,)
  return _isolation_probe[0]


def isolated(required: Optional[bool]) -> bool:
  """Whether to start a worker isolated: `required` True raises WorkerNotIsolatedError where
  it cannot be, False never isolates; None isolates where possible, else says once on
  stderr that the worker is exposed."""
  global _exposure_told
  if required is False:
    return False
  reason = isolation_unavailable()
  if reason is None:
    return True
  if required:
    raise WorkerNotIsolatedError(f'the worker cannot run isolated from the network here '
                                 f'({reason}); {ISOLATION_FIX}')
  if not _exposure_told:
    _exposure_told = True
    print(f'warning: {EXPOSURE} (no isolation here: {reason}); {ISOLATION_FIX}, or refuse '
          'to run exposed with --require_isolated_worker', file=sys.stderr, flush=True)
  return False


def relay_command(listen: str, command: list[str]) -> list[str]:
  """The command that runs `command` (a worker serving on NAMESPACE_PORT) in a private
  network namespace, reached at `listen` ('unix:/path' in a directory of its own, removed
  when the worker ends, or 'host:port'), dying with this process."""
  return [sys.executable, '-I', '-S', os.path.abspath(__file__), 'relay', f'--listen={listen}',
          f'--parent={os.getpid()}', '--own_directory', '--'] + command


def _listen(listen: str) -> socket.socket:
  if listen.startswith('unix:'):
    path = listen[len('unix:'):]
    if os.path.exists(path):   # left by a killed relay
      os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)   # connecting takes write permission: this user only
  else:
    host, _, port = listen.rpartition(':')
    host = host.strip('[]')
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
  server.listen(64)
  return server


def _pump(source: socket.socket, dest: socket.socket, done: threading.Semaphore) -> None:
  """Copies `source` to `dest` until end of stream, then half-closes `dest`."""
  buffer = bytearray(1 << 20)
  view = memoryview(buffer)
  try:
    while True:
      n = source.recv_into(buffer)
      if not n:
        break
      dest.sendall(view[:n])
  except OSError:
    pass
  try:
    dest.shutdown(socket.SHUT_WR)
  except OSError:
    pass
  done.release()


def _carry(client: socket.socket, port: int, deadline_seconds: float = 60.0) -> None:
  """Joins `client` to the worker at 127.0.0.1:`port` (waiting for it to listen) both ways."""
  deadline = time.monotonic() + deadline_seconds
  while True:
    try:
      upstream = socket.create_connection(('127.0.0.1', port))
      break
    except OSError:
      if time.monotonic() > deadline:
        client.close()
        return
      time.sleep(0.02)
  for s in (client, upstream):
    if s.family != socket.AF_UNIX:
      s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  done = threading.Semaphore(0)
  threading.Thread(target=_pump, args=(upstream, client, done), daemon=True).start()
  _pump(client, upstream, done)
  done.acquire()
  done.acquire()
  client.close()
  upstream.close()


def serve_isolated(listen: str, command: list[str], parent: Optional[int] = None,
                   own_directory: bool = False) -> int:
  """Runs `command` (a worker serving on NAMESPACE_PORT) in a private network namespace and
  relays `listen` to it; returns the worker's exit status. This process must be
  single-threaded; with `parent`, it and the worker stop when that process dies (SIGTERM,
  so that the socket goes too, and the socket's directory with `own_directory`)."""
  server = _listen(listen)
  worker = None
  stopping = []

  def stop(signum, frame):
    del frame
    stopping.append(signum)
    if worker is not None:
      worker.kill()

  for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, stop)
  try:
    try:
      enter_private_network()
    except OSError as e:
      print(f'error: {e}; {ISOLATION_FIX}', file=sys.stderr, flush=True)
      return 3
    if parent is not None:
      _set_parent_death_signal(signal.SIGTERM)
      if os.getppid() != parent:
        return 1   # the parent died before the signal was set
    worker = subprocess.Popen(command, preexec_fn=_set_parent_death_signal)
    if stopping:
      worker.kill()
    port = NAMESPACE_PORT
    for argument in command:
      if argument.startswith('--port='):
        port = int(argument[len('--port='):])

    def accept():
      while True:
        try:
          client, _ = server.accept()
        except OSError:
          return
        threading.Thread(target=_carry, args=(client, port), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    status = worker.wait()   # the main thread: the worker's parent-death signal follows it
    return status if status >= 0 else 128 - status
  finally:
    if listen.startswith('unix:'):
      path = listen[len('unix:'):]
      try:
        os.unlink(path)
        if own_directory:
          os.rmdir(os.path.dirname(path))
      except OSError:
        pass


def _main(argv) -> int:
  """`probe`: exit 0 if this process can enter a private network namespace; `relay
  --listen=ADDRESS [--parent=PID] [--own_directory] -- COMMAND...`: `serve_isolated`."""
  parser = argparse.ArgumentParser(prog='workers.py')
  parser.add_argument('mode', choices=('probe', 'relay'))
  parser.add_argument('--listen', default='')
  parser.add_argument('--parent', type=int, default=None)
  parser.add_argument('--own_directory', action='store_true')
  split = argv.index('--') if '--' in argv else len(argv)
  args = parser.parse_args(argv[:split])
  command = argv[split + 1:]
  if args.mode == 'probe':
    try:
      enter_private_network()
    except OSError as e:
      print(e.strerror or str(e), file=sys.stderr)
      return 1
    return 0
  return serve_isolated(args.listen, command, args.parent, args.own_directory)


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


if __name__ == '__main__':
  sys.exit(_main(sys.argv[1:]))
