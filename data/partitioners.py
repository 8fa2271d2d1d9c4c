"""Seeded label-based partitioners: one labelled array -> per-client index lists.

Every partitioner is a small frozen object (flwr-datasets style) whose
`partition(labels)` returns a `Partition` (partition.py): disjoint int64 index arrays into
the labelled array, one per client, plus optional ground-truth cluster ids. Only
`np.random.default_rng(seed)` is used, so the same seed gives the same
partition on any machine and NumPy 1.17+. Requests that cannot be satisfied
raise `PartitionError` with one line saying what to change, before any work.

Client indices are returned sorted (canonical form: saved partitions compare
byte-for-byte); the training loop draws a fresh sample order every epoch anyway.

Nothing here imports TensorFlow: partitions can be computed, inspected and
plotted without paying the TF import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from .partition import Partition, jsonable

__all__ = [
    'PartitionError',
    'Partitioner',
    'IidPartitioner',
    'DirichletPartitioner',
    'ShardPartitioner',
    'ClassesPerClientPartitioner',
    'QuantitySkewPartitioner',
    'ClusterSkewPartitioner',
    'CLUSTER_LAYOUTS',
    'PARTITIONERS',
    'make_partitioner',
]


class PartitionError(ValueError):
  """A partition request that cannot be satisfied (message says what to change)."""


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _check_labels(labels: np.ndarray, who: str) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise PartitionError(
        f'{who}: labels must be 1-D (one class id per example), got shape {labels.shape}'
    )
  if labels.size and not np.issubdtype(labels.dtype, np.integer):
    raise PartitionError(f'{who}: labels must be integers, got dtype {labels.dtype}')
  if labels.size and labels.min() < 0:
    raise PartitionError(f'{who}: labels must be non-negative class ids')
  return labels.astype(np.int64, copy=False)


def _check_positive_int(value: Any, name: str, who: str) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise PartitionError(f'{who}: {name} must be a positive integer, got {value!r}')


def _check_seed(seed: Any, who: str) -> None:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise PartitionError(f'{who}: seed must be a non-negative integer, got {seed!r}')


def _check_alpha(alpha: Any, who: str, hint: str) -> None:
  if not (isinstance(alpha, (int, float, np.floating, np.integer))
          and math.isfinite(alpha) and alpha > 0):
    raise PartitionError(f'{who}: alpha must be a finite number > 0 ({hint}), got {alpha!r}')


def _check_min_size(min_size: Any, who: str) -> None:
  if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
    raise PartitionError(f'{who}: min_size must be an integer >= 0, got {min_size!r}')


def _check_enough_samples(n: int, num_clients: int, who: str, per_client: int = 1) -> None:
  if num_clients * per_client > n:
    raise PartitionError(
        f'{who}: {num_clients} clients x {per_client} sample(s) each need '
        f'{num_clients * per_client} samples but only {n} are available; use fewer clients'
        + (' or a smaller min_size' if per_client > 1 else '')
    )


def _allocate(total: int, weights: np.ndarray, minimum: int = 0) -> np.ndarray:
  """Splits integer `total` into len(weights) parts >= minimum, proportional to
  weights (largest-remainder rounding, ties by position: deterministic)."""
  weights = np.asarray(weights, dtype=np.float64)
  k = weights.size
  rest = total - minimum * k
  if rest < 0:
    raise ValueError('total too small for the minimum')
  if weights.sum() <= 0:
    weights = np.ones(k)
  exact = rest * weights / weights.sum()
  base = np.floor(exact).astype(np.int64)
  remainder = rest - int(base.sum())
  if remainder > 0:
    order = np.argsort(-(exact - base), kind='stable')
    base[order[:remainder]] += 1
  return base + minimum


def _apportion(total: int, weights: Sequence[float]) -> np.ndarray:
  """Hamilton apportionment of `total` seats by weights, then at least one seat
  each (taken from the largest): 100 clients at 3:3:2:1:1 -> 30/30/20/10/10."""
  seats = _allocate(total, np.asarray(weights, dtype=np.float64))
  while np.any(seats == 0):
    seats[int(np.argmax(seats))] -= 1
    seats[int(np.flatnonzero(seats == 0)[0])] += 1
  return seats


def _finish(client_lists: Sequence[np.ndarray], meta: dict,
            true_clusters: Optional[np.ndarray] = None) -> Partition:
  return Partition([np.sort(np.asarray(c, np.int64)) for c in client_lists],
                   true_clusters, meta)


# --------------------------------------------------------------------------- #
# partitioners
# --------------------------------------------------------------------------- #


class Partitioner:
  """Base: subclasses are frozen dataclasses with `num_clients` and `seed`."""

  name: ClassVar[str] = ''

  def partition(self, labels: np.ndarray) -> Partition:  # pragma: no cover
    raise NotImplementedError

  def params(self) -> dict:
    return jsonable(dataclasses.asdict(self))

  def _meta(self, **extra) -> dict:
    return {'partitioner': self.name, **self.params(), **extra}


@dataclasses.dataclass(frozen=True)
class IidPartitioner(Partitioner):
  """Uniformly random split into clients of equal size (+-1); covers all samples."""

  num_clients: int
  seed: int = 0
  name: ClassVar[str] = 'iid'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_seed(self.seed, self.name)

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    _check_enough_samples(labels.size, self.num_clients, self.name)
    rng = np.random.default_rng(self.seed)
    perm = rng.permutation(labels.size)
    return _finish(np.array_split(perm, self.num_clients), self._meta())


@dataclasses.dataclass(frozen=True)
class DirichletPartitioner(Partitioner):
  """Label skew: per class, proportions over clients ~ Dirichlet(alpha).

  The standard procedure of Hsu et al. 2019 as implemented in NIID-Bench (Li et
  al. 2022) and used by FedCross/FedCDA: for each class, draw p ~ Dir(alpha*1),
  zero the share of clients that already hold more than n/N samples
  (`balance=True`, keeps sizes from exploding), and cut the shuffled class
  indices at the cumulative proportions. The whole draw is repeated until every
  client has at least `min_size` samples; after `max_retries` draws it gives up
  with a PartitionError instead of looping forever. Smaller alpha = more skew.
  """

  num_clients: int
  alpha: float
  seed: int = 0
  min_size: int = 10
  balance: bool = True
  max_retries: int = 1000
  name: ClassVar[str] = 'dirichlet'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_seed(self.seed, self.name)
    _check_alpha(self.alpha, self.name, 'e.g. 0.1 skewed, 100 near-IID')
    _check_min_size(self.min_size, self.name)
    _check_positive_int(self.max_retries, 'max_retries', self.name)

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    n, num = labels.size, self.num_clients
    _check_enough_samples(n, num, self.name, max(1, self.min_size))
    rng = np.random.default_rng(self.seed)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    cap = n / num
    for attempt in range(1, self.max_retries + 1):
      parts = [[] for _ in range(num)]
      sizes = np.zeros(num, dtype=np.int64)
      for idx_k in by_class:
        idx_k = rng.permutation(idx_k)
        p = rng.dirichlet(np.full(num, float(self.alpha)))
        if self.balance:
          masked = p * (sizes < cap)
          if masked.sum() > 0:
            p = masked
        p = p / p.sum()
        cuts = (np.cumsum(p) * idx_k.size).astype(np.int64)[:-1]
        for j, chunk in enumerate(np.split(idx_k, cuts)):
          if chunk.size:
            parts[j].append(chunk)
            sizes[j] += chunk.size
      if sizes.min() >= self.min_size:
        lists = [np.concatenate(c) if c else np.zeros([0], np.int64) for c in parts]
        return _finish(lists, self._meta(attempts=attempt))
    raise PartitionError(
        f'{self.name}: no draw in {self.max_retries} attempts gave all {num} clients '
        f'>= min_size={self.min_size} samples (alpha={self.alpha}, {n} samples); '
        'lower min_size, raise alpha or use fewer clients'
    )


@dataclasses.dataclass(frozen=True)
class ShardPartitioner(Partitioner):
  """FedAvg's pathological split: sort by label, cut into N*s shards, deal s
  random shards to each client.

  Shards never straddle a class boundary: each class is cut into a number of
  shards proportional to its size (largest remainder, at least one), so shards
  are of near-equal size and "at most shards_per_client classes per client"
  holds exactly (McMahan et al.'s fixed-size shards can straddle two classes).
  Covers all samples. Needs at least as many shards as classes.
  """

  num_clients: int
  shards_per_client: int
  seed: int = 0
  name: ClassVar[str] = 'shards'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_positive_int(self.shards_per_client, 'shards_per_client', self.name)
    _check_seed(self.seed, self.name)

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    num_shards = self.num_clients * self.shards_per_client
    if num_shards > labels.size:
      raise PartitionError(
          f'{self.name}: {self.num_clients} clients x {self.shards_per_client} shards = '
          f'{num_shards} shards but only {labels.size} samples; use fewer clients or shards'
      )
    classes, class_sizes = np.unique(labels, return_counts=True)
    if num_shards < classes.size:
      raise PartitionError(
          f'{self.name}: {num_shards} shards cannot cover {classes.size} classes; '
          'num_clients x shards_per_client must be >= the number of classes'
      )
    rng = np.random.default_rng(self.seed)
    shards_per_class = _allocate(num_shards, class_sizes, minimum=1)
    # A class smaller than its shard count would give empty shards: move the
    # excess to the largest classes (always possible since num_shards <= n).
    while np.any(shards_per_class > class_sizes):
      k = int(np.argmax(shards_per_class - class_sizes))
      excess = shards_per_class[k] - class_sizes[k]
      shards_per_class[k] -= excess
      room = class_sizes - shards_per_class
      for _ in range(excess):
        j = int(np.argmax(room))
        shards_per_class[j] += 1
        room[j] -= 1
    shards = []
    for k, count in zip(classes, shards_per_class):
      idx_k = rng.permutation(np.flatnonzero(labels == k))
      shards.extend(np.array_split(idx_k, count))
    deal = rng.permutation(num_shards).reshape(self.num_clients, self.shards_per_client)
    lists = [np.concatenate([shards[s] for s in row]) for row in deal]
    return _finish(lists, self._meta())


@dataclasses.dataclass(frozen=True)
class ClassesPerClientPartitioner(Partitioner):
  """Every client holds exactly `classes_per_client` distinct classes (FedLEx's
  "2 classes per client").

  Class assignment is balanced: clients pick, in turn, the k least-used classes
  (ties broken at random), so every class is used and usage counts differ by at
  most one. Each class's samples are then split evenly (+-1) among its holders.
  Covers all samples.
  """

  num_clients: int
  classes_per_client: int
  seed: int = 0
  name: ClassVar[str] = 'classes'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_positive_int(self.classes_per_client, 'classes_per_client', self.name)
    _check_seed(self.seed, self.name)

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    classes, class_sizes = np.unique(labels, return_counts=True)
    k, num = self.classes_per_client, self.num_clients
    if k > classes.size:
      raise PartitionError(
          f'{self.name}: classes_per_client={k} exceeds the {classes.size} classes present; '
          f'use classes_per_client <= {classes.size}'
      )
    if num * k < classes.size:
      raise PartitionError(
          f'{self.name}: {num} clients x {k} classes cannot use all {classes.size} classes; '
          f'need num_clients >= {math.ceil(classes.size / k)}'
      )
    rng = np.random.default_rng(self.seed)
    usage = np.zeros(classes.size, dtype=np.int64)
    assignment = np.zeros([num, k], dtype=np.int64)
    for i in range(num):
      order = np.lexsort((rng.random(classes.size), usage))
      chosen = np.sort(order[:k])
      assignment[i] = chosen
      usage[chosen] += 1
    too_small = usage > class_sizes
    if np.any(too_small):
      c = int(np.flatnonzero(too_small)[0])
      raise PartitionError(
          f'{self.name}: class {int(classes[c])} has {int(class_sizes[c])} samples but '
          f'{int(usage[c])} clients hold it; use fewer clients or fewer classes per client'
      )
    parts = [[] for _ in range(num)]
    for c in range(classes.size):
      holders = np.flatnonzero((assignment == c).any(axis=1))
      idx_c = rng.permutation(np.flatnonzero(labels == classes[c]))
      for holder, chunk in zip(holders, np.array_split(idx_c, holders.size)):
        parts[holder].append(chunk)
    lists = [np.concatenate(p) for p in parts]
    return _finish(lists, self._meta())


@dataclasses.dataclass(frozen=True)
class QuantitySkewPartitioner(Partitioner):
  """IID labels, unequal client sizes: sizes ~ Dirichlet(alpha) over clients.

  Each client first receives `min_size` samples; the remaining samples are
  shared in proportion to one Dirichlet(alpha) draw (largest remainder), then a
  random permutation is cut at those sizes. Covers all samples.
  """

  num_clients: int
  alpha: float
  seed: int = 0
  min_size: int = 1
  name: ClassVar[str] = 'quantity'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_seed(self.seed, self.name)
    _check_alpha(self.alpha, self.name, 'smaller = more unequal sizes')
    _check_min_size(self.min_size, self.name)

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    _check_enough_samples(labels.size, self.num_clients, self.name, max(1, self.min_size))
    rng = np.random.default_rng(self.seed)
    p = rng.dirichlet(np.full(self.num_clients, float(self.alpha)))
    sizes = _allocate(labels.size, p, minimum=self.min_size)
    perm = rng.permutation(labels.size)
    lists = np.split(perm, np.cumsum(sizes)[:-1])
    return _finish(lists, self._meta())


# CADIS cluster-skewed layouts: (relative clients per cluster, sample sizes).
CLUSTER_LAYOUTS = {
    # Sample-unbalanced multi-cluster (CADIS Sec. V-A, "MC"): 3:3:2:1:1.
    'mc': ((3, 3, 2, 1, 1), 'unbalanced'),
    # Sample-unbalanced single (big) cluster (CADIS Sec. V-C, "UC"): as BC but
    # with unbalanced client sizes.
    'uc': ((6, 1, 1, 1, 1), 'unbalanced'),
    # Sample-balanced single (big) cluster (CADIS Sec. V-C, "BC"): one cluster
    # holds 60% of the clients (the paper's example), the rest split equally;
    # every client has the same number of samples.
    'bc': ((6, 1, 1, 1, 1), 'balanced'),
}


@dataclasses.dataclass(frozen=True)
class ClusterSkewPartitioner(Partitioner):
  """CADIS cluster-skewed layouts with known ground-truth clusters.

  The classes 0..C-1 are cut into `len(ratios)` (default 5) consecutive groups:
  with 10 classes the pairs {0,1},{2,3},{4,5},{6,7},{8,9}. Cluster c owns group c
  and a share of the clients given by the layout's ratios (largest remainder,
  at least one client per cluster; 100 clients MC -> 30/30/20/10/10). Every
  client of a cluster holds all classes of its group with the same count per
  class.

  Layouts (see CLUSTER_LAYOUTS; `cluster_ratios` overrides the ratios):
    mc: 3:3:2:1:1, client sizes lognormal(0, size_sigma) within each cluster;
        a cluster's samples are divided among its clients.
    uc: 6:1:1:1:1 (one big cluster with 60% of the clients, CADIS Sec. V-C),
        unbalanced sizes as in mc.
    bc: 6:1:1:1:1 with balanced sizes: every client of every cluster gets the
        same number of samples, set by the cluster with the fewest samples per
        client, so the big cluster really holds more data; the rest is unused.

  Because counts per class are equal inside a client, each cluster uses
  min over its classes of the class size per class; surplus samples of larger
  classes are left out (the Partition covers a documented subset).
  Needs C divisible by the number of clusters (10 classes for the paper's
  pairs; CIFAR-100 gives 20 classes per cluster, the paper's "20% of labels").
  """

  num_clients: int
  layout: str = 'mc'
  seed: int = 0
  cluster_ratios: Optional[tuple] = None
  size_sigma: float = 1.0
  min_per_class: int = 1
  name: ClassVar[str] = 'cluster'

  def __post_init__(self):
    _check_positive_int(self.num_clients, 'num_clients', self.name)
    _check_seed(self.seed, self.name)
    if self.layout not in CLUSTER_LAYOUTS:
      raise PartitionError(
          f'{self.name}: unknown layout {self.layout!r}; use one of {sorted(CLUSTER_LAYOUTS)}'
      )
    ratios = self.ratios
    if len(ratios) < 1 or any((not math.isfinite(r)) or r <= 0 for r in ratios):
      raise PartitionError(f'{self.name}: cluster_ratios must be positive numbers, got {ratios}')
    if self.num_clients < len(ratios):
      raise PartitionError(
          f'{self.name}: {self.num_clients} clients cannot fill {len(ratios)} clusters; '
          f'use num_clients >= {len(ratios)}'
      )
    if not (math.isfinite(self.size_sigma) and self.size_sigma >= 0):
      raise PartitionError(f'{self.name}: size_sigma must be >= 0, got {self.size_sigma!r}')
    _check_positive_int(self.min_per_class, 'min_per_class', self.name)

  @property
  def ratios(self) -> tuple:
    if self.cluster_ratios is not None:
      return tuple(float(r) for r in self.cluster_ratios)
    return tuple(float(r) for r in CLUSTER_LAYOUTS[self.layout][0])

  @property
  def balanced(self) -> bool:
    return CLUSTER_LAYOUTS[self.layout][1] == 'balanced'

  def clients_per_cluster(self) -> np.ndarray:
    """Number of clients of each cluster (largest remainder, >= 1 each)."""
    return _apportion(self.num_clients, self.ratios)

  def params(self) -> dict:
    p = super().params()
    p['cluster_ratios'] = list(self.ratios)
    p['balanced'] = self.balanced
    return p

  def _meta(self, **extra) -> dict:
    return {'partitioner': f'cluster_{self.layout}', **self.params(), **extra}

  def partition(self, labels: np.ndarray) -> Partition:
    labels = _check_labels(labels, self.name)
    num_clusters = len(self.ratios)
    num_classes = int(labels.max()) + 1 if labels.size else 0
    present = np.unique(labels)
    if num_classes == 0 or num_classes % num_clusters or present.size != num_classes:
      raise PartitionError(
          f'{self.name}_{self.layout}: needs labels 0..C-1 all present with C divisible by '
          f'{num_clusters} clusters (10 classes for the paper\'s label pairs); '
          f'got {present.size} classes with max label {num_classes - 1}'
      )
    per_cluster = num_classes // num_clusters
    groups = [list(range(c * per_cluster, (c + 1) * per_cluster)) for c in range(num_clusters)]
    counts = self.clients_per_cluster()
    rng = np.random.default_rng(self.seed)
    by_class = [rng.permutation(np.flatnonzero(labels == k)) for k in range(num_classes)]
    budgets = np.array([min(by_class[k].size for k in g) for g in groups], dtype=np.int64)
    for c in range(num_clusters):
      if budgets[c] < counts[c] * self.min_per_class:
        raise PartitionError(
            f'{self.name}_{self.layout}: cluster {c} (classes {groups[c]}) has '
            f'{budgets[c]} samples per class for {counts[c]} clients x min_per_class='
            f'{self.min_per_class}; use fewer clients'
        )
    if self.balanced:
      per_client = int(min(budgets[c] // counts[c] for c in range(num_clusters)))
      per_class_sizes = [np.full(counts[c], per_client, np.int64) for c in range(num_clusters)]
    else:
      per_class_sizes = []
      for c in range(num_clusters):
        w = rng.lognormal(0.0, float(self.size_sigma), size=counts[c])
        per_class_sizes.append(_allocate(int(budgets[c]), w, minimum=self.min_per_class))
    lists, clusters = [], []
    for c in range(num_clusters):
      cuts = np.cumsum(per_class_sizes[c])
      starts = cuts - per_class_sizes[c]
      for i in range(counts[c]):
        lists.append(np.concatenate([by_class[k][starts[i]:cuts[i]] for k in groups[c]]))
        clusters.append(c)
    # Clients are listed cluster by cluster; shuffle so that client index does
    # not reveal the cluster (matters for in-order collaborator selection).
    order = rng.permutation(len(lists))
    lists = [lists[i] for i in order]
    clusters = np.array(clusters, np.int64)[order]
    return _finish(lists, self._meta(cluster_classes=groups,
                                     clients_per_cluster=counts.tolist()), clusters)


PARTITIONERS = {
    'iid': (IidPartitioner, {}),
    'dirichlet': (DirichletPartitioner, {}),
    'shards': (ShardPartitioner, {}),
    'classes': (ClassesPerClientPartitioner, {}),
    'quantity': (QuantitySkewPartitioner, {}),
    'cluster_mc': (ClusterSkewPartitioner, {'layout': 'mc'}),
    'cluster_uc': (ClusterSkewPartitioner, {'layout': 'uc'}),
    'cluster_bc': (ClusterSkewPartitioner, {'layout': 'bc'}),
}


def make_partitioner(name: str, **params) -> Partitioner:
  """Builds a partitioner by name (iid, dirichlet, shards, classes, quantity,
  cluster_mc, cluster_uc, cluster_bc), rejecting unknown parameters by name."""
  if name not in PARTITIONERS:
    raise ValueError(f'unknown partitioner {name!r}; valid: {", ".join(PARTITIONERS)}')
  cls, fixed = PARTITIONERS[name]
  fields = {f.name for f in dataclasses.fields(cls)} - set(fixed)
  unknown = sorted(set(params) - fields)
  if unknown:
    raise PartitionError(
        f'partitioner {name!r} does not take {", ".join(unknown)}; it takes '
        f'{", ".join(sorted(fields))}'
    )
  missing = sorted(
      f.name for f in dataclasses.fields(cls)
      if f.name not in params and f.name not in fixed
      and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
  )
  if missing:
    raise PartitionError(f'partitioner {name!r} needs {", ".join(missing)}')
  return cls(**fixed, **params)
