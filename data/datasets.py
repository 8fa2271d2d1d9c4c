"""In-memory dataset containers: central arrays and their federated form.

Everything is materialised as NumPy arrays because the training program feeds
clients whole-client tensors (docs/tff_integration.md, "The ClientData adapter":
they beat tf.data on this runtime); `ArrayClientData` still is a real
`tff.simulation.datasets.ClientData`, so TFF utilities and users' own
pipelines that expect ClientData keep working.

Conventions: images float32 in [0, 1] with a channel axis ([n, H, W, C]);
token sequences int32; labels int32. Clients are identified by str(n) for
n in range(N), and client n is the n-th entry of `client_ids`, which is also
the int32 client index the algorithms receive as client input.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from .partition import Partition
from .partitioners import Partitioner

__all__ = ['ArrayDataset', 'ArrayClientData', 'FederatedDataset', 'federate',
           'hold_out_client_test', 'held_out_count']


def _check_xy(x: np.ndarray, y: np.ndarray, what: str) -> None:
  if x.shape[0] != y.shape[0]:
    raise ValueError(f'{what}: {x.shape[0]} inputs but {y.shape[0]} labels')


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayDataset:
  """A centrally held dataset (train/test arrays) before partitioning."""

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  def __post_init__(self):
    _check_xy(self.x_train, self.y_train, f'{self.name} train')
    _check_xy(self.x_test, self.y_test, f'{self.name} test')
    if self.x_train.shape[1:] != self.x_test.shape[1:]:
      raise ValueError(
          f'{self.name}: train inputs {self.x_train.shape[1:]} and test inputs '
          f'{self.x_test.shape[1:]} differ in shape'
      )
    for arr, what in ((self.y_train, 'y_train'), (self.y_test, 'y_test')):
      if arr.dtype != np.int32:
        raise ValueError(f'{self.name}: {what} must be int32, got {arr.dtype}')

  @property
  def input_shape(self) -> tuple:
    return tuple(self.x_train.shape[1:])


class ArrayClientData(tff.simulation.datasets.ClientData):
  """A ClientData backed by per-client NumPy arrays.

  Elements are `OrderedDict(x=..., y=...)`, one example each. `arrays(id)` is
  the fast path the training program uses (no tf.data); the tf.data views
  exist for TFF compatibility. `serializable_dataset_fn` embeds all data as
  graph constants, so use it only for datasets small enough to serialise
  (well under 2 GB); `create_tf_dataset_for_client` has no such limit.
  """

  def __init__(self, client_arrays: Mapping[str, tuple]):
    num = len(client_arrays)
    if num == 0:
      raise ValueError('ArrayClientData needs at least one client')
    expected = {str(i) for i in range(num)}
    if set(client_arrays) != expected:
      bad = sorted(set(client_arrays) - expected)[:3]
      raise ValueError(
          f'client ids must be "0".."{num - 1}" (str of the client index); got e.g. {bad}'
      )
    self._client_ids = [str(i) for i in range(num)]
    self._x, self._y = [], []
    for cid in self._client_ids:
      x, y = client_arrays[cid]
      x, y = np.asarray(x), np.asarray(y)
      _check_xy(x, y, f'client {cid}')
      if y.dtype != np.int32:
        y = y.astype(np.int32)
      self._x.append(x)
      self._y.append(y)
    x0, y0 = self._x[0], self._y[0]
    for cid, x, y in zip(self._client_ids, self._x, self._y):
      if x.shape[1:] != x0.shape[1:] or x.dtype != x0.dtype or y.shape[1:] != y0.shape[1:]:
        raise ValueError(
            f'client {cid} has inputs {x.dtype}{list(x.shape[1:])} / labels '
            f'{list(y.shape[1:])}, client 0 has {x0.dtype}{list(x0.shape[1:])} / '
            f'{list(y0.shape[1:])}: all clients must share element shapes'
        )
    self._element_spec = collections.OrderedDict(
        x=tf.TensorSpec(shape=x0.shape[1:], dtype=tf.as_dtype(x0.dtype)),
        y=tf.TensorSpec(shape=y0.shape[1:], dtype=tf.int32),
    )
    self._serializable_fn = None

  @classmethod
  def from_partition(cls, x: np.ndarray, y: np.ndarray, partition: Partition) -> 'ArrayClientData':
    """Gathers each client's rows (copies) from the central arrays."""
    x, y = np.asarray(x), np.asarray(y)
    _check_xy(x, y, 'from_partition')
    partition.validate(x.shape[0])
    return cls({str(n): (x[idx], y[idx].astype(np.int32))
                for n, idx in enumerate(partition.client_indices)})

  # ---- ClientData interface ---------------------------------------------- #

  @property
  def client_ids(self) -> list:
    return list(self._client_ids)

  @property
  def num_clients(self) -> int:
    return len(self._client_ids)

  @property
  def element_type_structure(self):
    return self._element_spec

  def _index(self, client_id) -> int:
    try:
      n = int(client_id)
    except (TypeError, ValueError):
      n = -1
    if not (0 <= n < len(self._x)) or str(client_id) != str(n):
      raise ValueError(
          f'ID [{client_id}] is not a client in this ClientData; ids are "0".."{len(self._x) - 1}"'
      )
    return n

  def arrays(self, client_id) -> tuple:
    """(x, y) NumPy arrays of one client (no copy); accepts "n" or n."""
    n = self._index(client_id)
    return self._x[n], self._y[n]

  def sizes(self) -> np.ndarray:
    return np.array([y.shape[0] for y in self._y], dtype=np.int64)

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    x, y = self.arrays(client_id)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

  @property
  def serializable_dataset_fn(self):
    """TF-traceable client_id -> dataset (data captured as constants).

    Built lazily, since it copies all data into TF constants. The id is parsed
    with tf.strings.to_number, which is why ids are the decimal client index.
    """
    if self._serializable_fn is None:
      offsets = np.concatenate([[0], np.cumsum(self.sizes())]).astype(np.int64)
      x_all = tf.constant(np.concatenate(self._x, axis=0))
      y_all = tf.constant(np.concatenate(self._y, axis=0))
      offsets_t = tf.constant(offsets)

      def dataset_fn(client_id):
        n = tf.strings.to_number(client_id, out_type=tf.int64)
        start, end = offsets_t[n], offsets_t[n + 1]
        return tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(x=x_all[start:end], y=y_all[start:end])
        )

      self._serializable_fn = dataset_fn
    return self._serializable_fn


