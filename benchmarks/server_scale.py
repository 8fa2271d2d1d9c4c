"""How CADIS's and FedCDA's server side grows with the number of clients N.

For each N, builds the method as the training program does (P clients per round, indices
drawn from [0, N), the same small client data), then times, interleaved in one process:

  full   a round whose clients train one epoch;
  empty  a round whose clients train 0 epochs (same uploads, same server step): its time
         bounds the server step from above (it also holds dispatch and upload).

It also reports the aggregator state's size (it lives in the worker and travels back to
Python every round inside the process state) and the TFF worker's peak resident memory
(VmHWM of the worker_binary children, cumulative over the run, so read it per N in
increasing N).

  .venv/bin/python benchmarks/server_scale.py --method=cadis --num_clients=100,300,1000
  .venv/bin/python benchmarks/server_scale.py --method=fedcda --model=fedavg_cnn \
      --dataset=fashion_mnist --num_clients=10,25,50
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf  # before app.run parses flags (see round_overhead.py)

_METHOD = flags.DEFINE_enum('method', 'cadis', ['cadis', 'fedcda'], 'Method whose server side to scale.')
_NUM_CLIENTS = flags.DEFINE_list('num_clients', ['100', '300', '1000'], 'Values of N.')
_MODEL = flags.DEFINE_string('model', 'tiny_cnn', 'tff_algos.models zoo model.')
_DATASET = flags.DEFINE_enum('dataset', 'digits', ['fashion_mnist', 'digits'], 'Client data.')
_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'P.')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 50, 'Examples per client.')
_BATCH = flags.DEFINE_integer('batch_size', 25, 'Local batch size.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per variant.')
_CACHE = flags.DEFINE_integer('fedcda_cache_size', 3, 'FedCDA K.')
_MAX_GIB = flags.DEFINE_float('fedcda_max_cache_gib', 16.0, 'FedCDA refusal threshold.')


def worker_peak_bytes() -> int:
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  peak = 0
  for pid in execution.worker_pids():
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          peak = max(peak, int(line.split()[1]) * 1024)
  return peak


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  import data  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top

  ds = data.load_fashion_mnist() if _DATASET.value == 'fashion_mnist' else data.load_digits()
  per_round, per_client = _PER_ROUND.value, _EXAMPLES.value
  xs = np.split(ds.x_train[:per_round * per_client], per_round)
  ys = np.split(ds.y_train[:per_round * per_client], per_round)
  model_fn = models.make_model_fn(_MODEL.value, ds.input_shape, ds.num_classes, seed=0)
  print(f'setup: {_METHOD.value}, {ds.name}, model {_MODEL.value}, P={per_round} clients x '
        f'{per_client} examples per round, batch {_BATCH.value}, {_ROUNDS.value} timed rounds '
        'per variant after 1 warm-up, full and empty rounds interleaved', flush=True)
  print(f'load average at start: {os.getloadavg()[0]:.1f} (2 cores; shared machine)')
  print('| N | state MB | full round s (min / median) | empty round s (min / median) | '
        'empty / full (min) | worker peak RSS MB |')
  print('|---|---|---|---|---|---|', flush=True)
  for n in [int(v) for v in _NUM_CLIENTS.value]:
    config = experiment.ExperimentConfig(
        algorithm=_METHOD.value, num_clients=n, clients_per_round=per_round,
        batch_size=_BATCH.value, client_lr=0.05, client_momentum=0.0,
        fedcda_warmup_rounds=0, fedcda_cache_size=_CACHE.value,
        fedcda_max_cache_gib=_MAX_GIB.value)
    try:
      process = experiment.build_process(config, model_fn, n)
    except experiment.ExperimentError as e:
      print(f'| {n} | refused: {e} | | | | |', flush=True)
      continue
    states = dict(full=process.initialize(), empty=process.initialize())
    state_bytes = sum(np.asarray(t).nbytes for t in tf.nest.flatten(states['full'].aggregator))
    times = dict(full=[], empty=[])
    for r in range(_ROUNDS.value + 1):
      ids = np.random.default_rng([n, r]).choice(n, per_round, replace=False)
      for variant in (('full', 'empty') if r % 2 else ('empty', 'full')):
        epochs = 1 if variant == 'full' else 0
        inputs = [[data.client_input(xs[s], ys[s], epochs, np.random.default_rng([r, s]),
                                     int(ids[s]), s)] for s in range(per_round)]
        t0 = time.perf_counter()
        with execution.collector_paused():
          states[variant] = process.next(states[variant], inputs).state
        if r:
          times[variant].append(time.perf_counter() - t0)
      if r == 0:
        execution.freeze_long_lived_objects()
    full, empty = min(times['full']), min(times['empty'])  # min: least disturbed by load
    print(f'| {n} | {state_bytes / 2**20:.1f} | {full:.3f} / {statistics.median(times["full"]):.3f} | '
          f'{empty:.3f} / {statistics.median(times["empty"]):.3f} | {100 * empty / full:.0f}% | '
          f'{worker_peak_bytes() / 2**20:.0f} |', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  app.run(main)
