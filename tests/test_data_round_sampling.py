"""Tests for data.round_sampling: the fixed per-client input structure and seeded sampling."""

import collections

import numpy as np
import pytest

from tff_algos.data.round_sampling import client_input, round_inputs, sample_clients


class _FakeFederated:
  """Just what round_inputs needs (keeps these tests free of TF)."""

  def __init__(self, sizes):
    self._data = [(np.full([n, 3, 3, 1], i, np.float32), np.full([n], i, np.int32))
                  for i, n in enumerate(sizes)]

  @property
  def num_clients(self):
    return len(self._data)

  def client_arrays(self, n):
    return self._data[n]


def _is_permutation(row, n):
  return np.array_equal(np.sort(row), np.arange(n))


def test_client_input_structure():
  x = np.random.default_rng(0).random([17, 28, 28, 1]).astype(np.float32)
  y = np.arange(17, dtype=np.int64) % 10
  inp = client_input(x, y, epochs=3, rng=np.random.default_rng(5), index=42, slot=3)
  assert isinstance(inp, collections.OrderedDict)
  assert list(inp) == ['x', 'y', 'order', 'index', 'slot', 'work']
  assert inp['x'] is x and inp['x'].dtype == np.float32
  assert inp['y'].dtype == np.int32 and np.array_equal(inp['y'], y)
  assert inp['order'].shape == (3, 17) and inp['order'].dtype == np.int32
  assert all(_is_permutation(row, 17) for row in inp['order'])
  assert len({tuple(r) for r in inp['order']}) == 3  # independent per epoch
  assert inp['index'].dtype == np.int32 and inp['index'] == 42
  assert inp['slot'].dtype == np.int32 and inp['slot'] == 3


def test_client_input_tokens_and_empty():
  tokens = np.ones([4, 80], np.int32)
  inp = client_input(tokens, tokens, 2, np.random.default_rng(0), 0, 0)
  assert inp['x'].dtype == np.int32 and inp['y'].shape == (4, 80)
  empty = client_input(np.zeros([0, 8, 8, 1], np.float32), np.zeros([0], np.int32), 4,
                       np.random.default_rng(0), 1, 1)
  assert empty['order'].shape == (4, 0) and empty['order'].dtype == np.int32
  with pytest.raises(ValueError, match='inputs but'):
    client_input(np.zeros([3, 2]), np.zeros([2]), 1, np.random.default_rng(0), 0, 0)
  with pytest.raises(ValueError, match='epochs'):
    client_input(np.zeros([3, 2]), np.zeros([3]), -1, np.random.default_rng(0), 0, 0)


def test_client_input_is_deterministic_given_rng_seed():
  x, y = np.zeros([9, 2], np.float32), np.zeros([9], np.int32)
  a = client_input(x, y, 2, np.random.default_rng([1, 2]), 0, 0)['order']
  b = client_input(x, y, 2, np.random.default_rng([1, 2]), 0, 0)['order']
  c = client_input(x, y, 2, np.random.default_rng([1, 3]), 0, 0)['order']
  assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_sample_clients():
  s = sample_clients(100, 10, round_num=4, seed=0)
  assert s.dtype == np.int32 and s.shape == (10,)
  assert np.unique(s).size == 10 and s.min() >= 0 and s.max() < 100
  assert np.array_equal(s, sample_clients(100, 10, 4, 0))  # resume samples identically
  assert not np.array_equal(s, sample_clients(100, 10, 5, 0))
  assert not np.array_equal(s, sample_clients(100, 10, 4, 1))
  full = sample_clients(10, 10, 0, 0)
  assert sorted(full.tolist()) == list(range(10))
  assert full.tolist() != list(range(10))  # random order: position = slot
  with pytest.raises(ValueError, match='clients_per_round'):
    sample_clients(5, 6, 0, 0)


def test_sampling_is_uniform():
  hits = np.zeros(20)
  for t in range(2000):
    hits[sample_clients(20, 5, t, seed=9)] += 1
  assert np.all(np.abs(hits / 2000 - 0.25) < 0.04)


def test_round_inputs():
  fed = _FakeFederated([5, 0, 7, 3, 9, 4])
  ids, inputs = round_inputs(fed, round_num=2, clients_per_round=3, epochs=2, seed=11)
  assert np.array_equal(ids, sample_clients(6, 3, 2, 11))
  assert len(inputs) == 3
  for slot, (n, inp) in enumerate(zip(ids, inputs)):
    assert inp['index'] == n and inp['slot'] == slot
    x, y = fed.client_arrays(int(n))
    assert inp['x'] is x and np.array_equal(inp['y'], y)
    size = x.shape[0]
    assert inp['order'].shape == (2, size)
    expected = client_input(x, y, 2, np.random.default_rng([11, 2, int(n), 1]), n, slot)
    assert np.array_equal(inp['order'], expected['order'])
  ids2, inputs2 = round_inputs(fed, 2, 3, 2, 11)
  assert np.array_equal(ids, ids2)
  assert all(np.array_equal(a['order'], b['order']) for a, b in zip(inputs, inputs2))


def test_round_inputs_with_given_clients():
  fed = _FakeFederated([5, 0, 7, 3])
  ids, inputs = round_inputs(fed, 0, clients_per_round=None, epochs=1, seed=0,
                             client_ids=[3, 1])
  assert ids.tolist() == [3, 1] and ids.dtype == np.int32
  assert [int(i['slot']) for i in inputs] == [0, 1]
  assert inputs[1]['order'].shape == (1, 0)
  with pytest.raises(ValueError, match='in \\[0, 4\\)'):
    round_inputs(fed, 0, None, 1, 0, client_ids=[4])
  with pytest.raises(ValueError, match='distinct'):
    round_inputs(fed, 0, None, 1, 0, client_ids=[1, 1])


def test_client_input_is_the_element_type_the_processes_take():
  """The client input written here has the keys, dtypes and ranks of
  `local_training.client_element_type` (both from constants.CLIENT_INPUT_FIELDS)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos.client_work import local_training  # pylint: disable=g-import-not-at-top
  element = client_input(np.zeros((3, 4), np.float32), np.zeros(3, np.int64), 2,
                         np.random.default_rng(0), index=5, slot=1, work=0.5)
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  element_type = local_training.client_element_type(spec)
  names = tff.structure.name_list(element_type)
  assert list(element) == names
  for name in names:
    t = element_type[name]
    assert np.asarray(element[name]).dtype == t.dtype and np.ndim(element[name]) == len(t.shape)


def test_a_foreign_class_of_our_name_is_named_with_its_module():
  """Messages name a class with its module, so another `FederatedDataset` (e.g. a user's, or
  a second copy of ours imported under another name) does not read as ours."""

  class FederatedDataset:  # pylint: disable=missing-class-docstring
    pass

  with pytest.raises(TypeError) as info:
    round_inputs(FederatedDataset(), 0, 1, 1, 0)
  assert str(info.value).startswith(
      'round_inputs needs a data.FederatedDataset or data.ClientDataInputs, got '
      f'{__name__}.test_a_foreign_class_of_our_name_is_named_with_its_module.<locals>.'
      'FederatedDataset;')
  with pytest.raises(TypeError, match=r'got list;'):
    round_inputs([], 0, 1, 1, 0)
