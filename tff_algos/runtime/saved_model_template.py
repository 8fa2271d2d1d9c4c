"""tff.program checkpoint versions whose tensors the worker writes: a program state's
SavedModel made from a template.

`tff.program.FileProgramStateManager.save` writes a version as a SavedModel
(`file_utils.write_saved_model`): each leaf of the program state, in
`structure_utils.flatten` order, becomes a `tf.Variable` of a `tf.Module` whose one function
returns the structure. Its `saved_model.pb` (the object graph and that function) depends on
the structure, shapes and dtypes only; `variables/variables` is a TensorFlow tensor bundle
holding each leaf under its object-graph key (`_value/<path>/.ATTRIBUTES/VARIABLE_VALUE`)
and the object graph itself (`_CHECKPOINTABLE_OBJECT_GRAPH`, a string); `fingerprint.pb`
hashes `saved_model.pb` and the bundle's index. For one run the structure never changes, so
`SavedModelTemplate` writes the program's initial state once through TFF's own
`write_saved_model` and keeps its `saved_model.pb`, the key of each leaf and the object
graph: a version is then a bundle written by anyone under those keys (the worker's `SaveV2`
of the state: `ResidentProcess.write` with `worker_layout`), the kept `saved_model.pb` and
the fingerprint TensorFlow computes of them (`write_graph`). `FileProgramStateManager.load`
reads it as its own (tests/test_checkpoint_writer.py: the same leaves, to the bit), also
when its large tensors are written in parts (`worker_layout(..., min_part_bytes)`,
`bundle_parts`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
# What tf.saved_model.save runs to write fingerprint.pb (TF 2.14).
from tensorflow.python.saved_model import fingerprinting_utils
from tensorflow_federated.python.common_libs import structure
# The SavedModel writer and the flattening FileProgramStateManager uses (TFF 0.87).
from tensorflow_federated.python.program import file_utils
from tensorflow_federated.python.program import structure_utils

from tff_algos.runtime import bundle_parts
from tff_algos.runtime import resident_state
from tff_algos.runtime import state_transfer

# The bundle's entry holding the object graph (TensorFlow's OBJECT_GRAPH_PROTO_KEY).
OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
# Where a SavedModel keeps its bundle, relative to its directory.
VARIABLES_PREFIX = os.path.join('variables', 'variables')


class TemplateMismatch(ValueError):
  """The program state cannot be named leaf by leaf in its SavedModel as the worker holds
  it: its checkpoints are left to TFF's own writer."""


def _leaf_keys(object_graph: trackable_object_graph_pb2.TrackableObjectGraph,
               program_state) -> list[str]:
  """The bundle key of each leaf of `program_state` (structure_utils.flatten order): the
  object graph walked from its root's `_value` along the leaf's path. Raises TemplateMismatch if
  a leaf is not a variable of its own (TFF's module keeps such a value in saved_model.pb)."""
  keys = []
  for name, _ in structure_utils.flatten_with_name(program_state):
    node = object_graph.nodes[0]
    for part in ['_value'] + name.split('/'):
      child = [c.node_id for c in node.children if c.local_name == part]
      if not child:
        raise TemplateMismatch(f'the program state\'s leaf {name} is not in its SavedModel\'s '
                         'object graph')
      node = object_graph.nodes[child[0]]
    values = [a.checkpoint_key for a in node.attributes if a.name == 'VARIABLE_VALUE']
    if len(values) != 1:
      raise TemplateMismatch(f'the program state\'s leaf {name} is not a variable of its SavedModel')
    keys.append(values[0])
  return keys


