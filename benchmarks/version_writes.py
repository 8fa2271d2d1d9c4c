"""What writing one checkpoint version costs, by when the oldest version is removed.

The training program writes a checkpoint version every round and keeps the newest
KEEP_VERSIONS (`programs/checkpoint_writer.py`). Removing the oldest frees the memory its
files held, and a new version's files take memory: on some machines (virtual ones that hand
freed memory back to their host a while after it is freed) memory not used for a while costs
the write several times more system time than memory freed a moment before. This benchmark
writes --versions versions of a float32 state of --megabytes, --pause s apart (a round), as
TFF's worker writes them (one `SaveV2` of the state's tensors into a new version directory,
renamed when written), in two orders, interleaved version by version in one process:

  removed after: the oldest version is removed once the new one is complete (as TFF's
    FileProgramStateManager.save does), so the next write comes a round after the removal;
  removed before: the oldest is removed just before the next write starts (the writer
    removes it in its thread as the worker starts the write: `CheckpointWriter._doom_oldest`).

It prints each version's wall, user and system seconds in each order, the median wall time
of the versions written after the first removal, and the ratio of the two orders' medians.

  .venv/bin/python benchmarks/version_writes.py --megabytes=200 --versions=10 --pause=3
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from absl import flags
import tensorflow as tf

from programs import checkpoint_writer  # pylint: disable=g-import-not-at-top
from programs import flag_parsing

_MEGABYTES = flags.DEFINE_float(
    'megabytes', 80.0, 'Size of the state (SCAFFOLD\'s in round_overhead: 12 models of '
    '1,663,370 float32 parameters, 80 MB; FedCDA\'s: 200 MB).', lower_bound=0.001)
_TENSORS = flags.DEFINE_integer('tensors', 12, 'Tensors the state is split into.',
                                lower_bound=1)
_VERSIONS = flags.DEFINE_integer(
    'versions', 10, 'Versions written in each order; at least KEEP_VERSIONS + 2, so that '
    'some follow a removal.', lower_bound=checkpoint_writer.KEEP_VERSIONS + 2)
_PAUSE = flags.DEFINE_float(
    'pause', 3.0, 'Seconds from one version\'s write to the next one\'s in the same order '
    '(a round, as the program writes them).', lower_bound=0.0)
_DIR = flags.DEFINE_string('dir', None, 'Where to write (default: a temp directory, removed).')

ORDERS = ('removed after', 'removed before')


class VersionWriter:
  """Writes versions of a state into `directory`, keeping the newest `keep`, removing the
  oldest after each write (`remove_before=False`) or just before the next one."""

  def __init__(self, directory: str, keep: int, remove_before: bool):
    self.directory, self.keep, self.remove_before = directory, keep, remove_before
    self.version = 0
    os.makedirs(directory)

  def _remove_beyond(self, keep: int) -> None:
    for old in range(1, self.version - keep + 1):
      path = os.path.join(self.directory, f'program_state_{old}')
      if os.path.exists(path):
        shutil.rmtree(path)

  def write(self, tensors) -> tuple:
    """Writes the next version; returns the write's (wall, user, system) s."""
    if self.remove_before:
      self._remove_beyond(self.keep - 1)
    self.version += 1
    temp = os.path.join(self.directory, f'program_state_{self.version}_temp')
    os.makedirs(os.path.join(temp, 'variables'))
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    tf.raw_ops.SaveV2(prefix=os.path.join(temp, 'variables', 'variables'),
                      tensor_names=[f'state/{i}' for i in range(len(tensors))],
                      shape_and_slices=[''] * len(tensors), tensors=tensors)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    os.rename(temp, os.path.join(self.directory, f'program_state_{self.version}'))
    if not self.remove_before:
      self._remove_beyond(self.keep)
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime

  def kept(self) -> list:
    return sorted((int(name.rsplit('_', 1)[1]) for name in os.listdir(self.directory)))


def main(argv):
  del argv
  keep = checkpoint_writer.KEEP_VERSIONS
  count = _TENSORS.value
  size = max(1, int(_MEGABYTES.value * 2**20 / 4 / count))
  tensors = [tf.random.normal([size], seed=i) for i in range(count)]
  print(f'state: {count} float32 tensors of {size:,} ({count * size * 4 / 2**20:.1f} MB); '
        f'{_VERSIONS.value} versions in each order, {_PAUSE.value:g} s apart, the newest '
        f'{keep} kept')
  times = {order: [] for order in ORDERS}
  with tempfile.TemporaryDirectory(dir=_DIR.value) as directory:
    writers = {order: VersionWriter(os.path.join(directory, order.replace(' ', '_')), keep,
                                    remove_before=order == 'removed before')
               for order in ORDERS}
    for _ in range(_VERSIONS.value):
      for order in ORDERS:   # each order's writes _PAUSE apart, the other's in between
        times[order].append(writers[order].write(tensors))
        time.sleep(_PAUSE.value / len(ORDERS))
    for order in ORDERS:
      print(f'{order}: kept ' + ', '.join(f'program_state_{v}' for v in writers[order].kept()))
  for version in range(_VERSIONS.value):
    print(f'version {version + 1}: ' + '; '.join(
        f'{order} wall {w:.3f} s, user {u:.3f} s, system {s:.3f} s'
        for order in ORDERS for w, u, s in [times[order][version]]))
  # The versions written after the oldest was first removed: from keep + 2 on.
  medians = {order: statistics.median(t[0] for t in times[order][keep + 1:])
             for order in ORDERS}
  print(f'median wall from version {keep + 2} on: ' +
        ', '.join(f'{order} {medians[order]:.3f} s' for order in ORDERS) +
        f'; ratio removed after / removed before '
        f'{medians[ORDERS[0]] / medians[ORDERS[1]]:.2f}x')


if __name__ == '__main__':
  flag_parsing.run(main)
