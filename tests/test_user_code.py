"""Import paths for --model, --dataset and --algorithm (programs/user_code.py): a package of
the user's outside the repository, trained, resumed exactly, with faults and bytes, refused on
resume once its file changed; each bad path refused with one line; the example method
(examples/my_method) checked against FedAvg's update clipped by NumPy."""

import csv
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from programs import experiment
from programs import experiment_config
from programs.methods import registry
from programs import user_code
from programs.studies import study_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_METHOD = os.path.join(ROOT, 'examples', 'my_method', 'my_fl', 'fedclip.py')
PACKAGE = 'byo_pkg'

PARTS = '''
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tff_algos import data

def small_mlp(input_shape, num_classes):
  return tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=input_shape),
                              tf.keras.layers.Dense(16, activation='relu'),
                              tf.keras.layers.Dense(num_classes)])

def three_outputs(input_shape, num_classes):
  return small_mlp(input_shape, 3)

def not_a_model(input_shape, num_classes):
  return 'a model'

def digits_arrays(seed):
  d = data.load_digits(seed=seed)
  return d.x_train, d.y_train, d.x_test, d.y_test

def clients_of_writers():
  rng = np.random.default_rng(3)
  clients = {f'writer_{i}': dict(x=rng.random([5 + i, 4], np.float32),
                                 y=rng.integers(0, 3, 5 + i).astype(np.int32))
             for i in range(3)}
  return (tff.simulation.datasets.TestClientData(clients),
          (rng.random([6, 4], np.float32), np.array([0, 1, 2, 0, 1, 4], np.int32)))

def a_string():
  return 'data'

def returns_a_string(model_fn, client_optimizer_fn):
  return 'a process'

def no_model_fn(client_optimizer_fn):
  return None

NOT_CALLABLE = 3
'''


def _write_package(folder) -> str:
  package = os.path.join(str(folder), PACKAGE)
  os.makedirs(package)
  for name, text in (('__init__.py', ''), ('parts.py', PARTS),
                     ('broken.py', 'import no_such_dependency_of_byo\n')):
    with open(os.path.join(package, name), 'w') as f:
      f.write(textwrap.dedent(text))
  shutil.copy(EXAMPLE_METHOD, os.path.join(package, 'fedclip.py'))
  return str(folder)


@pytest.fixture(scope='module')
def package_dir(tmp_path_factory):
  """A folder outside the repository holding the user's package byo_pkg (on sys.path here;
  a subprocess gets it on PYTHONPATH)."""
  folder = _write_package(tmp_path_factory.mktemp('user'))
  sys.path.insert(0, folder)
  yield folder
  sys.path.remove(folder)
  for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + '.')]:
    del sys.modules[name]


def _config(**fields):
  base = dict(dataset='digits', num_clients=6, clients_per_round=3, batch_size=16,
              client_lr=0.1, rounds=3, progress=False)
  return experiment_config.ExperimentConfig(**{**base, **fields})


def _refusal(config) -> str:
  with pytest.raises(experiment_config.ExperimentError) as e:
    experiment_config.validate(config)
  assert '\n' not in str(e.value)
  return str(e.value)


@pytest.mark.parametrize('flag, value, expected', [
    ('model', f'{PACKAGE}.parts:', "--model='byo_pkg.parts:' is not an import path; write "
     'package.module:attribute'),
    ('model', 'no_such_package_xyz.models:cnn', '--model=no_such_package_xyz.models:cnn: no '
     'module named no_such_package_xyz; put the folder that holds it on PYTHONPATH'),
    ('dataset', f'{PACKAGE}.broken:load', 'importing byo_pkg.broken failed: '
     "ModuleNotFoundError: No module named 'no_such_dependency_of_byo'"),
    ('model', f'{PACKAGE}.parts:small_mpl', 'module byo_pkg.parts has no attribute small_mpl '
     '(did you mean small_mlp?)'),
    ('algorithm', f'{PACKAGE}.parts:NOT_CALLABLE', 'is int, not callable'),
    ('algorithm', f'{PACKAGE}.parts:no_model_fn', 'must take the keyword arguments model_fn, '
     'client_optimizer_fn (it lacks model_fn)'),
])
def test_a_bad_path_is_one_line_naming_the_fix(package_dir, flag, value, expected):
  assert expected in _refusal(_config(**{flag: value}))


