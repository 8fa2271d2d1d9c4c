"""A TFF user's own `tff.simulation.datasets.ClientData` -> our processes' client inputs.

Every `tff_algos` process takes, per sampled client, a one-element sequence holding
`OrderedDict(x, y, order, index, slot, work)` (`data.round_sampling`; docs/architecture.md,
"Client identity"). A TFF user has a `ClientData` with string ids whose datasets yield `<x, y>`
(an OrderedDict/dict with keys 'x' and 'y', or an `(x, y)` tuple), batched or not. This
module is the one step between the two:

    selection_fn = data.client_selection_fn(client_data, clients_per_round=5, epochs=1)
    tff.simulation.run_training_process(process, selection_fn, total_rounds=10)

    source = data.federated_data_source(client_data, epochs=1)
    await tff.learning.programs.train_model(train_data_source=source, ...)

What it settles:

* **Client index.** The int32 index n in [0, N) that FedCDA's cache rows, CADIS's Q-matrix
  and SCAFFOLD-like state are keyed by is the id's position in `client_ids` (default: the
  ClientData's own `client_ids` order). The map travels with the run: the
  `FederatedDataSource`'s iterator serialises it into every `tff.program` checkpoint and a
  resumed run refuses a ClientData whose ids no longer match it; for
  `run_training_process`, `ClientDataInputs.save_client_ids` / `load_client_ids` keep it
  beside the state manager's directory.
* **Slot.** A client's slot is its position in the round's sample (0..P-1), so FedCross
  client s trains middleware model s: a round's P clients train P distinct models.
* **Sampling and batch order.** Round r samples P distinct clients uniformly, in random
  order, from `default_rng([seed, r])`, and client n's per-epoch permutations come from
  `default_rng([seed, r, n, 1])` (as `data.round_inputs`): a resumed run replays the
  sampling and the batch orders of an unbroken one.
* **Faults.** With `faults=data.ClientFaults(...)`, client n's `work` in round r is
  `faults.work(seed, r, n)` (it drops out, or runs a share of its steps), as in the training
  program; without, every client reports and runs all its steps.
* **Data.** Each client's dataset is read once into NumPy arrays (batched datasets are
  concatenated, unbatched ones stacked) and cached, because our processes train on
  whole-client tensors (the fast path, benchmarks/results/RESULTS.md). Labels become int32, as
  every zoo model's input_spec wants; pass `label_dtype` for a model whose `y` spec is
  another dtype.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_algos import constants

from .client_faults import ClientFaults
from .errors import type_name
from .round_sampling import client_input, sample_clients

__all__ = ['ClientDataInputs', 'ClientDataSource', 'ClientDataSourceIterator',
           'client_selection_fn', 'federated_data_source', 'load_client_ids']


def _xy_specs(element_spec) -> tuple:
  """(x spec, y spec) of a dataset element: a mapping with 'x' and 'y', or a 2-tuple."""
  if isinstance(element_spec, collections.abc.Mapping) and set(element_spec) >= {'x', 'y'}:
    return element_spec['x'], element_spec['y']
  if isinstance(element_spec, (tuple, list)) and len(element_spec) == 2:
    return element_spec[0], element_spec[1]
  raise TypeError(
      'client datasets must yield OrderedDict(x=..., y=...) or (x, y) tuples, batched or not; '
      f'got elements {element_spec}. Map them first, e.g. '
      "client_data.preprocess(lambda ds: ds.map(lambda e: (e['pixels'], e['label'])))")


def _is_batched(element_spec) -> bool:
  """A batched dataset's x and y both start with an unknown (batch) dimension."""
  x_spec, y_spec = _xy_specs(element_spec)
  return all(s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None
             for s in (x_spec, y_spec))


def load_client_ids(path: str) -> list:
  """The client-id order saved by `ClientDataInputs.save_client_ids`."""
  with open(path) as f:
    ids = json.load(f)['client_ids']
  return [str(i) for i in ids]


