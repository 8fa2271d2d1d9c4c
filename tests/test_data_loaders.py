"""Tests for data.loaders on files written here in the real formats.

IDX (gzip'd and raw), tensorflow-datasets (a really prepared dataset whose
download step is patched to local IDX files, and tfds.testing.mock_data),
TFF's SQLite schema (checked against TFF's own parsing/preprocessing), and the
registry (LEAF JSON: tests/test_data_leaf.py). Network access fails loudly in every test.
"""

import collections
import gzip
import json
import os
import socket
import subprocess
import sqlite3
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.data import loaders
from tff_algos.data.datasets import ArrayDataset, FederatedDataset
from tff_algos.data.errors import DatasetFormatError, DatasetNotFoundError
from tests.helpers import leaf_femnist_user, write_leaf_json


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('a loader tried to use the network')
  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(socket, 'create_connection', refuse)


def _one_line(err):
  text = str(err.value)
  assert '\n' not in text and len(text) > 20
  return text


# --------------------------------------------------------------------------- #
# IDX / Fashion-MNIST
# --------------------------------------------------------------------------- #


def write_idx(path, array, code=0x08, compress=False):
  array = np.asarray(array)
  dtype = {0x08: 'u1', 0x09: 'i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}[code]
  payload = (bytes([0, 0, code, array.ndim]) + np.array(array.shape, '>u4').tobytes()
             + array.astype(dtype).tobytes())
  opener = gzip.open if compress else open
  with opener(path, 'wb') as f:
    f.write(payload)
  return str(path)


def write_fashion_dir(directory, n_train=30, n_test=10, compress=True, seed=0):
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  arrays = {
      'train-images-idx3-ubyte': rng.integers(0, 256, [n_train, 28, 28]),
      'train-labels-idx1-ubyte': np.arange(n_train) % 10,
      't10k-images-idx3-ubyte': rng.integers(0, 256, [n_test, 28, 28]),
      't10k-labels-idx1-ubyte': (np.arange(n_test) * 3) % 10,
  }
  for name, arr in arrays.items():
    write_idx(os.path.join(directory, name + ('.gz' if compress else '')), arr,
              compress=compress)
  return arrays


@pytest.mark.parametrize('code,values', [
    (0x08, np.arange(24).reshape(2, 3, 4)),
    (0x09, np.array([-3, 0, 5])),
    (0x0B, np.array([[-300, 2], [7, 32000]])),
    (0x0C, np.array([1, -2, 70000])),
    (0x0D, np.array([0.5, -1.25])),
    (0x0E, np.array([[1e-9], [3.0]])),
])
@pytest.mark.parametrize('compress', [False, True])
def test_read_idx(tmp_path, code, values, compress):
  path = write_idx(tmp_path / 'a.idx', values, code, compress)
  out = loaders.read_idx(path)
  assert out.shape == values.shape
  assert out.dtype.byteorder in ('=', '|')  # native order for downstream math
  np.testing.assert_array_equal(out, values)


def test_read_idx_rejects_corrupt_files(tmp_path):
  good = write_idx(tmp_path / 'x', np.zeros([4, 5]), compress=False)
  with open(good, 'rb') as f:
    raw = f.read()
  (tmp_path / 'trunc').write_bytes(raw[:-3])
  with pytest.raises(ValueError, match='payload'):
    loaders.read_idx(str(tmp_path / 'trunc'))
  (tmp_path / 'magic').write_bytes(b'\x01\x02' + raw[2:])
  with pytest.raises(ValueError, match='magic'):
    loaders.read_idx(str(tmp_path / 'magic'))
  (tmp_path / 'type').write_bytes(raw[:2] + b'\x07' + raw[3:])
  with pytest.raises(ValueError, match='type code'):
    loaders.read_idx(str(tmp_path / 'type'))


@pytest.mark.parametrize('compress', [True, False])
def test_load_fashion_mnist_from_idx(tmp_path, compress):
  arrays = write_fashion_dir(tmp_path, compress=compress)
  ds = loaders.load_fashion_mnist(str(tmp_path))
  assert isinstance(ds, ArrayDataset) and ds.name == 'fashion_mnist' and ds.num_classes == 10
  assert ds.x_train.shape == (30, 28, 28, 1) and ds.x_train.dtype == np.float32
  assert ds.x_test.shape == (10, 28, 28, 1)
  assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
  np.testing.assert_allclose(ds.x_train[..., 0] * 255.0, arrays['train-images-idx3-ubyte'],
                             atol=1e-3)
  np.testing.assert_array_equal(ds.y_test, arrays['t10k-labels-idx1-ubyte'])
  assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0


def test_fashion_mnist_missing_files(tmp_path):
  with pytest.raises(DatasetNotFoundError) as err:
    loaders.load_fashion_mnist(str(tmp_path / 'nowhere'))
  text = _one_line(err)
  assert 'apt-get install dataset-fashion-mnist' in text and 'nowhere' in text
  assert isinstance(err.value, FileNotFoundError)
  write_fashion_dir(tmp_path)
  os.remove(tmp_path / 't10k-labels-idx1-ubyte.gz')
  with pytest.raises(DatasetNotFoundError, match='missing t10k-labels-idx1-ubyte'):
    loaders.load_fashion_mnist(str(tmp_path))


def test_fashion_mnist_inconsistent_files(tmp_path):
  write_fashion_dir(tmp_path)
  write_idx(tmp_path / 'train-labels-idx1-ubyte.gz', np.zeros(7), compress=True)
  with pytest.raises(ValueError, match='disagree'):
    loaders.load_fashion_mnist(str(tmp_path))


@pytest.mark.skipif(not os.path.isdir(loaders.FASHION_MNIST_DIR),
                    reason='Debian dataset-fashion-mnist not installed')
def test_real_fashion_mnist_package():
  ds = loaders.load_dataset('fashion_mnist')
  assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
  assert np.bincount(ds.y_train).tolist() == [6000] * 10


# --------------------------------------------------------------------------- #
# digits
# --------------------------------------------------------------------------- #


def test_load_digits():
  ds = loaders.load_digits()
  assert ds.x_train.shape == (1437, 8, 8, 1) and ds.x_test.shape == (360, 8, 8, 1)
  assert ds.x_train.dtype == np.float32 and ds.x_train.max() == 1.0 and ds.x_train.min() == 0.0
  assert ds.y_train.dtype == np.int32 and ds.num_classes == 10
  assert np.all(np.bincount(ds.y_test) >= 35)  # stratified
  again = loaders.load_digits()
  np.testing.assert_array_equal(ds.y_test, again.y_test)
  np.testing.assert_array_equal(ds.x_train, again.x_train)
  assert not np.array_equal(loaders.load_digits(seed=1).y_test, ds.y_test)


# --------------------------------------------------------------------------- #
# tensorflow-datasets
# --------------------------------------------------------------------------- #


def test_tfds_really_prepared_mnist(tmp_path):
  """tfds's own MNIST builder prepares real TFRecords from local IDX files
  (only its download step is patched), then load_tfds reads them unpatched."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.image_classification import mnist as tfds_mnist

  rng = np.random.default_rng(0)
  files, images = {}, {}
  for split, n in (('train', 20), ('test', 8)):
    images[split] = rng.integers(0, 256, [n, 28, 28])
    files[f'{split}_data'] = write_idx(tmp_path / f'{split}-images', images[split])
    files[f'{split}_labels'] = write_idx(tmp_path / f'{split}-labels', np.arange(n) % 10)
  data_dir = str(tmp_path / 'tfds')
  with mock.patch.object(tfds_mnist, '_TRAIN_EXAMPLES', 20), \
      mock.patch.object(tfds_mnist, '_TEST_EXAMPLES', 8), \
      mock.patch.object(tfds.download.DownloadManager, 'download_and_extract',
                        lambda self, urls: files):
    tfds.builder('mnist', data_dir=data_dir).download_and_prepare()

  ds = loaders.load_tfds('mnist', data_dir)
  assert ds.x_train.shape == (20, 28, 28, 1) and ds.x_test.shape == (8, 28, 28, 1)
  assert ds.num_classes == 10 and ds.y_train.dtype == np.int32
  # tfds shuffles on write: compare as sets of (image, label) rows.
  got = sorted((int(round(x.sum() * 255)), int(y)) for x, y in zip(ds.x_train, ds.y_train))
  want = sorted((int(x.sum()), i % 10) for i, x in enumerate(images['train']))
  assert got == want
  via_registry = loaders.load_dataset('mnist', data_dir=data_dir)
  np.testing.assert_array_equal(np.sort(via_registry.y_test), np.sort(ds.y_test))


@pytest.mark.parametrize('name,shape,classes', [
    ('mnist', (28, 28, 1), 10),
    ('cifar10', (32, 32, 3), 10),
    ('cifar100', (32, 32, 3), 100),
    ('emnist', (28, 28, 1), 47),
])
def test_tfds_mock_data(tmp_path, name, shape, classes):
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=6):
    ds = loaders.load_tfds(name, str(tmp_path))
  assert ds.x_train.shape == (6,) + shape and ds.x_test.shape == (6,) + shape
  assert ds.x_train.dtype == np.float32 and 0.0 <= ds.x_train.min() <= ds.x_train.max() <= 1.0
  assert ds.num_classes == classes and ds.y_train.dtype == np.int32
  assert ds.y_train.max() < classes


def test_tfds_not_prepared(tmp_path):
  with pytest.raises(DatasetNotFoundError) as err:
    loaders.load_tfds('cifar10', str(tmp_path))
  text = _one_line(err)
  assert 'tfds build cifar10' in text and str(tmp_path) in text
  with pytest.raises(ValueError, match='unknown tensorflow-datasets name'):
    loaders.load_tfds('no_such_dataset_xyz', str(tmp_path))


# --------------------------------------------------------------------------- #
# TFF SQLite (emnist_all.sqlite, shakespeare.sqlite)
# --------------------------------------------------------------------------- #

# Exactly the tables TFF's sql_client_data_utils.save_to_sql_client_data creates.
_SCHEMA = (
    'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
    'serialized_example_proto BLOB NOT NULL);',
    'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
    'num_examples INTEGER NOT NULL);',
)


def write_sqlite(path, rows):
  """rows: iterable of (split_name, client_id, serialized proto bytes)."""
  counts = collections.Counter((split, cid) for split, cid, _ in rows)
  with sqlite3.connect(str(path)) as con:
    for q in _SCHEMA:
      con.execute(q)
    con.executemany('INSERT INTO examples VALUES (?, ?, ?)', rows)
    con.executemany('INSERT INTO client_metadata VALUES (?, ?, ?)',
                    [(cid, split, n) for (split, cid), n in counts.items()])
  return str(path)


def emnist_example(pixels, label):
  return tf.train.Example(features=tf.train.Features(feature={
      'pixels': tf.train.Feature(float_list=tf.train.FloatList(value=pixels.reshape(-1))),
      'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
  })).SerializeToString()


def snippet_example(text):
  return tf.train.Example(features=tf.train.Features(feature={
      'snippets': tf.train.Feature(bytes_list=tf.train.BytesList(value=[text])),
  })).SerializeToString()


@pytest.fixture(scope='module')
def emnist_sqlite(tmp_path_factory):
  directory = tmp_path_factory.mktemp('tff_emnist')
  rng = np.random.default_rng(0)
  rows, truth = [], collections.defaultdict(list)
  writers = ['f0003_12', 'f0001_40', 'f0002_07']  # deliberately unsorted
  for w, writer in enumerate(writers):
    for split, n in (('train', 3 + w), ('test', 2)):
      for i in range(n):
        pixels = rng.random([28, 28]).astype(np.float32)
        label = (7 * w + i) % 62
        rows.append((f'all_{split}', writer, emnist_example(pixels, label)))
        truth[(f'all_{split}', writer)].append((pixels, label))
        if label < 10:
          rows.append((f'digits_only_{split}', writer, emnist_example(pixels, label)))
          truth[(f'digits_only_{split}', writer)].append((pixels, label))
  rng.shuffle(rows)  # storage order must not matter
  write_sqlite(directory / 'emnist_all.sqlite', rows)
  return str(directory), truth


def test_tff_emnist_matches_tff_parsing(emnist_sqlite):
  directory, _ = emnist_sqlite
  fed = loaders.load_tff_emnist(directory)
  assert isinstance(fed, FederatedDataset) and fed.name == 'femnist_tff'
  assert fed.num_classes == 62 and fed.num_clients == 3
  assert fed.info['client_names'] == ['f0001_40', 'f0002_07', 'f0003_12']
  # Reference: TFF's own EMNIST pipeline on the same file (download step skipped).
  path = os.path.join(directory, 'emnist_all.sqlite')
  reference = tff.simulation.datasets.SqlClientData(path, 'all_train').preprocess(
      tff.simulation.datasets.emnist._add_proto_parsing)  # pylint: disable=protected-access
  for n, writer in enumerate(fed.info['client_names']):
    x, y = fed.client_arrays(n)
    assert x.shape[1:] == (28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int32
    ref = list(reference.create_tf_dataset_for_client(writer).as_numpy_iterator())
    ref_x = np.stack([e['pixels'] for e in ref])[..., None]
    ref_y = np.array([e['label'] for e in ref])
    order, ref_order = np.argsort(x.sum(axis=(1, 2, 3))), np.argsort(ref_x.sum(axis=(1, 2, 3)))
    np.testing.assert_array_equal(x[order], ref_x[ref_order])
    np.testing.assert_array_equal(y[order], ref_y[ref_order])
  assert fed.x_test.shape == (6, 28, 28, 1) and fed.y_test.shape == (6,)
  # Each client's own test data is its writer's test split in TFF's parsing.
  test_reference = tff.simulation.datasets.SqlClientData(path, 'all_test').preprocess(
      tff.simulation.datasets.emnist._add_proto_parsing)  # pylint: disable=protected-access
  assert sum(len(y) for _, y in fed.client_test) == 6
  for n, writer in enumerate(fed.info['client_names']):
    x, y = fed.client_test[n]
    ref = list(test_reference.create_tf_dataset_for_client(writer).as_numpy_iterator())
    assert sorted(y) == sorted(e['label'] for e in ref)
    np.testing.assert_allclose(np.sort(x.sum(axis=(1, 2, 3))),
                               np.sort([e['pixels'].sum() for e in ref]), rtol=1e-6)


def test_tff_emnist_digits_and_max_clients(emnist_sqlite):
  directory, truth = emnist_sqlite
  fed = loaders.load_tff_emnist(directory, only_digits=True, max_clients=2)
  assert fed.num_classes == 10 and fed.num_clients <= 2
  assert fed.y_test.max(initial=0) < 10
  names = fed.info['client_names']
  assert names == sorted(names)
  n_test = sum(len(truth[('digits_only_test', w)]) for w in names)
  assert fed.y_test.shape == (n_test,)


@pytest.fixture(scope='module')
def shakespeare_sqlite(tmp_path_factory):
  directory = tmp_path_factory.mktemp('tff_shakespeare')
  long = ('To be, or not to be, that is the question: Whether tis nobler in the mind to '
          'suffer The slings and arrows of outrageous fortune').encode()
  rows = [
      ('train', 'HAMLET', long),
      ('train', 'HAMLET', b'Hark!'),
      ('train', 'OPHELIA', 'Caf\u00e9 ~ odd bytes'.encode('utf-8')),
      ('test', 'HAMLET', b'Words, words, words.'),
      ('test', 'OPHELIA', b'O, what a noble mind is here o\'erthrown!'),
  ]
  write_sqlite(directory / 'shakespeare.sqlite',
               [(split, cid, snippet_example(text)) for split, cid, text in rows])
  return str(directory)


def test_tff_shakespeare_matches_tff_preprocessing(shakespeare_sqlite):
  from tensorflow_federated.python.simulation.baselines import client_spec
  from tensorflow_federated.python.simulation.baselines.shakespeare import (
      char_prediction_preprocessing as cpp)

  fed = loaders.load_tff_shakespeare(shakespeare_sqlite)
  assert fed.info['client_names'] == ['HAMLET', 'OPHELIA']
  assert fed.num_classes == fed.info['vocab_size'] == len(cpp.CHAR_VOCAB) + 4
  # Reference: TFF's Shakespeare baseline preprocessing (no shuffle) on the
  # ClientData TFF parses from the same file.
  path = os.path.join(shakespeare_sqlite, 'shakespeare.sqlite')
  reference = tff.simulation.datasets.load_and_parse_sql_client_data(
      path, collections.OrderedDict(snippets=tf.TensorSpec([], tf.string)), split_name='train')
  preprocess = cpp.create_preprocess_fn(
      client_spec.ClientSpec(num_epochs=1, batch_size=1000, shuffle_buffer_size=1))
  for n, name in enumerate(fed.info['client_names']):
    x, y = fed.client_arrays(n)
    assert x.dtype == np.int32 and y.dtype == np.int32 and x.shape[1:] == (80,)
    ref_x, ref_y = next(iter(preprocess(reference.create_tf_dataset_for_client(name))))
    np.testing.assert_array_equal(x, ref_x.numpy())
    np.testing.assert_array_equal(y, ref_y.numpy())
  assert fed.client_arrays(0)[0].shape[0] == 3  # long snippet spans two windows
  np.testing.assert_array_equal(fed.x_test[:, 1:], fed.y_test[:, :-1])  # shifted by one
  # Each client's own test windows: its role's test split, TFF's preprocessing.
  test_reference = tff.simulation.datasets.load_and_parse_sql_client_data(
      path, collections.OrderedDict(snippets=tf.TensorSpec([], tf.string)), split_name='test')
  for n, name in enumerate(fed.info['client_names']):
    x, y = fed.client_test[n]
    if name not in test_reference.client_ids:
      assert x.shape == (0, 80)
      continue
    ref_x, ref_y = next(iter(preprocess(test_reference.create_tf_dataset_for_client(name))))
    np.testing.assert_array_equal(x, ref_x.numpy())
    np.testing.assert_array_equal(y, ref_y.numpy())
  np.testing.assert_array_equal(np.concatenate([x for x, _ in fed.client_test]), fed.x_test)


def test_tff_missing_and_malformed(tmp_path):
  for fn, filename in ((loaders.load_tff_emnist, 'emnist_all.sqlite'),
                       (loaders.load_tff_shakespeare, 'shakespeare.sqlite')):
    with pytest.raises(DatasetNotFoundError) as err:
      fn(str(tmp_path))
    text = _one_line(err)
    assert filename in text and str(tmp_path) in text
  with sqlite3.connect(str(tmp_path / 'emnist_all.sqlite')) as con:
    con.execute('CREATE TABLE examples (client_id TEXT)')
  with pytest.raises(Exception, match='client_metadata'):
    loaders.load_tff_emnist(str(tmp_path))


def test_truncated_gzip_idx_is_a_format_error(tmp_path):
  import gzip  # pylint: disable=g-import-not-at-top
  raw = gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 200]) + bytes(200))
  (tmp_path / 'f.gz').write_bytes(raw[:len(raw) // 2])
  with pytest.raises(DatasetFormatError, match='truncated or corrupt gzip'):
    loaders.read_idx(str(tmp_path / 'f.gz'))


def test_loaders_import_without_tensorflow():
  """Programs check --dataset against the registry before TensorFlow starts."""
  code = ('import sys; from tff_algos import data; data.DATASETS; data.DatasetFormatError; '
          'from tff_algos.models import catalog; import tff_algos; '
          'assert "tensorflow" not in sys.modules, "TF imported"')
  subprocess.run([sys.executable, '-c', code], check=True, cwd=os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- #
# registry
# --------------------------------------------------------------------------- #


def test_registry(tmp_path):
  assert loaders.DATASETS == (
      'digits', 'fashion_mnist', 'mnist', 'cifar10', 'cifar100', 'emnist',
      'femnist_tff', 'shakespeare_tff', 'femnist_leaf', 'shakespeare_leaf', 'sent140_leaf')
  assert set(loaders.NATURALLY_FEDERATED) < set(loaders.DATASETS)
  with pytest.raises(ValueError, match='valid: digits, fashion_mnist'):
    loaders.load_dataset('imagenet')
  assert isinstance(loaders.load_dataset('digits'), ArrayDataset)
  write_fashion_dir(tmp_path / 'fm')
  assert loaders.load_dataset('fashion_mnist', str(tmp_path / 'fm')).x_train.shape[0] == 30
  rng = np.random.default_rng(0)
  write_leaf_json(str(tmp_path / 'leaf' / 'all_data' / 'a.json'), {'u': leaf_femnist_user(rng, 5)})
  fed = loaders.load_dataset('femnist_leaf', str(tmp_path / 'leaf'))
  assert isinstance(fed, FederatedDataset) and fed.num_clients == 1
  for name in ('femnist_tff', 'shakespeare_tff', 'shakespeare_leaf', 'cifar100'):
    with pytest.raises(DatasetNotFoundError):
      loaders.load_dataset(name, str(tmp_path / 'empty'))