def test_method_kwargs_are_checked_against_the_builder(package_dir):
  method = f'{PACKAGE}.fedclip:build_fedclip'
  assert 'takes no keyword clip_nrom (did you mean clip_norm?)' in _refusal(
      _config(algorithm=method, method_kwargs='{"clip_nrom": 1}'))
  assert '--method_kwargs: seed is set by the program' in _refusal(
      _config(algorithm=method, method_kwargs='{"seed": 1}'))
  assert 'is not JSON' in _refusal(_config(algorithm=method, method_kwargs='{clip_norm: 1}'))
  assert 'not by --algorithm=fedavg; drop it' in _refusal(
      _config(method_kwargs='{"clip_norm": 1}'))
  assert '--dataset=byo_pkg.parts:digits_arrays is your own: name its model' in _refusal(
      _config(dataset=f'{PACKAGE}.parts:digits_arrays'))
  assert '--guided and --kd_weight' in _refusal(_config(algorithm=method, kd_weight=0.5))
  # The keywords the builder gets: the standard ones it declares, then --method_kwargs.
  inputs = registry.BuildInputs(model_fn='m', client_optimizer='c', server_optimizer=None,
                               num_clients=6, true_clusters=None)
  config = _config(algorithm=method, method_kwargs='{"clip_norm": 0.5}')
  assert user_code.method(method).arguments(config, inputs) == ((), dict(
      model_fn='m', client_optimizer_fn='c', client_batch_size=16, clip_norm=0.5))
  assert user_code.method(method).arguments(
      config, dataclasses.replace(inputs, server_optimizer='s'))[1]['server_optimizer_fn'] == 's'
  # The builder's own server-optimizer flags are read: it takes server_optimizer_fn.
  experiment_config.validate(_config(algorithm=method, server_lr=0.5,
                                     method_kwargs='{"clip_norm": 1}'))
  # A study file's table becomes the flag's JSON.
  flag_value = study_file._flag_value  # pylint: disable=protected-access
  assert flag_value('s.toml', '[runs.mine]', 'method_kwargs',
                    {'clip_norm': 0.5}) == '{"clip_norm": 0.5}'


def test_wrong_returns_are_one_line_each(package_dir, runtime):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x_spec = tf.TensorSpec([8, 8, 1], tf.float32)
  with pytest.raises(experiment_config.ExperimentError,
                     match=r'three_outputs\(\(8, 8, 1\), 10\) gives 3 outputs per example; '
                     r'expected one logit per class \(10\)$'):
    user_code.model_fn(f'{PACKAGE}.parts:three_outputs', x_spec, 10, 0)
  with pytest.raises(experiment_config.ExperimentError,
                     match='returned str; expected a tf.keras.Model'):
    user_code.model_fn(f'{PACKAGE}.parts:not_a_model', x_spec, 10, 0)
  with pytest.raises(experiment_config.ExperimentError,
                     match='returned str; expected a tff_algos.data.FederatedDataset'):
    user_code.load_dataset(_config(dataset=f'{PACKAGE}.parts:a_string', model='tiny_cnn'))
  with pytest.raises(experiment_config.ExperimentError,
                     match='returned str; expected a tff.learning.templates.LearningProcess'):
    user_code.check_process(_config(algorithm=f'{PACKAGE}.parts:returns_a_string'),
                            'a process')


