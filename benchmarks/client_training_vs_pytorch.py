"""Seconds per round of client training: our round as the training program runs it, a tight
plain-TF loop, and a PyTorch simulator's round, side by side on the same clients.

For each model (--models) and batch size (--batch_sizes), on the same clients (--clients x
--examples_per_client training examples), one local epoch of plain SGD per client and the
example-weighted mean of the clients' models, from the same initial weights:

  ours      `baselines.build_fedavg` run as programs/train.py runs it by default: resident
            in the TFF worker, a checkpoint every round (`fedavg_rounds.ProgramRun`);
  plain_tf  a tight plain-TF loop in this process (`fedavg_rounds.PlainTF`);
  torch     a PyTorch simulator's round (`torch_twins.Simulator`: each client loads the
            global weights, trains its epoch in eager PyTorch, weighted mean of the state
            dicts), in a child process of --torch_python.

The three take turns, one round each, the order rotating every round, so they never run at
the same time; the warm-up rounds are untimed. Printed per model x batch: the median s/round
of each and the ratios ours / torch and plain_tf / torch; --json writes them. Before the
rounds, two checks per setting: the parameter counts of the Keras model and its PyTorch twin
(trainable, and BatchNorm's statistics), and one client's first step from the same weights on
the same batch, plain TF's against PyTorch's (max |difference| of the trainable weights within
TOLERANCE: float32 sums in other orders). The same over the client's whole epoch is printed
beside it: those differences grow step by step (SGD amplifies them), so it is no check.

Threads: --tf_intra_op_threads / --tf_inter_op_threads set TF's pools in this process and, as
TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS in its environment, in the TFF worker (its
sessions take TF's default pools, which TF sizes from these; read back from the worker's
environment and printed); --max_concurrent_computation_calls goes to
the worker's command line; --torch_threads is PyTorch's `set_num_threads`. 0 = the library's
default. --profile instead profiles one client epoch of the plain-TF loop per setting
(`epoch_profile`: which ops take the time, and the framework's overhead per step).

  .venv/bin/python benchmarks/client_training_vs_pytorch.py --torch_python=/path/to/python \\
      --json=figures.json

PyTorch is never a dependency of the project: when --torch_python (default: this interpreter)
cannot import torch, the benchmark says how to get it and runs the TF side alone.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top
from absl import logging
import numpy as np
import tensorflow as tf  # before the flags are parsed: fedavg_rounds' docstring

from benchmarks import epoch_profile  # pylint: disable=g-import-not-at-top
from benchmarks import fedavg_rounds
from benchmarks.method_builds import load_data
from programs import flag_parsing
from programs import generated_files

TWINS = ('fedavg_cnn', 'simple_cnn', 'mlp_2nn', 'resnet20')   # torch_twins.TWINS
SIDES = ('ours', 'plain_tf', 'torch')
TOLERANCE = 1e-5   # one SGD step: float32 rounding, not training's drift
TWINS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'torch_twins.py')
TORCH_HOWTO = ('PyTorch is not importable by {python}: the torch column is skipped. Get it '
               "with `.venv/bin/pip install -e '.[bench]' --extra-index-url "
               "https://download.pytorch.org/whl/cpu` (the CPU wheel), or pass "
               '--torch_python=PYTHON of an interpreter that has it.')

_MODELS = flags.DEFINE_list('models', list(TWINS), f'Zoo models, of {", ".join(TWINS)}.')
_BATCHES = flags.DEFINE_list('batch_sizes', ['50', '10', '8'], 'Local batch sizes.')
_DATASET = flags.DEFINE_enum('dataset', 'fashion_mnist', ['fashion_mnist', 'digits'],
                             'Data (fashion_mnist falls back to digits if it is missing).')
_CLIENTS = flags.DEFINE_integer('clients', 10, 'Clients per round (all take part).',
                                lower_bound=1)
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 600, 'Examples per client.',
                                 lower_bound=1)
_LR = flags.DEFINE_float('client_lr', 0.1, 'Client SGD learning rate.', lower_bound=0.0)
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per side and setting.',
                               lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed rounds per side first.',
                               lower_bound=0)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the clients\' data, orders and model init.',
                             lower_bound=0)
_TORCH_PYTHON = flags.DEFINE_string(
    'torch_python', '', 'Interpreter with PyTorch that runs the torch side (default: this '
    'one); without torch there, the torch column is skipped.')
_TORCH_THREADS = flags.DEFINE_integer('torch_threads', 0, 'torch.set_num_threads (0: '
                                      'PyTorch\'s default).', lower_bound=0)
_INTRA = flags.DEFINE_integer('tf_intra_op_threads', 0, 'TF\'s intra-op pool, in this '
                              'process and the TFF worker (0: TF\'s default).', lower_bound=0)
_INTER = flags.DEFINE_integer('tf_inter_op_threads', 0, 'TF\'s inter-op pool, in this '
                              'process and the TFF worker (0: TF\'s default).', lower_bound=0)
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1, 'The TFF worker\'s limit (-1: none).',
    lower_bound=-1)
_PROFILE = flags.DEFINE_bool(
    'profile', False, 'Instead of timing rounds, profile one client epoch of the plain-TF '
    'loop per setting: op types by time, and the framework\'s overhead per step.')
_JSON = flags.DEFINE_string('json', None, 'Also write the figures to this JSON file.')


@flags.multi_flags_validator(['models', 'batch_sizes', 'examples_per_client'],
                             message='--models takes ' + ', '.join(TWINS) + '; --batch_sizes '
                             'positive integers dividing --examples_per_client')
def _check_settings(values):
  try:
    batches = [int(b) for b in values['batch_sizes']]
  except ValueError:
    return False
  return (bool(values['models']) and set(values['models']) <= set(TWINS) and bool(batches)
          and all(b > 0 and values['examples_per_client'] % b == 0 for b in batches))


def worker_settings() -> dict:
  """The TFF worker's thread settings as it runs: its environment's TF_NUM_*_THREADS and
  its --max_concurrent_computation_calls, read from /proc ({} if it has not started within
  30 s: an isolated worker is started by its relay)."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + 30
  while not (pids := execution.worker_pids()) and time.monotonic() < deadline:
    time.sleep(0.1)
  if not pids:
    return {}
  with open(f'/proc/{pids[0]}/environ', 'rb') as f:
    env = dict(item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item)
  with open(f'/proc/{pids[0]}/cmdline', 'rb') as f:
    args = [a.decode() for a in f.read().split(b'\0') if a]
  calls = next((a.split('=', 1)[1] for a in args
                if a.startswith('--max_concurrent_computation_calls=')), None)
  return dict(
      intra_op_threads=env.get(b'TF_NUM_INTRAOP_THREADS', b'default').decode(),
      inter_op_threads=env.get(b'TF_NUM_INTEROP_THREADS', b'default').decode(),
      max_concurrent_computation_calls=calls)


