"""How a TFF worker is started isolated from the network, and the relay that reaches it.

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

Standard library only: scripts/start_worker.py loads this file alone, by path, and it runs
as the relay. The workers' lifecycle (started, found, stopped; `WorkerService`) is `workers`.
"""


from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import importlib.util
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Optional


WORKER_NAME = 'worker_binary'
# The port the worker serves on inside its own network namespace (nothing else is there).
NAMESPACE_PORT = 8000
EXPOSURE = ('TFF\'s worker_binary serves unauthenticated gRPC on every network interface: '
            'anyone who can reach its port can run code as this user')
ISOLATION_FIX = ('run on Linux as root or with unprivileged user namespaces enabled '
                 '(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0; '
                 'Ubuntu: kernel.apparmor_restrict_unprivileged_userns=0; in a container, '
                 'allow unshare(2))')


class WorkerNotIsolatedError(RuntimeError):
  """A worker was required to run isolated from the network where it cannot be."""


def set_parent_death_signal(signum: int = signal.SIGKILL):
  """`signum` to this process when its parent dies (in a child between fork and exec)."""
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(1, signum)  # PR_SET_PDEATHSIG = 1
  except OSError:
    pass


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
      set_parent_death_signal(signal.SIGTERM)
      if os.getppid() != parent:
        return 1   # the parent died before the signal was set
    worker = subprocess.Popen(command, preexec_fn=set_parent_death_signal)
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
  parser = argparse.ArgumentParser(prog='isolation.py')
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


if __name__ == '__main__':
  sys.exit(_main(sys.argv[1:]))
