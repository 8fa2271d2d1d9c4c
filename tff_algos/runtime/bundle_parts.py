"""A TensorFlow tensor bundle written in parts, sharing its unchanged parts with the last one.

A large tensor is cut along its leading axes into parts of at least `min_part_bytes`
(`part_axes`: FedCDA's cache chunk [G, K, D] into its G·K cached models), each part a
slice in a bundle of its own. The writer (`write_parts`, run by the worker in its save
computation) fingerprints every part (FarmHash64 of its bytes, `tf.fingerprint`) and writes
only those whose fingerprint differs from the previous bundle's, with the tensors that are
not cut in one more bundle; `assemble` (in Python) then hard-links each part left unwritten
from the previous bundle's directory and merges every part into one bundle
(TensorFlow's MergeV2Checkpoints, which renames each part's data file into a shard of it
and writes its one index). RestoreV2 reads a tensor whole from its slices, so the bundle
reads as one written whole (`tf.train.load_checkpoint`, `tf.saved_model.load`).

Each part's files stay listed in the bundle's `PARTS_DIR` (links to the bundle's shards),
where the next bundle links them from (or copies them, on a file system without hard
links). A bundle's files are never written again once it is merged: removing one bundle
leaves every other whole, while a file damaged in place damages every bundle that shares
it. So each bundle records, in `PARTS_DIR`/`RECORD`, every part's fingerprint (the one
`write_parts` computed) and its data file's size, and whether it was written whole
(sharing nothing); `damaged_parts` reads a bundle's parts back against that record.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

# What a tensor is cut into at least, by default (FedCDA's cached model of FedAvg's CNN:
# 6.6 MB; no model's weight is cut).
MIN_PART_BYTES = 1 << 20
# Bytes of one part's fingerprint (tf.fingerprint's farmhash64).
FINGERPRINT_BYTES = 8
# The tensors that are not cut, written whole every time.
REST = 'rest'
# Beside the merged bundle: each part's files, which the next bundle links.
PARTS_DIR = 'parts'
DATA_SUFFIX = '.data-00000-of-00001'
# In PARTS_DIR: what each part was when written (`write_record`).
RECORD = 'record.json'


def part_axes(shape: Sequence[int], itemsize: int,
              min_part_bytes: int = MIN_PART_BYTES) -> int:
  """m: how many leading axes a tensor of `shape` is cut along, the most that leave at least
  two parts of at least `min_part_bytes` each (the parts: shape[m:]); 0 when none do."""
  shape = [int(d) for d in shape]
  axes = 0
  for m in range(1, len(shape)):
    if (int(np.prod(shape[:m])) >= 2 and
        int(np.prod(shape[m:])) * int(itemsize) >= int(min_part_bytes)):
      axes = m
  return axes


def num_parts(shape: Sequence[int], axes: int) -> int:
  return int(np.prod([int(d) for d in shape[:axes]])) if axes else 0


def part_name(index: int) -> str:
  return f'part_{index}'


def slice_spec(shape: Sequence[int], axes: int, part: int) -> str:
  """TensorFlow's slice spec (SaveV2's shape_and_slices) of part `part` of a tensor of
  `shape` cut along its first `axes` axes: "d0 d1 ... start,1:...:-"."""
  coordinates = np.unravel_index(part, [int(d) for d in shape[:axes]])
  extents = [f'{int(c)},1' for c in coordinates] + ['-'] * (len(shape) - axes)
  return ' '.join(str(int(d)) for d in shape) + ' ' + ':'.join(extents)


def write_parts(directory, names: Sequence[str], tensors: Sequence[tf.Tensor],
                cut: Sequence[tuple], previous, linkable):
  """Writes `tensors` under `names` in `directory` (a string tensor): those listed in `cut`
  ((index into `tensors`, axes) pairs, `part_axes`) part by part, each part
  (`part_name`, numbered tensor by tensor in `cut`'s order) only if `linkable` is False or
  its fingerprint differs from its row of `previous` (uint8 [parts, FINGERPRINT_BYTES]),
  the others whole as `REST`. Returns the parts' fingerprints (uint8 [parts, 8]), computed
  once every write is done. Runs in a graph (the worker's save computation) or eagerly."""
  cut = dict(cut)
  rest = [i for i in range(len(tensors)) if i not in cut]
  writes = []
  if rest:
    writes.append(tf.raw_ops.SaveV2(
        prefix=tf.strings.join([directory, REST], separator='/'),
        tensor_names=[names[i] for i in rest], shape_and_slices=[''] * len(rest),
        tensors=[tensors[i] for i in rest]))
  rows, fingerprints = [], []
  for i, axes in cut.items():
    flat = tf.reshape(tensors[i], [num_parts(tensors[i].shape, axes), -1])
    rows.append((i, axes, flat))
    fingerprints.append(tf.fingerprint(flat))
  if not rows:
    with tf.control_dependencies(writes):
      return tf.zeros([0, FINGERPRINT_BYTES], tf.uint8)
  fingerprints = tf.concat(fingerprints, axis=0)
  changed = tf.logical_or(tf.logical_not(linkable),
                          tf.reduce_any(tf.not_equal(fingerprints, previous), axis=1))
  part = 0
  for i, axes, flat in rows:
    shape = tensors[i].shape
    for row in range(num_parts(shape, axes)):
      def write(row=row, part=part):
        value = tf.reshape(flat[row], [1] * axes + list(shape[axes:]))
        with tf.control_dependencies([tf.raw_ops.SaveV2(
            prefix=tf.strings.join([directory, part_name(part)], separator='/'),
            tensor_names=[names[i]], shape_and_slices=[slice_spec(shape, axes, row)],
            tensors=[value])]):
          return tf.constant(True)
      writes.append(tf.cond(changed[part], write, lambda: tf.constant(False)))
      part += 1
  with tf.control_dependencies(writes):
    return tf.identity(fingerprints)


def _link(source: str, target: str) -> None:
  """A hard link, or a copy on a file system that has none."""
  try:
    os.link(source, target)
  except OSError as e:
    if e.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP,
                       errno.EMLINK):
      raise
    shutil.copyfile(source, target)


def assemble(written: str, directory: str, prefix: str, parts: int,
             previous: Optional[str]) -> None:
  """Merges what `write_parts` wrote in `written` into the bundle at `prefix`, each part it
  left unwritten linked from the bundle `previous` assembled (its `directory`), and keeps
  every part's files in `directory`/PARTS_DIR. `written` is then removed."""
  kept = os.path.join(directory, PARTS_DIR)
  os.makedirs(kept)
  rest = os.path.join(written, REST)
  prefixes = [rest] if os.path.exists(rest + '.index') else []
  for part in range(parts):
    name = part_name(part)
    prefixes.append(os.path.join(written, name))
    for suffix in ('.index', DATA_SUFFIX):
      here = os.path.join(written, name + suffix)
      if not os.path.exists(here):
        if previous is None:
          raise FileNotFoundError(f'{here} was not written and no bundle precedes it')
        _link(os.path.join(previous, PARTS_DIR, name + suffix), here)
      _link(here, os.path.join(kept, name + suffix))
  tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=prefixes, destination_prefix=prefix,
                                delete_old_dirs=True)
  if os.path.isdir(written):
    os.rmdir(written)


