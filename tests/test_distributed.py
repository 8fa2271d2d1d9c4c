"""Several TFF worker services on loopback: every method's rounds split across 2 and 3
services give local mode's weights; a killed worker is restarted (ours) or named in a clear
error (someone else's), never a hang; the program's --workers/--local_workers/--worker_timeout.

Three worker services are started once for the module with scripts/start_worker.py (as a user
starts them on other machines). Each comparison runs 2 rounds of 4 digits clients (tiny CNN,
1 epoch) locally, then on 2 and on 3 of those services.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top
import functools
import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from programs import computations
from programs import experiment
from programs import experiment_config
from programs import fedlex_exploration
from programs import methods
from programs import run_results
from tests import helpers
import tff_algos
from tff_algos import evaluation
from tff_algos import execution
from tff_algos import fedlex
from tff_algos import models
from tff_algos.runtime import workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FN = models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
ROUNDS = 2
NUM_CLIENTS, CLIENTS_PER_ROUND = 8, 4
RTOL, ATOL = 1e-5, 1e-6  # merging partial sums in another order moves the last float bits
# No test may hang: every distributed call runs under a bound. TFF's Python-side compilation
# of a method's round to the mergeable form takes 30-120 s (FedCDA, on a loaded 2-core
# machine), hence the generous bound for whole trainings; a killed worker must be reported
# well within KILL_TIMEOUT.
CALL_TIMEOUT = 1200
KILL_TIMEOUT = 300


def _start_service():
  """A worker service as a user starts one (scripts/start_worker.py), dying with pytest."""
  port = workers.unused_port()
  process = workers.PopenDyingWithParent(
      [sys.executable, os.path.join(ROOT, 'scripts', 'start_worker.py'), f'--port={port}'],
      stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  return f'127.0.0.1:{port}', process


def _stop(process):
  if process.poll() is None:
    process.kill()
  process.wait(timeout=30)


@pytest.fixture(scope='module')
def services():
  started = [_start_service() for _ in range(3)]
  yield [address for address, _ in started]
  for _, process in started:
    _stop(process)


@pytest.fixture(scope='module')
def contexts(services):
  execution.initialize_runtime()
  return {n: execution.distributed_context(services[:n], worker_timeout_seconds=60)
          for n in (2, 3)}


@pytest.fixture(scope='module')
def fed():
  return experiment.load_federated_data(_config('fedavg'))  # the program's own data


def _config(algorithm, **kwargs):
  return experiment_config.ExperimentConfig(
      algorithm=algorithm, dataset='digits', num_clients=NUM_CLIENTS,
      clients_per_round=CLIENTS_PER_ROUND, batch_size=16, client_lr=0.1, local_epochs=1,
      fedcda_warmup_rounds=1, fedcda_batches=2, fedlex_exploration_epochs=1,
      **helpers.METHOD_SETTINGS.get(algorithm, {}), **kwargs)


@functools.lru_cache(maxsize=None)
def _build(algorithm):
  """Each method's process once for the module (tracing one costs 10-30 s here)."""
  return computations.build_process(_config(algorithm), MODEL_FN, NUM_CLIENTS)


def _train(config, fed, process, rounds=ROUNDS):
  """The program's loop (FedLEx: exploration first); returns the global weights' arrays."""
  state = process.initialize()
  if config.algorithm in methods.FEDLEX_ALGORITHMS:
    exploration, explorers = fedlex_exploration.exploration_computation(
        config, MODEL_FN, NUM_CLIENTS)
    _, inputs = data.round_inputs(fed, 0, len(explorers), 1, 1, client_ids=explorers)
    state, _ = fedlex.explore_and_initialize(process, exploration, [[x] for x in inputs], state)
  for round_num in range(1, rounds + 1):
    _, inputs = data.round_inputs(fed, round_num, CLIENTS_PER_ROUND, 1, 0)
    state = process.next(state, [[x] for x in inputs]).state
  return [np.asarray(w) for w in tf.nest.flatten(process.get_model_weights(state))]


