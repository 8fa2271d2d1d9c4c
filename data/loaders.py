"""Dataset loaders that read local files only (no network at run time).

Each loader returns either an `ArrayDataset` (central data, to be partitioned)
or a `FederatedDataset` (naturally federated: LEAF / TFF writers, users,
speakers). When the files are missing, the loader raises
`DatasetNotFoundError` with one line saying where to put them or what to run;
programs print that line instead of a traceback.

Formats read here:
  - IDX (MNIST family, optionally gzip'd): our own small parser `read_idx`.
  - scikit-learn's bundled 8x8 digits (no files needed).
  - tensorflow-datasets prepared data under a local data_dir.
  - TFF's LEAF-derived SQLite files (emnist_all.sqlite, shakespeare.sqlite).
LEAF's own JSON is read by `leaf.load_leaf`; `load_dataset` reaches every format by name.
"""

from __future__ import annotations

import collections
import gzip
import os
import sqlite3
import zlib
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from .errors import DatasetFormatError, DatasetNotFoundError
from .leaf import load_leaf

if TYPE_CHECKING:
  from .datasets import ArrayDataset, FederatedDataset

# data.datasets (TensorFlow, TFF) is imported inside the loaders, so that the registry below
# (DATASETS, NATURALLY_FEDERATED) and the error types import without TensorFlow: programs
# check their flags before TF starts.

__all__ = [
    'FASHION_MNIST_DIR',
    'read_idx',
    'load_fashion_mnist',
    'load_digits',
    'TFDS_NAMES',
    'load_tfds',
    'load_tff_emnist',
    'load_tff_shakespeare',
    'DATASETS',
    'NATURALLY_FEDERATED',
    'load_dataset',
]

FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
DEFAULT_TFF_CACHE = os.path.join(os.path.expanduser('~'), '.tff')


# --------------------------------------------------------------------------- #
# IDX (MNIST / Fashion-MNIST)
# --------------------------------------------------------------------------- #

