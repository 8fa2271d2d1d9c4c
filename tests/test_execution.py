"""The execution context owns TFF's worker processes: none outlives its Python parent."""

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from tests.helpers import process_alive
from tff_algos import execution
from tff_algos.runtime import contexts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import os, sys, time
from tff_algos import execution
execution.initialize_runtime()
execution.initialize_runtime()  # idempotent: no second worker, no hang
import numpy as np, tensorflow_federated as tff
@tff.federated_computation
def three():
  return tff.federated_value(np.int32(3), tff.SERVER)
print('result', three(), 'workers', len(execution.worker_pids()), flush=True)
if len(sys.argv) > 1:
  print('worker', execution.worker_pids()[0], flush=True)
  try:
    time.sleep(600)
  except BaseException as e:  # a library must not raise into its user's code on SIGTERM
    print('caught', type(e).__name__, flush=True)
"""


def _env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)


def test_program_through_a_pipe_terminates_cleanly():
  result = subprocess.run(['bash', '-c', f'{sys.executable} -c "$SCRIPT" 2>&1 | cat'],
                          env=dict(_env(), SCRIPT=SCRIPT), capture_output=True, text=True,
                          timeout=180)
  assert 'result 3 workers 1' in result.stdout, result.stdout
  assert 'Traceback' not in result.stdout and 'Exception ignored' not in result.stdout


@pytest.mark.parametrize('signum', [signal.SIGKILL, signal.SIGTERM])
def test_worker_dies_with_a_killed_parent(signum):
  proc = subprocess.Popen([sys.executable, '-c', SCRIPT, 'hold'], env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  worker = None
  deadline = time.time() + 120
  while time.time() < deadline:
    line = proc.stdout.readline()
    if line.startswith('worker'):
      worker = int(line.split()[1])
      break
  assert worker is not None and process_alive(worker)
  proc.send_signal(signum)
  rest = proc.communicate(timeout=60)[0]
  # SIGTERM keeps its default meaning (the process ends with the signal's status), and no
  # exception is raised into the code that was running.
  assert proc.returncode == -signum and 'caught' not in rest, (proc.returncode, rest)
  deadline = time.time() + 20
  while process_alive(worker) and time.time() < deadline:
    time.sleep(0.2)
  assert not process_alive(worker)


def test_collector_paused_restores_the_collector_even_on_error():
  import gc
  assert gc.isenabled()
  with execution.collector_paused():
    assert not gc.isenabled()
  assert gc.isenabled()
  try:
    with execution.collector_paused():
      raise RuntimeError('boom')
  except RuntimeError:
    pass
  assert gc.isenabled()
  gc.disable()
  try:
    with execution.collector_paused():  # a disabled collector stays disabled
      pass
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_freeze_long_lived_objects_hides_them_from_the_collector():
  import gc
  try:
    frozen = execution.freeze_long_lived_objects()
    assert frozen > 1000  # (frozen objects can still be freed by reference counting)
    assert len(gc.get_objects()) < frozen / 2
  finally:
    gc.unfreeze()


def test_protobuf_is_compiled_here():
  # Under protobuf's pure-Python implementation TFF's builds and rounds are 3-9x slower
  # (benchmarks/results/RESULTS.md, "protobuf"): the pinned environment must not fall back to it.
  assert execution.protobuf_implementation() in ('upb', 'cpp')


def test_initialize_runtime_warns_under_pure_python_protobuf(monkeypatch):
  import tensorflow_federated as tff
  calls = []
  monkeypatch.setattr(contexts, '_installed', None)
  monkeypatch.setattr(contexts, '_installed_context', contexts._installed_context)  # pylint: disable=protected-access
  monkeypatch.setattr(contexts, 'protobuf_implementation', lambda: 'python')
  monkeypatch.setattr(contexts, 'local_context', lambda **kwargs: calls.append(kwargs) or 'context')
  installed = []
  monkeypatch.setattr(tff.framework.get_context_stack(), 'set_default_context',
                      installed.append)
  with pytest.warns(RuntimeWarning, match=r'protobuf>=4\.21'):
    execution.initialize_runtime(default_num_clients=7)
  assert calls and calls[0]['default_num_clients'] == 7 and installed == ['context']
  monkeypatch.setattr(contexts, '_installed', None)
  monkeypatch.setattr(contexts, 'protobuf_implementation', lambda: 'upb')
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    execution.initialize_runtime(default_num_clients=8)


HELD_AT_EXIT = """
import tempfile
_early = tempfile.TemporaryDirectory()  # a weakref.finalize made before tff_algos is imported
import asyncio
import numpy as np
import tensorflow_federated as tff
from tff_algos import execution
execution.initialize_runtime()
context = tff.framework.get_context_stack().current
executor = context._async_context.executor_factory.create_executor({})
HELD = [asyncio.run(executor.create_value(np.int32(n), tff.TensorType(np.int32)))
        for n in range(45)]   # TFF sends disposals in batches of 20