class SavedModelTemplate:
  """The SavedModel of `program_state`'s structure (a mapping: the state under `state_key`,
  and scalar figures), written once in a scratch directory under `scratch_dir` (removed at
  once). `keys`, `dtypes`, `shapes`: each leaf's bundle key, dtype and shape
  (structure_utils.flatten order); `figures`: the names of the entries besides the state."""

  def __init__(self, program_state, state_key: str = 'state',
               scratch_dir: Optional[str] = None):
    scratch = tempfile.mkdtemp(prefix=resident_state.SCRATCH_PREFIX + 'template_',
                               dir=scratch_dir)
    try:
      path = os.path.join(scratch, 'program_state')
      # On a loop of its own, leaving the calling thread's current loop as it was
      # (asyncio.run would unset it: TFF's programs then find none in the main thread).
      loop = asyncio.new_event_loop()
      try:
        loop.run_until_complete(file_utils.write_saved_model(program_state, path))
      finally:
        loop.close()
      with open(os.path.join(path, 'saved_model.pb'), 'rb') as f:
        self.saved_model_pb = f.read()
      reader = tf.train.load_checkpoint(os.path.join(path, VARIABLES_PREFIX))
      self.object_graph = reader.get_tensor(OBJECT_GRAPH_KEY)
      dtypes, shapes = reader.get_variable_to_dtype_map(), reader.get_variable_to_shape_map()
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(self.object_graph)
    self.keys = _leaf_keys(graph, program_state)
    if len(set(self.keys)) != len(self.keys) or set(dtypes) != set(self.keys) | {
        OBJECT_GRAPH_KEY}:
      raise TemplateMismatch('the program state\'s SavedModel holds other tensors than its leaves')
    self.dtypes = [dtypes[k] for k in self.keys]
    self.shapes = [tuple(shapes[k]) for k in self.keys]
    names = [name for name, _ in structure_utils.flatten_with_name(program_state)]
    self._state_key = state_key
    self._in_state = [i for i, name in enumerate(names) if name.startswith(state_key + '/')]
    self._figures = [i for i, name in enumerate(names) if not name.startswith(state_key + '/')]
    self.figures = [names[i] for i in self._figures]
    if any('/' in names[i] or self.shapes[i] for i in self._figures):
      raise TemplateMismatch('the program state\'s entries besides its state must be scalars')
    self._names = names
    # The structure with each leaf's index in place of the leaf.
    self._indexed = structure_utils.unflatten_as(program_state, list(range(len(names))))

  def worker_layout(self, state_type, min_part_bytes: Optional[int] = None
                    ) -> state_transfer.FileLayout:
    """The names the worker gives a version's tensors (`ResidentProcess.write`): the state's
    tensors (of type `state_type`, in TFF's order) under their keys, the figures (their
    values: `extras`) and the object graph; with `min_part_bytes`, the state's tensors that
    are written in parts of at least that many bytes (`bundle_parts.part_axes`). Raises
    TemplateMismatch if a tensor of the state's type has not the template's dtype or
    shape."""
    order = state_transfer.state_leaves(self._indexed[self._state_key], state_type)
    types = structure.flatten(state_type)
    if sorted(order) != self._in_state or len(types) != len(order):
      raise TemplateMismatch('the state\'s type and its Python value have different leaves')
    for i, t in zip(order, types):
      if tf.as_dtype(t.dtype) != self.dtypes[i] or tuple(t.shape) != self.shapes[i]:
        raise TemplateMismatch(f'the state\'s tensor {self._names[i]} is {t} in the worker and '
                         f'{self.dtypes[i].name}{list(self.shapes[i])} in its SavedModel')
    cut = []
    for position, t in enumerate(types):
      dtype = tf.as_dtype(t.dtype)
      if min_part_bytes is None or dtype == tf.string:
        continue
      axes = bundle_parts.part_axes(t.shape, dtype.size, min_part_bytes)
      if axes:
        cut.append((position, axes, bundle_parts.num_parts(t.shape, axes)))
    return state_transfer.FileLayout(
        cut=tuple(cut),
        state=tuple(self.keys[i] for i in order),
        extras=tuple((self.keys[i], np.dtype(self.dtypes[i].as_numpy_dtype))
                     for i in self._figures),
        constants=((OBJECT_GRAPH_KEY, self.object_graph),))

  def extras(self, figures: Mapping[str, Any]) -> list[np.ndarray]:
    """The figures' values (a mapping by name) as the layout's extras, in the template's
    dtypes (those FileProgramStateManager.save gives them)."""
    return [np.asarray(figures[self._names[i]], self.dtypes[i].as_numpy_dtype)
            for i in self._figures]

  def write_graph(self, directory: str) -> None:
    """Completes the SavedModel in `directory`, whose bundle is written: saved_model.pb, an
    empty assets/ (as tf.saved_model.save leaves it) and fingerprint.pb."""
    with open(os.path.join(directory, 'saved_model.pb'), 'wb') as f:
      f.write(self.saved_model_pb)
    os.makedirs(os.path.join(directory, 'assets'), exist_ok=True)
    fingerprinting_utils.write_fingerprint(directory)
