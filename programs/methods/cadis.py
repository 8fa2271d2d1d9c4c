"""--algorithm=cadis (docs/algorithms.md#cadis): its flags, their checks, its summary entries
and its builder, `tff_algos.cadis.build_cadis`."""

from __future__ import annotations

import math
from typing import Optional

from programs.methods import registry
from programs.methods.registry import STAGES, Flag, one_of
from tff_algos import constants

FLAGS = (
    Flag('cadis_threshold', 0.975, 'CADIS: initial clustering threshold tau_0.',
         kwarg='threshold'),
    Flag('cadis_threshold_max', 0.985, 'CADIS: largest threshold.', kwarg='threshold_max'),
    Flag('cadis_kd_weight', 1.0, 'CADIS: lambda of the KD term (0 = off); the general '
         '--kd_weight, when given, sets it instead.',
         lambda v: None if v >= 0 and math.isfinite(v) else f' must be >= 0, got {v}',
         target=STAGES, kwarg='kd_weight'),
    Flag('cadis_kd_reduction', 'sum', 'CADIS KD: sum or mean.', one_of(constants.KD_REDUCTIONS),
         target=STAGES, kwarg='kd_reduction'),
    Flag('cadis_kd_std', 'population', 'CADIS KD: sigma of the pairwise distances, '
         'population or sample (n - 1, the authors\' code).', one_of(constants.KD_STDS),
         target=STAGES, kwarg='kd_std'),
    Flag('cadis_similarity_layer', 'bias',
         'CADIS: classifier bias or kernel delta for similarity.',
         one_of(constants.CADIS_SIMILARITY_LAYERS), kwarg='similarity_layer'),
    Flag('cadis_sample_weighted', True, 'CADIS: weights (1/|C|)(n_i/n); false: 1/|C| only.',
         kwarg='sample_weighted'),
    Flag('cadis_closure', 'two_hop', 'CADIS: two_hop, components, or oracle (|C_i| from the '
         'partition\'s true clusters: a diagnosis; cluster-skewed partitions only).',
         one_of(constants.CADIS_CLOSURES),
         kwarg='closure'),
    Flag('cadis_transitive', False, 'CADIS: transitive learning of never co-sampled pairs.',
         kwarg='transitive'),
    Flag('cadis_reference_quirks', False, 'CADIS: cluster as the authors\' code does, not as '
         'the paper says (a pair scored with the wrong upload; abs() after the min-max '
         'rescale): a diagnosis.', kwarg='reference_quirks'),
)


def cadis_clusters_match(row: dict, num_clients: int) -> bool:
  """Whether a metrics.csv row's learned clusters are the partition's: every client seen
  (`clusters_match` alone compares only the clients seen so far)."""
  return (float(row.get('aggregator/clusters_match') or 0) == 1.0
          and int(float(row.get('aggregator/seen_clients') or 0)) == num_clients)


def _summary(run: registry.RunRecord) -> dict:
  """When the clusters first matched the partition's, and the KD term beside cross-entropy."""
  rows = run.rows
  matched = [int(r['round']) for r in rows if cadis_clusters_match(r, run.num_clients)]
  out = dict(cadis_first_round_clusters_match=matched[0] if matched else None,
             cadis_final_num_clusters=(int(float(rows[-1]['aggregator/num_clusters']))
                                       if rows else None))
  # The KD term's size beside the cross-entropy it regularises (both example-weighted means
  # over every local step, averaged over rounds); absent without KD.
  with_kd = [r for r in rows if r.get('client_work/train/extra_loss') not in (None, '')]
  kd = [float(r['client_work/train/extra_loss']) for r in with_kd]
  ce = [float(r['client_work/train/loss']) for r in with_kd]
  if kd:
    import numpy as np  # pylint: disable=g-import-not-at-top
    kd_mean, ce_mean = float(np.mean(kd)), float(np.mean(ce))
    out.update(cadis_kd_loss_mean=kd_mean, cadis_cross_entropy_mean=ce_mean,
               cadis_kd_to_cross_entropy=kd_mean / max(ce_mean, 1e-12))
  return out


def _check(config) -> Optional[str]:
  if not 0 <= config.cadis_threshold <= config.cadis_threshold_max <= 1:
    return (f'CADIS needs 0 <= --cadis_threshold <= --cadis_threshold_max <= 1, got '
            f'{config.cadis_threshold} and {config.cadis_threshold_max}')
  if config.cadis_closure == 'oracle' and not config.partition.startswith('cluster_'):
    return ('--cadis_closure=oracle takes the clusters from a cluster-skewed partition: add '
            '--partition=cluster_mc (or cluster_uc, cluster_bc)')
  return None


def build_cadis(*args, **kwargs):
  """`tff_algos.cadis.build_cadis`, imported when a process is built (importing this file
  starts no TensorFlow: flags are checked first)."""
  from tff_algos import cadis  # pylint: disable=g-import-not-at-top
  return cadis.build_cadis(*args, **kwargs)


METHOD = registry.Method(
    'cadis', build_cadis,
    lambda config, i: (registry.head(config, i) + (i.num_clients,),
                  dict(clients_per_round=config.clients_per_round, true_clusters=i.true_clusters,
                       server_optimizer_fn=i.server_optimizer)),
    flags=FLAGS, reads=registry.OPTIMIZER_FLAGS, check=_check,
    errors=(ValueError, TypeError), error_prefix='--algorithm=cadis: ', summary=_summary)