@dataclasses.dataclass(eq=False)
class FederatedDataset:
  """Clients' training data plus a central test set.

  Attributes:
    name: dataset name.
    client_data: the clients (client n = id str(n)).
    x_test, y_test: central test set (for natural federated datasets: the
      union of the clients' test splits).
    num_classes: number of output classes (vocabulary size for next-char).
    true_clusters: int [N] ground-truth cluster id per client, when known.
    partition: the Partition that produced client_data (None for natural
      federated datasets).
    info: extras: vocab_size, sequence_length, vocab, client_names
      (source writer/user ids in client order), ...
    client_test: each client's own test data, (x, y) per client in client order, or None:
      the users' own test split for the naturally federated loaders (LEAF, TFF's SQLite;
      empty arrays for a user without test data), or what `hold_out_client_test` held out.
  """

  name: str
  client_data: ArrayClientData
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  true_clusters: Optional[np.ndarray] = None
  partition: Optional[Partition] = None
  info: dict = dataclasses.field(default_factory=dict)
  client_test: Optional[list] = None

  @property
  def num_clients(self) -> int:
    return self.client_data.num_clients

  def client_arrays(self, n: int) -> tuple:
    """(x, y) of client n (its index, not its source name)."""
    return self.client_data.arrays(str(int(n)))

  def client_sizes(self) -> np.ndarray:
    return self.client_data.sizes()


def client_slices(x: np.ndarray, y: np.ndarray, sizes: Sequence[int]) -> list:
  """A naturally federated dataset's `client_test`: (x, y) views of consecutive rows of its
  central test set, client n's being the `sizes[n]` after the clients before it."""
  ends = np.cumsum(sizes, dtype=np.int64)
  return [(x[end - size:end], y[end - size:end]) for end, size in zip(ends, sizes)]


def federate(dataset: ArrayDataset, partitioner: Partitioner) -> FederatedDataset:
  """Partitions a central dataset's training split over clients."""
  partition = partitioner.partition(dataset.y_train)
  return FederatedDataset(
      name=dataset.name,
      client_data=ArrayClientData.from_partition(dataset.x_train, dataset.y_train, partition),
      x_test=dataset.x_test,
      y_test=dataset.y_test,
      num_classes=dataset.num_classes,
      true_clusters=partition.true_clusters,
      partition=partition,
  )


def held_out_count(num_examples: int, fraction: float) -> int:
  """How many of a client's `num_examples` `hold_out_client_test` holds out: `fraction` of
  them rounded half up, at least 1 and at most all but one, so every client with 2 or more
  examples has test data and keeps training data; a client with 0 or 1 keeps them all for
  training (and has no test data)."""
  if num_examples < 2:
    return 0
  return int(min(num_examples - 1, max(1, np.floor(fraction * num_examples + 0.5))))


def hold_out_client_test(fed: FederatedDataset, fraction: float, seed: int) -> FederatedDataset:
  """`fed` with `held_out_count(n, fraction)` of each client's examples moved out of its
  training data into `client_test`.

  Client n's held-out examples are drawn without replacement by
  `np.random.default_rng([seed, n, 57])` (its own stream: the choice depends on the seed and
  the client only, and differs from the sampling and batch-order streams); both parts keep
  the examples' original order. The central test set, partition and info are kept.
  """
  if not 0 < fraction < 1:
    raise ValueError(f'fraction must be in (0, 1), got {fraction}')
  if fed.client_test is not None:
    raise ValueError(f'{fed.name} already has per-client test data (client_test): use it '
                     'instead of holding out a fraction')
  train, test = {}, []
  for n in range(fed.num_clients):
    x, y = fed.client_arrays(n)
    size = y.shape[0]
    held = np.zeros(size, bool)
    held[np.random.default_rng([int(seed), n, 57]).choice(
        size, held_out_count(size, fraction), replace=False)] = True
    train[str(n)] = (x[~held], y[~held])
    test.append((x[held], y[held]))
  return dataclasses.replace(fed, client_data=ArrayClientData(train), client_test=test)
