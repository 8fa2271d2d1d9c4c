"""CADIS: clustered aggregation + knowledge-distilled regularisation, as a `LearningProcess`.

Nguyen et al., "CADIS: Handling Cluster-skewed Non-IID Data in Federated Learning with
Clustered Aggregation and Knowledge DIStilled Regularization". The rule, its defaults and
options: docs/algorithms.md#cadis.

Composed with `compose_learning_process`: TFF's broadcast; client work training with
cross-entropy + λ·KL (`tff_algos.client_work.distillation`, the received model as teacher)
and uploading OrderedDict(client_index, delta) with weight n_i; the
`tff_algos.aggregators.clustered_aggregation.ClusteredAggregator`, whose state holds Q, F,
τ and a round counter and whose result is Σ p_i Δ_i; TFF's apply-optimizer finalizer with
server SGD at rate 1.0. Metrics: client_work/train (`loss` is the cross-entropy part) and the
aggregator's clusters and weights. Client inputs carry the client's `index`:
`data.client_selection_fn(client_data, P)(round_num)`.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.aggregators import clustered_aggregation, factories, reporting
from tff_algos.client_work import local_training, model_delta, plugins
from tff_algos.models import model_fns, representation


def classifier_similarity_index(model_fn, similarity_layer: str = 'bias') -> int:
  """Position of the final classifier's bias ('bias') or kernel ('kernel') among the
  model's trainable tensors, i.e. in its model deltas."""
  if similarity_layer not in constants.CADIS_SIMILARITY_LAYERS:
    raise ValueError(f'similarity_layer must be one of '
                     f'{constants.CADIS_SIMILARITY_LAYERS}, got {similarity_layer!r}')
  with tf.Graph().as_default():
    kernel, bias = representation.classifier_weight_indices(model_fn())
  return bias if similarity_layer == 'bias' else kernel


