"""Datasets -> tff.simulation ClientData: loaders, partitioners, client inputs.

Imported as `tff_algos.data` only. The folder stays `data/` at the top of the checkout (the
layout the project's users asked for: tff_algos/, programs/, data/, tests/); the symlink
`tff_algos/data` -> `../data` makes it `tff_algos.data` in the checkout, and pyproject.toml's
`[tool.setuptools.package-dir]` ("tff_algos.data" = "data") puts it in the wheel as
`tff_algos/data`. A top-level `data` would be a second copy of every class beside
`tff_algos.data`'s (isinstance across them fails) and clashes with a user's own `data`, so
importing it under that name raises ImportError.
`tff_algos.data.client_data_adapter` turns a user's own TFF ClientData into our client inputs.

Public names are re-exported lazily (PEP 562): `from tff_algos.data import IidPartitioner`
or `import tff_algos.data.partitioners` does not import TensorFlow, which the partition
explorer and quick checks appreciate; names from `datasets` / `loaders` import TF/TFF on
first use.

This package depends on numpy, TF/TFF, tensorflow-datasets, scikit-learn and
matplotlib only: never on `programs` or the method modules of `tff_algos`. It does import
`tff_algos.execution` (stdlib only), whose exit hook stops TFF's worker processes: without
it a script that loads data through TFF and nothing of `tff_algos` ends with TFF's
ServiceManager traceback.

Modules (docs/architecture.md has the whole map):

* `client_data_adapter`: a user's own `ClientData` turned into our client inputs.
* `client_faults`: `ClientFaults`, the seeded draw of which clients drop out and how much of
  their steps stragglers run.
* `datasets`: in-memory datasets, central and federated, as TFF `ClientData`.
* `errors`: the loaders' two errors (a missing data set, a bad file), with the fix in their
  message.
* `leaf`: LEAF's JSON files (FEMNIST, Shakespeare, Sent140) read into users' arrays.
* `loaders`: dataset loaders reading local files only (Fashion-MNIST, digits, TFF's and
  tfds' caches).
* `partition`: `Partition`, a partitioner's result: save, load, summary and plot.
* `partitioners`: seeded partitioners (IID, Dirichlet, shards, quantity skew, CADIS's
  cluster-skewed layouts).
* `round_sampling`: each sampled client's input: whole-client tensors, epoch orders, index,
  slot and work.
"""

if __name__ != 'tff_algos.data':
  raise ImportError(f'import the data layer as tff_algos.data (`from tff_algos import data`), '
                    f'not as {__name__}')

from typing import TYPE_CHECKING  # noqa: E402

from .. import execution as _execution  # noqa: E402,F401
from .._lazy_exports import lazy_exports  # noqa: E402

_EXPORTS = {
    'tff_algos.data.partition': ('Partition',),
    'tff_algos.data.partitioners': (
        'PartitionError', 'Partitioner', 'IidPartitioner',
        'DirichletPartitioner', 'ShardPartitioner', 'ClassesPerClientPartitioner',
        'QuantitySkewPartitioner', 'ClusterSkewPartitioner', 'CLUSTER_LAYOUTS',
        'PARTITIONERS', 'make_partitioner',
    ),
    'tff_algos.data.round_sampling': ('client_input', 'sample_clients', 'round_inputs'),
    'tff_algos.data.client_faults': ('ClientFaults',),
    'tff_algos.data.client_data_adapter': (
        'ClientDataInputs', 'ClientDataSource', 'ClientDataSourceIterator',
        'client_selection_fn', 'federated_data_source', 'load_client_ids',
    ),
    'tff_algos.data.datasets': ('ArrayDataset', 'ArrayClientData', 'FederatedDataset', 'federate',
                                'hold_out_client_test', 'held_out_count'),
    'tff_algos.data.errors': ('DatasetNotFoundError', 'DatasetFormatError'),
    'tff_algos.data.loaders': (
        'FASHION_MNIST_DIR', 'read_idx', 'load_fashion_mnist', 'load_digits', 'TFDS_NAMES',
        'load_tfds', 'load_tff_emnist', 'load_tff_shakespeare', 'DATASETS', 'NATURALLY_FEDERATED',
        'load_dataset',
    ),
    'tff_algos.data.leaf': ('LEAF_LETTERS', 'load_leaf'),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # static analysers and IDEs see the real names
  from .client_data_adapter import (  # noqa: F401
      ClientDataInputs, ClientDataSource, ClientDataSourceIterator, client_selection_fn,
      federated_data_source, load_client_ids)
  from .round_sampling import client_input, round_inputs, sample_clients  # noqa: F401
  from .client_faults import ClientFaults  # noqa: F401
  from .datasets import (  # noqa: F401
      ArrayClientData, ArrayDataset, FederatedDataset, federate, held_out_count,
      hold_out_client_test)
  from .errors import DatasetFormatError, DatasetNotFoundError  # noqa: F401
  from .leaf import LEAF_LETTERS, load_leaf  # noqa: F401
  from .loaders import (  # noqa: F401
      DATASETS, FASHION_MNIST_DIR, NATURALLY_FEDERATED, TFDS_NAMES, load_dataset, load_digits,
      load_fashion_mnist, load_tfds, load_tff_emnist, load_tff_shakespeare, read_idx)
  from .partition import Partition  # noqa: F401
  from .partitioners import (  # noqa: F401
      CLUSTER_LAYOUTS, PARTITIONERS, ClassesPerClientPartitioner, ClusterSkewPartitioner,
      DirichletPartitioner, IidPartitioner, PartitionError, Partitioner,
      QuantitySkewPartitioner, ShardPartitioner, make_partitioner)
