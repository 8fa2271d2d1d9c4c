"""Tests for data.partitioners: coverage, determinism, skew behaviour, layouts, I/O, errors."""

import os
import sys

import numpy as np
import pytest

from tff_algos.data.partitioners import (
    ClassesPerClientPartitioner,
    ClusterSkewPartitioner,
    DirichletPartitioner,
    IidPartitioner,
    Partition,
    PartitionError,
    QuantitySkewPartitioner,
    ShardPartitioner,
    make_partitioner,
)

NUM_CLASSES = 10


@pytest.fixture(scope='module')
def labels():
  """6000 labels, 10 classes of unequal size (550..650) in shuffled order."""
  rng = np.random.default_rng(123)
  sizes = 550 + 100 * np.arange(NUM_CLASSES) // (NUM_CLASSES - 1)
  y = np.repeat(np.arange(NUM_CLASSES), sizes)
  return rng.permutation(y).astype(np.int32)


# Partitioners that must cover every sample, with the params used below.
COVERING = {
    'iid': dict(num_clients=20),
    'dirichlet': dict(num_clients=20, alpha=0.3),
    'shards': dict(num_clients=20, shards_per_client=2),
    'classes': dict(num_clients=20, classes_per_client=2),
    'quantity': dict(num_clients=20, alpha=0.5),
}
CLUSTERED = {
    'cluster_mc': dict(num_clients=20),
    'cluster_uc': dict(num_clients=20),
    'cluster_bc': dict(num_clients=20),
}
ALL = {**COVERING, **CLUSTERED}


def _entropy(counts):
  p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
  with np.errstate(divide='ignore', invalid='ignore'):
    return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