class ClientDataInputs:
  """A `ClientData` with a fixed id -> index map, producing our processes' client inputs.

  Args:
    client_data: a `tff.simulation.datasets.ClientData` (any string ids) whose datasets
      yield `OrderedDict(x, y)` / dicts with 'x' and 'y', or `(x, y)` tuples.
    epochs: local epochs per round (the rows of each client's `order`).
    seed: seeds the client sampling and the per-epoch batch orders.
    client_ids: the id order that defines the client indices (default: the ClientData's
      `client_ids`); pass `load_client_ids(path)` to keep a saved run's map.
    batched: whether the datasets are batched; default: inferred from the element spec
      (batched when x and y both start with an unknown dimension).
    label_dtype: dtype labels are cast to (int32, what `tff_algos.models` expect).
    cache: keep each client's arrays after its first read (default True).
    faults: a `data.ClientFaults` drawing each client's `work` per round (default None:
      every client reports and runs all its local steps).
  """

  def __init__(self, client_data: tff.simulation.datasets.ClientData, *, epochs: int = 1,
               seed: int = 0, client_ids: Optional[Sequence[str]] = None,
               batched: Optional[bool] = None, label_dtype=np.int32, cache: bool = True,
               faults: Optional[ClientFaults] = None):
    if not isinstance(client_data, tff.simulation.datasets.ClientData):
      raise TypeError('client_data must be a tff.simulation.datasets.ClientData, got '
                      f'{type(client_data).__name__}')
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
      raise ValueError(f'epochs must be an integer >= 1, got {epochs!r}')
    available = [str(i) for i in client_data.client_ids]
    if client_ids is None:
      ids = available
    else:
      ids = [str(i) for i in client_ids]
      missing = sorted(set(ids) - set(available))
      if missing:
        raise ValueError(f'client ids {missing[:3]} are not in this ClientData: the saved '
                         'id -> index map belongs to other data')
    if not ids:
      raise ValueError('the ClientData has no clients')
    if len(set(ids)) != len(ids):
      raise ValueError('client_ids must be distinct')
    spec = client_data.element_type_structure
    _xy_specs(spec)  # validates the element structure up front
    self._client_data = client_data
    self._client_ids = tuple(ids)
    self._index = {cid: n for n, cid in enumerate(ids)}
    self._batched = _is_batched(spec) if batched is None else bool(batched)
    self._label_dtype = np.dtype(label_dtype)
    self._epochs = int(epochs)
    self._seed = int(seed)
    self._cache = {} if cache else None
    if faults is not None and not isinstance(faults, ClientFaults):
      raise TypeError(f'faults must be a data.ClientFaults, got {type_name(faults)}')
    self._faults = faults

  # ---- the id -> index map ------------------------------------------------ #

  @property
  def client_ids(self) -> tuple:
    """Client ids in index order: client `client_ids[n]` has index n."""
    return self._client_ids

  @property
  def num_clients(self) -> int:
    """N: pass it as `num_clients` to `build_fedcda` / `build_cadis`."""
    return len(self._client_ids)

  @property
  def epochs(self) -> int:
    return self._epochs

  @property
  def seed(self) -> int:
    return self._seed

  @property
  def faults(self) -> Optional[ClientFaults]:
    return self._faults

  def index_of(self, client_id: str) -> int:
    try:
      return self._index[str(client_id)]
    except KeyError:
      raise ValueError(f'client id {client_id!r} is not in this ClientData') from None

  def fingerprint(self) -> str:
    """Identifies the id -> index map (a hash of the ordered ids)."""
    return hashlib.sha256('\0'.join(self._client_ids).encode()).hexdigest()[:16]

  def save_client_ids(self, path: str) -> None:
    """Writes the id order (the index map) as JSON; reload with `load_client_ids`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
      json.dump({'client_ids': list(self._client_ids)}, f)

  # ---- data ---------------------------------------------------------------- #

  def element_type(self) -> tff.StructType:
    """The TFF type of one client's input element (what `select` hands the process)."""
    x_spec, y_spec = _xy_specs(self._client_data.element_type_structure)
    x_shape = x_spec.shape[1:] if self._batched else x_spec.shape
    y_shape = y_spec.shape[1:] if self._batched else y_spec.shape
    return tff.StructWithPythonType([
        ('x', tff.TensorType(x_spec.dtype.as_numpy_dtype, [None, *x_shape])),
        ('y', tff.TensorType(self._label_dtype, [None, *y_shape])),
    ] + [(name, tff.TensorType(np.dtype(dtype), shape))
         for name, dtype, shape in constants.CLIENT_INPUT_FIELDS], collections.OrderedDict)

  def federated_type(self) -> tff.FederatedType:
    """The type of one round's selection: one-element sequences of `element_type` at
    CLIENTS (the process's `next` data parameter)."""
    return tff.FederatedType(tff.SequenceType(self.element_type()), tff.CLIENTS)

  def client_arrays(self, n: int) -> tuple:
    """(x, y) NumPy arrays of client index n (read once, then cached)."""
    n = int(n)
    if self._cache is not None and n in self._cache:
      return self._cache[n]
    dataset = self._client_data.create_tf_dataset_for_client(self._client_ids[n])
    x_spec, y_spec = _xy_specs(dataset.element_spec)
    if not self._batched:
      dataset = dataset.batch(4096)
    xs, ys = [], []
    for element in dataset.as_numpy_iterator():
      x, y = _xy_specs(element)
      xs.append(x)
      ys.append(y)
    if xs:
      x, y = np.concatenate(xs), np.concatenate(ys)
    else:
      x_shape = x_spec.shape[1:] if self._batched else x_spec.shape
      y_shape = y_spec.shape[1:] if self._batched else y_spec.shape
      x = np.zeros([0, *x_shape], x_spec.dtype.as_numpy_dtype)
      y = np.zeros([0, *y_shape], self._label_dtype)
    arrays = (x, y.astype(self._label_dtype, copy=False))
    if self._cache is not None:
      self._cache[n] = arrays
    return arrays

  def round_inputs(self, round_num: int, client_ids: Sequence[str]) -> list:
    """One round's client inputs for `process.next`: a one-element list per client.

    Slot = position in `client_ids` (the round's sample, in its order); index = the id's
    position in the id map; batch orders from default_rng([seed, round_num, index, 1]);
    work from `faults.work(seed, round_num, index)` (1 without faults).
    """
    if len(set(map(str, client_ids))) != len(client_ids):
      raise ValueError(f'a round samples distinct clients, got {list(client_ids)}')
    out = []
    for slot, cid in enumerate(client_ids):
      n = self.index_of(cid)
      x, y = self.client_arrays(n)
      rng = np.random.default_rng([self._seed, int(round_num), n, 1])
      work = 1.0 if self._faults is None else self._faults.work(self._seed, round_num, n)
      inp = client_input(x, y, self._epochs, rng, n, slot, work)
      inp['y'] = inp['y'].astype(self._label_dtype, copy=False)
      out.append([inp])
    return out

  def sample(self, round_num: int, clients_per_round: int) -> list:
    """Round `round_num`'s sampled client ids, in slot order (seeded by seed and round)."""
    indices = sample_clients(self.num_clients, clients_per_round, round_num, self._seed)
    return [self._client_ids[n] for n in indices]

  def selection_fn(self, clients_per_round: int) -> Callable[[int], list]:
    """`training_selection_fn` for `tff.simulation.run_training_process`."""
    sample_clients(self.num_clients, clients_per_round, 0, 0)  # validates the size now

    def select(round_num: int) -> list:
      return self.round_inputs(round_num, self.sample(round_num, clients_per_round))

    return select