print('held', len(HELD), flush=True)
"""


def test_values_held_at_exit_end_without_a_traceback():
  """Values still referenced on the worker when the program ends: TFF disposes of them at
  exit, after our hook stopped the worker when weakref's exit hook is the older one (as
  here). Closed first, their executor skips those disposals: no gRPC traceback."""
  result = subprocess.run([sys.executable, '-c', HELD_AT_EXIT], env=_env(),
                          capture_output=True, text=True, timeout=180)
  assert result.returncode == 0 and 'held 45' in result.stdout, result.stderr
  assert 'Traceback' not in result.stderr and 'Exception ignored' not in result.stderr, (
      result.stderr[-2000:])


def test_data_alone_through_tff_ends_without_a_traceback():
  """`tff_algos.data` used without anything else of tff_algos (e.g. a notebook that only
  partitions and federates a data set) still gets the exit hook: TFF's ServiceManager would
  otherwise try to stop its worker when `subprocess` is already gone and print a traceback."""
  script = ('from tff_algos import data\n'
            'from tff_algos.data import datasets\n'
            'import sys\n'
            'print("tff_algos.execution" in sys.modules, flush=True)\n')
  result = subprocess.run([sys.executable, '-c', script], env=_env(), capture_output=True,
                          text=True, timeout=180)
  assert result.returncode == 0 and result.stdout.strip() == 'True', result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and 'Exception ignored' not in result.stderr, (
      result.stderr[-2000:])


def test_closing_remote_executors_does_not_wake_lazy_proxies(monkeypatch):
  """Exit finds TFF's RemoteExecutors among all objects by their type: isinstance would read
  every object's `__class__`, which on lazy proxies (tfds's builders) imports what they
  stand for and logs a warning each."""
  import types  # pylint: disable=g-import-not-at-top

  class RemoteExecutor:
    closed = 0

    def close(self):
      RemoteExecutor.closed += 1

  class Subclass(RemoteExecutor):
    pass

  class LazyProxy:
    woken = 0

    @property
    def __class__(self):   # what a lazy-import proxy does on `__class__`
      LazyProxy.woken += 1
      return RemoteExecutor

  fake = types.ModuleType('remote_executor')
  fake.RemoteExecutor = RemoteExecutor
  monkeypatch.setitem(
      sys.modules, 'tensorflow_federated.python.core.impl.executors.remote_executor', fake)
  held = [RemoteExecutor(), Subclass(), LazyProxy()]
  contexts._close_remote_executors()  # pylint: disable=protected-access
  assert RemoteExecutor.closed == 2 and LazyProxy.woken == 0
  del held


def test_value_bytes_counts_every_tensor_of_a_nested_placed_type_and_the_limit_is_one_line():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  dtypes = [np.float32, np.float64, np.int32, np.float16, np.int64]
  leaves = [(dtypes[rng.integers(len(dtypes))], tuple(int(d) for d in rng.integers(1, 9, rng.integers(0, 4))))
            for _ in range(7)]
  expected = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                 for dt, shape in leaves)
  tensors = [tff.TensorType(dt, shape) for dt, shape in leaves]
  nested = tff.FederatedType(tff.StructType([
      ('a', tensors[0]), ('b', tff.StructType(tensors[1:4])),
      ('c', tff.StructType([('d', tff.StructType(tensors[4:]))]))]), tff.SERVER)
  assert execution.value_bytes(nested) == expected
  execution.check_value_fits(nested, 'small', 'no fix needed')   # far below the limit
  big = tff.TensorType(np.float32, [execution.MAX_VALUE_BYTES // 4 + 1])
  with pytest.raises(execution.ValueTooLargeError) as info:
    execution.check_value_fits(big, 'the state', 'shrink it')
  assert '\n' not in str(info.value) and str(info.value).endswith('; shrink it')