def _in_context(context, fn, *args, timeout=CALL_TIMEOUT):
  """fn(*args) with `context` installed, in a thread bounded by `timeout` seconds."""
  box = {}

  def run():
    try:
      with tff.framework.get_context_stack().install(context):
        box['value'] = fn(*args)
    except BaseException as e:  # pylint: disable=broad-except
      box['error'] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(timeout)
  assert not thread.is_alive(), f'distributed call still running after {timeout} s'
  if 'error' in box:
    raise box['error']
  return box['value']


def _assert_same(expected, actual):
  assert len(expected) == len(actual)
  for e, a in zip(expected, actual):
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


# Every method, in the default suite: about 10 s each (its build, the mergeable compilation,
# the local run and the distributed calls) since protobuf 4's compiled implementation; under
# protobuf 3.20's pure-Python one each took about a minute and only FedCross ran by default.
@pytest.mark.parametrize('algorithm', [
    'fedavg',
    'fedcross',      # federated_select dispatch + keyed federated_aggregate
    'fedcda',        # keyed uploads into the [N, K, D] cache
    'cadis',         # KD client work, N x N state, clustering
    'fedlex_avgm',   # exploration computation, guided rounds
    'scaffold',      # federated_select keyed by client index, [N, D] control variates
])
def test_method_on_2_and_3_services_matches_local_mode(contexts, fed, algorithm):
  config = _config(algorithm)
  process = _build(algorithm)
  execution.check_mergeable(process.next, algorithm)
  local = _train(config, fed, process)
  for n in (2, 3):
    _assert_same(local, _in_context(contexts[n], _train, config, fed, process))


def test_per_client_evaluation_on_2_services_matches_local_mode(contexts, fed):
  # The program's --client_test_fraction evaluation: each client's counts keyed by index
  # arrive whole whichever service evaluated the client.
  config = _config('fedavg', client_test_fraction=0.2)
  split, client_test = experiment.with_client_test(config, fed, NUM_CLIENTS)
  evaluate = evaluation.build_per_client_evaluation(MODEL_FN, NUM_CLIENTS)
  execution.check_mergeable(evaluate, 'per-client evaluation')
  process = _build('fedavg')
  state = process.next(process.initialize(), [[x] for x in data.round_inputs(
      split, 1, CLIENTS_PER_ROUND, 1, 0)[1]]).state
  weights = process.get_model_weights(state)
  inputs = evaluation.client_evaluation_inputs(client_test)
  local = evaluate(weights, inputs)
  assert list(local['count']) == [len(y) for _, y in client_test]
  distributed = _in_context(contexts[2], evaluate, weights, inputs)
  for key in ('correct', 'count'):
    np.testing.assert_array_equal(distributed[key], local[key])


def test_dependent_aggregations_are_refused_with_the_reason():
  execution.initialize_runtime()

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def centered_mean(x):  # the second mean needs the first one's result at the clients
    mean = tff.federated_broadcast(tff.federated_mean(x))
    return tff.federated_mean(tff.federated_map(
        tff.tensorflow.computation(lambda a, b: a - b), (x, mean)))

  with pytest.raises(execution.NotMergeableError, match='centered_mean cannot be split'):
    execution.check_mergeable(centered_mean, 'centered_mean')


def _kill_at_first_compute(service, process):
  """Makes `service`'s next executor kill `process` when the round's first Compute call is
  sent to it (the worker holds the round's values and is asked for a result): a kill in
  the middle of the round, at a known point."""
  real_stub = service.stub

  class KillingStub:

    def __init__(self, stub):
      self._stub = stub

    def compute(self, request):
      if process.poll() is None:
        process.kill()
        process.wait()
      return self._stub.compute(request)

    def __getattr__(self, name):
      return getattr(self._stub, name)

  def stub_once(timeout_seconds):
    service.stub = real_stub  # later executors (the retries) talk to the worker directly
    return KillingStub(real_stub(timeout_seconds))

  service.stub = stub_once