def client_selection_fn(client_data: tff.simulation.datasets.ClientData,
                        clients_per_round: int, **kwargs) -> Callable[[int], list]:
  """`training_selection_fn` for `tff.simulation.run_training_process`: round r's
  `clients_per_round` sampled clients' inputs (kwargs: see `ClientDataInputs`)."""
  return ClientDataInputs(client_data, **kwargs).selection_fn(clients_per_round)


# Data sources by fingerprint, so an iterator restored from a checkpoint (TFF calls
# `from_bytes` on the class, with the bytes only) finds the ClientData of this process.
_SOURCES: dict = {}


class ClientDataSourceIterator(tff.program.FederatedDataSourceIterator):
  """Selects round after round; its bytes (in every checkpoint) hold the id map, the seed,
  the epochs, the faults and the next round number, so a resumed run continues the same sequence."""

  def __init__(self, inputs: ClientDataInputs, next_round: int = 1):
    self._inputs = inputs
    self._next_round = int(next_round)

  @property
  def next_round(self) -> int:
    return self._next_round

  @property
  def federated_type(self) -> tff.FederatedType:
    return self._inputs.federated_type()

  def select(self, k: Optional[int] = None) -> Any:
    if k is None:
      raise ValueError('select needs k, the number of clients of the round')
    round_num = self._next_round
    self._next_round += 1
    return self._inputs.round_inputs(round_num, self._inputs.sample(round_num, k))

  def to_bytes(self) -> bytes:
    return json.dumps(dict(
        fingerprint=self._inputs.fingerprint(), client_ids=list(self._inputs.client_ids),
        epochs=self._inputs.epochs, seed=self._inputs.seed,
        faults=repr(self._inputs.faults), next_round=self._next_round)).encode()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'ClientDataSourceIterator':
    saved = json.loads(bytes(buffer).decode())
    inputs = _SOURCES.get(saved['fingerprint'])
    if inputs is None:
      raise ValueError(
          'the checkpoint\'s data iterator needs its ClientData: create the same '
          'data.federated_data_source(client_data, ...) in this process before resuming '
          f'(id map {saved["fingerprint"]}, {len(saved["client_ids"])} clients)')
    if list(inputs.client_ids) != saved['client_ids'] or (
        inputs.epochs, inputs.seed) != (saved['epochs'], saved['seed']):
      raise ValueError('the checkpoint was written with another id map, epochs or seed '
                       f'(saved epochs={saved["epochs"]}, seed={saved["seed"]})')
    if saved.get('faults', repr(None)) != repr(inputs.faults):
      raise ValueError(f'the checkpoint was written with faults={saved.get("faults")}, not '
                       f'{inputs.faults!r}: pass the same data.ClientFaults')
    return cls(inputs, saved['next_round'])

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ClientDataSourceIterator):
      return NotImplemented
    return self.to_bytes() == other.to_bytes()


class ClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` over a user's ClientData, for
  `tff.learning.programs.train_model`; each `select(k)` is one round's k clients."""

  def __init__(self, inputs: ClientDataInputs):
    self._inputs = inputs
    _SOURCES[inputs.fingerprint()] = inputs

  @property
  def inputs(self) -> ClientDataInputs:
    return self._inputs

  @property
  def federated_type(self) -> tff.FederatedType:
    return self._inputs.federated_type()

  def iterator(self) -> ClientDataSourceIterator:
    return ClientDataSourceIterator(self._inputs)


def federated_data_source(client_data: tff.simulation.datasets.ClientData,
                          **kwargs) -> ClientDataSource:
  """A `tff.program.FederatedDataSource` for `tff.learning.programs.train_model`
  (kwargs: see `ClientDataInputs`)."""
  return ClientDataSource(ClientDataInputs(client_data, **kwargs))