def test_every_model_of_a_seed_starts_alike(package_dir, runtime):
  """Keras's unseeded initialisers draw their seeds from Python's random module: the
  model_fn seeds it, so every build of one seed (each process's, a resumed run's) is the
  same model, and another seed another one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x_spec = tf.TensorSpec([8, 8, 1], tf.float32)

  def weights(seed):
    model = user_code.model_fn(f'{PACKAGE}.parts:small_mlp', x_spec, 10, seed)()
    return [v.numpy() for v in model.trainable_variables]

  first, again, other = weights(0), weights(0), weights(1)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0], other[0])


def test_a_client_data_set_is_read_client_by_client(package_dir):
  fed = user_code.load_dataset(_config(dataset=f'{PACKAGE}.parts:clients_of_writers',
                                       model='mlp_2nn'))
  rng = np.random.default_rng(3)   # the test's own copy of the data set's draws
  expected = [(rng.random([5 + i, 4], np.float32), rng.integers(0, 3, 5 + i)) for i in range(3)]
  assert fed.num_clients == 3 and fed.num_classes == 5   # the test set's label 4
  assert fed.info['client_names'] == ['writer_0', 'writer_1', 'writer_2']
  for n, (x, y) in enumerate(expected):
    got_x, got_y = fed.client_arrays(n)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)


def test_the_example_method_clips_fedavgs_update(package_dir, runtime, tiny_model_fn, sgd,
                                                 digits):
  """One round of build_fedclip = one round of FedAvg whose global update is scaled to norm
  clip_norm when longer (the test's NumPy)."""
  from tff_algos import baselines, data  # pylint: disable=g-import-not-at-top
  from byo_pkg import fedclip  # pylint: disable=g-import-not-at-top
  fed = data.federate(digits, data.make_partitioner('iid', num_clients=4, seed=0))
  _, inputs = data.round_inputs(fed, 1, 4, 1, 0, client_ids=[0, 1, 2, 3])
  inputs = [[element] for element in inputs]

  def delta(process):
    state = process.initialize()
    before = process.get_model_weights(state).trainable
    after = process.get_model_weights(process.next(state, inputs).state).trainable
    return [np.asarray(a) - np.asarray(b) for a, b in zip(after, before)]

  plain = delta(baselines.build_fedavg(tiny_model_fn, sgd(0.1), 16))
  norm = np.sqrt(sum(float(np.sum(d.astype(np.float64) ** 2)) for d in plain))
  clip = norm / 4
  clipped = delta(fedclip.build_fedclip(tiny_model_fn, sgd(0.1), 16, clip_norm=clip))
  for got, want in zip(clipped, plain):
    np.testing.assert_allclose(got, want * clip / norm, rtol=1e-4, atol=1e-6)
  unclipped = delta(fedclip.build_fedclip(tiny_model_fn, sgd(0.1), 16, clip_norm=2 * norm))
  for got, want in zip(unclipped, plain):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _unreported(seed: int, rounds: int, num_clients: int, per_round: int, dropout: float):
  """Each round's clients that never report, from data.client_faults' rule by NumPy:
  u_drop = default_rng([seed, round, client, 2]).random(3)[0] < dropout."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  return [sum(np.random.default_rng([seed, r, int(n), 2]).random(3)[0] < dropout
              for n in data.sample_clients(num_clients, per_round, r, seed))
          for r in range(1, rounds + 1)]


MINE = dict(algorithm=f'{PACKAGE}.fedclip:build_fedclip', method_kwargs='{"clip_norm": 0.5}',
            model=f'{PACKAGE}.parts:small_mlp', dataset=f'{PACKAGE}.parts:digits_arrays',
            client_dropout=0.3)


def test_own_model_data_and_method_resume_exactly_and_refuse_a_changed_file(
    package_dir, runtime, tmp_path):
  config = _config(root_output_dir=str(tmp_path), **MINE)
  log = lambda msg: None  # noqa: E731
  straight = experiment.run_experiment(dataclasses.replace(config, experiment_name='unbroken'),
                                       log)
  experiment.run_experiment(dataclasses.replace(config, experiment_name='broken', rounds=2), log)
  resumed = experiment.run_experiment(
      dataclasses.replace(config, experiment_name='broken', resume=True), log)
  weights = [np.load(tmp_path / name / 'final_weights.npz') for name in ('unbroken', 'broken')]
  for key in weights[0].files:
    np.testing.assert_array_equal(weights[0][key], weights[1][key])
  rows = [_rows(tmp_path / name / 'metrics.csv') for name in ('unbroken', 'broken')]
  for column in ('test_accuracy', 'client_work/train/loss', 'unreported_clients'):
    assert [r[column] for r in rows[0]] == [r[column] for r in rows[1]]
  # Faults: the clients that never report are the rule's; bytes from the process's intrinsics.
  assert [int(r['unreported_clients']) for r in rows[0]] == _unreported(0, 3, 6, 3, 0.3)
  assert sum(int(r['unreported_clients']) for r in rows[0]) > 0
  assert straight['cumulative_bytes_up'] > 0 and straight['time_to_accuracy']
  assert resumed['final_accuracy'] == straight['final_accuracy']
  method_file = os.path.join(package_dir, PACKAGE, 'fedclip.py')
  with open(method_file, 'rb') as f:
    source = f.read()
  recorded = json.loads((tmp_path / 'unbroken' / 'config.json').read_text())['user_code']
  assert recorded['algorithm'] == dict(path=MINE['algorithm'], file=method_file,
                                       sha256=hashlib.sha256(source).hexdigest())
  assert straight['user_code'] == recorded
  try:
    with open(method_file, 'ab') as f:
      f.write(b'# a change\n')
    before = sorted(os.listdir(tmp_path / 'broken' / 'checkpoints'))
    with pytest.raises(experiment_config.ExperimentError,
                       match=r"^cannot resume .*broken: --algorithm=byo_pkg.fedclip:"
                       r"build_fedclip's file .*fedclip.py changed since the run started"):
      experiment.run_experiment(
          dataclasses.replace(config, experiment_name='broken', resume=True, rounds=4), log)
    assert sorted(os.listdir(tmp_path / 'broken' / 'checkpoints')) == before
    assert len(_rows(tmp_path / 'broken' / 'metrics.csv')) == 3
  finally:
    with open(method_file, 'wb') as f:
      f.write(source)


def test_the_program_refuses_a_bad_model_in_one_line(package_dir, tmp_path):
  """Through the program: one error line, exit 2, no run directory left behind."""
  proc = subprocess.run(
      [sys.executable, '-m', 'programs.train', '--dataset=digits', '--rounds=1',
       f'--model={PACKAGE}.parts:three_outputs', f'--root_output_dir={tmp_path}',
       '--experiment_name=bad', '--progress=false'],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join([package_dir, ROOT]),
               TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 2, proc.stderr
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: --model=byo_pkg.parts:three_outputs'), \
      proc.stderr
  assert 'gives 3 outputs per example; expected one logit per class (10)' in lines[0]
  assert not (tmp_path / 'bad').exists()


STUDY = '''
seeds = [0]
[common]
dataset = "{package}.parts:digits_arrays"
model = "{package}.parts:small_mlp"
num_clients = 4
clients_per_round = 2
batch_size = 16
client_lr = 0.1
client_dropout = 0.3
rounds = {rounds}
[runs.mine]
algorithm = "{package}.fedclip:build_fedclip"
method_kwargs = {{clip_norm = 0.5}}
[runs.fedavg]
algorithm = "fedavg"
[runs.fedcross]
algorithm = "fedcross"
[[compare]]
method = "mine"
baseline = "fedavg"
[[compare]]
method = "mine"
baseline = "fedcross"
'''


@pytest.mark.slow
def test_a_study_of_the_users_method_killed_resumed_compared(package_dir, tmp_path):
  """The acceptance study in subprocesses: the user's method (with the user's model and data)
  against FedAvg and FedCross; killed (SIGKILL) once its first run has a round, run again to
  the end: every run's final weights equal an unbroken study's; results.json compares; then
  the method file changes and a longer study is refused on resume in one line."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_dir, ROOT]),
             TF_CPP_MIN_LOG_LEVEL='3')

  def study(folder, rounds=3):
    folder.mkdir(exist_ok=True)
    path = folder / 'study.toml'
    path.write_text(STUDY.format(package=PACKAGE, rounds=rounds))
    return [sys.executable, '-m', 'programs.study', 'run', str(path)]

  unbroken = subprocess.run(study(tmp_path / 'a'), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=1800)
  assert unbroken.returncode == 0, unbroken.stderr
  proc = subprocess.Popen(study(tmp_path / 'b'), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  first = tmp_path / 'b' / 'study' / 'runs' / 'mine_s0' / 'metrics.csv'
  deadline = time.time() + 900
  try:
    while not (first.exists() and _rows(first)):
      assert proc.poll() is None and time.time() < deadline
      time.sleep(0.05)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  again = subprocess.run(study(tmp_path / 'b'), cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1800)
  assert again.returncode == 0, again.stderr
  for run in ('mine_s0', 'fedavg_s0', 'fedcross_s0'):
    a, b = (np.load(tmp_path / x / 'study' / 'runs' / run / 'final_weights.npz') for x in 'ab')
    for key in a.files:
      np.testing.assert_array_equal(a[key], b[key])
  summary = json.loads((tmp_path / 'b' / 'study' / 'runs' / 'mine_s0' / 'summary.json')
                       .read_text())
  assert summary['cumulative_bytes_up'] > 0
  assert summary['user_code']['algorithm']['path'] == f'{PACKAGE}.fedclip:build_fedclip'
  results = json.loads((tmp_path / 'b' / 'study' / 'results.json').read_text())
  assert [(c['method'], c['baseline']) for c in results['comparisons']] == [
      ('mine', 'fedavg'), ('mine', 'fedcross')]
  method_file = os.path.join(package_dir, PACKAGE, 'fedclip.py')
  with open(method_file, 'rb') as f:
    source = f.read()
  try:
    with open(method_file, 'ab') as f:
      f.write(b'# a change\n')
    refused = subprocess.run(study(tmp_path / 'b', rounds=4), cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)
  finally:
    with open(method_file, 'wb') as f:
      f.write(source)
  assert refused.returncode == 2, refused.stderr
  errors = [line for line in refused.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'fedclip.py changed since the run started' in errors[0], \
      refused.stderr
  assert len(_rows(first)) == 3