def test_our_worker_killed_mid_round_is_restarted_and_the_round_matches(fed):
  execution.initialize_runtime()
  config = _config('fedavg')
  process = _build('fedavg')
  local = _train(config, fed, process, rounds=1)
  context = execution.distributed_context(local_workers=2, worker_timeout_seconds=60)
  victim = context.worker_contexts[1].worker
  first = victim.process
  _kill_at_first_compute(victim, first)
  _assert_same(local, _in_context(context, _train, config, fed, process, 1))
  assert first.returncode is not None  # it was killed mid-round ...
  assert victim.process is not first and victim.process.poll() is None  # ... and restarted
  for worker in context.worker_contexts:
    worker.worker.stop()


def test_someone_elses_worker_killed_mid_round_is_named_in_a_clear_error(services, fed):
  execution.initialize_runtime()
  config = _config('fedavg')
  process = _build('fedavg')
  address, victim = _start_service()
  try:
    execution.WorkerService(address).stub(timeout_seconds=120)  # up (a loaded machine is slow)
    context = execution.distributed_context([services[0], address], worker_timeout_seconds=5)
    _kill_at_first_compute(context.worker_contexts[1].worker, victim)
    with pytest.raises(execution.WorkerUnavailableError, match=f'{address} did not answer'):
      _in_context(context, _train, config, fed, process, 1, timeout=KILL_TIMEOUT)
    assert victim.returncode is not None
  finally:
    _stop(victim)


def test_worker_devices_are_measured_inside_each_service(contexts, services):
  execution.initialize_runtime()
  cpu = {'default_device': 'CPU', 'gpu_usable': False}  # TFF 0.87's wheel: no CUDA
  assert execution.worker_devices() == {'local': cpu}
  assert execution.worker_devices(contexts[3]) == {a: cpu for a in services}


def test_our_services_die_with_a_killed_parent():
  script = ('import time\nfrom tff_algos import execution\n'
            'c = execution.distributed_context(local_workers=2)\n'
            'print(*[w.worker.process.pid for w in c.worker_contexts], flush=True)\n'
            'time.sleep(600)\n')
  parent = subprocess.Popen([sys.executable, '-c', script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT))
  pids = [int(p) for p in parent.stdout.readline().split()]
  assert len(pids) == 2
  parent.send_signal(signal.SIGKILL)
  parent.wait()
  deadline = time.time() + 20
  while any(helpers.process_alive(p) for p in pids):
    assert time.time() < deadline, f'worker services {pids} outlived their parent'
    time.sleep(0.2)


@pytest.mark.parametrize('text, expected', [
    ('', []),
    ('10.0.0.5:8000', ['10.0.0.5:8000']),
    (' a:1 , worker-2.svc:65535 ', ['a:1', 'worker-2.svc:65535']),
    ('unix:/home/me/.tff/w1.sock,a:1', ['unix:/home/me/.tff/w1.sock', 'a:1']),
])
def test_parse_worker_addresses(text, expected):
  assert execution.parse_worker_addresses(text) == expected


@pytest.mark.parametrize('text, fragment', [
    ('localhost', "'localhost' is not host:port"), (':80', 'is not host:port'),
    ('a:0', 'is not host:port'), ('a:70000', 'is not host:port'), ('a:1,a:1', 'listed twice'),
    ('unix:w.sock', 'is not unix:/absolute/path'),
])
def test_parse_worker_addresses_rejects(text, fragment):
  with pytest.raises(ValueError, match=fragment):
    execution.parse_worker_addresses(text)


# --- the training program ---------------------------------------------------------------

BASE = ['--dataset=digits', f'--num_clients={NUM_CLIENTS}',
        f'--clients_per_round={CLIENTS_PER_ROUND}', '--local_epochs=1', '--batch_size=16',
        '--client_lr=0.1', '--progress=false', '--eval_every=2']


def _run(args, timeout=CALL_TIMEOUT):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, '-m', 'programs.train', *BASE, *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


