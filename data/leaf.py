"""LEAF's own JSON (femnist, shakespeare, sent140) -> FederatedDataset, one client per user.

LEAF (https://github.com/TalwalkarLab/leaf) writes train/ + test/ (its sample or user split)
or all_data/ (split here per user); `load_leaf` reads either, and `loaders.load_dataset`
reaches it as femnist_leaf / shakespeare_leaf / sent140_leaf. Like every loader, it imports
TensorFlow only when called.
"""

from __future__ import annotations

import collections
import glob
import json
import os
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from .errors import DatasetFormatError, DatasetNotFoundError

if TYPE_CHECKING:
  from .datasets import FederatedDataset

__all__ = ['LEAF_LETTERS', 'load_leaf']


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
  from .datasets import (  # pylint: disable=g-import-not-at-top
      ArrayClientData, FederatedDataset, client_slices)
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
      client_test=client_slices(x_test, y_test, sizes),
  )


def _tokens(record) -> list:
  """Lower-cased whitespace tokens of a LEAF Sent140 record (its tweet text is field 4)."""
  if isinstance(record, (list, tuple)):
    if len(record) < 5:
      raise DatasetFormatError(
          f'LEAF sent140: a record must list 5+ fields with the text at index 4, got {record!r:.60}')
    record = record[4]
  return str(record).lower().split()