_IDX_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (LeCun's MNIST format), gzip'd or not.

  Header: two zero bytes, a type code, the number of dimensions, then each
  dimension as a big-endian uint32; the data follow big-endian. Compression is
  detected from the gzip magic bytes, not the file name.
  """
  with open(path, 'rb') as f:
    raw = f.read()
  if raw[:2] == b'\x1f\x8b':
    try:
      raw = gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as e:
      raise DatasetFormatError(
          f'{path}: truncated or corrupt gzip file ({e}); download it again') from None
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise DatasetFormatError(f'{path}: not an IDX file (bad magic number)')
  code, ndim = raw[2], raw[3]
  if code not in _IDX_DTYPES:
    raise DatasetFormatError(f'{path}: unknown IDX data type code 0x{code:02x}')
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise DatasetFormatError(f'{path}: truncated IDX header')
  shape = tuple(int(d) for d in np.frombuffer(raw, dtype='>u4', count=ndim, offset=4))
  dtype = _IDX_DTYPES[code]
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise DatasetFormatError(
        f'{path}: IDX payload is {len(raw) - header} bytes, header {shape} needs {expected}'
    )
  data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
  return data.astype(dtype.newbyteorder('='))


_FMNIST_FILES = {
    'x_train': 'train-images-idx3-ubyte',
    'y_train': 'train-labels-idx1-ubyte',
    'x_test': 't10k-images-idx3-ubyte',
    'y_test': 't10k-labels-idx1-ubyte',
}


def _find_idx(directory: str, stem: str) -> Optional[str]:
  for name in (stem, stem + '.gz', stem.replace('-idx', '.idx'),
               stem.replace('-idx', '.idx') + '.gz'):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  return None


def load_fashion_mnist(data_dir: Optional[str] = None) -> ArrayDataset:
  """Fashion-MNIST (60k/10k, 28x28 grey, 10 classes) from IDX files.

  Default location is the Debian package `dataset-fashion-mnist`.
  """
  from .datasets import ArrayDataset  # pylint: disable=g-import-not-at-top
  directory = data_dir or FASHION_MNIST_DIR
  paths = {k: _find_idx(directory, stem) for k, stem in _FMNIST_FILES.items()}
  missing = [_FMNIST_FILES[k] for k, p in paths.items() if p is None]
  if missing:
    what = '' if len(missing) == len(_FMNIST_FILES) else f' (missing {", ".join(missing)}[.gz])'
    raise DatasetNotFoundError(
        f'Fashion-MNIST not found in {directory}{what}: '
        'run `apt-get install dataset-fashion-mnist` or pass --data_dir=DIR containing '
        'train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], '
        't10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]'
    )
  arrays = {k: read_idx(p) for k, p in paths.items()}
  for split in ('train', 'test'):
    x, y = arrays[f'x_{split}'], arrays[f'y_{split}']
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
      raise DatasetFormatError(
          f'Fashion-MNIST {split} files in {directory} disagree: images {x.shape}, labels {y.shape}'
      )
  return ArrayDataset(
      name='fashion_mnist',
      x_train=(arrays['x_train'][..., None].astype(np.float32) / 255.0),
      y_train=arrays['y_train'].astype(np.int32),
      x_test=(arrays['x_test'][..., None].astype(np.float32) / 255.0),
      y_test=arrays['y_test'].astype(np.int32),
      num_classes=10,
  )


# --------------------------------------------------------------------------- #
# scikit-learn digits
# --------------------------------------------------------------------------- #


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> ArrayDataset:
  """scikit-learn's bundled 8x8 digits (1797 images): the offline tiny dataset.

  Pixel values 0..16 are scaled to [0, 1]; the split is stratified and fixed
  by `seed` so every run and machine sees the same test set.
  """
  from .datasets import ArrayDataset  # pylint: disable=g-import-not-at-top
  from sklearn import datasets as sk_datasets
  from sklearn.model_selection import train_test_split

  bunch = sk_datasets.load_digits()
  x = (bunch.images.astype(np.float32) / 16.0)[..., None]
  y = bunch.target.astype(np.int32)
  x_tr, x_te, y_tr, y_te = train_test_split(
      x, y, test_size=test_fraction, random_state=seed, stratify=y
  )
  return ArrayDataset('digits', x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32), 10)


# --------------------------------------------------------------------------- #
# tensorflow-datasets
# --------------------------------------------------------------------------- #

# our name -> (tfds name, label key)
TFDS_NAMES = {
    'mnist': ('mnist', 'label'),
    'cifar10': ('cifar10', 'label'),
    'cifar100': ('cifar100', 'label'),
    'emnist': ('emnist/balanced', 'label'),
}


def _default_tfds_dir() -> str:
  return os.environ.get('TFDS_DATA_DIR') or os.path.join(
      os.path.expanduser('~'), 'tensorflow_datasets')


def load_tfds(name: str, data_dir: Optional[str] = None) -> ArrayDataset:
  """A tensorflow-datasets image dataset, from prepared local data only.

  `name` is one of TFDS_NAMES ('mnist', 'cifar10', 'cifar100', 'emnist') or a
  tfds name ('emnist/byclass', ...). Never downloads: if the dataset is not
  prepared under data_dir, raises DatasetNotFoundError naming the `tfds build`
  command. tfds stores EMNIST transposed (tensorflow/datasets#812); we
  transpose it back so it looks like MNIST.
  """
  from .datasets import ArrayDataset  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds

  tfds_name, label_key = TFDS_NAMES.get(name, (name, 'label'))
  directory = data_dir or _default_tfds_dir()
  build_hint = (f'run `tfds build {tfds_name} --data_dir=DIR` on a machine with internet '
                f'and copy DIR/{tfds_name.split("/")[0]} into {directory}, '
                'or pass --data_dir=DIR holding the prepared dataset')
  try:
    builder = tfds.builder(tfds_name, data_dir=directory)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f'unknown tensorflow-datasets name {tfds_name!r}') from e
  splits = {}
  try:
    for split in ('train', 'test'):
      # Fixed-size batches, not batch_size=-1: the latter sizes one batch from
      # the split metadata, which unknown/mocked metadata turns into sys.maxsize.
      batches = list(tfds.as_numpy(builder.as_dataset(split=split, batch_size=10000)))
      splits[split] = {key: np.concatenate([b[key] for b in batches])
                       for key in ('image', label_key)} if batches else None
  except AssertionError as e:
    if 'could not find data' in str(e):
      raise DatasetNotFoundError(
          f'tensorflow-datasets {tfds_name} is not prepared in {directory}: {build_hint}'
      ) from None
    raise
  features = builder.info.features
  num_classes = int(features[label_key].num_classes)
  out = {}
  for split, batch in splits.items():
    if batch is None:
      raise ValueError(f'tensorflow-datasets {tfds_name} in {directory}: split {split} is empty')
    x = np.asarray(batch['image'])
    if x.ndim == 3:
      x = x[..., None]
    if tfds_name.startswith('emnist'):
      x = np.swapaxes(x, 1, 2)
    out[f'x_{split}'] = x.astype(np.float32) / 255.0
    out[f'y_{split}'] = np.asarray(batch[label_key]).astype(np.int32)
  return ArrayDataset(name=name, num_classes=num_classes, **out)


# --------------------------------------------------------------------------- #
# TFF's LEAF-derived SQLite datasets
# --------------------------------------------------------------------------- #

_TFF_URL = 'https://storage.googleapis.com/tff-datasets-public/'


def _tff_sqlite(cache_dir: Optional[str], filename: str, loader: str) -> str:
  directory = cache_dir or DEFAULT_TFF_CACHE
  path = os.path.join(directory, filename)
  if not os.path.isfile(path):
    raise DatasetNotFoundError(
        f'TFF {filename} not found in {directory}: put the decompressed '
        f'{_TFF_URL}{filename}.lzma there (`xz -d`), or on a machine with internet run '
        f'`python -c "import tensorflow_federated as tff; '
        f'tff.simulation.datasets.{loader}.load_data(cache_dir=\'DIR\')"` and pass '
        '--data_dir=DIR'
    )
  return path


def _read_sql_split(path: str, split_name: str, max_clients: Optional[int]):
  """client_ids (sorted) and {client_id: [serialized tf.Example, ...]}.

  The schema is checked, and client ids listed, by TFF's own SqlClientData;
  the examples are then read in one SQL pass because materialising thousands
  of clients through per-client tf.data SqlDatasets is far slower.
  """
  import tensorflow_federated as tff

  sql_data = tff.simulation.datasets.SqlClientData(path, split_name)
  client_ids = list(sql_data.client_ids)
  if max_clients is not None:
    client_ids = client_ids[:max_clients]
  wanted = set(client_ids)
  protos = collections.defaultdict(list)
  con = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    rows = con.execute(
        'SELECT client_id, serialized_example_proto FROM examples '
        'WHERE split_name = ? ORDER BY rowid', (split_name,))
    for client_id, proto in rows:
      if client_id in wanted:
        protos[client_id].append(bytes(proto))
  finally:
    con.close()
  return client_ids, protos


def _parse_examples(protos: Sequence[bytes], spec: dict, chunk: int = 20000) -> dict:
  """Parses serialized tf.Examples in large batches (one TF op per chunk)."""
  import tensorflow as tf

  parts = collections.defaultdict(list)
  for start in range(0, len(protos), chunk):
    parsed = tf.io.parse_example(tf.constant(list(protos[start:start + chunk])), spec)
    for key, value in parsed.items():
      parts[key].append(value.numpy())
  return {key: np.concatenate(v) for key, v in parts.items()}


def load_tff_emnist(cache_dir: Optional[str] = None, only_digits: bool = False,
                    max_clients: Optional[int] = None) -> FederatedDataset:
  """TFF's federated EMNIST (LEAF FEMNIST by writer) from emnist_all.sqlite.

  Writers sorted by id become clients 0..N-1 (first `max_clients` of them if
  given); the central test set is the union of those writers' test splits.
  Pixels are kept as TFF stores them: float32 in [0, 1] with 1.0 = background.
  """
  from .datasets import (  # pylint: disable=g-import-not-at-top
      ArrayClientData, FederatedDataset, client_slices)
  import tensorflow as tf

  path = _tff_sqlite(cache_dir, 'emnist_all.sqlite', 'emnist')
  prefix = 'digits_only' if only_digits else 'all'
  spec = {
      'pixels': tf.io.FixedLenFeature(shape=(28, 28), dtype=tf.float32),
      'label': tf.io.FixedLenFeature(shape=(), dtype=tf.int64),
  }
  client_ids, train = _read_sql_split(path, f'{prefix}_train', max_clients)
  if not client_ids:
    raise ValueError(f'{path}: no clients in split {prefix}_train')
  _, test = _read_sql_split(path, f'{prefix}_test', None)

  def to_arrays(protos):
    if not protos:
      return np.zeros([0, 28, 28, 1], np.float32), np.zeros([0], np.int32)
    p = _parse_examples(protos, spec)
    return p['pixels'][..., None].astype(np.float32), p['label'].astype(np.int32)

  x_all, y_all = to_arrays([p for cid in client_ids for p in train.get(cid, [])])
  cuts = np.cumsum([len(train.get(cid, [])) for cid in client_ids])[:-1]
  clients = {str(n): (x, y) for n, (x, y) in
             enumerate(zip(np.split(x_all, cuts), np.split(y_all, cuts)))}
  x_test, y_test = to_arrays([p for cid in client_ids for p in test.get(cid, [])])
  return FederatedDataset(
      name='femnist_tff',
      client_data=ArrayClientData(clients),
      x_test=x_test,
      y_test=y_test,
      num_classes=10 if only_digits else 62,
      info={'client_names': list(client_ids), 'source': path},
      client_test=client_slices(x_test, y_test,
                                [len(test.get(cid, [])) for cid in client_ids]),
  )


def _tff_char_vocab():
  from tensorflow_federated.python.simulation.baselines.shakespeare import (
      char_prediction_preprocessing as cpp)
  return cpp.CHAR_VOCAB, cpp.get_special_tokens()


def _shakespeare_windows(snippets: Sequence[bytes], seq_len: int = 80) -> tuple:
  """NumPy replica of TFF's Shakespeare baseline preprocessing (no shuffle):
  bytes -> ids (vocab index + 1; 0 = pad, OOV/BOS/EOS after the vocab),
  [BOS] + ids + [EOS], zero-padded to a multiple of seq_len + 1, cut into
  windows; x = window[:-1], y = window[1:]."""
  vocab, (pad, oov, bos, eos) = _tff_char_vocab()
  table = np.full(256, oov, dtype=np.int32)
  for i, ch in enumerate(vocab):
    table[ord(ch)] = i + 1
  windows = []
  for snippet in snippets:
    ids = table[np.frombuffer(snippet, dtype=np.uint8)]
    tokens = np.concatenate([[bos], ids, [eos]]).astype(np.int32)
    padded = np.concatenate([tokens, np.full((-tokens.size) % (seq_len + 1), pad, np.int32)])
    windows.append(padded.reshape(-1, seq_len + 1))
  if not windows:
    return np.zeros([0, seq_len], np.int32), np.zeros([0, seq_len], np.int32)
  w = np.concatenate(windows)
  return w[:, :-1].copy(), w[:, 1:].copy()


def load_tff_shakespeare(cache_dir: Optional[str] = None,
                         max_clients: Optional[int] = None,
                         sequence_length: int = 80) -> FederatedDataset:
  """TFF's federated Shakespeare (LEAF, one client per speaking role) from
  shakespeare.sqlite, as next-character windows: x, y int32 [n, 80] with TFF's
  character vocabulary (num_classes = vocab + pad/OOV/BOS/EOS = 90)."""
  from .datasets import ArrayClientData, FederatedDataset  # pylint: disable=g-import-not-at-top
  import tensorflow as tf

  path = _tff_sqlite(cache_dir, 'shakespeare.sqlite', 'shakespeare')
  spec = {'snippets': tf.io.FixedLenFeature(shape=(), dtype=tf.string)}
  client_ids, train = _read_sql_split(path, 'train', max_clients)
  if not client_ids:
    raise ValueError(f'{path}: no clients in split train')
  _, test = _read_sql_split(path, 'test', None)

  def snippets_of(protos):
    return list(_parse_examples(protos, spec)['snippets']) if protos else []

  def to_arrays(protos):
    return _shakespeare_windows(snippets_of(protos), sequence_length)

  all_snippets = snippets_of([p for cid in client_ids for p in train.get(cid, [])])
  clients, start = {}, 0
  for n, cid in enumerate(client_ids):
    count = len(train.get(cid, []))
    clients[str(n)] = _shakespeare_windows(all_snippets[start:start + count], sequence_length)
    start += count
  # Windowed per writer (a window never spans two snippets), so per-client test windows
  # concatenate to the central test set.
  client_test = [to_arrays(test.get(cid, [])) for cid in client_ids]
  x_test = np.concatenate([x for x, _ in client_test])
  y_test = np.concatenate([y for _, y in client_test])
  vocab, _ = _tff_char_vocab()
  vocab_size = len(vocab) + 4
  return FederatedDataset(
      name='shakespeare_tff',
      client_data=ArrayClientData(clients),
      x_test=x_test,
      y_test=y_test,
      num_classes=vocab_size,
      info={'client_names': list(client_ids), 'vocab_size': vocab_size,
            'sequence_length': sequence_length, 'pad_id': 0, 'source': path},
      client_test=client_test,
  )


# --------------------------------------------------------------------------- #
# registry
# --------------------------------------------------------------------------- #

DATASETS = (
    'digits', 'fashion_mnist', 'mnist', 'cifar10', 'cifar100', 'emnist',
    'femnist_tff', 'shakespeare_tff', 'femnist_leaf', 'shakespeare_leaf', 'sent140_leaf',
)
# Datasets that come with their own clients (no partitioner applies).
NATURALLY_FEDERATED = (
    'femnist_tff', 'shakespeare_tff', 'femnist_leaf', 'shakespeare_leaf', 'sent140_leaf',
)


def load_dataset(name: str, data_dir: Optional[str] = None, **kwargs):
  """Loads any dataset of DATASETS by name.

  Returns an ArrayDataset for central datasets (partition them with
  `federate`) and a FederatedDataset for NATURALLY_FEDERATED ones. `data_dir`
  overrides the default location (Fashion-MNIST's Debian directory, the tfds
  data dir, TFF's ~/.tff cache; LEAF has no default and uses
  ~/leaf/data/<dataset>/data). Extra keyword arguments go to the loader.
  """
  if name not in DATASETS:
    raise ValueError(f'unknown dataset {name!r}; valid: {", ".join(DATASETS)}')
  if name == 'digits':
    if data_dir is not None:
      raise ValueError('digits is bundled with scikit-learn and takes no data_dir; drop --data_dir')
    return load_digits(**kwargs)
  if name == 'fashion_mnist':
    return load_fashion_mnist(data_dir, **kwargs)
  if name in TFDS_NAMES:
    return load_tfds(name, data_dir, **kwargs)
  if name == 'femnist_tff':
    return load_tff_emnist(data_dir, **kwargs)
  if name == 'shakespeare_tff':
    return load_tff_shakespeare(data_dir, **kwargs)
  leaf = name[:-len('_leaf')]
  root = data_dir or os.path.join(os.path.expanduser('~'), 'leaf', 'data', leaf, 'data')
  return load_leaf(root, leaf, **kwargs)
