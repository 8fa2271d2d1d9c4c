"""What the training loop hands to TFF for each sampled client, each round.

TFF's federated language is anonymous, so the methods that need identity
(FedCDA's cache, CADIS's similarity matrix, FedCross's per-slot models) get it
as client input (docs/architecture.md, "Client identity"). The structure is fixed —
the client-training code indexes into it:

  OrderedDict(x=x, y=y, order=int32[epochs, n], index=int32, slot=int32, work=float32)

`order` carries the epochs' sample orders (one permutation of range(n) per
epoch) so that shuffling is decided here, seeded, in NumPy, and a resumed run
reproduces it bit-for-bit; `index` is the client's position n in the
FederatedDataset, `slot` its position in this round's sample, `work` the share of its
local steps it runs (0: it never reports; `data.ClientFaults`, 1 without faults).

All randomness derives from np.random.default_rng([seed, round, ...]) so it
depends only on (seed, round, client), never on what ran before.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np

from tff_algos import constants

from .client_faults import ClientFaults
from .errors import type_name

__all__ = ['client_input', 'sample_clients', 'round_inputs']


def client_input(
    x: np.ndarray,
    y: np.ndarray,
    epochs: int,
    rng: np.random.Generator,
    index: int,
    slot: int,
    work: float = 1.0,
) -> collections.OrderedDict:
  """One client's input: its data, per-epoch sample orders, index, slot and work (0 = it
  never reports; else the share in (0, 1] of its local steps it runs)."""
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f'client {index}: {x.shape[0]} inputs but {y.shape[0]} labels')
  if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
    raise ValueError(f'epochs must be an integer >= 0, got {epochs!r}')
  if not 0.0 <= work <= 1.0:
    raise ValueError(f'client {index}: work must be in [0, 1], got {work!r}')
  n = x.shape[0]
  if n:
    order = np.stack([rng.permutation(n) for _ in range(epochs)]) if epochs else \
        np.zeros([0, n], np.int64)
  else:
    order = np.zeros([epochs, 0], np.int64)
  fields = dict(order=order, index=index, slot=slot, work=work)
  return collections.OrderedDict(
      [('x', x), ('y', y.astype(np.int32, copy=False))]
      + [(name, np.dtype(dtype).type(fields[name]) if shape == () else
          fields[name].astype(dtype))
         for name, dtype, shape in constants.CLIENT_INPUT_FIELDS])


def sample_clients(num_clients: int, clients_per_round: int, round_num: int,
                   seed: int) -> np.ndarray:
  """Uniform sample without replacement, in random order (position = slot).

  Seeded by (seed, round_num) only, so round t samples the same clients
  whether or not rounds 0..t-1 ran in this process (resume after a kill).
  """
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(
        f'clients_per_round must be in [1, num_clients={num_clients}], got {clients_per_round}'
    )
  rng = np.random.default_rng([int(seed), int(round_num)])
  return rng.choice(num_clients, size=clients_per_round, replace=False).astype(np.int32)


def round_inputs(
    fed,
    round_num: int,
    clients_per_round: int,
    epochs: int,
    seed: int,
    client_ids: Optional[Sequence[int]] = None,
    faults: Optional[ClientFaults] = None,
) -> tuple:
  """(sampled client indices int32 [P], list of P client inputs in slot order).

  Each input is the bare element; `process.next` takes a client's data as a one-element
  sequence: `process.next(state, [[x] for x in inputs])` (`ClientDataInputs.round_inputs`
  and `client_selection_fn` return that form already).

  `fed` is a FederatedDataset or a `data.ClientDataInputs` (which wraps any TFF
  ClientData; its `round_inputs(round_num, ids)` takes string ids). With `client_ids`, those clients are used in
  the given order (e.g. FedLEx's explorers, evaluation sweeps) instead of a
  random sample. Each client's orders come from
  default_rng([seed, round_num, client_index, 1]); with `faults` (a `data.ClientFaults`),
  its work from `faults.work(seed, round_num, client_index)`, else 1.
  """
  if not (hasattr(fed, 'client_arrays') and hasattr(fed, 'num_clients')):
    raise TypeError(
        f'round_inputs needs a data.FederatedDataset or data.ClientDataInputs, got '
        f'{type_name(fed)}; wrap a TFF ClientData with data.ClientDataInputs(client_data)')
  if client_ids is None:
    ids = sample_clients(fed.num_clients, clients_per_round, round_num, seed)
  else:
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= fed.num_clients):
      raise ValueError(f'client_ids must be in [0, {fed.num_clients}), got {ids.tolist()}')
    if np.unique(ids).size != ids.size:
      raise ValueError(f'client_ids must be distinct, got {ids.tolist()}')
    ids = ids.astype(np.int32)
  inputs = []
  for slot, n in enumerate(ids):
    x, y = fed.client_arrays(int(n))
    rng = np.random.default_rng([int(seed), int(round_num), int(n), 1])
    work = 1.0 if faults is None else faults.work(seed, round_num, int(n))
    inputs.append(client_input(x, y, epochs, rng, int(n), slot, work))
  return ids, inputs
