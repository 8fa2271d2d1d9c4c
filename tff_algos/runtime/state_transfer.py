"""How a server state crosses between Python and TFF's worker, as files or as values.

How `ResidentProcess`'s state crosses (`transfer`): by default ('files') as a TensorFlow
checkpoint in a scratch directory, written by the worker (a TF computation running `SaveV2`)
and read by Python, or written by Python and read by the worker (`RestoreV2`); a refresh has
the worker write it and read it back, and never passes through Python. A TFF value crossing
gRPC is serialised, copied into a message, parsed and held by the worker with its message,
so a file costs the worker less memory and time. With 'values' the state crosses as TFF
values, and above `chunk_bytes` (64 MiB) in chunks, each its own message (a computation splits
the state into tuples of its tensors, another joins them), so that no message exceeds TFF's
2 GB limit. Every way gives the same state to the bit, in the same containers (tested). With
'files', `ResidentProcess.write` has the worker write the state's tensors under names the
caller gives (a `FileLayout`, with a few scalars sent from Python and fixed strings) into a
file that never passes through Python: a checkpoint version (programs/checkpoint_writer.py).
With `wait=False` it returns as soon as the worker has the call (TFF's executor interface is
asynchronous: the worker's TensorFlowExecutor runs each call on a thread of its own pool and
only `compute()` waits), so the worker writes while the next round's calls run, and a
`WriteInFlight` says when the file is written.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import array
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_algos.runtime import bundle_parts


# A state larger than this crosses between Python and the worker in chunks of about this
# size. Whole, a value is one gRPC message: TFF 0.87 refuses one over 2 GB, and the worker
# holds the serialized message besides the tensors, so chunks keep its peak lower.
CHUNK_BYTES = 64 << 20
# How the state crosses between Python and the worker (ResidentProcess's `transfer`).
TRANSFERS = ('files', 'values')


def state_chunks(member_type, chunk_bytes: int):
  """[(start, stop)] ranges of the flattened tensors of `member_type` (in TFF's order),
  consecutive tensors grouped up to `chunk_bytes` each; None if the whole is that small."""
  sizes = [int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
           for t in structure.flatten(member_type)]
  if sum(sizes) <= chunk_bytes:
    return None
  chunks, start, total = [], 0, 0
  for i, size in enumerate(sizes):
    if i > start and total + size > chunk_bytes:
      chunks.append((start, i))
      start, total = i, 0
    total += size
  chunks.append((start, len(sizes)))
  return chunks


def chunk_type(member_type, start, stop):
  return tff.StructType([(None, t) for t in structure.flatten(member_type)[start:stop]])


def _leaves(value, member_type) -> list:
  """The tensors of a state (of type `member_type`, a struct or one tensor) in TFF's order."""
  if isinstance(member_type, tff.StructType):
    return structure.flatten(structure.from_container(value, recursive=True))
  return [value]


def split_computation(state_type, chunks):
  """state@SERVER -> <chunk_0@SERVER, ...>: each chunk a tuple of the state's tensors."""
  member = state_type.member

  def picker(start, stop):
    @tff.tensorflow.computation(member)
    def pick(state):
      return tuple(_leaves(state, member)[start:stop])
    return pick

  pickers = [picker(start, stop) for start, stop in chunks]

  @tff.federated_computation(state_type)
  def split(state):
    return [tff.federated_map(pick, state) for pick in pickers]

  return split


def join_computation(state_type, chunks):
  """<chunk_0@SERVER, ...> -> state@SERVER (the inverse of `split_computation`)."""
  member = state_type.member
  chunk_types = [chunk_type(member, start, stop) for start, stop in chunks]
  zipped_type = tff.StructType([(None, t) for t in chunk_types])

  @tff.tensorflow.computation(zipped_type)
  def pack(zipped):
    leaves = [leaf for chunk in zipped for leaf in chunk]
    return type_conversions.type_to_py_container(
        structure.pack_sequence_as(member, leaves), member)

  @tff.federated_computation(
      tff.StructType([(None, tff.FederatedType(t, tff.SERVER)) for t in chunk_types]))
  def join(chunks_at_server):
    return tff.federated_map(pack, tff.federated_zip(chunks_at_server))

  return join


class FileLayout(NamedTuple):
  """The names of the tensors in a file the worker writes of a state (`save_computation`,
  `ResidentProcess.write`): the state's tensors in TFF's order under `state`, then scalars
  Python passes with each write (`extras`: (name, dtype) pairs) and string scalars fixed for
  every write (`constants`: (name, bytes) pairs)."""

  state: tuple
  extras: tuple = ()
  constants: tuple = ()
  # State tensors written in parts (`bundle_parts`): (index into `state`, axes, parts)
  # triples. With any, the write's path is a directory for `bundle_parts.write_parts`, its
  # argument ends with the previous write's fingerprints and whether its parts can be
  # linked, and it returns this write's fingerprints.
  cut: tuple = ()

  @property
  def num_parts(self) -> int:
    return sum(parts for _, _, parts in self.cut)


def state_file_layout(member_type) -> FileLayout:
  """The layout of the state's own files (transfer='files'): tensor i as `state/<i>`."""
  return FileLayout(tuple(f'state/{i}' for i in range(len(structure.flatten(member_type)))))


def state_leaves(value, member_type) -> list:
  """A Python state's leaves (of type `member_type`) in TFF's order: the order in which the
  worker names them in its files (`FileLayout.state`)."""
  return _leaves(value, member_type)


def _write_leaves(path, names, tensors):
  """SaveV2 of `tensors` under `names` at `path` (in a TF computation or eagerly)."""
  return tf.raw_ops.SaveV2(prefix=path, tensor_names=list(names),
                           shape_and_slices=[''] * len(tensors), tensors=tensors)


def _read_leaves(path, member_type) -> list:
  """RestoreV2 of the tensors `_write_leaves` wrote for a state of `member_type`."""
  types = structure.flatten(member_type)
  return tf.raw_ops.RestoreV2(prefix=path,
                              tensor_names=list(state_file_layout(member_type).state),
                              shape_and_slices=[''] * len(types),
                              dtypes=[tf.as_dtype(t.dtype) for t in types])


def save_argument_type(layout: FileLayout):
  """<path, extra_0, ...[, previous, linkable]>: what a write of `layout` is given besides
  the state (`previous`, `linkable` with `layout.cut`: `bundle_parts.write_parts`)."""
  parts = ([(None, tff.TensorType(np.uint8, [layout.num_parts,
                                             bundle_parts.FINGERPRINT_BYTES])),
            (None, tff.TensorType(np.bool_))] if layout.cut else [])
  return tff.StructType([(None, tff.TensorType(np.str_))] +
                        [(None, tff.TensorType(dtype)) for _, dtype in layout.extras] + parts)


def save_arguments(layout: FileLayout, path: str, extras, previous) -> list:
  """The values of `save_argument_type(layout)`: `previous` is the last write's
  fingerprints (with `layout.cut`; None: write every part)."""
  values = [path] + [np.asarray(extra, dtype)
                     for extra, (_, dtype) in zip(extras, layout.extras, strict=True)]
  if layout.cut:
    shape = (layout.num_parts, bundle_parts.FINGERPRINT_BYTES)
    values += ([np.zeros(shape, np.uint8), np.bool_(False)] if previous is None else
               [np.asarray(previous, np.uint8).reshape(shape), np.bool_(True)])
  return values


def save_computation(state_type, layout: Optional[FileLayout] = None):
  """<state@SERVER, <path, extra_0, ...>@SERVER> -> path@SERVER: the worker writes, as one
  TensorFlow checkpoint at `path` (its .index and .data files), the state's tensors (in
  TFF's flattened order) under `layout.state`'s names (default: the state's own files,
  `state_file_layout`), the extras under `layout.extras`' and `layout.constants`, and
  returns `path` once they are written. With `layout.cut`, the tensors are written in parts
  in the directory `path` (`bundle_parts.write_parts`, given the argument's last two
  values) and the result is the parts' fingerprints."""
  member = state_type.member
  layout = layout or state_file_layout(member)
  if len(layout.state) != len(structure.flatten(member)):
    raise ValueError(f'the layout names {len(layout.state)} tensors; the state has '
                     f'{len(structure.flatten(member))}')
  names = (list(layout.state) + [name for name, _ in layout.extras] +
           [name for name, _ in layout.constants])
  argument_type = save_argument_type(layout)

  @tff.tensorflow.computation(member, argument_type)
  def save(state, argument):
    path = argument[0]
    tensors = (_leaves(state, member) + [argument[i + 1] for i in range(len(layout.extras))] +
               [tf.constant(value, tf.string) for _, value in layout.constants])
    if layout.cut:
      return bundle_parts.write_parts(path, names, tensors,
                                      [(i, axes) for i, axes, _ in layout.cut],
                                      argument[len(layout.extras) + 1],
                                      argument[len(layout.extras) + 2])
    if not tensors:   # nothing to write (read_state_file and restore expect no file)
      return tf.identity(path)
    with tf.control_dependencies([_write_leaves(path, names, tensors)]):
      return tf.identity(path)

  @tff.federated_computation(state_type, tff.FederatedType(argument_type, tff.SERVER))
  def save_at_server(state, argument):
    return tff.federated_map(save, tff.federated_zip((state, argument)))

  return save_at_server


def restore_computation(state_type):
  """path@SERVER -> <state@SERVER, size@SERVER>: the state read from a checkpoint that
  `save_computation` (or `write_state_file`) wrote; `size` (of its first tensor) is there to
  be fetched: once it has arrived, the file has been read."""
  member = state_type.member
  types = structure.flatten(member)

  @tff.tensorflow.computation(np.str_)
  def restore(path):
    if not types:
      return type_conversions.type_to_py_container(structure.Struct([]), member), tf.size(path)
    leaves = [tf.ensure_shape(leaf, t.shape)
              for leaf, t in zip(_read_leaves(path, member), types)]
    state = type_conversions.type_to_py_container(
        structure.pack_sequence_as(member, leaves), member)
    return state, tf.size(leaves[0])

  @tff.federated_computation(tff.FederatedType(np.str_, tff.SERVER))
  def restore_at_server(path):
    restored = tff.federated_map(restore, path)
    return restored[0], restored[1]

  return restore_at_server

def write_state_file(path: str, leaves, member_type) -> None:
  """Writes a state's flattened tensors (TFF's order) where `restore_computation` reads them.
  A leaf must have its type's shape and a dtype TFF would take for it (as when a value is
  sent to the worker); raises ValueError naming the leaf otherwise."""
  types = structure.flatten(member_type)
  if len(leaves) != len(types):
    raise ValueError(f'the state has {len(leaves)} tensors; its type has {len(types)}')
  tensors = []
  for i, (leaf, t) in enumerate(zip(leaves, types)):
    if t.dtype.type is np.str_:
      tensors.append(tf.constant(np.asarray(leaf, dtype=object), tf.string))
    else:
      if not array.is_compatible_dtype(leaf, t.dtype.type):
        raise ValueError(f'the state\'s tensor {i} ({np.asarray(leaf).dtype}) does not fit its '
                         f'type {t}')
      tensors.append(tf.convert_to_tensor(np.asarray(leaf, dtype=t.dtype)))
    if not tf.TensorShape(t.shape).is_compatible_with(tensors[-1].shape):
      raise ValueError(f'the state\'s tensor {i} has shape {tensors[-1].shape}; its type is {t}')
  if tensors:
    _write_leaves(path, state_file_layout(member_type).state, tensors)


def read_state_file(path: str, member_type) -> list[np.ndarray]:
  """The flattened tensors (TFF's order) of a state `save_computation` wrote at `path`."""
  if not structure.flatten(member_type):
    return []
  return [leaf.numpy() for leaf in _read_leaves(path, member_type)]


def remove_state_file(path: str) -> None:
  """Removes the files of the checkpoint at `path` (none if its directory is gone)."""
  directory, name = os.path.split(path)
  try:
    entries = os.listdir(directory)
  except FileNotFoundError:
    return
  for entry in entries:
    if entry.startswith(name + '.'):
      os.remove(os.path.join(directory, entry))