def test_importing_partitioners_does_not_import_tensorflow():
  # Imported above; the partition explorer relies on staying light.
  assert 'tff_algos.data.partitioners' in sys.modules
  code = ('import sys; sys.path.insert(0, %r); import tff_algos.data.partitioners, '
          'tff_algos.data.round_sampling; from tff_algos.data import IidPartitioner; '
          'assert "tensorflow" not in sys.modules, "TF imported"' %
          os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import subprocess
  subprocess.run([sys.executable, '-c', code], check=True)


@pytest.mark.parametrize('name', sorted(ALL))
def test_disjoint_shapes_and_seeded(labels, name):
  params = ALL[name]
  p1 = make_partitioner(name, seed=7, **params).partition(labels)
  p2 = make_partitioner(name, seed=7, **params).partition(labels)
  p3 = make_partitioner(name, seed=8, **params).partition(labels)
  assert p1.num_clients == params['num_clients']
  p1.validate(labels.size)  # in range, disjoint
  for idx in p1.client_indices:
    assert idx.dtype == np.int64 and idx.ndim == 1 and idx.size > 0
    assert np.all(np.diff(idx) > 0)  # sorted canonical form
  assert all(np.array_equal(a, b) for a, b in zip(p1.client_indices, p2.client_indices))
  assert any(not np.array_equal(a, b) for a, b in zip(p1.client_indices, p3.client_indices))
  assert p1.meta['partitioner'] == name and p1.meta['seed'] == 7
  if name in COVERING:
    assert np.array_equal(np.sort(p1.all_indices()), np.arange(labels.size))
    assert p1.true_clusters is None
  else:
    assert p1.all_indices().size <= labels.size
    assert p1.true_clusters.shape == (params['num_clients'],)


def test_known_partition_is_stable_across_machines():
  # default_rng(seed) streams are fixed by NumPy's PCG64 spec: pin one result.
  p = IidPartitioner(num_clients=3, seed=0).partition(np.arange(7) % 2)
  assert [c.tolist() for c in p.client_indices] == [[2, 3, 4], [5, 6], [0, 1]]


def test_iid_sizes_balanced(labels):
  p = IidPartitioner(num_clients=7, seed=0).partition(labels)
  sizes = p.sizes()
  assert sizes.max() - sizes.min() <= 1


def test_dirichlet_concentration(labels):
  def mean_entropy(alpha):
    p = DirichletPartitioner(num_clients=20, alpha=alpha, seed=1, min_size=5).partition(labels)
    return _entropy(p.counts(labels, NUM_CLASSES)).mean()

  skewed, near_iid = mean_entropy(0.05), mean_entropy(100.0)
  assert skewed < near_iid - 1.0
  assert near_iid > 0.95 * np.log(NUM_CLASSES)


def test_dirichlet_min_size_and_retry_error(labels):
  p = DirichletPartitioner(num_clients=20, alpha=0.1, seed=3, min_size=50).partition(labels)
  assert p.sizes().min() >= 50
  with pytest.raises(PartitionError, match='lower min_size'):
    DirichletPartitioner(num_clients=50, alpha=0.01, seed=0, min_size=110,
                         max_retries=3).partition(labels)


def test_shards_at_most_k_classes(labels):
  for k in (1, 2, 3):
    p = ShardPartitioner(num_clients=20, shards_per_client=k, seed=0).partition(labels)
    classes = (p.counts(labels, NUM_CLASSES) > 0).sum(axis=1)
    assert classes.max() <= k
    sizes = p.sizes()
    assert sizes.max() <= 1.2 * sizes.min()  # near-equal shards


def test_classes_per_client_exact_and_balanced(labels):
  for k in (1, 2, 5):
    p = ClassesPerClientPartitioner(num_clients=20, classes_per_client=k, seed=0).partition(labels)
    counts = p.counts(labels, NUM_CLASSES)
    assert np.all((counts > 0).sum(axis=1) == k)
    holders = (counts > 0).sum(axis=0)
    assert holders.min() >= 1 and holders.max() - holders.min() <= 1
    for c in range(NUM_CLASSES):  # each class split evenly among its holders
      nz = counts[:, c][counts[:, c] > 0]
      assert nz.max() - nz.min() <= 1


def test_quantity_skew_sizes(labels):
  p = QuantitySkewPartitioner(num_clients=20, alpha=0.2, seed=0, min_size=10).partition(labels)
  sizes = p.sizes()
  assert sizes.min() >= 10
  assert sizes.max() > 4 * np.median(sizes)  # genuinely unequal
  flat = QuantitySkewPartitioner(num_clients=20, alpha=1e4, seed=0).partition(labels).sizes()
  assert flat.max() < 1.2 * flat.min()


def test_cluster_mc_layout(labels):
  p = ClusterSkewPartitioner(num_clients=100, layout='mc', seed=0).partition(labels)
  assert np.bincount(p.true_clusters).tolist() == [30, 30, 20, 10, 10]
  counts = p.counts(labels, NUM_CLASSES)
  for n in range(p.num_clients):
    c = p.true_clusters[n]
    held = np.flatnonzero(counts[n])
    assert held.tolist() == [2 * c, 2 * c + 1]
    assert counts[n, 2 * c] == counts[n, 2 * c + 1]  # equal counts per class
  sizes = p.sizes()
  assert sizes.max() > 3 * sizes.min()  # unbalanced client sizes
  # A cluster's two classes are used up to the smaller class's size.
  for c in range(5):
    members = p.true_clusters == c
    smaller = min(np.sum(labels == 2 * c), np.sum(labels == 2 * c + 1))
    assert counts[members, 2 * c].sum() == smaller
  # Client index does not reveal the cluster.
  assert not np.all(np.diff(p.true_clusters) >= 0)
  assert p.meta['cluster_classes'] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_cluster_uc_and_bc_layouts(labels):
  uc = ClusterSkewPartitioner(num_clients=100, layout='uc', seed=0).partition(labels)
  bc = ClusterSkewPartitioner(num_clients=100, layout='bc', seed=0).partition(labels)
  for p in (uc, bc):
    assert np.bincount(p.true_clusters).tolist() == [60, 10, 10, 10, 10]
    assert np.all((p.counts(labels, NUM_CLASSES) > 0).sum(axis=1) == 2)
  assert len(set(bc.sizes().tolist())) == 1  # balanced: every client the same size
  assert uc.sizes().max() > 3 * uc.sizes().min()
  custom = ClusterSkewPartitioner(num_clients=10, seed=0, cluster_ratios=(1, 1, 1, 1, 6))
  assert np.bincount(custom.partition(labels).true_clusters).tolist() == [1, 1, 1, 1, 6]


def test_cluster_generalises_to_100_classes():
  y = np.repeat(np.arange(100), 30).astype(np.int32)
  p = ClusterSkewPartitioner(num_clients=20, seed=0).partition(y)
  held = (p.counts(y, 100) > 0).sum(axis=1)
  assert np.all(held == 20)  # CADIS: 20% of the labels per client


def test_save_load_round_trip(tmp_path, labels):
  p = ClusterSkewPartitioner(num_clients=20, layout='mc', seed=2).partition(labels)
  path = tmp_path / 'sub' / 'partition.npz'
  assert p.save(str(path)) == str(path)
  assert os.listdir(tmp_path / 'sub') == ['partition.npz']  # temp file replaced
  q = Partition.load(str(path))
  assert q.num_clients == p.num_clients
  assert all(np.array_equal(a, b) and b.dtype == np.int64
             for a, b in zip(p.client_indices, q.client_indices))
  assert np.array_equal(p.true_clusters, q.true_clusters)
  assert q.meta == p.meta
  r = IidPartitioner(num_clients=4, seed=0).partition(labels)
  r.save(str(tmp_path / 'iid.npz'))
  assert Partition.load(str(tmp_path / 'iid.npz')).true_clusters is None


def test_summary(labels):
  p = ShardPartitioner(num_clients=10, shards_per_client=2, seed=0).partition(labels)
  s = p.summary(labels)
  assert s['num_clients'] == 10 and s['num_samples'] == labels.size
  assert s['counts'].shape == (10, NUM_CLASSES)
  assert s['counts'].sum() == labels.size
  assert s['samples_per_client']['min'] <= s['samples_per_client']['mean'] \
      <= s['samples_per_client']['max']
  assert 1 <= s['classes_per_client']['max'] <= 2
  c = ClusterSkewPartitioner(num_clients=10, seed=0).partition(labels).summary(labels)
  assert c['clients_per_cluster'] == {0: 3, 1: 3, 2: 2, 3: 1, 4: 1}


def test_plot_writes_png(tmp_path, labels):
  for name in ('dirichlet', 'cluster_mc'):
    p = make_partitioner(name, **ALL[name]).partition(labels)
    path = tmp_path / f'{name}.png'
    p.plot(labels, str(path), num_classes=NUM_CLASSES)
    data = path.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 2000


@pytest.mark.parametrize('make,match', [
    (lambda y: IidPartitioner(num_clients=10, seed=0).partition(y[:5]), 'use fewer clients'),
    (lambda y: DirichletPartitioner(num_clients=5, alpha=0.0), 'alpha must be'),
    (lambda y: DirichletPartitioner(num_clients=5, alpha=-1.0), 'alpha must be'),
    (lambda y: QuantitySkewPartitioner(num_clients=5, alpha=float('nan')), 'alpha must be'),
    (lambda y: ClassesPerClientPartitioner(num_clients=5, classes_per_client=11).partition(y),
     'classes_per_client=11 exceeds'),
    (lambda y: ClassesPerClientPartitioner(num_clients=2, classes_per_client=2).partition(y),
     'cannot use all 10 classes'),
    (lambda y: ShardPartitioner(num_clients=3, shards_per_client=3).partition(y),
     'cannot cover 10 classes'),
    (lambda y: ShardPartitioner(num_clients=10, shards_per_client=2).partition(y[:15]),
     'shards but only 15 samples'),
    (lambda y: ClusterSkewPartitioner(num_clients=4), 'num_clients >= 5'),
    (lambda y: ClusterSkewPartitioner(num_clients=10, layout='xx'), 'unknown layout'),
    (lambda y: ClusterSkewPartitioner(num_clients=10).partition(y % 7), 'divisible by'),
    (lambda y: ClusterSkewPartitioner(num_clients=1000).partition(y[:600]), 'use fewer clients'),
    (lambda y: IidPartitioner(num_clients=0), 'positive integer'),
    (lambda y: IidPartitioner(num_clients=3, seed=-1), 'seed'),
    (lambda y: IidPartitioner(num_clients=3).partition(y.astype(np.float32)), 'integers'),
    (lambda y: IidPartitioner(num_clients=3).partition(y.reshape(-1, 2)), '1-D'),
    (lambda y: make_partitioner('iid', num_clients=3, alpha=1.0), 'does not take alpha'),
    (lambda y: make_partitioner('dirichlet', num_clients=3), 'needs alpha'),
])
def test_impossible_requests(labels, make, match):
  with pytest.raises(PartitionError, match=match) as info:
    make(labels)
  assert '\n' not in str(info.value)


def test_make_partitioner_names():
  with pytest.raises(ValueError, match='valid: iid, dirichlet'):
    make_partitioner('pareto', num_clients=3)
  assert make_partitioner('cluster_uc', num_clients=10).layout == 'uc'
  with pytest.raises(PartitionError, match='does not take layout'):
    make_partitioner('cluster_mc', num_clients=10, layout='bc')
