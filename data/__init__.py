"""Datasets -> tff.simulation ClientData: loaders, partitioners, client inputs.

In a checkout this package is `data`; the wheel installs it as `tff_algos.data` (a name
that cannot clash with a user's own `data`), so its modules import each other relatively.
`data.client_data_inputs` turns a user's own TFF ClientData into our client inputs.

Public names are re-exported lazily (PEP 562): `from data import
IidPartitioner` or `import data.partitioners` does not import TensorFlow,
which the partition explorer and quick checks appreciate; names from
`data.datasets` / `data.loaders` import TF/TFF on first use.

This package depends on numpy, TF/TFF, tensorflow-datasets, scikit-learn and
matplotlib only: never on `programs` or the method modules of `tff_algos`. It does import
`tff_algos.execution` (stdlib only), whose exit hook stops TFF's worker processes: without
it a script that loads data through TFF and nothing of `tff_algos` ends with TFF's
ServiceManager traceback.
"""

import importlib
from typing import TYPE_CHECKING

try:   # installed, or through the checkout's link: this package is `tff_algos.data`
  from .. import execution as _execution  # noqa: F401
except ImportError:
  try:   # a checkout's top-level `data`, beside `tff_algos`
    from tff_algos import execution as _execution  # noqa: F401
  except ImportError:   # `data` copied out alone: TFF's own exit
    _execution = None

_EXPORTS = {
    'data.partitioners': (
        'PartitionError', 'Partition', 'Partitioner', 'IidPartitioner',
        'DirichletPartitioner', 'ShardPartitioner', 'ClassesPerClientPartitioner',
        'QuantitySkewPartitioner', 'ClusterSkewPartitioner', 'CLUSTER_LAYOUTS',
        'PARTITIONERS', 'make_partitioner',
    ),
    'data.client_inputs': ('client_input', 'sample_clients', 'round_inputs'),
    'data.client_data_inputs': (
        'ClientDataInputs', 'ClientDataSource', 'ClientDataSourceIterator',
        'client_selection_fn', 'federated_data_source', 'load_client_ids',
    ),
    'data.datasets': ('ArrayDataset', 'ArrayClientData', 'FederatedDataset', 'federate',
                      'hold_out_client_test', 'held_out_count'),
    'data.loaders': (
        'DatasetNotFoundError', 'DatasetFormatError', 'FASHION_MNIST_DIR', 'read_idx', 'load_fashion_mnist',
        'load_digits', 'TFDS_NAMES', 'load_tfds', 'load_tff_emnist', 'load_tff_shakespeare',
        'LEAF_LETTERS', 'load_leaf', 'DATASETS', 'NATURALLY_FEDERATED', 'load_dataset',
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
  module = _WHERE.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  # Relative to this package: installed from the wheel it is `tff_algos.data`.
  value = getattr(importlib.import_module(module[len('data'):], __name__), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the real names
  from .client_data_inputs import (  # noqa: F401
      ClientDataInputs, ClientDataSource, ClientDataSourceIterator, client_selection_fn,
      federated_data_source, load_client_ids)
  from .client_inputs import client_input, round_inputs, sample_clients  # noqa: F401
  from .datasets import (  # noqa: F401
      ArrayClientData, ArrayDataset, FederatedDataset, federate, held_out_count,
      hold_out_client_test)
  from .loaders import (  # noqa: F401
      DATASETS, FASHION_MNIST_DIR, LEAF_LETTERS, NATURALLY_FEDERATED, TFDS_NAMES,
      DatasetFormatError, DatasetNotFoundError, load_dataset, load_digits, load_fashion_mnist, load_leaf,
      load_tfds, load_tff_emnist, load_tff_shakespeare, read_idx)
  from .partitioners import (  # noqa: F401
      CLUSTER_LAYOUTS, PARTITIONERS, ClassesPerClientPartitioner, ClusterSkewPartitioner,
      DirichletPartitioner, IidPartitioner, Partition, PartitionError, Partitioner,
      QuantitySkewPartitioner, ShardPartitioner, make_partitioner)
