"""No worker a run starts can be reached from outside the training process.

TFF's `worker_binary` runs any TensorFlow computation it is handed, unauthenticated. A run
(initialize_runtime plus one computation: the local runtime, and two local services) is
attacked from a second process as an attacker would: every TCP port any process of the run
listens on in this host's network namespace is found (/proc/<pid>/fd against
/proc/net/tcp{,6}) and handed a computation that writes a file; and, as the user `nobody`,
the run's endpoints (Unix sockets) are connected to. Both must fail: the workers run in
private network namespaces (tff_algos/runtime/isolation.py), reached through 0700
directories. Loopback only.
"""

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from programs import experiment
from programs import experiment_config
from tff_algos import execution
from tff_algos.runtime import contexts
from tff_algos.runtime import isolation
from tff_algos.runtime import workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534

RUN = """
import sys, time
from tff_algos import execution
from tff_algos.runtime import workers
execution.initialize_runtime(local_workers=int(sys.argv[1]))
import numpy as np, tensorflow_federated as tff
@tff.federated_computation
def three():
  return tff.federated_value(np.int32(3), tff.SERVER)
print('result', three(), flush=True)
print('endpoints', *[s.address for s in workers._owned_services], flush=True)
time.sleep(600)
"""


def _isolation_or_skip():
  reason = isolation.isolation_unavailable()
  if reason is not None:
    pytest.skip(f'workers cannot run isolated from the network on this machine: {reason}')


def _listening_tcp_ports(pids) -> list[int]:
  """TCP ports on which any of `pids` listens in this host's network namespace."""
  inodes = set()
  for pid in pids:
    try:
      for fd in os.listdir(f'/proc/{pid}/fd'):
        target = os.readlink(f'/proc/{pid}/fd/{fd}')
        if target.startswith('socket:['):
          inodes.add(target[len('socket:['):-1])
    except OSError:
      continue
  ports = set()
  for table in ('/proc/self/net/tcp', '/proc/self/net/tcp6'):
    with open(table) as f:
      for line in f.readlines()[1:]:
        fields = line.split()
        if fields[3] == '0A' and fields[9] in inodes:   # LISTEN
          ports.add(int(fields[1].rsplit(':', 1)[1], 16))
  return sorted(ports)


def _attack(address: str, marker: str) -> bool:
  """True if a computation handed to the service at `address` ran (it writes `marker`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.tensorflow.computation
  def write():
    with tf.control_dependencies([tf.io.write_file(marker, 'ran')]):
      return tf.constant(1)

  try:
    context = execution.distributed_context([address], worker_timeout_seconds=10)
    with tff.framework.get_context_stack().install(context):
      write()
  except Exception:  # pylint: disable=broad-except
    pass
  return os.path.exists(marker)


def _connect_as_nobody(path: str) -> str:
  """What `nobody` gets connecting to the Unix socket at `path`: 'connected', or the error."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:   # the child: no Python-level cleanup, no return into pytest
    try:
      os.close(read)
      os.setgroups([])
      os.setgid(NOBODY)
      os.setuid(NOBODY)
      import socket  # pylint: disable=g-import-not-at-top
      with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
      answer = 'connected'
    except OSError as e:
      answer = type(e).__name__
    except BaseException as e:  # pylint: disable=broad-except
      answer = f'child failed: {e!r}'
    os.write(write, answer.encode())
    os._exit(0)
  os.close(write)
  answer = b''
  while chunk := os.read(read, 1024):
    answer += chunk
  os.close(read)
  os.waitpid(pid, 0)
  return answer.decode()


@pytest.fixture
def run(request):
  """A run (`local_workers` services, 0: the local runtime) after one computation: (its
  process, the endpoints of its workers, local_workers)."""
  _isolation_or_skip()
  process = subprocess.Popen(
      [sys.executable, '-c', RUN, str(request.param)], cwd=ROOT, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT))
  lines = []
  deadline = time.time() + 300
  while time.time() < deadline:
    line = process.stdout.readline()
    if not line:
      break
    lines.append(line)
    if line.startswith('endpoints'):
      break
  try:
    assert lines and lines[-1].startswith('endpoints') and 'result 3' in ''.join(lines), lines
    yield process, lines[-1].split()[1:], request.param
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.mark.parametrize('run', [0, 2], indirect=True, ids=['local', 'local_workers=2'])
def test_no_process_of_a_run_can_be_reached_from_another_process(run, tmp_path):
  process, endpoints, local_workers = run
  tree = [process.pid] + workers.descendant_pids(process.pid)
  assert len(endpoints) == max(1, local_workers)
  # As this user, from another process: every TCP port the run listens on here.
  ports = _listening_tcp_ports(tree)
  ran = [port for port in ports
         if _attack(f'127.0.0.1:{port}', str(tmp_path / f'ran_{port}'))]
  assert not ran, f'a computation ran through ports {ran} of the run'
  assert not ports, f'the run listens on TCP ports {ports} in the host\'s network namespace'
  # As another user: the endpoints the workers are reached at.
  for endpoint in endpoints:
    assert endpoint.startswith('unix:'), endpoint
    path = endpoint[len('unix:'):]
    directory = os.stat(os.path.dirname(path))
    assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()
    assert _connect_as_nobody(path) == 'PermissionError'


