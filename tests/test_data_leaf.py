"""Tests for data.leaf on LEAF JSON written here in LEAF's layout (train/ + test/, all_data/,
several files per split, malformed files)."""

import os

import numpy as np
import pytest

from tff_algos.data import leaf
from tff_algos.data.errors import DatasetFormatError, DatasetNotFoundError
from tests.helpers import leaf_femnist_user, leaf_shakespeare_users, write_leaf_json


def _one_line(err):
  text = str(err.value)
  assert '\n' not in text and len(text) > 20
  return text


def test_leaf_femnist_train_test(tmp_path):
  rng = np.random.default_rng(0)
  train = {'f_b': leaf_femnist_user(rng, 4), 'f_a': leaf_femnist_user(rng, 6)}
  test = {'f_b': leaf_femnist_user(rng, 2), 'f_a': leaf_femnist_user(rng, 1)}
  # Users spread over two files, as LEAF writes them.
  write_leaf_json(str(tmp_path / 'train' / 'all_data_0_niid_train.json'), {'f_b': train['f_b']})
  write_leaf_json(str(tmp_path / 'train' / 'all_data_1_niid_train.json'), {'f_a': train['f_a']})
  write_leaf_json(str(tmp_path / 'test' / 'all_data_0_niid_test.json'), test)
  fed = leaf.load_leaf(str(tmp_path), 'femnist')
  assert fed.name == 'femnist_leaf' and fed.num_classes == 62
  assert fed.info['client_names'] == ['f_a', 'f_b']
  x, y = fed.client_arrays(0)
  assert x.shape == (6, 28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int32
  np.testing.assert_allclose(x.reshape(6, 784), np.array(train['f_a']['x'], np.float32))
  np.testing.assert_array_equal(y, train['f_a']['y'])
  assert fed.x_test.shape == (3, 28, 28, 1)
  np.testing.assert_array_equal(fed.y_test, test['f_a']['y'] + test['f_b']['y'])
  one = leaf.load_leaf(str(tmp_path), 'femnist', max_clients=1)
  assert one.num_clients == 1 and one.y_test.shape == (1,)
  # Each client's own test data (per-client evaluation), in client order.
  for n, user in enumerate(['f_a', 'f_b']):
    cx, cy = fed.client_test[n]
    np.testing.assert_allclose(cx.reshape(-1, 784), np.array(test[user]['x'], np.float32))
    np.testing.assert_array_equal(cy, test[user]['y'])


def test_leaf_client_test_is_each_users_own_test_data(tmp_path):
  # A training user without test data gets an empty one; a test-only user (LEAF's user
  # split) is in the central test set but no client's.
  rng = np.random.default_rng(1)
  train = {'a': leaf_femnist_user(rng, 3), 'b': leaf_femnist_user(rng, 4), 'c': leaf_femnist_user(rng, 2)}
  test = {'c': leaf_femnist_user(rng, 2), 'a': leaf_femnist_user(rng, 1), 'z': leaf_femnist_user(rng, 5)}
  write_leaf_json(str(tmp_path / 'train' / 'tr.json'), train)
  write_leaf_json(str(tmp_path / 'test' / 'te.json'), test)
  fed = leaf.load_leaf(str(tmp_path), 'femnist')
  assert [len(y) for _, y in fed.client_test] == [1, 0, 2]
  np.testing.assert_array_equal(fed.client_test[0][1], test['a']['y'])
  np.testing.assert_array_equal(fed.client_test[2][1], test['c']['y'])
  assert fed.client_test[1][0].shape == (0, 28, 28, 1)
  np.testing.assert_array_equal(fed.y_test, test['a']['y'] + test['c']['y'] + test['z']['y'])


def test_leaf_all_data_split(tmp_path):
  rng = np.random.default_rng(1)
  users = {f'u{i}': leaf_femnist_user(rng, n) for i, n in enumerate([10, 5, 1, 2])}
  write_leaf_json(str(tmp_path / 'all_data' / 'all_data_0.json'), users)
  a = leaf.load_leaf(str(tmp_path), 'femnist', seed=3)
  b = leaf.load_leaf(str(tmp_path), 'femnist', seed=3)
  c = leaf.load_leaf(str(tmp_path), 'femnist', seed=4)
  assert a.client_sizes().tolist() == [8, 4, 1, 1]  # 80% (at least one) per user
  assert a.y_test.shape == (4,)  # 2 + 1 + 0 + 1
  np.testing.assert_array_equal(a.client_arrays(0)[0], b.client_arrays(0)[0])
  assert not np.array_equal(a.client_arrays(0)[0], c.client_arrays(0)[0])
  # Train and test of a user are disjoint and together are the user's data.
  x0, _ = a.client_arrays(0)
  all_rows = {tuple(r) for r in np.array(users['u0']['x'], np.float32)}
  train_rows = {tuple(r) for r in x0.reshape(-1, 784)}
  test_rows = {tuple(r) for r in a.x_test.reshape(-1, 784)} & all_rows
  assert train_rows | test_rows == all_rows and not train_rows & test_rows
  # leaf/data/<dataset> (parent of data/) is accepted too.
  os.rename(tmp_path / 'all_data', tmp_path / 'data')
  os.makedirs(tmp_path / 'data' / 'all_data')
  os.rename(tmp_path / 'data' / 'all_data_0.json', tmp_path / 'data' / 'all_data' / 'x.json')
  assert leaf.load_leaf(str(tmp_path), 'femnist', seed=3).num_clients == 4


def test_leaf_shakespeare(tmp_path):
  line = 'Whether tis nobler in the mind to suffer the slings and arrows of outrageous for'
  assert len(line) == 80
  odd = 'x' * 79 + '\u00e9'  # a character outside LEAF's alphabet
  train = {'HAMLET': {'x': [line, odd], 'y': ['u', '!']}}
  test = {'HAMLET': {'x': [line], 'y': ['z']}}
  write_leaf_json(str(tmp_path / 'train' / 'a.json'), train)
  write_leaf_json(str(tmp_path / 'test' / 'a.json'), test)
  fed = leaf.load_leaf(str(tmp_path), 'shakespeare')
  letters = leaf.LEAF_LETTERS
  assert len(letters) == 80 and letters[0] == '\n' and letters[1] == ' '
  assert fed.num_classes == 81 == fed.info['vocab_size']
  x, y = fed.client_arrays(0)
  assert x.shape == (2, 80) and x.dtype == np.int32 and y.tolist() == [letters.index('u'),
                                                                        letters.index('!')]
  assert ''.join(letters[i] for i in x[0]) == line
  assert x[1, -1] == 80  # OOV id
  assert fed.y_test.tolist() == [letters.index('z')]
  write_leaf_json(str(tmp_path / 'train' / 'a.json'), {'H': {'x': ['short'], 'y': ['a']}})
  with pytest.raises(ValueError, match='80 characters'):
    leaf.load_leaf(str(tmp_path), 'shakespeare')


def test_leaf_sent140(tmp_path):
  def rec(text):
    return ['1467810369', 'Mon Apr 06 22:19:45 PDT 2009', 'NO_QUERY', 'someone', text]
  train = {
      'alice': {'x': [rec('I love this so much'), rec('love love it')], 'y': [1, 1]},
      'bob': {'x': [rec('this is awful ' + 'word ' * 40)], 'y': [0]},
  }
  test = {'alice': {'x': [rec('Love unseenword')], 'y': [1]}, 'bob': {'x': [], 'y': []}}
  write_leaf_json(str(tmp_path / 'train' / 'a.json'), train)
  write_leaf_json(str(tmp_path / 'test' / 'a.json'), test)
  fed = leaf.load_leaf(str(tmp_path), 'sent140')
  vocab = fed.info['vocab']
  assert vocab[:2] == ['word', 'love']  # by frequency (40, 4)
  assert fed.num_classes == 2 and fed.info['vocab_size'] == len(vocab) + 2
  x, y = fed.client_arrays(0)
  assert x.shape == (2, 25) and x.dtype == np.int32 and y.tolist() == [1, 1]
  ids = {w: i + 2 for i, w in enumerate(vocab)}
  assert x[1].tolist() == [ids['love'], ids['love'], ids['it']] + [0] * 22
  xb, yb = fed.client_arrays(1)
  assert xb.shape == (1, 25) and np.all(xb > 0) and yb.tolist() == [0]  # truncated to 25
  assert fed.x_test[0, :3].tolist() == [ids['love'], 1, 0]  # lower-cased; OOV = 1
  small = leaf.load_leaf(str(tmp_path), 'sent140', max_vocab=1)
  assert small.info['vocab'] == ['word']


def test_leaf_user_split_keeps_held_out_test_users(tmp_path):
  """LEAF's `-t user` split: test/ holds other users than train/; all of them are tested."""
  train = leaf_shakespeare_users(['ROMEO', 'JULIET'], 3)
  test = leaf_shakespeare_users(['HAMLET', 'OPHELIA'], 2, start=100)
  write_leaf_json(str(tmp_path / 'train' / 'a.json'), train)
  write_leaf_json(str(tmp_path / 'test' / 'a.json'), test)
  fed = leaf.load_leaf(str(tmp_path), 'shakespeare')
  assert fed.info['client_names'] == ['JULIET', 'ROMEO']
  assert fed.info['test_users'] == ['HAMLET', 'OPHELIA']
  expected = leaf._encode_leaf_targets(test['HAMLET']['y'] + test['OPHELIA']['y'])  # pylint: disable=protected-access
  np.testing.assert_array_equal(fed.y_test, expected)
  assert fed.x_test.shape == (4, 80)
  # Sample split (same users in both): only the kept clients' test data.
  write_leaf_json(str(tmp_path / 'test' / 'a.json'), leaf_shakespeare_users(['ROMEO', 'JULIET'], 1))
  one = leaf.load_leaf(str(tmp_path), 'shakespeare', max_clients=1)
  assert one.info['test_users'] == ['JULIET'] and one.y_test.shape == (1,)


@pytest.mark.parametrize('content, fragment', [
    ('{"users": ["a"], "user_data": {"a": {"x": [[0.5]', 'not valid JSON'),
    ('{"users": ["a"], "num_samples": [1]}', 'no "user_data"'),
    ('{"user_data": {"a": {"x": [[0.5]], "y": [1, 2]}}}', 'equally long "x" and "y"'),
    ('{"user_data": {"a": {"x": [[0.5, 0.5]], "y": [1]}}}', '784 pixels'),
    ('{"user_data": {"a": {"x": [[0.5]], "y": ["b"]}}}', 'labels'),
])
def test_leaf_bad_files_raise_one_line_format_errors(tmp_path, content, fragment):
  for split in ('train', 'test'):
    os.makedirs(tmp_path / split)
    (tmp_path / split / 'a.json').write_text(content)
  with pytest.raises(DatasetFormatError) as err:
    leaf.load_leaf(str(tmp_path), 'femnist')
  text = _one_line(err)
  assert fragment in text and str(tmp_path) in text, text


def test_leaf_missing(tmp_path):
  with pytest.raises(DatasetNotFoundError) as err:
    leaf.load_leaf(str(tmp_path), 'femnist')
  text = _one_line(err)
  assert 'all_data/*.json' in text and 'preprocess.sh' in text
  os.makedirs(tmp_path / 'train')
  (tmp_path / 'train' / 'a.json').write_text('{}')
  os.makedirs(tmp_path / 'test')
  (tmp_path / 'test' / 'a.json').write_text('{}')
  with pytest.raises(ValueError, match='not a LEAF JSON'):
    leaf.load_leaf(str(tmp_path), 'femnist')
  with pytest.raises(ValueError, match='valid: femnist, shakespeare, sent140'):
    leaf.load_leaf(str(tmp_path), 'celeba')
