"""--algorithm=fedcda (docs/algorithms.md#fedcda): its flags, their checks, its summary
entries and its builder, `tff_algos.fedcda.build_fedcda`."""

from __future__ import annotations

from typing import Optional

from programs.methods import registry
from programs.methods.registry import Flag, one_of, non_negative, positive, at_least
from tff_algos import constants

FLAGS = (
    Flag('fedcda_cache_size', 3, 'FedCDA: models cached per client (K).', at_least(1),
         kwarg='cache_size'),
    Flag('fedcda_batches', 3, 'FedCDA: batches of the greedy selection (B).', at_least(1),
         kwarg='num_batches'),
    Flag('fedcda_warmup_rounds', 50, 'FedCDA: FedAvg rounds before selection.', non_negative,
         kwarg='warmup_rounds'),
    Flag('fedcda_smoothness', 1.0, 'FedCDA: L in eq. 8.', non_negative, kwarg='smoothness'),
    Flag('fedcda_selection', 'batch_greedy',
         'FedCDA selection: batch_greedy, exact, newest or random.',
         one_of(constants.FEDCDA_SELECTIONS),
         kwarg='selection'),
    Flag('fedcda_warmup_weighting', 'data_size',
         'FedCDA: client weights of the warmup FedAvg: data_size (the paper) or uniform.',
         one_of(constants.FEDCDA_WARMUP_WEIGHTINGS), kwarg='warmup_weighting'),
    Flag('fedcda_max_cache_gib', 4.0,
         'FedCDA: refuse a cache (b*N*K*D bytes) above this many GiB.', positive,
         kwarg='max_cache_gib'),
    Flag('fedcda_cache_dtype', 'float32',
         'FedCDA: dtype of the cached models: float32, or float16 / bfloat16 (b = 2 bytes per '
         'weight: half the memory; uploads are rounded as they enter the cache).',
         one_of(constants.FEDCDA_CACHE_DTYPES), kwarg='cache_dtype'),
)


def _check(config) -> Optional[str]:
  per_batch = 1 if config.fedcda_selection == 'exact' else config.fedcda_batches
  size = max(1, -(-config.clients_per_round // per_batch))
  if config.fedcda_selection in ('batch_greedy', 'exact') and config.fedcda_cache_size ** size > 1 << 20:
    return (f'--fedcda_selection={config.fedcda_selection} would search {config.fedcda_cache_size}^{size} '
            'combinations per batch; raise --fedcda_batches or lower --fedcda_cache_size')
  return None


def _note(config) -> Optional[str]:
  if config.fedcda_warmup_rounds >= config.rounds:
    return (f'note: --fedcda_warmup_rounds={config.fedcda_warmup_rounds} >= --rounds={config.rounds}: '
            'this run is its warmup FedAvg throughout')
  return None



def _summary(run: registry.RunRecord) -> dict:
  """The cache's size: the formula's bytes beside the measured aggregator state."""
  from tff_algos.aggregators import cross_round_cache  # pylint: disable=g-import-not-at-top
  c = run.config
  d = registry.num_weights(run.model_weights)
  b = constants.FEDCDA_CACHE_DTYPES[c.fedcda_cache_dtype]
  return dict(
      fedcda_state_formula_bytes=cross_round_cache.state_size_bytes(
          run.num_clients, c.fedcda_cache_size, d, c.fedcda_cache_dtype),
      fedcda_cache_formula=(
          f'{b}*N*K*D = {b}*{run.num_clients}*{c.fedcda_cache_size}*{d} bytes '
          f'({c.fedcda_cache_dtype}) + 8*D running sum + 4*(3NK+2N+1) bookkeeping'))


def build_fedcda(*args, **kwargs):
  """`tff_algos.fedcda.build_fedcda`, imported when a process is built (importing this file
  starts no TensorFlow: flags are checked first)."""
  from tff_algos import fedcda  # pylint: disable=g-import-not-at-top
  return fedcda.build_fedcda(*args, **kwargs)


METHOD = registry.Method(
    'fedcda', build_fedcda,
    lambda config, i: (registry.head(config, i) + (i.num_clients, config.clients_per_round), dict(seed=config.seed)),
    flags=FLAGS, check=_check, errors=(ValueError,), note=_note, summary=_summary,
    server_rate=False)