def build_cadis(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    client_batch_size: int,
    num_clients: int,
    *,
    clients_per_round: int,
    client_stages: plugins.ClientStages = plugins.ClientStages(kd_weight=1.0),
    threshold: float = clustered_aggregation.DEFAULT_THRESHOLD,
    threshold_max: float = clustered_aggregation.DEFAULT_THRESHOLD_MAX,
    similarity_layer: str = 'bias',
    sample_weighted: bool = True,
    closure: str = 'two_hop',
    transitive: bool = False,
    true_clusters: Optional[Sequence[int]] = None,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    model_aggregator=None,
    two_hop_metrics_max_clients: Optional[int] = (
        clustered_aggregation.DEFAULT_TWO_HOP_METRICS_MAX_CLIENTS),
    reference_quirks: bool = False,
) -> tff.learning.templates.LearningProcess:
  """Builds a learning process for CADIS (clustered aggregation + KD regularisation).

  Args:
    model_fn: no-arg function returning a Keras-backed `tff.learning.models.VariableModel`
      whose final Dense layer is named 'classifier' (every `tff_algos.models` zoo model).
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local steps (paper: SGD,
      lr 1e-3 in the reference code).
    client_batch_size: local batch size (paper: 8).
    num_clients: N, the number of clients; client inputs carry `index` in [0, N).
    clients_per_round: the most clients one round may bring (the server accumulator's
      rows; a round with more clients fails).
    client_stages: the plug-ins, CADIS's KD term and FedLEx's guidance
      (`tff_algos.ClientStages`); default KD at λ = 1.0 (`ClientStages(kd_weight=1.0)`),
      unguided; `kd_weight=0` is plain local SGD (no teacher built).
    threshold: τ_0, the clustering threshold on the rescaled Q-matrix (0.975).
    threshold_max: τ_max of the schedule τ_{t+1} = min(τ_t·1.0005^t, τ_max) (0.985).
    similarity_layer: 'bias' (default) or 'kernel' of the final classifier: whose delta's
      cosine measures client similarity.
    sample_weighted: p_i ∝ (1/|C_i|)(n_i/n) (True, the paper) or 1/|C_i| (reference code).
    closure: 'two_hop' (reference code), 'components', or 'oracle' (|C_i| from
      `true_clusters`, a diagnosis separating the clustering from the weighting).
    transitive: transitive learning of unobserved pairs (default off).
    true_clusters: optional int [N] ground-truth cluster per client (e.g. a cluster-skewed
      partition's `true_clusters`), for the cluster-recovery metrics only.
    server_optimizer_fn: applied to Σ p_i Δ_i (default SGD with learning rate 1.0, which
      makes the new global model Σ p_i w_i).
    model_aggregator: optional TFF aggregation factory for the weighted mean of the deltas
      (e.g. `tff.aggregators.clipping_factory(..., MeanFactory())`, compression, DP). The
      round then has two aggregations: the clients' similarity vectors first (the server
      updates Q, F and the clusters and computes each participant's p_i), then, with p_i
      broadcast back, the deltas through the factory: a weighted factory gets p_i as the
      client weight (`MeanFactory()` equals the default up to float rounding); an
      unweighted one gets K·p_i·Δ_i, K = the round's uploads, so its uniform mean is
      Σ p_i Δ_i (its clipping then bounds K·p_i·Δ_i). A DP factory makes only this
      second aggregation private: the similarity vectors still reach the server one by
      one, and p_i depends on the other clients' uploads. The two dependent
      aggregations cannot be split across worker services (`execution.check_mergeable`
      refuses them). None (default): Σ p_i Δ_i on the server's accumulator in one
      aggregation. State gains `aggregator.delta_aggregator` (the factory's
      state), metrics `aggregator/delta_aggregator` (its measurements).
    two_hop_metrics_max_clients: with closure 'two_hop', the whole-relation metrics
      (`num_clusters`, `cluster_pair_accuracy`, `clusters_match`: 4·N³ flops) are computed
      while N is at most this (default 1000; None: always), and read -1 / NaN above it.
      Cluster sizes and weights never depend on it.
    reference_quirks: the server clusters as the authors' code does, not as the paper says:
      a pair scored with the wrong upload and abs() after the min-max rescale (strongly
      dissimilar clients become neighbours; `clustering` module doc). A diagnosis
      of the published code, default off.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: an argument is out of range or inconsistent (checked before building).
    TypeError: model_aggregator is not a TFF aggregation factory, or client_stages is not
      a `ClientStages`.
  """
  factories.check_model_aggregator(model_aggregator)
  model_fn = model_fns.as_model_fn(model_fn)
  local_training.check_client_training(client_optimizer_fn, client_batch_size)
  # Before the (slower) factory is built.
  plugins.ClientStages.of(client_stages)
  # The factory validates num_clients, clients_per_round, thresholds, closure, layer and
  # true_clusters; the similarity tensor's position comes from the model itself.
  factory = clustered_aggregation.ClusteredAggregator(
      num_clients, clients_per_round, threshold=threshold, threshold_max=threshold_max,
      similarity_layer=similarity_layer,
      similarity_index=classifier_similarity_index(model_fn, similarity_layer),
      sample_weighted=sample_weighted, closure=closure, transitive=transitive,
      true_clusters=true_clusters, delta_aggregator=model_aggregator,
      two_hop_metrics_max_clients=two_hop_metrics_max_clients,
      reference_quirks=reference_quirks)

  initial_weights = model_delta.initial_model_weights_fn(model_fn)
  weights_type = initial_weights.type_signature.result
  client_work = model_delta.build_model_delta_client_work(
      model_fn, client_optimizer_fn, int(client_batch_size), keyed=True,
      client_stages=client_stages)
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  # A round nobody reported in leaves the model and the server optimizer as they were.
  aggregator = reporting.ReportingFactory(factory).create(
      model_delta.keyed_update_type(weights_type.trainable), tff.TensorType(np.float32))
  finalizer = reporting.keep_unless_reported(
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer_fn or tff.learning.optimizers.build_sgdm(learning_rate=1.0),
          weights_type))
  return tff.learning.templates.compose_learning_process(
      initial_weights, distributor, client_work, aggregator, finalizer)
