"""`execution.serialize_value` writes exactly the message TFF's own `serialize_value` builds.

TFF 0.87 copies every nested sub-message into its parent; ours writes each part in place
(tff_algos/runtime/serialization.py). Compared on random nested values of every kind a round
sends: tensors of several dtypes and shapes (scalars and strings go through TFF's own path),
named and unnamed structs, server and client placements, client datasets; and on the errors
TFF raises for values that do not match their type.
"""

import collections
import contextlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.executors import value_serialization

from tff_algos import execution
from tff_algos.runtime import serialization

DTYPES = (np.float32, np.float64, np.int32, np.int64, np.bool_)


@pytest.fixture(scope='module', autouse=True)
def installed():
  execution.initialize_runtime()
  assert value_serialization.serialize_value is execution.serialize_value


@contextlib.contextmanager
def tff_own_serializer():
  """TFF's function, recursing into itself (not into ours) for nested values."""
  ours = value_serialization.serialize_value
  value_serialization.serialize_value = serialization._tff_serialize_value  # pylint: disable=protected-access
  try:
    yield value_serialization.serialize_value
  finally:
    value_serialization.serialize_value = ours


def random_tensor(rng):
  """(value, type): arrays of any dtype and rank (some empty), scalars, strings, lists."""
  kind = rng.integers(6)
  dtype = DTYPES[rng.integers(len(DTYPES))]
  if kind == 0:
    return dtype(rng.integers(5)), tff.TensorType(dtype)
  if kind == 1:
    return 'text', tff.TensorType(np.str_)
  if kind == 2:
    return [1.5, 2.5], tff.TensorType(np.float32, [2])
  shape = tuple(int(d) for d in rng.integers(0, 4, size=rng.integers(1, 4)))
  value = (rng.random(shape) * 10).astype(dtype)
  declared = [None if rng.random() < 0.2 else d for d in shape]  # some unknown dims
  return value, tff.TensorType(dtype, declared)


def random_struct(rng, depth):
  n = int(rng.integers(0, 4))
  named = rng.random() < 0.6
  values, types = [], []
  for _ in range(n):
    v, t = random_value(rng, depth + 1)
    values.append(v)
    types.append(t)
  if named:
    names = [f'f{i}' for i in range(n)]
    return (collections.OrderedDict(zip(names, values)),
            tff.StructType(list(zip(names, types))))
  return list(values), tff.StructType(types)


def random_value(rng, depth=0):
  if depth < 3 and rng.random() < 0.5:
    return random_struct(rng, depth)
  return random_tensor(rng)


def without_dataset_graphs(message):
  """A copy with each dataset's serialized graph cleared: TFF writes the same dataset's
  graph differently on every call (its own function, twice, gives different bytes), and
  both sides serialise datasets with TFF's function."""
  message = type(message).FromString(message.SerializeToString())
  stack = [message]
  while stack:
    m = stack.pop()
    kind = m.WhichOneof('value')
    if kind == 'sequence':
      assert m.sequence.serialized_graph_def
      m.sequence.ClearField('serialized_graph_def')
    elif kind == 'struct':
      stack.extend(e.value for e in m.struct.element)
    elif kind == 'federated':
      stack.extend(m.federated.value)
  return message


def assert_same_message(value, type_spec):
  with tff_own_serializer() as theirs:
    want, want_type = theirs(value, type_spec)
  got, got_type = execution.serialize_value(value, type_spec)
  got, want = without_dataset_graphs(got), without_dataset_graphs(want)
  assert got == want
  assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
  assert got_type == want_type


@pytest.mark.parametrize('seed', range(40))
def test_random_nested_values_serialize_as_tff_does(seed):
  rng = np.random.default_rng(seed)
  value, type_spec = random_value(rng)
  assert_same_message(value, type_spec)
  assert_same_message(value, tff.FederatedType(type_spec, tff.SERVER))
  # CLIENTS: a list of members of one type (the generator with one seed, three times).
  same = [random_value(np.random.default_rng([seed, 2])) for _ in range(3)]
  assert_same_message([v for v, _ in same], tff.FederatedType(same[0][1], tff.CLIENTS))


def test_a_round_argument_with_client_datasets_and_a_large_state():
  state = collections.OrderedDict(
      model=[np.random.default_rng(0).random((300, 200), dtype=np.float32)],
      cache=np.random.default_rng(1).random((5, 3, 1000), dtype=np.float32),
      round_num=np.int32(4))
  state_type = tff.StructType([
      ('model', [tff.TensorType(np.float32, [300, 200])]),
      ('cache', tff.TensorType(np.float32, [5, 3, 1000])),
      ('round_num', tff.TensorType(np.int32))])
  element = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                    y=tf.TensorSpec([None], tf.int32))
  datasets = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.full((n, 2), n, np.float32), y=np.arange(n, dtype=np.int32))).batch(2)
              for n in (3, 4)]
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element))
  assert_same_message(
      [state, datasets],
      tff.StructType([tff.FederatedType(state_type, tff.SERVER),
                      tff.FederatedType(data_type, tff.CLIENTS)]))


@pytest.mark.parametrize('value, type_spec', [
    (np.zeros([2, 3], np.float32), tff.TensorType(np.float32, [3, 2])),   # shape
    (np.zeros([2], np.float64), tff.TensorType(np.int32, [2])),           # dtype
    ([np.zeros([2], np.float32)], tff.StructType([tff.TensorType(np.float32, [2])] * 2)),
])
def test_mismatched_values_raise_tffs_error(value, type_spec):
  with tff_own_serializer() as theirs, pytest.raises(TypeError) as want:
    theirs(value, type_spec)
  with pytest.raises(TypeError) as got:
    execution.serialize_value(value, type_spec)
  assert str(got.value) == str(want.value)


def test_a_process_round_is_unchanged_by_the_serializer():
  """The same FedAvg round through TFF's serializer and through ours: identical weights."""
  from tff_algos import baselines, models  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  ds = data.load_digits()
  model_fn = models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
  process = baselines.build_fedavg(model_fn, tff.learning.optimizers.build_sgdm(0.1), 16)
  inputs = [[data.client_input(ds.x_train[i * 30:(i + 1) * 30], ds.y_train[i * 30:(i + 1) * 30],
                               1, np.random.default_rng(i), i, i)] for i in range(2)]
  ours = process.next(process.initialize(), inputs).state
  with tff_own_serializer():
    theirs = process.next(process.initialize(), inputs).state
  for a, b in zip(process.get_model_weights(ours).trainable,
                  process.get_model_weights(theirs).trainable):
    np.testing.assert_array_equal(a, b)
