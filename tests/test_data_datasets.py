"""Tests for data.datasets: ArrayClientData as a real TFF ClientData, federate()."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.data.datasets import (
    ArrayClientData, ArrayDataset, FederatedDataset, federate, hold_out_client_test)
from tff_algos.data.partitioners import ClusterSkewPartitioner, DirichletPartitioner, IidPartitioner


def _central(n_train=400, n_test=50):
  rng = np.random.default_rng(0)
  return ArrayDataset(
      name='toy',
      x_train=rng.random([n_train, 8, 8, 1]).astype(np.float32),
      y_train=(np.arange(n_train) % 10).astype(np.int32),
      x_test=rng.random([n_test, 8, 8, 1]).astype(np.float32),
      y_test=(np.arange(n_test) % 10).astype(np.int32),
      num_classes=10,
  )


def test_array_dataset_validates():
  ds = _central()
  assert ds.input_shape == (8, 8, 1)
  with pytest.raises(ValueError, match='int32'):
    ArrayDataset('bad', ds.x_train, ds.y_train.astype(np.int64), ds.x_test, ds.y_test, 10)
  with pytest.raises(ValueError, match='inputs but'):
    ArrayDataset('bad', ds.x_train, ds.y_train[:-1], ds.x_test, ds.y_test, 10)


def test_client_data_is_a_tff_client_data():
  ds = _central()
  part = DirichletPartitioner(num_clients=12, alpha=0.5, seed=0, min_size=2).partition(ds.y_train)
  cd = ArrayClientData.from_partition(ds.x_train, ds.y_train, part)
  assert isinstance(cd, tff.simulation.datasets.ClientData)
  assert cd.client_ids == [str(i) for i in range(12)]
  spec = cd.element_type_structure
  assert list(spec) == ['x', 'y']
  assert spec['x'] == tf.TensorSpec([8, 8, 1], tf.float32)
  assert spec['y'] == tf.TensorSpec([], tf.int32)
  for n in (0, 5, 11):
    x, y = cd.arrays(str(n))
    idx = part.client_indices[n]
    assert np.array_equal(x, ds.x_train[idx]) and np.array_equal(y, ds.y_train[idx])
    assert cd.arrays(n)[0] is x  # int index accepted, no copy
    elements = list(cd.create_tf_dataset_for_client(str(n)).as_numpy_iterator())
    assert len(elements) == idx.size
    assert isinstance(elements[0], collections.OrderedDict)
    assert np.array_equal(np.stack([e['y'] for e in elements]), y)
  assert cd.sizes().tolist() == part.sizes().tolist()
  with pytest.raises(ValueError, match='not a client'):
    cd.arrays('12')
  with pytest.raises(ValueError, match='not a client'):
    cd.create_tf_dataset_for_client('03')


def test_serializable_dataset_fn_traces_in_tf_function():
  ds = _central(100)
  part = IidPartitioner(num_clients=4, seed=0).partition(ds.y_train)
  cd = ArrayClientData.from_partition(ds.x_train, ds.y_train, part)
  fn = cd.serializable_dataset_fn

  @tf.function
  def label_sum(client_id):
    return fn(client_id).reduce(tf.constant(0), lambda s, e: s + e['y'])

  for n in range(4):
    assert int(label_sum(tf.constant(str(n)))) == int(cd.arrays(n)[1].sum())
  everything = list(cd.create_tf_dataset_from_all_clients(seed=0).as_numpy_iterator())
  assert len(everything) == 100
  assert sorted(int(e['y']) for e in everything) == sorted(ds.y_train.tolist())


def test_client_data_validation():
  x, y = np.zeros([3, 2], np.float32), np.zeros([3], np.int32)
  with pytest.raises(ValueError, match='"0".."1"'):
    ArrayClientData({'0': (x, y), 'a': (x, y)})
  with pytest.raises(ValueError, match='share element shapes'):
    ArrayClientData({'0': (x, y), '1': (np.zeros([3, 5], np.float32), y)})
  with pytest.raises(ValueError, match='at least one'):
    ArrayClientData({})
  empty = ArrayClientData({'0': (x, y), '1': (x[:0], y[:0])})
  assert empty.sizes().tolist() == [3, 0]
  assert list(empty.create_tf_dataset_for_client('1')) == []


def test_federate():
  ds = _central()
  fed = federate(ds, ClusterSkewPartitioner(num_clients=10, layout='mc', seed=0))
  assert isinstance(fed, FederatedDataset)
  assert fed.num_clients == 10 and fed.num_classes == 10 and fed.name == 'toy'
  assert fed.x_test is ds.x_test
  assert np.array_equal(fed.true_clusters, fed.partition.true_clusters)
  x, y = fed.client_arrays(3)
  assert np.array_equal(x, ds.x_train[fed.partition.client_indices[3]])
  assert set(np.unique(y).tolist()) == {2 * fed.true_clusters[3], 2 * fed.true_clusters[3] + 1}
  assert fed.client_sizes().sum() == fed.partition.all_indices().size


def _numbered_clients(sizes):
  """A FederatedDataset whose example ids (0, 1, ...) are their x values and labels."""
  starts = np.concatenate([[0], np.cumsum(sizes)])
  clients = {str(n): (np.arange(a, a + s, dtype=np.float32).reshape(s, 1),
                      np.arange(a, a + s, dtype=np.int32))
             for n, (a, s) in enumerate(zip(starts, sizes))}
  return FederatedDataset(name='numbered', client_data=ArrayClientData(clients),
                          x_test=np.zeros([1, 1], np.float32), y_test=np.zeros([1], np.int32),
                          num_classes=10)


# (fraction, client size) -> examples held out: fraction x size rounded half up, at least one
# from a client of 2 or more, never all of them; clients of 0 or 1 keep theirs for training.
HELD_OUT = {(0.2, 0): 0, (0.2, 1): 0, (0.2, 2): 1, (0.2, 3): 1, (0.2, 10): 2, (0.2, 57): 11,
            (0.5, 3): 2, (0.5, 5): 3, (0.9, 2): 1, (0.9, 10): 9, (0.01, 40): 1}


@pytest.mark.parametrize('fraction', sorted({f for f, _ in HELD_OUT}))
def test_hold_out_client_test_is_seeded_disjoint_and_of_the_right_size(fraction):
  sizes = [n for f, n in HELD_OUT if f == fraction]
  fed = _numbered_clients(sizes)
  split = hold_out_client_test(fed, fraction, seed=3)
  assert split.x_test is fed.x_test and split.num_clients == fed.num_clients
  for n, size in enumerate(sizes):
    original = fed.client_arrays(n)[1]
    train_x, train_y = split.client_arrays(n)
    test_x, test_y = split.client_test[n]
    assert len(test_y) == HELD_OUT[(fraction, size)], (fraction, size)
    # Disjoint, together the client's examples, each part in the original order, x with its y.
    assert not set(train_y) & set(test_y)
    assert sorted([*train_y, *test_y]) == list(original)
    assert list(train_y) == sorted(train_y) and list(test_y) == sorted(test_y)
    np.testing.assert_array_equal(train_x[:, 0], train_y)
    np.testing.assert_array_equal(test_x[:, 0], test_y)
  again = hold_out_client_test(fed, fraction, seed=3)
  for n in range(len(sizes)):
    np.testing.assert_array_equal(again.client_test[n][1], split.client_test[n][1])


def test_hold_out_client_test_depends_on_the_seed_and_refuses_existing_test_data():
  fed = _numbered_clients([50, 50])
  a, b = (hold_out_client_test(fed, 0.2, seed=s) for s in (0, 1))
  assert list(a.client_test[0][1]) != list(b.client_test[0][1])
  # Each client its own stream: two equal-sized clients do not hold out the same positions.
  assert list(a.client_test[0][1]) != [i - 50 for i in a.client_test[1][1]]
  with pytest.raises(ValueError, match='already has per-client test data'):
    hold_out_client_test(a, 0.2, seed=0)
  with pytest.raises(ValueError, match=r'fraction must be in \(0, 1\)'):
    hold_out_client_test(fed, 1.0, seed=0)
