"""Where one client epoch of a TF loop spends its time: TensorFlow's profiler over one call,
its op events summed by op type, and the part of the wall time no op covers (the framework's
overhead: the executor's scheduling, the loop's control flow, the call itself).

The trace is `tf.profiler.experimental`'s XSpace (`*.xplane.pb`), read here directly: the
host plane's events named `op_name:OpType` are TF ops run by the executor. Ops that run other
ops (the loop's `While`, function calls) are left out of the sums, so each op counts once;
ops on several threads at once count once in the covered time (the union of their
intervals). The profiler's own cost per op inflates the figures somewhat: compare op types
with each other and one setting with another, not with an unprofiled epoch's time.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
import time

import tensorflow as tf

# Ops whose events contain other ops' events.
CONTAINERS = frozenset({'While', 'StatelessWhile', 'If', 'StatelessIf', 'PartitionedCall',
                        'StatefulPartitionedCall', 'Case', 'StatelessCase'})


def _op_events(xspace_path: str) -> list:
  """[(op type, start ps, duration ps)] of the TF op events of a profile's host planes."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  with open(xspace_path, 'rb') as f:
    space.ParseFromString(f.read())
  events = []
  for plane in space.planes:
    if not plane.name.startswith('/host:'):
      continue
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        op_name, sep, op_type = name.rpartition(':')
        # Op types are CamelCase; Grappler's fused kernels (_FusedConv2D, _FusedMatMul:
        # the forward layers) start with an underscore.
        if (not sep or not op_name or '::' in name or not op_type.lstrip('_')[:1].isupper()
            or '/' in op_type or op_type in CONTAINERS):
          continue
        start = line.timestamp_ns * 1000 + event.offset_ps
        events.append((op_type, start, event.duration_ps))
  return events


def _covered_ps(events) -> int:
  """Picoseconds covered by at least one event (the union of their intervals)."""
  covered, end = 0, None
  for _, start, duration in sorted(events, key=lambda e: e[1]):
    stop = start + duration
    if end is None or start > end:
      covered += duration
      end = stop
    elif stop > end:
      covered += stop - end
      end = stop
  return covered


def profile_call(fn, steps: int, top: int = 12) -> dict:
  """Profiles one `fn()` (already traced: a warm call) of `steps` steps: its wall seconds,
  per step the ops' covered time and the rest (overhead), and the `top` op types by time."""
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', '*.xplane.pb'))
    if not paths:
      raise RuntimeError(f'TensorFlow\'s profiler wrote no trace under {logdir}')
    events = _op_events(paths[0])
  by_type = collections.defaultdict(lambda: [0, 0])
  for op_type, _, duration in events:
    by_type[op_type][0] += 1
    by_type[op_type][1] += duration
  ops_s = _covered_ps(events) / 1e12
  total_op_s = sum(d for _, d in by_type.values()) / 1e12
  rows = sorted(by_type.items(), key=lambda kv: -kv[1][1])[:top]
  return dict(
      wall_s=wall, steps=steps, step_ms=1e3 * wall / steps, ops_ms_per_step=1e3 * ops_s / steps,
      overhead_ms_per_step=1e3 * (wall - ops_s) / steps,
      ops=[dict(op=op, calls_per_step=count / steps, ms_per_step=ps / 1e9 / steps,
                share_of_op_time=ps / 1e12 / total_op_s if total_op_s else 0.0)
           for op, (count, ps) in rows])


def table(profile: dict) -> str:
  """The profile as a short Markdown table, under a line of the per-step split."""
  lines = [f'one client epoch, {profile["steps"]} steps, {profile["wall_s"]:.3f} s profiled: '
           f'{profile["step_ms"]:.2f} ms/step = ops {profile["ops_ms_per_step"]:.2f} ms + '
           f'framework overhead {profile["overhead_ms_per_step"]:.2f} ms '
           f'({profile["overhead_ms_per_step"] / profile["step_ms"]:.0%})',
           '| op | calls/step | ms/step | share of op time |', '|---|---|---|---|']
  lines += [f'| {o["op"]} | {o["calls_per_step"]:.1f} | {o["ms_per_step"]:.3f} | '
            f'{o["share_of_op_time"]:.1%} |' for o in profile['ops']]
  return '\n'.join(lines)
