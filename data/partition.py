"""`Partition`: what a partitioner returns, per-client index lists into one labelled array,
and what can be done with one: validate, save/load (.npz, no pickle), summarise, plot.

Nothing here imports TensorFlow (matplotlib only when plotting).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from typing import Any, Optional

import numpy as np

__all__ = ['Partition']

_FORMAT_VERSION = 1


def jsonable(value: Any) -> Any:
  """Converts numpy scalars/arrays inside meta so it survives JSON round trips."""
  if isinstance(value, dict):
    return {str(k): jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value


@dataclasses.dataclass(eq=False)
class Partition:
  """Per-client index lists into one labelled array.

  Attributes:
    client_indices: one int64 array per client (client n = position n), sorted,
      pairwise disjoint. Their union is the whole array unless the partitioner
      documents that it uses a subset (cluster layouts with equal class counts).
    true_clusters: int64 [N] ground-truth cluster id per client when the layout
      defines one (CADIS cluster-skewed partitions), else None.
    meta: partitioner name and parameters (JSON-compatible), for provenance.
  """

  client_indices: list
  true_clusters: Optional[np.ndarray] = None
  meta: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.client_indices = [
        np.asarray(idx, dtype=np.int64).reshape(-1) for idx in self.client_indices
    ]
    if self.true_clusters is not None:
      self.true_clusters = np.asarray(self.true_clusters, dtype=np.int64)
      if self.true_clusters.shape != (len(self.client_indices),):
        raise ValueError(
            f'true_clusters has shape {self.true_clusters.shape}, expected '
            f'({len(self.client_indices)},) (one cluster id per client)'
        )
    self.meta = jsonable(dict(self.meta))

  @property
  def num_clients(self) -> int:
    return len(self.client_indices)

  def sizes(self) -> np.ndarray:
    """Number of samples per client, int64 [N]."""
    return np.array([len(i) for i in self.client_indices], dtype=np.int64)

  def all_indices(self) -> np.ndarray:
    """Concatenation of all clients' indices (client order)."""
    if not self.client_indices:
      return np.zeros([0], np.int64)
    return np.concatenate(self.client_indices)

  def validate(self, num_samples: Optional[int] = None) -> None:
    """Raises ValueError unless indices are in range and pairwise disjoint."""
    flat = self.all_indices()
    if flat.size and flat.min() < 0:
      raise ValueError('partition has negative indices')
    if num_samples is not None and flat.size and flat.max() >= num_samples:
      raise ValueError(
          f'partition index {flat.max()} out of range for {num_samples} samples'
      )
    if np.unique(flat).size != flat.size:
      raise ValueError('partition clients overlap (an index is used twice)')

  # ---- statistics -------------------------------------------------------- #

  def counts(self, labels: np.ndarray, num_classes: Optional[int] = None) -> np.ndarray:
    """Per-client x per-class sample counts, int64 [N, num_classes]."""
    labels = np.asarray(labels).reshape(-1)
    if num_classes is None:
      num_classes = int(labels.max()) + 1 if labels.size else 0
    out = np.zeros([self.num_clients, num_classes], dtype=np.int64)
    for n, idx in enumerate(self.client_indices):
      if idx.size:
        out[n] = np.bincount(labels[idx], minlength=num_classes)[:num_classes]
    return out

  def summary(self, labels: np.ndarray, num_classes: Optional[int] = None) -> dict:
    """Statistics for logs and the partition explorer (plain Python + one matrix)."""
    counts = self.counts(labels, num_classes)
    sizes = counts.sum(axis=1)
    classes = (counts > 0).sum(axis=1)
    with np.errstate(divide='ignore', invalid='ignore'):
      p = counts / np.maximum(sizes, 1)[:, None]
      ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)
    result = {
        'partitioner': self.meta.get('partitioner'),
        'num_clients': self.num_clients,
        'num_samples': int(sizes.sum()),
        'num_labelled': int(np.asarray(labels).size),
        'num_classes': int(counts.shape[1]),
        'samples_per_client': {
            'min': int(sizes.min()) if sizes.size else 0,
            'mean': float(sizes.mean()) if sizes.size else 0.0,
            'max': int(sizes.max()) if sizes.size else 0,
            'std': float(sizes.std()) if sizes.size else 0.0,
        },
        'classes_per_client': {
            'min': int(classes.min()) if classes.size else 0,
            'mean': float(classes.mean()) if classes.size else 0.0,
            'max': int(classes.max()) if classes.size else 0,
        },
        'mean_label_entropy': float(ent.mean()) if ent.size else 0.0,
        'counts': counts,
    }
    if self.true_clusters is not None:
      ids, num = np.unique(self.true_clusters, return_counts=True)
      result['clients_per_cluster'] = {int(i): int(c) for i, c in zip(ids, num)}
    return result

  # ---- persistence ------------------------------------------------------- #

  def save(self, path: str) -> str:
    """Writes an .npz atomically (temp file + os.replace); returns `path`.

    Atomic so that a program killed mid-write never leaves a truncated
    partition that a resumed run would silently load. The file is written at
    exactly `path` (no '.npz' is appended).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    sizes = self.sizes()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    arrays = {
        'format_version': np.int64(_FORMAT_VERSION),
        'indices': self.all_indices(),
        'offsets': offsets,
        'has_clusters': np.bool_(self.true_clusters is not None),
        'true_clusters': (
            self.true_clusters
            if self.true_clusters is not None
            else np.zeros([0], np.int64)
        ),
        'meta_json': np.array(json.dumps(self.meta, sort_keys=True)),
    }
    fd, tmp = tempfile.mkstemp(
        dir=directory, prefix='.' + os.path.basename(path) + '.', suffix='.tmp'
    )
    try:
      with os.fdopen(fd, 'wb') as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
      # mkstemp creates the file 0600; give it the permissions open() would (0666 & ~umask).
      umask = os.umask(0)
      os.umask(umask)
      os.chmod(tmp, 0o666 & ~umask)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise
    return path

  @classmethod
  def load(cls, path: str) -> 'Partition':
    """Reads a file written by `save` (no pickle involved)."""
    with np.load(os.fspath(path), allow_pickle=False) as z:
      version = int(z['format_version'])
      if version != _FORMAT_VERSION:
        raise ValueError(
            f'{path}: partition format version {version}, expected {_FORMAT_VERSION}'
        )
      indices = z['indices'].astype(np.int64)
      offsets = z['offsets'].astype(np.int64)
      clusters = z['true_clusters'] if bool(z['has_clusters']) else None
      meta = json.loads(str(z['meta_json']))
    client_indices = [indices[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    return cls(client_indices, clusters, meta)

  # ---- plotting ---------------------------------------------------------- #

  def plot(
      self,
      labels: np.ndarray,
      path: str,
      num_classes: Optional[int] = None,
      title: Optional[str] = None,
  ) -> str:
    """Writes a client x class bubble chart PNG (bubble area ~ count), like
    FedCross's Figure 3; clients are coloured by true cluster when known.

    Uses matplotlib's Agg canvas directly (no pyplot) so it neither needs a
    display nor changes the process-wide backend of a notebook that imports us.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = self.counts(labels, num_classes)
    n, c = counts.shape
    fig = Figure(figsize=(min(max(6.0, 0.12 * n + 2.0), 40.0), min(max(3.0, 0.3 * c + 1.5), 30.0)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    client_idx, class_idx = np.nonzero(counts)
    values = counts[client_idx, class_idx].astype(np.float64)
    max_area = 250.0 if n <= 50 else max(20.0, 250.0 * 50 / n)
    areas = max_area * values / max(values.max(), 1.0) if values.size else values
    if self.true_clusters is not None and values.size:
      colours = self.true_clusters[client_idx]
      ax.scatter(client_idx, class_idx, s=areas, c=colours, cmap='tab10', alpha=0.7,
                 edgecolors='none')
    else:
      ax.scatter(client_idx, class_idx, s=areas, color='tab:blue', alpha=0.7,
                 edgecolors='none')
    ax.set_xlabel('client')
    ax.set_ylabel('class')
    ax.set_xlim(-1, n)
    ax.set_ylim(-1, c)
    if c <= 30:
      ax.set_yticks(range(c))
    ax.set_title(title or self.meta.get('partitioner', 'partition'))
    fig.tight_layout()
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=100)
    with open(path, 'wb') as f:
      f.write(buf.getvalue())
    return path
