"""Dataset loaders that read local files only (no network at run time).

Each loader returns either an `ArrayDataset` (central data, to be partitioned)
or a `FederatedDataset` (naturally federated: LEAF / TFF writers, users,
speakers). When the files are missing, the loader raises
`DatasetNotFoundError` with one line saying where to put them or what to run;
programs print that line instead of a traceback.

Formats read:
  - IDX (MNIST family, optionally gzip'd): our own small parser `read_idx`.
  - scikit-learn's bundled 8x8 digits (no files needed).
  - tensorflow-datasets prepared data under a local data_dir.
  - TFF's LEAF-derived SQLite files (emnist_all.sqlite, shakespeare.sqlite).
  - LEAF's own JSON (train/ + test/, or all_data/ split here per user).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import sqlite3
import zlib
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
  from .datasets import ArrayDataset, FederatedDataset

# data.datasets (TensorFlow, TFF) is imported inside the loaders, so that the registry below
# (DATASETS, NATURALLY_FEDERATED) and the error types import without TensorFlow: programs
# check their flags before TF starts.

__all__ = [
    'DatasetNotFoundError',
    'DatasetFormatError',
    'FASHION_MNIST_DIR',
    'read_idx',
    'load_fashion_mnist',
    'load_digits',
    'TFDS_NAMES',
    'load_tfds',
    'load_tff_emnist',
    'load_tff_shakespeare',
    'LEAF_LETTERS',
    'load_leaf',
    'DATASETS',
    'NATURALLY_FEDERATED',
    'load_dataset',
]

FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
DEFAULT_TFF_CACHE = os.path.join(os.path.expanduser('~'), '.tff')


class DatasetNotFoundError(FileNotFoundError):
  """Dataset files are absent; str(error) is one line saying how to get them."""

  def __init__(self, message: str):
    super().__init__(' '.join(message.split()))

  def __str__(self) -> str:
    return self.args[0]


class DatasetFormatError(ValueError):
  """Dataset files exist but cannot be read (corrupt, truncated, wrong layout);
  str(error) is one line naming the file and what is wrong with it."""

  def __init__(self, message: str):
    super().__init__(' '.join(str(message).split()))

  def __str__(self) -> str:
    return self.args[0]


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
  from .datasets import ArrayClientData, FederatedDataset  # pylint: disable=g-import-not-at-top
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
      client_test=_client_slices(x_test, y_test,
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
# LEAF JSON
# --------------------------------------------------------------------------- #

# LEAF's models/utils/language_utils.py ALL_LETTERS: 80 characters, the first
# being a newline (id 0), then ' ' (id 1), ...
LEAF_LETTERS = ('\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ'
                '[]abcdefghijklmnopqrstuvwxyz}')
_LEAF_DATASETS = ('femnist', 'shakespeare', 'sent140')
SENT140_SEQUENCE_LENGTH = 25


def _read_leaf_dir(directory: str) -> dict:
  """{user: {'x': [...], 'y': [...]}} merged over every *.json in directory.

  Raises DatasetFormatError naming the file for anything that is not LEAF's layout
  ({"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}).
  """
  merged = collections.OrderedDict()
  for path in sorted(glob.glob(os.path.join(directory, '*.json'))):
    try:
      with open(path, 'r', encoding='utf-8') as f:
        blob = json.load(f)
    except json.JSONDecodeError as e:
      raise DatasetFormatError(
          f'{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); regenerate '
          'it with LEAF') from None
    except UnicodeDecodeError as e:
      raise DatasetFormatError(f'{path}: not UTF-8 text ({e.reason}); regenerate it with LEAF'
                               ) from None
    if not isinstance(blob, dict) or not isinstance(blob.get('user_data'), dict):
      raise DatasetFormatError(f'{path}: not a LEAF JSON file (no "user_data" object)')
    for user, data in blob['user_data'].items():
      if (not isinstance(data, dict) or not isinstance(data.get('x'), list)
          or not isinstance(data.get('y'), list) or len(data['x']) != len(data['y'])):
        raise DatasetFormatError(
            f'{path}: user {user!r} needs equally long "x" and "y" lists (LEAF layout)')
      entry = merged.setdefault(user, {'x': [], 'y': []})
      entry['x'].extend(data['x'])
      entry['y'].extend(data['y'])
  return merged


def _leaf_missing(root: str, dataset: str) -> DatasetNotFoundError:
  return DatasetNotFoundError(
      f'LEAF {dataset} not found in {root}: expected {root}/train/*.json and '
      f'{root}/test/*.json or {root}/all_data/*.json; generate them with LEAF '
      f'(https://github.com/TalwalkarLab/leaf, cd data/{dataset} && ./preprocess.sh ...) '
      'and pass --data_dir=leaf/data/' + dataset + '/data'
  )


def _split_user(x: list, y: list, rng: np.random.Generator, train_fraction: float):
  n = len(y)
  perm = rng.permutation(n)
  n_train = max(1, int(train_fraction * n)) if n else 0
  tr, te = perm[:n_train], perm[n_train:]
  return ([x[i] for i in tr], [y[i] for i in tr]), ([x[i] for i in te], [y[i] for i in te])


def _leaf_char_table() -> dict:
  return {ch: i for i, ch in enumerate(LEAF_LETTERS)}


def _encode_leaf_inputs(strings: Sequence[str], length: int = 80) -> np.ndarray:
  """LEAF Shakespeare inputs (fixed-length strings) -> int32 [n, length]."""
  table, oov = _leaf_char_table(), len(LEAF_LETTERS)
  out = np.zeros([len(strings), length], np.int32)
  for i, s in enumerate(strings):
    if not isinstance(s, str) or len(s) != length:
      raise DatasetFormatError(
          f'LEAF shakespeare: inputs must be strings of {length} characters, got '
          f'{len(s) if isinstance(s, str) else type(s).__name__}: {str(s)[:20]!r}')
    out[i] = [table.get(ch, oov) for ch in s]
  return out


def _encode_leaf_targets(chars: Sequence[str]) -> np.ndarray:
  """LEAF Shakespeare targets (one character each) -> int32 [n]."""
  table, oov = _leaf_char_table(), len(LEAF_LETTERS)
  for c in chars:
    if not isinstance(c, str) or len(c) != 1:
      raise DatasetFormatError(f'LEAF shakespeare: targets must be single characters, got {c!r}')
  return np.array([table.get(c, oov) for c in chars], np.int32).reshape(-1)


def _encode_femnist(x: list, y: list, where: str) -> tuple:
  try:
    pixels = np.asarray(x, np.float32)
    labels = np.asarray(y, np.int64).astype(np.int32).reshape(-1)
  except (TypeError, ValueError) as e:
    raise DatasetFormatError(f'{where}: LEAF femnist rows must be lists of 784 numbers and '
                             f'labels integers ({e})') from None
  if pixels.size and (pixels.ndim != 2 or pixels.shape[1] != 28 * 28):
    raise DatasetFormatError(
        f'{where}: LEAF femnist rows must hold 784 pixels (28x28), got rows of shape '
        f'{pixels.shape[1:]}')
  if labels.size and not 0 <= labels.min() <= labels.max() < 62:
    raise DatasetFormatError(f'{where}: LEAF femnist labels must be in [0, 62), got '
                             f'{labels.min()}..{labels.max()}')
  return pixels.reshape(-1, 28, 28, 1), labels


def load_leaf(root: str, dataset: str = 'femnist', seed: int = 0,
              train_fraction: float = 0.8, max_clients: Optional[int] = None,
              max_vocab: Optional[int] = None) -> FederatedDataset:
  """A LEAF dataset from its JSON files.

  Layouts: root/train/*.json + root/test/*.json (LEAF's split), or
  root/all_data/*.json, which is split here per user (train_fraction, at least
  one training example, seeded by `seed`). Users of train/ sorted by name become
  clients 0..N-1 (first max_clients if given). The central test set is the test
  data of those clients plus that of every test/ user who has no training data:
  LEAF's sample split (`-t sample`) puts the same users in both directories,
  its user split (`-t user`) puts held-out users in test/, and both are kept.

  Encodings: femnist x = 784 floats -> [28, 28, 1] (LEAF keeps 1.0 =
  background), 62 classes; shakespeare x = 80-char string -> int32 [80], y =
  the one next char, both via LEAF's ALL_LETTERS (80 chars; any other char ->
  id 80, so num_classes = 81); sent140 x = tweet record (text at index 4) ->
  lower-cased whitespace tokens, ids from a vocabulary of the clients' training
  tweets (0 pad, 1 OOV, then words by decreasing frequency, ties by spelling;
  the first `max_vocab` words if given), padded/truncated to 25, y in {0, 1}.
  The vocabulary is in `info['vocab']` (word i has id i + 2).

  Raises:
    DatasetNotFoundError: no LEAF JSON under root.
    DatasetFormatError: a file is not LEAF's JSON layout or holds malformed rows.
  """
  from .datasets import ArrayClientData, FederatedDataset  # pylint: disable=g-import-not-at-top
  if dataset not in _LEAF_DATASETS:
    raise ValueError(f'unknown LEAF dataset {dataset!r}; valid: {", ".join(_LEAF_DATASETS)}')
  if root and not os.path.isdir(os.path.join(root, 'train')) \
      and not os.path.isdir(os.path.join(root, 'all_data')) \
      and os.path.isdir(os.path.join(root, 'data')):
    root = os.path.join(root, 'data')  # accept leaf/data/<dataset> too

  def has_json(d):
    return bool(glob.glob(os.path.join(root, d, '*.json')))

  if has_json('train') and has_json('test'):
    train_users = _read_leaf_dir(os.path.join(root, 'train'))
    test_users = _read_leaf_dir(os.path.join(root, 'test'))
    users = sorted(train_users)
  elif has_json('all_data'):
    all_users = _read_leaf_dir(os.path.join(root, 'all_data'))
    users = sorted(all_users)
    rng = np.random.default_rng(seed)
    train_users, test_users = {}, {}
    for user in users:  # sorted order: the split depends only on the seed
      (xtr, ytr), (xte, yte) = _split_user(all_users[user]['x'], all_users[user]['y'], rng,
                                           train_fraction)
      train_users[user] = {'x': xtr, 'y': ytr}
      test_users[user] = {'x': xte, 'y': yte}
  else:
    raise _leaf_missing(root, dataset)
  if max_clients is not None:
    users = users[:max_clients]
  if not users:
    raise DatasetFormatError(f'LEAF {dataset} in {root}: no users with training data')
  held_out = sorted(u for u in test_users if u not in train_users)
  test_from = [u for u in users if u in test_users] + held_out
  test_x = [v for u in test_from for v in test_users[u]['x']]
  test_y = [v for u in test_from for v in test_users[u]['y']]
  info = {'client_names': users, 'test_users': test_from, 'source': root}

  if dataset == 'femnist':
    def encode(x, y):
      return _encode_femnist(x, y, f'{root} ({dataset})')
    num_classes = 62
  elif dataset == 'shakespeare':
    def encode(x, y):
      return _encode_leaf_inputs(x, 80), _encode_leaf_targets(y)
    num_classes = len(LEAF_LETTERS) + 1
    info.update(vocab_size=num_classes, sequence_length=80, oov_id=len(LEAF_LETTERS))
  else:
    counter = collections.Counter(
        tok for u in users for rec in train_users[u]['x'] for tok in _tokens(rec))
    words = sorted(counter, key=lambda w: (-counter[w], w))
    if max_vocab is not None:
      words = words[:max_vocab]
    vocab = {w: i + 2 for i, w in enumerate(words)}

    def encode(x, y):
      out = np.zeros([len(x), SENT140_SEQUENCE_LENGTH], np.int32)
      for i, rec in enumerate(x):
        ids = [vocab.get(t, 1) for t in _tokens(rec)][:SENT140_SEQUENCE_LENGTH]
        out[i, :len(ids)] = ids
      try:
        labels = np.asarray(y, np.float64).astype(np.int32).reshape(-1)
      except (TypeError, ValueError) as e:
        raise DatasetFormatError(f'{root}: LEAF sent140 labels must be 0 or 1 ({e})') from None
      if labels.size and not set(np.unique(labels)) <= {0, 1}:
        raise DatasetFormatError(f'{root}: LEAF sent140 labels must be 0 or 1, got '
                                 f'{sorted(set(np.unique(labels)) - {0, 1})[:3]}')
      return out, labels
    num_classes = 2
    info.update(vocab_size=len(vocab) + 2, sequence_length=SENT140_SEQUENCE_LENGTH,
                pad_id=0, oov_id=1, vocab=words)

  clients = {str(n): encode(train_users[u]['x'], train_users[u]['y'])
             for n, u in enumerate(users)}
  x_test, y_test = encode(test_x, test_y)
  # The clients' own test data are the first rows of the central test set, in client order.
  sizes = [len(test_users[u]['y']) if u in test_users else 0 for u in users]
  return FederatedDataset(
      name=f'{dataset}_leaf',
      client_data=ArrayClientData(clients),
      x_test=x_test,
      y_test=y_test,
      num_classes=num_classes,
      info=info,
      client_test=_client_slices(x_test, y_test, sizes),
  )


def _client_slices(x: np.ndarray, y: np.ndarray, sizes: Sequence[int]) -> list:
  """(x, y) views of consecutive rows: client n's are the `sizes[n]` after the clients
  before it."""
  ends = np.cumsum(sizes, dtype=np.int64)
  return [(x[end - size:end], y[end - size:end]) for end, size in zip(ends, sizes)]


def _tokens(record) -> list:
  """Lower-cased whitespace tokens of a LEAF Sent140 record (its tweet text is field 4)."""
  if isinstance(record, (list, tuple)):
    if len(record) < 5:
      raise DatasetFormatError(
          f'LEAF sent140: a record must list 5+ fields with the text at index 4, got {record!r:.60}')
    record = record[4]
  return str(record).lower().split()


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