def part_slices(cut: Sequence[tuple], names: Sequence[str], shapes: Sequence[Sequence[int]],
                dtypes: Sequence[str]) -> list[tuple]:
  """Each part's (tensor name, slice spec, dtype name), in `write_parts`' order, for a state
  whose tensor i is `names[i]` of `shapes[i]` and `dtypes[i]`, cut as `cut` ((index, axes,
  parts) triples)."""
  return [(names[i], slice_spec(shapes[i], axes, row), str(dtypes[i]))
          for i, axes, parts in cut for row in range(parts)]


def _data_file(directory: str, part: int) -> str:
  return os.path.join(directory, PARTS_DIR, part_name(part) + DATA_SUFFIX)


def write_record(directory: str, slices: Sequence[tuple], fingerprints: np.ndarray,
                 whole: bool) -> None:
  """Records in `directory`/PARTS_DIR each part's slice (`part_slices`), fingerprint
  (uint8 [parts, FINGERPRINT_BYTES], `write_parts`' result) and data file's size, and
  whether every part was written anew (`whole`: the bundle shares no file)."""
  fingerprints = np.asarray(fingerprints, np.uint8)
  parts = [dict(name=name, slice=spec, dtype=dtype, fingerprint=row.tobytes().hex(),
                size=os.path.getsize(_data_file(directory, part)))
           for part, ((name, spec, dtype), row) in enumerate(zip(slices, fingerprints,
                                                                  strict=True))]
  with open(os.path.join(directory, PARTS_DIR, RECORD), 'w') as f:
    json.dump(dict(whole=bool(whole), parts=parts), f)


def read_record(directory: str) -> Optional[dict]:
  """The bundle's record (`write_record`) in `directory`, None if it has none (a bundle
  not written in parts) or it cannot be read."""
  try:
    with open(os.path.join(directory, PARTS_DIR, RECORD)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def damaged_parts(directory: str, record: Optional[dict] = None) -> dict[str, str]:
  """{data file: 'size' or 'fingerprint'}: the parts of the bundle in `directory` whose
  file no longer matches its record (its size; else the fingerprint of the tensor read back,
  or a read that fails, as TensorFlow's own checksum does); {} if all match. Reading a part
  costs what fingerprinting it cost its writer. A record that is gone or unreadable counts
  as the damage of the record file itself."""
  if record is None:
    record = read_record(directory)
    if record is None:
      return {os.path.join(directory, PARTS_DIR, RECORD): 'record'}
  damaged = {}
  for part, row in enumerate(record['parts']):
    path = _data_file(directory, part)
    try:
      size = os.path.getsize(path)
    except OSError:
      size = None
    if size != row['size']:
      damaged[path] = 'size'
      continue
    try:
      [value] = tf.raw_ops.RestoreV2(
          prefix=os.path.join(directory, PARTS_DIR, part_name(part)),
          tensor_names=[row['name']], shape_and_slices=[row['slice']],
          dtypes=[tf.as_dtype(row['dtype'])])
      fingerprint = tf.fingerprint(tf.reshape(value, [1, -1]))[0].numpy().tobytes().hex()
    except (tf.errors.OpError, ValueError):
      fingerprint = None
    if fingerprint != row['fingerprint']:
      damaged[path] = 'fingerprint'
  return damaged