def torch_available(python: str) -> bool:
  if python == sys.executable:
    return importlib.util.find_spec('torch') is not None
  return subprocess.run([python, '-c', 'import torch'], capture_output=True,
                        check=False).returncode == 0


class TorchSide:
  """The PyTorch simulator in a child process (`torch_twins.py`): one request at a time."""

  def __init__(self, python: str, threads: int):
    self.process = subprocess.Popen([python, TWINS_SCRIPT], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
    self.info = self.call('hello', threads=threads)

  def call(self, kind: str, **args):
    pickle.dump((kind, args), self.process.stdin, protocol=4)
    self.process.stdin.flush()
    ok, reply = pickle.load(self.process.stdout)
    if not ok:
      raise RuntimeError(f'the torch side failed on {kind}:\n{reply}')
    return reply

  def close(self):
    self.process.stdin.close()
    self.process.wait(timeout=60)


def keras_layers(keras_model) -> list:
  """[(layer name, its weights)] of the layers that have weights (torch_twins' input)."""
  return [(layer.name, layer.get_weights()) for layer in keras_model.layers if layer.weights]


def weight_counts(keras_model) -> dict:
  count = lambda vs: sum(int(np.prod(v.shape)) for v in vs)
  return dict(trainable=count(keras_model.trainable_weights),
              non_trainable=count(keras_model.non_trainable_weights))


def run_setting(model_name, batch, ds, xs, ys, torch_side, scratch):
  """Sets one model x batch up on every side, checks it, then times its rounds (or, with
  --profile, profiles one client epoch of plain TF). The setting's figures."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top

  seed, lr, num_clients = _SEED.value, _LR.value, len(xs)
  figures = dict(model=model_name, batch_size=batch)
  print(f'\n{model_name}, batch {batch}:', flush=True)
  sides = ['plain_tf']
  if not _PROFILE.value:
    model_fn = models.make_model_fn(model_name, ds.input_shape, ds.num_classes, seed=seed)
    ours = baselines.build_fedavg(model_fn, tff.learning.optimizers.build_sgdm(learning_rate=lr),
                                  batch, tff.learning.optimizers.build_sgdm(learning_rate=1.0))
    resident = resident_state.ResidentProcess(ours, num_clients, refresh_every=0)
    directory = tempfile.mkdtemp(dir=scratch)
    program = fedavg_rounds.ProgramRun(resident, os.path.join(directory, 'ckpt'), directory)
    sides.insert(0, 'ours')
  # Plain TF: a Keras model created after TFF has built its process (TFF_NOTES traps),
  # starting from our process's initial weights; its layers' weights start PyTorch's twin.
  keras_model = models.build_keras_model(model_name, ds.input_shape, ds.num_classes, seed=seed)
  plain = fedavg_rounds.PlainTF(keras_model, lr, batch)
  if not _PROFILE.value:
    for v, w in zip(keras_model.trainable_variables, program.model_weights().trainable):
      v.assign(w)
  initial = [tf.constant(v.numpy()) for v in keras_model.trainable_variables]
  initial_layers = keras_layers(keras_model)
  figures['params'] = weight_counts(keras_model)
  inputs0 = fedavg_rounds.round_inputs(xs, ys, 1, seed, 0)

  if _PROFILE.value:
    xb, yb = plain.batches(inputs0[0])
    plain.client_epochs(initial, xb, yb)   # traced, warm
    profile = epoch_profile.profile_call(lambda: plain.client_epochs(initial, xb, yb)[1].numpy(),
                                         int(xb.shape[0]))
    print(epoch_profile.table(profile), flush=True)
    figures['profile'] = profile
    return figures

  if torch_side is not None:
    counts = torch_side.call('setup', model=model_name, input_shape=tuple(ds.input_shape),
                             num_classes=ds.num_classes, layers=initial_layers, xs=xs, ys=ys,
                             lr=lr, batch=batch)
    figures['torch_params'] = counts
    if counts != figures['params']:
      raise RuntimeError(f'{model_name}: the PyTorch twin has {counts} weights, Keras '
                         f'{figures["params"]}')
    # One client's first step, then its epoch, from the same weights in the same batch
    # order, on both sides.
    for key, order in (('step', inputs0[0]['order'][:1, :batch]),
                       ('epoch', inputs0[0]['order'])):
      plain.client_epochs(initial, *plain.batches(dict(inputs0[0], order=order)))
      figures[f'{key}_max_abs_difference'] = torch_side.call(
          'epoch_difference', client=0, order=order, layers_after=keras_layers(keras_model))
    step, epoch = figures['step_max_abs_difference'], figures['epoch_max_abs_difference']
    sides.append('torch')
    print(f'  params: Keras {figures["params"]["trainable"]:,} trainable + '
          f'{figures["params"]["non_trainable"]:,} statistics, PyTorch twin '
          f'{counts["trainable"]:,} + {counts["non_trainable"]:,}: equal; one client\'s first '
          f'step from the same weights on the same batch: max |PyTorch - plain TF| {step:.2e} '
          f'({"within" if step <= TOLERANCE else "ABOVE"} the float32 tolerance '
          f'{TOLERANCE:g}); after its epoch of {inputs0[0]["order"].size // batch} steps '
          f'{epoch:.2e} (rounding grows step by step)', flush=True)

  plain_weights = initial
  times = {side: [] for side in sides}
  for r in range(_WARMUP.value + _ROUNDS.value):
    inputs = fedavg_rounds.round_inputs(xs, ys, 1, seed, r)
    shift = r % len(sides)
    line = []
    for side in sides[shift:] + sides[:shift]:
      t0 = time.perf_counter()
      if side == 'ours':
        program.round(inputs)
        dt = time.perf_counter() - t0
      elif side == 'plain_tf':
        plain_weights = plain.round(plain_weights, inputs)
        dt = time.perf_counter() - t0
      else:   # the simulator's own time of its round (not the request's round trip)
        dt = torch_side.call('round', orders=[inp['order'] for inp in inputs])
      line.append(f'{side} {dt:.3f}s')
      if r >= _WARMUP.value:
        times[side].append(dt)
    tag = 'warm-up' if r < _WARMUP.value else 'timed'
    print(f'  round {r} ({tag}): ' + ', '.join(line), flush=True)
  program.close()
  figures['ours_vs_plain_tf_max_abs_difference'] = fedavg_rounds.max_abs_difference(
      program.model_weights().trainable, plain_weights)
  figures['plain_tf_moved_max_abs'] = fedavg_rounds.max_abs_difference(plain_weights, initial)
  figures['median_s'] = {s: statistics.median(t) for s, t in times.items()}
  figures['min_s'] = {s: min(t) for s, t in times.items()}
  med = figures['median_s']
  figures['ratio_ours_to_plain_tf'] = med['ours'] / med['plain_tf']
  summary = '  median s/round: ' + ', '.join(f'{s} {med[s]:.3f}' for s in sides)
  if 'torch' in med:
    figures['ratio_ours_to_torch'] = med['ours'] / med['torch']
    figures['ratio_plain_tf_to_torch'] = med['plain_tf'] / med['torch']
    summary += (f'; ours / torch {figures["ratio_ours_to_torch"]:.2f}x, plain_tf / torch '
                f'{figures["ratio_plain_tf_to_torch"]:.2f}x')
  print(summary + f'; ours / plain_tf {figures["ratio_ours_to_plain_tf"]:.2f}x (final weights '
        f'max |ours - plain_tf| {figures["ours_vs_plain_tf_max_abs_difference"]:.2e})',
        flush=True)
  return figures


def table(settings: list) -> list:
  """The timed settings' medians and ratios as Markdown lines (RESULTS.md's rows)."""
  lines = ['| model | batch | ours s | plain TF s | PyTorch s | ours / PyTorch | '
           'plain TF / PyTorch |', '|---|---|---|---|---|---|---|']
  for f in settings:
    med = f['median_s']
    torch_cells = (f'{med["torch"]:.3f} | {f["ratio_ours_to_torch"]:.2f}x | '
                   f'{f["ratio_plain_tf_to_torch"]:.2f}x' if 'torch' in med else '- | - | -')
    lines.append(f'| {f["model"]} | {f["batch_size"]} | {med["ours"]:.3f} | '
                 f'{med["plain_tf"]:.3f} | {torch_cells} |')
  return lines


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  t_start = time.perf_counter()
  # Thread pools before TF's runtime starts: this process's, and the worker's environment.
  if _INTRA.value:
    tf.config.threading.set_intra_op_parallelism_threads(_INTRA.value)
    os.environ['TF_NUM_INTRAOP_THREADS'] = str(_INTRA.value)
  if _INTER.value:
    tf.config.threading.set_inter_op_parallelism_threads(_INTER.value)
    os.environ['TF_NUM_INTEROP_THREADS'] = str(_INTER.value)
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime(max_concurrent_computation_calls=_MAX_CALLS.value)

  ds = load_data(_DATASET.value)
  try:
    xs, ys = fedavg_rounds.client_split(ds, _CLIENTS.value, _EXAMPLES.value, _SEED.value)
  except ValueError as e:
    print(f'error: {e}: lower --clients or --examples_per_client', file=sys.stderr)
    return flag_parsing.EXIT_CODE
  torch_side = None
  python = _TORCH_PYTHON.value or sys.executable
  if not _PROFILE.value:
    if torch_available(python):
      torch_side = TorchSide(python, _TORCH_THREADS.value)
    else:
      print(TORCH_HOWTO.format(python=python), flush=True)
  worker = worker_settings()
  setup = dict(
      dataset=ds.name, clients=len(xs), examples_per_client=int(xs[0].shape[0]),
      seed=_SEED.value, clients_sha256=fedavg_rounds.clients_sha256(xs, ys), epochs=1,
      client_lr=_LR.value, warmup_rounds=_WARMUP.value, rounds=_ROUNDS.value, tf=tf.__version__,
      tf_intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
      tf_inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
      worker=worker, torch=torch_side.info if torch_side else None,
      load_average=os.getloadavg()[0], cpus=os.cpu_count())
  torch_text = (f'torch {torch_side.info["torch"]} ({python}) set_num_threads '
                f'{torch_side.info["threads"]}, interop {torch_side.info["interop_threads"]}'
                if torch_side else 'torch skipped')
  print(f'setup: {ds.name}, {_CLIENTS.value} clients x {_EXAMPLES.value} examples, 1 epoch of '
        f'SGD at {_LR.value:g}, {_WARMUP.value} warm-up + {_ROUNDS.value} timed rounds, sides '
        f'interleaved; threads (0/default = the library\'s own): TF {tf.__version__} in this '
        f'process intra-op {setup["tf_intra_op_threads"]}, inter-op '
        f'{setup["tf_inter_op_threads"]}; TFF worker intra-op '
        f'{worker.get("intra_op_threads")}, inter-op {worker.get("inter_op_threads")}, '
        f'max_concurrent_computation_calls {worker.get("max_concurrent_computation_calls")}; '
        f'{torch_text}; load average {setup["load_average"]:.1f} ({setup["cpus"]} cpus)',
        flush=True)

  results = []
  with tempfile.TemporaryDirectory() as scratch:
    for model_name in _MODELS.value:
      for batch in (int(b) for b in _BATCHES.value):
        results.append(run_setting(model_name, batch, ds, xs, ys, torch_side, scratch))
  if torch_side is not None:
    torch_side.close()

  if not _PROFILE.value:
    print('\n' + '\n'.join(table(results)))
  if _JSON.value:
    generated_files.write_json(_JSON.value, dict(setup=setup, settings=results))
  print(f'total wall time {time.perf_counter() - t_start:.0f} s')
  return 0


if __name__ == '__main__':
  flag_parsing.run(lambda argv: sys.exit(main(argv)))
