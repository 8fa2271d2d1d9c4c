"""How values cross between Python and TFF's worker: the serializer, and the size limit.

Every `process.next` sends the whole server state. TFF 0.87 builds a nested value's message
bottom-up, passing each finished sub-message to its parent's constructor, which copies it:
a tensor d levels deep is copied about 3d times. `install_value_serialization()` (called by
`initialize_runtime` and `distributed_context`) replaces TFF's `serialize_value` with one
that writes every part into its place in a single message: byte-identical output
(tests/test_value_serialization.py; its cost: benchmarks/results/RESULTS.md, "Moving values
to TFF's worker").

Each value crosses as one gRPC message, which the worker refuses above `MAX_VALUE_BYTES`:
`check_value_fits` says so before anything runs.
"""

from __future__ import annotations

_tff_serialize_value = None  # TFF's own serialize_value, once replaced


def _serialize_into(dest, value, type_spec) -> None:
  """Writes `value` of `type_spec` into the `executor_pb2.Value` `dest`, as TFF's
  `serialize_value` would build it. Tensors, structs and federated values are written in
  place; anything else (sequences, computations, scalars, strings, values TFF must reject
  with its own error) goes through TFF's function."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.compiler import array  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import array_shape, computation_types, dtype_utils, type_serialization  # pylint: disable=g-import-not-at-top,g-multiple-import
  if isinstance(type_spec, computation_types.TensorType):
    # TFF's `_serialize_tensor_value` with `array.to_proto_content`, for the case it
    # handles that way: a non-scalar, non-string numpy array of a compatible shape and dtype.
    if (isinstance(value, np.ndarray)
        and not array_shape.is_shape_scalar(type_spec.shape)
        and type_spec.dtype.type is not np.str_
        and array.is_compatible_shape(value, type_spec.shape)
        and array.is_compatible_dtype(value, type_spec.dtype.type)):
      dtype = type_spec.dtype.type
      value = np.asarray(value, dtype)
      dest.array.dtype = dtype_utils.to_proto(dtype)
      dest.array.shape.CopyFrom(array_shape.to_proto(value.shape))
      dest.array.content = value.tobytes()
      return
  elif isinstance(type_spec, computation_types.StructType) and not _is_computation(value):
    elements = structure.from_container(value)
    if len(elements) == len(type_spec):
      dest.struct.SetInParent()  # an empty struct is still a struct
      for (name, element_type), (_, element) in zip(structure.iter_elements(type_spec),
                                                    structure.iter_elements(elements)):
        slot = dest.struct.element.add()
        if name:
          slot.name = name
        _serialize_into(slot.value, element, element_type)
      return
  elif isinstance(type_spec, computation_types.FederatedType) and not _is_computation(value):
    members = [value] if type_spec.all_equal else value
    if isinstance(members, list):
      for member in members:
        _serialize_into(dest.federated.value.add(), member, type_spec.member)
      dest.federated.type.CopyFrom(type_serialization.serialize_type(type_spec).federated)
      return
  try:
    proto, _ = _tff_serialize(value, type_spec)
  except TypeError as e:
    if _is_client_input(type_spec):
      raise TypeError(RAW_CLIENT_DATA) from e
    raise
  dest.CopyFrom(proto)


# What a process of this package says when a client is a plain tf.data dataset.
RAW_CLIENT_DATA = (
    "this process's clients are one-element sequences of OrderedDict(x, y, order, index, "
    'slot, work), not plain tf.data datasets: build each round\'s clients from your ClientData '
    'with data.client_selection_fn(client_data, clients_per_round)(round_num) (or '
    'data.ClientDataInputs(client_data).round_inputs(...))')


def _is_client_input(type_spec) -> bool:
  """A sequence of the client input our processes take (x, y and `constants.CLIENT_INPUT_FIELDS`)."""
  from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import computation_types as ct  # pylint: disable=g-import-not-at-top
  from tff_algos import constants  # pylint: disable=g-import-not-at-top
  return (isinstance(type_spec, ct.SequenceType)
          and isinstance(type_spec.element, ct.StructType)
          and [name for name, _ in structure.iter_elements(type_spec.element)]
          == ['x', 'y'] + [name for name, _, _ in constants.CLIENT_INPUT_FIELDS])


def _is_computation(value) -> bool:
  from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  return isinstance(value, (computation_pb2.Computation, computation_impl.ConcreteComputation))


def _data_type(type_spec) -> bool:
  """Only tensors, sequences, structs and federated values (no functions) inside."""
  from tensorflow_federated.python.core.impl.types import computation_types as ct  # pylint: disable=g-import-not-at-top
  if isinstance(type_spec, (ct.TensorType, ct.SequenceType)):
    return True
  if isinstance(type_spec, ct.StructType):
    return all(_data_type(t) for t in type_spec)
  if isinstance(type_spec, ct.FederatedType):
    return _data_type(type_spec.member)
  return False


def _tff_serialize(value, type_spec):
  if _tff_serialize_value is not None:
    return _tff_serialize_value(value, type_spec)
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  return value_serialization.serialize_value(value, type_spec)


def serialize_value(value, type_spec=None):
  """TFF's `value_serialization.serialize_value`, without copying nested messages."""
  if type_spec is None or _is_computation(value) or not _data_type(type_spec):
    return _tff_serialize(value, type_spec)
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top
  dest = executor_pb2.Value()
  _serialize_into(dest, value, type_spec)
  return dest, type_spec


def install_value_serialization() -> None:
  """Makes TFF's remote executors serialise values with `serialize_value` (idempotent)."""
  global _tff_serialize_value
  from tensorflow_federated.python.core.impl.executors import value_serialization  # pylint: disable=g-import-not-at-top
  if value_serialization.serialize_value is not serialize_value:
    _tff_serialize_value = value_serialization.serialize_value
    value_serialization.serialize_value = serialize_value


# The largest value TFF 0.87's runtime moves between Python and a worker: each value crosses
# in one gRPC message, and the worker refuses to send one above this ("Sent message larger
# than max"); Python's own channel allows 2e9.
MAX_VALUE_BYTES = 1_895_825_408


class ValueTooLargeError(ValueError):
  """A value (e.g. a server state) too large to cross between Python and TFF's worker."""


def value_bytes(type_spec) -> int:
  """Bytes of a value of TFF type `type_spec` (tensors only; placements are looked through).

  Computed from the type alone, before anything runs."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if isinstance(type_spec, tff.FederatedType):
    return value_bytes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(value_bytes(t) for _, t in tff.structure.iter_elements(type_spec))
  if isinstance(type_spec, tff.TensorType):
    return int(np.prod(type_spec.shape, dtype=np.int64)) * np.dtype(type_spec.dtype).itemsize
  return 0


def check_value_fits(type_spec, what: str, fixes: str) -> None:
  """Raises ValueTooLargeError (one line: '<what> is X GB, above ...; <fixes>') when a value
  of `type_spec` cannot cross between Python and TFF's worker (`MAX_VALUE_BYTES`)."""
  size = value_bytes(type_spec)
  if size > MAX_VALUE_BYTES:
    raise ValueTooLargeError(
        f'{what} is {size / 1e9:.2f} GB, above the {MAX_VALUE_BYTES / 1e9:.2f} GB a value can '
        f'have in TFF 0.87\'s runtime (it crosses to and from the worker as one gRPC message); '
        f'{fixes}')