@pytest.mark.parametrize('run', [0], indirect=True, ids=['local'])
def test_an_isolated_worker_dies_with_its_killed_run(run):
  process, endpoints, _ = run
  tree = workers.descendant_pids(process.pid)
  assert len(tree) == 2   # the relay and the worker
  process.send_signal(signal.SIGKILL)
  process.wait()
  deadline = time.time() + 30
  while any(os.path.exists(f'/proc/{pid}') and _state(pid) != 'Z' for pid in tree):
    assert time.time() < deadline, f'{tree} outlived their run'
    time.sleep(0.2)
  # The relay removed the socket and its directory.
  assert not os.path.exists(os.path.dirname(endpoints[0][len('unix:'):]))


def _state(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0]
  except OSError:
    return 'Z'


def test_the_isolated_worker_reads_and_writes_this_file_system(tmp_path):
  """The resident state crosses as files: the worker shares the mount namespace."""
  _isolation_or_skip()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  assert contexts.installed_context().worker.isolated
  source, dest = tmp_path / 'in.txt', str(tmp_path / 'out.txt')
  source.write_text('from python')

  @tff.tensorflow.computation
  def copy():
    content = tf.io.read_file(str(source))
    with tf.control_dependencies([tf.io.write_file(dest, content)]):
      return tf.strings.length(content)

  assert copy() == len('from python')
  with open(dest) as f:
    assert f.read() == 'from python'


def test_without_isolation_the_run_says_so_in_one_line_and_goes_on(monkeypatch, capsys):
  monkeypatch.setattr(isolation, '_isolation_probe', ('no user namespaces (simulated)',))
  monkeypatch.setattr(isolation, '_exposure_told', False)
  execution.shutdown_workers()
  try:
    execution.initialize_runtime()
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    @tff.federated_computation
    def three():
      return tff.federated_value(np.int32(3), tff.SERVER)

    assert three() == 3
    assert not contexts.installed_context().worker.isolated
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('warning: ') and 'every network' in lines[0]
    assert 'no user namespaces (simulated)' in lines[0] and '--require_isolated_worker' in lines[0]
    with pytest.raises(isolation.WorkerNotIsolatedError, match='cannot run isolated'):
      execution.initialize_runtime(require_isolated_worker=True)
  finally:
    execution.shutdown_workers()


def test_program_require_isolated_worker_flag(monkeypatch, tmp_path):
  """--require_isolated_worker: where the worker cannot be isolated the run stops before
  anything starts, with one line naming the fix."""
  monkeypatch.setattr(isolation, '_isolation_probe', ('no user namespaces (simulated)',))
  config = experiment_config.ExperimentConfig(
      algorithm='fedavg', dataset='digits', num_clients=4, clients_per_round=2, rounds=1,
      progress=False, root_output_dir=str(tmp_path), require_isolated_worker=True)
  with pytest.raises(experiment_config.ExperimentError) as info:
    experiment.run_experiment(config)
  message = str(info.value)
  assert '\n' not in message and 'isolated' in message and 'user namespaces' in message
  assert not os.path.exists(config.experiment_dir)


def test_start_worker_binds_only_where_told(tmp_path):
  """scripts/start_worker.py --bind: the service answers there (a computation runs) and
  listens on nothing else; a Unix socket is reachable as a --workers address."""
  _isolation_or_skip()
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  port = workers.unused_port()
  socket_path = str(tmp_path / 'w.sock')
  started = [workers.PopenDyingWithParent(
      [sys.executable, os.path.join(ROOT, 'scripts', 'start_worker.py'), *args],
      stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
      for args in ([f'--port={port}'], [f'--bind=unix:{socket_path}'])]
  try:
    context = execution.distributed_context([f'127.0.0.1:{port}', f'unix:{socket_path}'],
                                            worker_timeout_seconds=120)

    @tff.federated_computation
    def three():
      return tff.federated_value(np.int32(3), tff.SERVER)

    assert execution.worker_devices(context).keys() == {f'127.0.0.1:{port}',
                                                        f'unix:{socket_path}'}
    with tff.framework.get_context_stack().install(context):
      assert three() == 3
    tree = [p.pid for p in started] + [d for p in started for d in workers.descendant_pids(p.pid)]
    assert _listening_tcp_ports(tree) == [port]
    with open('/proc/self/net/tcp') as f:   # bound to loopback, not to every interface
      bound = [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == '0A']
    assert f'0100007F:{port:04X}' in bound and f'00000000:{port:04X}' not in bound
  finally:
    for process in started:
      process.terminate()
      process.wait(timeout=30)
  assert not os.path.exists(socket_path)
