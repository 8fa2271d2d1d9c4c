"""Shared pytest setup: quiet TensorFlow before it is imported, and import from the checkout."""

import os
import sys

os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  """Slow reproduction runs are skipped unless RUN_SLOW=1 (see docs/reproduction.md)."""
  del config
  if os.environ.get('RUN_SLOW') == '1':
    return
  skip = pytest.mark.skip(reason='slow reproduction run: set RUN_SLOW=1 to run it')
  for item in items:
    if 'slow' in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope='session', autouse=True)
def _stop_tff_workers():
  """Tests start TFF worker processes; none may outlive the session."""
  yield
  if 'tff_algos.execution' in sys.modules:
    sys.modules['tff_algos.execution'].shutdown_workers()


# Set-up shared by the test files; the imports are inside the fixtures so that files which use
# none of them collect without TensorFlow.


@pytest.fixture(scope='session')
def runtime():
  """TFF's local execution context as the programs install it (`initialize_runtime` is
  idempotent); files that run TFF computations use it (pytestmark usefixtures)."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()


@pytest.fixture(scope='session')
def tiny_model_fn():
  """The small CNN on 8x8x1 digits, 10 classes, seed 0: the model of the method tests."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  return models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)


@pytest.fixture(scope='session')
def sgd():
  """sgd(learning_rate=0.1, momentum=None): a fresh TFF SGD(M) optimizer."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  def make(learning_rate=0.1, momentum=None):
    return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate, momentum=momentum)

  return make


@pytest.fixture(scope='module')
def digits():
  """scikit-learn's 8x8 digits as `data.load_digits()` gives them, one copy per test file."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  return data.load_digits()


# A small study on digits: two rounds' worth of work per run takes seconds (tests/test_study.py).
DIGITS_STUDY_COMMON = '''
[common]
dataset = "digits"
num_clients = 4
clients_per_round = 2
batch_size = 16
eval_every = 1
rounds = {rounds}
'''


@pytest.fixture
def put_back():
  """put_back(paths) keeps the files of `paths` that exist as they are now and writes them
  back when the test ends, whatever it did to them: for tests that regenerate committed pages.
  Returns {path: bytes} of the files kept."""
  kept = {}

  def keep(paths):
    for path in paths:
      if os.path.exists(path) and path not in kept:
        with open(path, 'rb') as f:
          kept[path] = f.read()
    return dict(kept)

  yield keep
  for path, data in kept.items():
    with open(path, 'wb') as f:
      f.write(data)


@pytest.fixture(scope='session')
def write_study():
  """write_study(folder, body, rounds=3, name='study.toml') -> the path of a study file in
  `folder`: `body` (its seeds, runs, comparisons, grids) over DIGITS_STUDY_COMMON."""
  import textwrap  # pylint: disable=g-import-not-at-top

  def write(folder, body, rounds=3, name='study.toml'):
    path = os.path.join(str(folder), name)
    with open(path, 'w') as f:
      f.write(textwrap.dedent(body).strip() + '\n' + DIGITS_STUDY_COMMON.format(rounds=rounds))
    return path

  return write


@pytest.fixture(scope='session')
def study_command():
  """study_command(*args) -> the finished `python -m programs.study *args` (a CompletedProcess,
  text), run from the checkout; its stdout ends with a line 'TF' or 'no TF': whether it
  imported TensorFlow. `program='benchmarks.study'`: the papers' study files' entry."""
  import subprocess  # pylint: disable=g-import-not-at-top

  def run(*args, timeout=600, program='programs.study'):
    code = ('import atexit, runpy, sys; '
            'atexit.register(lambda: print("TF" if "tensorflow" in sys.modules else "no TF")); '
            f'sys.argv = ["study"] + {list(args)!r}; '
            f'runpy.run_module({program!r}, run_name="__main__")')
    return subprocess.run([sys.executable, '-c', code], cwd=_ROOT,
                          env=dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL='3'),
                          capture_output=True, text=True, timeout=timeout)

  return run
