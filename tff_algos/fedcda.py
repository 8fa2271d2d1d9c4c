"""FedCDA: cross-round divergence-aware aggregation, as a `LearningProcess`.

Wang et al., "FedCDA: Federated Learning with Cross-Rounds Divergence-Aware Aggregation",
ICLR 2024. The rule, its defaults and options: docs/algorithms.md#fedcda.

Composed with `compose_learning_process`: TFF's broadcast, client work uploading the trained
model and its last-epoch loss keyed by client index (`tff_algos.client_work.model_upload`),
the per-client cache and selection (`tff_algos.aggregators.cross_round_cache`) and a finalizer
that makes the aggregate the global model. The cache is the method's cost: b·N·K·D bytes
(`cross_round_cache.state_size_bytes`), refused above `max_cache_gib`. Client inputs carry
the client's index and slot: `data.client_selection_fn(client_data, P)(round_num)`.
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow_federated as tff

from tff_algos.aggregators import cross_round_cache, factories
from tff_algos.client_work import model_delta, model_upload, plugins
from tff_algos.models import model_fns


def build_fedcda(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    num_clients: int,
    clients_per_round: int,
    *,
    cache_size: int = 3,
    num_batches: int = 3,
    warmup_rounds: int = 50,
    smoothness: float = 1.0,
    selection: str = 'batch_greedy',
    warmup_weighting: str = 'data_size',
    seed: int = 0,
    max_cache_gib: Optional[float] = 4.0,
    cache_dtype: str = 'float32',
    model_aggregator=None,
    client_stages: plugins.ClientStages = plugins.ClientStages(),
) -> tff.learning.templates.LearningProcess:
  """FedCDA as a `tff.learning.templates.LearningProcess`.

  Args:
    model_fn: no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local steps (paper: SGD
      lr 1e-3, momentum 1e-4, weight decay 1e-5).
    client_batch_size: local batch size (paper: 64).
    num_clients: N; client inputs carry `index` in [0, N).
    clients_per_round: P; client inputs carry `slot` in [0, P).
    cache_size: K, models cached per client (paper: 3).
    num_batches: B, batches of the batch-greedy selection (paper: 3).
    warmup_rounds: rounds of FedAvg before selection starts (paper: 50 of 200 rounds).
    smoothness: L in eq. 8 (paper: 1).
    selection: 'batch_greedy' (default), 'exact' (all K^P combinations at once), 'newest'
      or 'random' (the paper's ablations). On Fashion-MNIST 'newest' ended above
      'batch_greedy' at both skews benchmarked (benchmarks/results/fedcda/diagnosis.md).
    warmup_weighting: the warmup FedAvg's client weights: 'data_size' (example counts, the
      paper's FedAvg; default) or 'uniform'.
    seed: seeds the random batch split and the 'random' selection, with the round number.
    max_cache_gib: refuse configurations whose aggregator state exceeds this (None: no
      limit). The state is 4·N·K·D bytes of cache, 8·D of the selected models' running sum
      and 4·(3NK + 2N + 1) of bookkeeping.
    cache_dtype: 'float32' (default), or 'float16' / 'bfloat16': the cache in half the
      memory; uploads are rounded as they enter it (`cache_selection`'s "Precision").
    model_aggregator: must be None (accepted for TFF-style call sites; a factory is refused
      with the reason, see `tff_algos.aggregators.factories`).
    client_stages: the plug-ins, FedLEx's guidance and CADIS's KD term
      (`tff_algos.ClientStages`; default none).

  Returns:
    A LearningProcess; `next(state, client_data)` takes the P clients' one-element
    sequences (`tff_algos.client_work.local_training.client_data_type`). Metrics:
    client_work/train (loss, accuracy, last_epoch_loss, ...), aggregator (warmup,
    cached_clients, uploads, switched, objective_before, objective_after).
  """
  factories.refuse_model_aggregator(
      'FedCDA', model_aggregator,
      'every upload enters its own client\'s cache (by client index) and the global model '
      'is a mean over the cached models each client selects on the server, so the server '
      'needs every upload individually, which a TFF aggregation factory (a sum over '
      'clients) does not deliver')
  model_fn = model_fns.as_model_fn(model_fn)
  initial_weights = model_delta.initial_model_weights_fn(model_fn)
  weights_type = initial_weights.type_signature.result
  aggregator = cross_round_cache.build_cross_round_cache_process(
      weights_type, num_clients, clients_per_round, cache_size=cache_size,
      num_batches=num_batches, warmup_rounds=warmup_rounds, smoothness=smoothness,
      selection=selection, warmup_weighting=warmup_weighting, seed=seed,
      max_cache_gib=max_cache_gib, cache_dtype=cache_dtype)
  return tff.learning.templates.compose_learning_process(
      initial_weights,
      tff.learning.templates.build_broadcast_process(weights_type),
      model_upload.build_model_upload_client_work(
          model_fn, client_optimizer_fn, client_batch_size, client_stages=client_stages),
      aggregator,
      cross_round_cache.build_replace_finalizer(weights_type))