def test_program_on_given_and_local_services_reproduces_local_weights(tmp_path, services, fed):
  result = _run(['--algorithm=fedcross', f'--rounds={ROUNDS}', f'--workers={services[0]}',
                 '--local_workers=1', f'--root_output_dir={tmp_path}', '--experiment_name=w'])
  assert result.returncode == 0, result.stderr
  with open(tmp_path / 'w' / 'summary.json') as f:
    devices = json.load(f)['compute_devices']
  assert services[0] in devices and len(devices) == 2, devices  # both flags were used
  program = run_results.load_final_weights(str(tmp_path / 'w'))
  execution.initialize_runtime()
  process = _build('fedcross')
  state = process.initialize()
  for round_num in range(1, ROUNDS + 1):
    sampled = data.sample_clients(NUM_CLIENTS, CLIENTS_PER_ROUND, round_num, 0)
    _, inputs = data.round_inputs(fed, round_num, CLIENTS_PER_ROUND, 1, 0, client_ids=sampled)
    state = process.next(state, [[x] for x in inputs]).state
  weights = process.get_model_weights(state)
  local = [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]
  _assert_same(local, program)


@pytest.mark.parametrize('flags, fragment', [
    (['--workers=localhost'], "--workers: 'localhost' is not host:port"),
    (['--local_workers=-1'], '--local_workers must be >= 0'),
    (['--worker_timeout=0', '--local_workers=1'], '--worker_timeout must be > 0'),
    # nothing listens on port 1: named after --worker_timeout, not after the 60 s default
    (['--workers=127.0.0.1:1', '--worker_timeout=2'], '127.0.0.1:1 did not answer within 2 s'),
])
def test_program_worker_flags_bad_input_is_one_line(tmp_path, flags, fragment):
  result = _run(flags + ['--rounds=1', f'--root_output_dir={tmp_path}'], timeout=180)
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: ') and fragment in lines[0], lines


def _digits_client_data():
  """A user's ClientData: 8 clients of 40 digits, batched."""
  digits = data.load_digits()
  return tff.simulation.datasets.TestClientData(collections.OrderedDict(
      (f'user{n}', collections.OrderedDict(x=digits.x_train[40 * n:40 * (n + 1)],
                                           y=digits.y_train[40 * n:40 * (n + 1)]))
      for n in range(NUM_CLIENTS))).preprocess(lambda d: d.batch(16))


def test_train_model_runs_on_the_services_through_program_context(contexts, tmp_path):
  """A TFF program (`tff.learning.programs.train_model`, checkpointed) on 2 worker services
  through `execution.program_context`, with the round split over them: local mode's weights.
  FedCross: its model goes down through federated_select."""
  client_data = _digits_client_data()
  process = tff_algos.build_fedcross(
      MODEL_FN, tff.learning.optimizers.build_sgdm(learning_rate=0.1), 16,
      num_models=CLIENTS_PER_ROUND)

  def train_model(context, root):
    released = tff.program.MemoryReleaseManager()
    with tff.framework.get_context_stack().install(context):
      helpers.run_async(tff.learning.programs.train_model(
          train_process=process,
          train_data_source=data.federated_data_source(client_data, seed=0),
          train_per_round_clients=CLIENTS_PER_ROUND, train_total_rounds=ROUNDS,
          program_state_manager=tff.program.FileProgramStateManager(root),
          model_output_manager=released,
          train_metrics_manager=tff.program.MemoryReleaseManager(),
          evaluation_manager=None, evaluation_periodicity=1))
    final = list(released.values().values())[-1]
    return [np.asarray(w) for w in tf.nest.flatten(process.get_model_weights(final))]

  class Counted:
    """The 2-service context, counting the program's calls that reach it."""
    calls = 0

    def invoke(self, comp, arg):
      Counted.calls += 1
      return contexts[2].invoke(comp, arg)

  local = train_model(execution.program_context(), str(tmp_path / 'local'))
  distributed = _in_context(contexts[2], train_model, execution.program_context(Counted()),
                            str(tmp_path / 'distributed'))
  assert Counted.calls >= ROUNDS + 1   # initialize and every round ran on the services
  _assert_same(local, distributed)
