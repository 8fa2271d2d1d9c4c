"""What it costs to move a value through TFF 0.87's local runtime, by size.

Every `process.next(state, data)` sends the whole server state to TFF's C++ worker and gets
the new state back (over gRPC, as serialized protocol buffers), so a method whose state is
large pays for it every round: FedCross holds K middleware models, FedCDA its N·K·D cache.
This benchmark calls a TFF computation that adds 1 to a float32 tensor of each size (the
value goes in and comes back, as a method's state does) and the same addition in plain TF
in this process, interleaved, and prints seconds, MB/s through TFF and the ratio. Then it
times the Python-side serialisation of a nested state with TFF's `serialize_value` and with
`tff_algos.execution.serialize_value` (which `initialize_runtime` installs, and which the
transfers above use).

  .venv/bin/python benchmarks/value_transfer.py --megabytes=16,64,200
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from absl import flags

from programs import flag_parsing  # pylint: disable=g-import-not-at-top
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
  serializers(tff, execution)
  print(f'load average at end {os.getloadavg()[0]:.1f}')


def serializers(tff, execution):
  """TFF's own serialize_value against execution.serialize_value on a nested server state
  shaped like FedCDA's in the reproduction (20 clients x K = 3 cached models of the simple
  CNN, 582,026 weights, inside LearningAlgorithmState-like structs), interleaved."""
  import collections  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  d = 582026
  rng = np.random.default_rng(0)
  state = collections.OrderedDict(
      global_model_weights=[rng.random(d, dtype=np.float32)],
      aggregator=collections.OrderedDict(cache=rng.random((20, 3, d), dtype=np.float32),
                                         counts=np.zeros((20, 3), np.int32)))
  state_type = tff.FederatedType(tff.StructType([
      ('global_model_weights', [tff.TensorType(np.float32, [d])]),
      ('aggregator', tff.StructType([('cache', tff.TensorType(np.float32, [20, 3, d])),
                                     ('counts', tff.TensorType(np.int32, [20, 3]))]))]),
      tff.SERVER)
  ours = execution.serialize_value
  from tff_algos.runtime import serialization  # pylint: disable=g-import-not-at-top
  theirs = serialization._tff_serialize_value  # pylint: disable=protected-access
  times = {'tff': [], 'ours': []}
  for _ in range(_REPEATS.value):
    for name, fn in (('tff', theirs), ('ours', ours)):
      value_serialization.serialize_value = fn  # TFF's recursion goes through the module
      t0 = time.perf_counter()
      proto, _ = fn(state, state_type)
      times[name].append(time.perf_counter() - t0)
  value_serialization.serialize_value = ours
  t_tff, t_ours = statistics.median(times['tff']), statistics.median(times['ours'])
  print(f'\nserialising a {proto.ByteSize() / 1e6:.0f} MB nested server state (median of '
        f'{_REPEATS.value}): TFF {t_tff:.3f} s, execution.serialize_value {t_ours:.3f} s, '
        f'{t_tff / t_ours:.1f}x')


if __name__ == '__main__':
  flag_parsing.run(main)
