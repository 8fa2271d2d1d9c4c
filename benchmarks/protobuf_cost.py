"""What protobuf's implementation costs TFF: compiled (upb) against pure Python.

TFF builds and compiles every computation by rewriting protocol buffers in Python, and every
call into its C++ worker serialises its arguments and results as protocol buffers. protobuf
3.20 has no compiled implementation for Python 3.11, so under it all of that runs in pure
Python. This benchmark builds each method's process, initialises it and runs rounds on the
same clients under both implementations, one child process per implementation (the choice is
made at import, through PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION), alternating which goes first
in each repeat, and prints each phase's median seconds and the ratio python / upb. Training
results are identical (the implementation only changes how messages are built): the children
print a checksum of the final weights, and the parent checks they agree.

  .venv/bin/python benchmarks/protobuf_cost.py --methods=fedavg,fedcda --repeats=2
  # protobuf 3.20.3 (pure Python only) in a second virtualenv:
  .venv/bin/python benchmarks/protobuf_cost.py --python_interpreter=/tmp/pb3/bin/python
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import flags

from programs import flag_parsing  # pylint: disable=g-import-not-at-top
# Imported before app.run parses the flags (see round_overhead.py); in a child the protobuf
# implementation is already chosen by its environment.
import tensorflow as tf  # pylint: disable=unused-import

_METHODS = flags.DEFINE_list(
    'methods', ['fedavg', 'fedcross', 'fedcda', 'cadis', 'fedlex_avgm'],
    'fedavg (tff_algos.baselines.build_fedavg) and any method of '
    'benchmarks/method_builds.py (as the training program builds it).')
_MODEL = flags.DEFINE_string('model', 'tiny_cnn', 'tff_algos.models zoo model.')
_DATASET = flags.DEFINE_enum('dataset', 'digits', ['digits', 'fashion_mnist'], 'Data.')
_CLIENTS = flags.DEFINE_integer('clients', 4, 'Clients per round (all take part).')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 100, 'Examples per client.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds after the first (timed, median).')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Child runs per implementation.')
_PYTHON_INTERPRETER = flags.DEFINE_string(
    'python_interpreter', None, 'Interpreter for the pure-Python children (default: this one, '
    'switched to the pure-Python implementation). Give one of a virtualenv with protobuf '
    '3.20.3, the project\'s pin before protobuf 4, to measure that environment.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: run the measurement for this method.')

IMPLEMENTATIONS = ('upb', 'python')
PHASES = ('build', 'initialize', 'first round', 'later round')


def measure(method: str) -> dict:
  """Seconds of each phase for one method, in this process's protobuf implementation."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from benchmarks import method_builds  # pylint: disable=g-import-not-at-top
  from tff_algos import baselines, execution, models  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  execution.initialize_runtime()
  ds = method_builds.load_data(_DATASET.value)
  n, per = _CLIENTS.value, _EXAMPLES.value
  pick = np.random.default_rng(0).permutation(ds.x_train.shape[0])[:n * per]
  xs, ys = np.split(ds.x_train[pick], n), np.split(ds.y_train[pick], n)
  model_fn = models.make_model_fn(_MODEL.value, ds.input_shape, ds.num_classes, seed=0)
  import google.protobuf  # pylint: disable=g-import-not-at-top
  out = {'implementation': execution.protobuf_implementation(),
         'protobuf': google.protobuf.__version__}
  t0 = time.perf_counter()
  if method == 'fedavg':
    process = baselines.build_fedavg(
        model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.1), 20)
  else:
    process = method_builds.build_method(method, model_fn, n, 20, 0.1, 0)
  out['build'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  state = process.initialize()
  out['initialize'] = time.perf_counter() - t0
  later = []
  for r in range(1 + _ROUNDS.value):
    inputs = [[data.client_input(xs[c], ys[c], 1, np.random.default_rng([r, c]), c, c)]
              for c in range(n)]
    t0 = time.perf_counter()
    with execution.collector_paused():
      state = process.next(state, inputs).state
    dt = time.perf_counter() - t0
    if r == 0:
      out['first round'] = dt
      execution.freeze_long_lived_objects()
    else:
      later.append(dt)
  out['later round'] = statistics.median(later)
  weights = process.get_model_weights(state).trainable
  out['checksum'] = float(sum(np.sum(np.asarray(w, np.float64)) for w in weights))
  return out


def run_child(method: str, implementation: str) -> dict:
  env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=implementation)
  interpreter = sys.executable
  if implementation == 'python' and _PYTHON_INTERPRETER.value:
    interpreter = _PYTHON_INTERPRETER.value
  args = [interpreter, os.path.abspath(__file__), f'--child={method}',
          f'--model={_MODEL.value}', f'--dataset={_DATASET.value}', f'--clients={_CLIENTS.value}',
          f'--examples_per_client={_EXAMPLES.value}', f'--rounds={_ROUNDS.value}']
  proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
  if proc.returncode or not lines:
    raise RuntimeError(f'{method} under protobuf {implementation} failed:\n{proc.stderr[-2000:]}')
  result = json.loads(lines[-1])
  if result['implementation'] != implementation:
    raise RuntimeError(f'asked for protobuf {implementation}, the child ran '
                       f'{result["implementation"]}')
  return result


def main(argv):
  del argv
  if _CHILD.value:
    print(json.dumps(measure(_CHILD.value)), flush=True)
    return
  t_start = time.perf_counter()
  print(f'setup: {_DATASET.value}, model {_MODEL.value}, {_CLIENTS.value} clients x '
        f'{_EXAMPLES.value} examples, 1 epoch, first round + {_ROUNDS.value} rounds, '
        f'{_REPEATS.value} child process(es) per implementation, alternating; load average '
        f'{os.getloadavg()[0]:.1f} (2 cores)', flush=True)
  rows = []
  for method in _METHODS.value:
    runs = {impl: [] for impl in IMPLEMENTATIONS}
    for rep in range(_REPEATS.value):
      order = IMPLEMENTATIONS if rep % 2 == 0 else IMPLEMENTATIONS[::-1]
      for impl in order:
        result = run_child(method, impl)
        runs[impl].append(result)
        phases = ', '.join(f'{p} {result[p]:.2f}s' for p in PHASES)
        print(f'{method} {impl} (protobuf {result["protobuf"]}): {phases}', flush=True)
    checksums = {r['checksum'] for impl in IMPLEMENTATIONS for r in runs[impl]}
    if len(checksums) != 1:
      raise RuntimeError(f'{method}: final weights differ between runs: {sorted(checksums)}')
    med = {impl: {p: statistics.median(r[p] for r in runs[impl]) for p in PHASES}
           for impl in IMPLEMENTATIONS}
    rows.append((method, med))
  print(f'\nload average at end: {os.getloadavg()[0]:.1f}; final weights identical under '
        'both implementations for every method\n')
  print('| method | ' + ' | '.join(f'{p}: upb s / python s (ratio)' for p in PHASES) + ' |')
  print('|---|' + '---|' * len(PHASES))
  for method, med in rows:
    cells = [f'{med["upb"][p]:.2f} / {med["python"][p]:.2f} ({med["python"][p] / med["upb"][p]:.1f}x)'
             for p in PHASES]
    print(f'| {method} | ' + ' | '.join(cells) + ' |')
  print(f'\ntotal wall time {time.perf_counter() - t_start:.0f} s')


if __name__ == '__main__':
  flag_parsing.run(main)
