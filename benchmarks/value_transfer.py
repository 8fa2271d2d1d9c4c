"""What it costs to move a value through TFF 0.87's local runtime, by size.

Every `process.next(state, data)` sends the whole server state to TFF's C++ worker and gets
the new state back (over gRPC, as serialized protocol buffers), so a method whose state is
large pays for it every round: FedCross holds K middleware models, FedCDA its N·K·D cache.
This benchmark calls a TFF computation that adds 1 to a float32 tensor of each size (the
value goes in and comes back, as a method's state does) and the same addition in plain TF
in this process, interleaved, and prints seconds, MB/s through TFF and the ratio.

  .venv/bin/python benchmarks/value_transfer.py --megabytes=16,64,200
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
import numpy as np
import tensorflow as tf

_MEGABYTES = flags.DEFINE_list('megabytes', ['16', '64', '200'], 'Tensor sizes in MB (1e6 B).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per size and variant (median).')


def main(argv):
  del argv
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  print(f'load average {os.getloadavg()[0]:.1f} (2 cores); protobuf '
        f'{execution.protobuf_implementation()}', flush=True)
  print('| MB | TFF call s | plain TF s | TFF MB/s (in + out) | TFF / plain TF |')
  print('|---|---|---|---|---|')
  for text in _MEGABYTES.value:
    n = int(float(text) * 1e6 / 4)
    x = np.random.default_rng(0).random(n, dtype=np.float32)

    @tff.tensorflow.computation(tff.TensorType(np.float32, [n]))
    def add_one(v):
      return v + 1.0

    plain = tf.function(lambda v: v + 1.0)
    add_one(x)  # first call: compilation
    plain(x).numpy()
    times = {'tff': [], 'plain': []}
    for _ in range(_REPEATS.value):
      with execution.collector_paused():
        t0 = time.perf_counter()
        y = add_one(x)
        times['tff'].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        z = plain(x).numpy()
        times['plain'].append(time.perf_counter() - t0)
      assert np.array_equal(y, z)
    tff_s, plain_s = statistics.median(times['tff']), statistics.median(times['plain'])
    print(f'| {x.nbytes / 1e6:.0f} | {tff_s:.3f} | {plain_s:.3f} | '
          f'{2 * x.nbytes / 1e6 / tff_s:.0f} | {tff_s / plain_s:.0f}x |', flush=True)
  print(f'load average at end {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  app.run(main)
