"""The methods of the training program, declared once: flags, validation, builder arguments.

One `Method` per `--algorithm`: its own flags (name, default, help, validation rule and where
the value goes: a keyword of its builder, of FedLEx's exploration builder, or the program's
loop), the general server flags it reads, and how its builder is called. The plug-in client
stages every method takes (`--guided` with FedLEx's exploration flags, `--kd_weight`:
`tff_algos/client_work/plugins.py`) are declared here once too, as general flags.
`programs/train.py` defines the absl flags from it, `programs/experiment_config.py` validates
and refuses ignored flags, `programs/computations.py` builds the process from it, the option
table of docs/methods.md is generated from it (`python -m programs.methods` rewrites it;
tests/test_method_flags.py checks the page holds it) and the flag tests iterate over it. A
new method is one module in tff_algos, one `Method` here and its tests.

Importing this module imports neither TensorFlow nor TFF (flags are validated before TF
starts): builders are named as 'module:function' and imported when a process is built.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from typing import Any, Callable, Optional

from programs import pages

# Where a method flag's value goes.
BUILDER = 'builder'          # a keyword argument of the method's builder
EXPLORATION = 'exploration'  # a keyword of tff_algos.fedlex.build_fedlex_exploration
PROGRAM = 'program'          # read by programs/experiment.py's loop (named in `help`)

# The general flags that configure the server optimizer; each method says which it reads.
OPTIMIZER_FLAGS = ('server_optimizer', 'server_lr', 'server_momentum')
SERVER_FLAGS = OPTIMIZER_FLAGS + ('proximal_strength',)


# Validation rules: value -> None, or the error text after '--name'. Their wording is the
# program's (tests match it).
def at_least(bound):
  return lambda v: None if v >= bound else f' must be at least {bound}, got {v}'


def non_negative(v):
  return None if v >= 0 and math.isfinite(v) else f' must be >= 0 and finite, got {v}'


def positive(v):
  return None if v > 0 else f' must be > 0, got {v}'


def in_interval(text: str, test: Callable[[Any], bool]):
  """`text` is the interval as the message shows it, e.g. '[0.5, 1)'."""
  return lambda v: None if test(v) else f' must be in {text}, got {v}'


def one_of(choices):
  return lambda v: (None if v in choices else
                    f'={v!r} is unknown; choose one of {", ".join(choices)}')


@dataclasses.dataclass(frozen=True)
class Flag:
  """A method's own flag (also an `ExperimentConfig` field of the same name)."""
  name: str
  default: Any               # its type is the flag's type (bool, int, float, str)
  help: str
  check: Optional[Callable[[Any], Optional[str]]] = None
  target: str = BUILDER      # BUILDER, EXPLORATION or PROGRAM
  kwarg: Optional[str] = None  # the keyword it becomes (BUILDER / EXPLORATION targets)
  transform: Callable[[Any], Any] = lambda v: v  # flag value -> argument value

  def error(self, value) -> Optional[str]:
    """The one-line error for `value`, or None."""
    if self.check is None:
      return None
    problem = self.check(value)
    return None if problem is None else f'--{self.name}{problem}'


@dataclasses.dataclass(frozen=True)
class BuildInputs:
  """What the program hands a method's `arguments` besides its flags."""
  model_fn: Callable
  client_optimizer: Any
  server_optimizer: Any      # from --server_optimizer/--server_lr/--server_momentum, or None
  num_clients: int
  true_clusters: Any         # the partition's ground-truth clusters or None


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """What a method's `summary` reads of a finished run."""
  config: Any
  rows: list                 # metrics.csv rows (dicts of strings), one per round
  state: Any                 # the final server state
  model_weights: Any         # the process's get_model_weights(state)
  num_clients: int


@dataclasses.dataclass(frozen=True)
class Method:
  """One `--algorithm`.

  `arguments(config, inputs)` returns the builder's (args, kwargs) apart from the BUILDER
  flags' keywords, which are added from `flags`. `reads` are the general server flags
  (SERVER_FLAGS) the arguments use; any other one set away from its default is refused.
  `check(config)` validates combinations of flags (None or a message). `errors`: exception
  types the builder raises for impossible settings, reported as `error_prefix + str(e)`.
  `note(config)`: a line the program prints before training (a valid but noteworthy
  setting), or None. `summary(run)`: the method's own entries of summary.json from the
  finished run (a `RunRecord`).
  `guided`: the method is a plug-in preset, guided whatever --guided says (fedlex_*).
  `local_steps`: False for FedSGD's one gradient (no KD there, no client rate to schedule).
  `server_rate`: False for a method whose server takes no optimizer step (no server rate to
  schedule: FedCross, FedCDA).
  """
  name: str
  builder: str               # 'module:function'
  arguments: Callable[[Any, BuildInputs], tuple]
  flags: tuple = ()
  reads: tuple = ()
  check: Callable[[Any], Optional[str]] = lambda c: None
  errors: tuple = ()
  error_prefix: str = ''
  note: Callable[[Any], Optional[str]] = lambda c: None
  summary: Callable[[Any], dict] = lambda run: {}
  guided: bool = False
  local_steps: bool = True
  server_rate: bool = True

  def builder_function(self) -> Callable:
    return named_function(self.builder)

  def builder_kwargs(self, config, target: str = BUILDER) -> dict:
    """{keyword: value} of this method's flags that go to `target`."""
    return {f.kwarg: f.transform(getattr(config, f.name)) for f in self.flags
            if f.target == target}

  def validate(self, config) -> Optional[str]:
    for flag in self.flags + PLUGIN_FLAGS + FEDLEX_FLAGS:
      error = flag.error(getattr(config, flag.name))
      if error:
        return error
    return self.check_plugins(config) or self.check(config)

  def is_guided(self, config) -> bool:
    """Whether a run of `config` trains with FedLEx's guidance (and explores first)."""
    return self.guided or config.guided

  def plugin_kwargs(self, config) -> dict:
    """The plug-in keywords (`guided=`, `kd_weight=`) `config` adds to the builder call;
    none when the flags are at their defaults, so a plain run's call is as it was."""
    kwargs = {}
    if config.guided and not self.guided:
      kwargs['guided'] = True
    if config.kd_weight >= 0:   # < 0: the method's own default (CADIS: --cadis_kd_weight)
      kwargs['kd_weight'] = config.kd_weight
    return kwargs

  def check_plugins(self, config) -> Optional[str]:
    """The plug-in flags' combinations with this method (None or a message)."""
    if config.kd_weight > 0 and not self.local_steps:
      return (f'--kd_weight does not apply to --algorithm={self.name}: FedSGD takes its one '
              'gradient at the received model, where the student is the teacher and the KD '
              'term and its gradient are 0; drop it')
    if config.kd_weight >= 0 and any(
        f.kwarg == 'kd_weight' and getattr(config, f.name) != f.default for f in self.flags):
      own = next(f.name for f in self.flags if f.kwarg == 'kd_weight')
      return f'--kd_weight and --{own} both set the KD weight; drop --{own}'
    if not self.is_guided(config):
      for flag in FEDLEX_FLAGS:
        if getattr(config, flag.name) != flag.default:
          return (f'--{flag.name} is read only by a guided run (--guided or '
                  f'--algorithm=fedlex_*); add --guided or drop it')
      return None
    return _check_fedlex(config)


def named_function(name: str) -> Callable:
  """The function named 'module:function' (imported now)."""
  module, function = name.split(':')
  return getattr(importlib.import_module(module), function)


def _lr_or(default):
  """--server_lr, or `default` when it is left at its 'algorithm default' value (< 0)."""
  return lambda c: c.server_lr if c.server_lr >= 0 else default


# ---- FedCross (docs/algorithms.md#fedcross) ----
FEDCROSS_SELECTIONS = ('lowest_similarity', 'highest_similarity', 'in_order')
FEDCROSS_SIMILARITIES = ('model', 'layerwise')  # cross_aggregation.SIMILARITIES
FEDCROSS_FLAGS = (
    Flag('fedcross_alpha', 0.99, 'FedCross alpha in [0.5, 1).',
         in_interval('[0.5, 1)', lambda v: 0.5 <= v < 1), kwarg='alpha'),
    Flag('fedcross_selection', 'lowest_similarity',
         'FedCross collaborator rule: lowest_similarity, highest_similarity, in_order.',
         one_of(FEDCROSS_SELECTIONS), kwarg='selection'),
    Flag('fedcross_similarity', 'model',
         'FedCross similarity of the similarity rules: model (cosine of whole models, the '
         'paper) or layerwise (sum of per-layer cosines, the authors\' code).',
         one_of(FEDCROSS_SIMILARITIES), kwarg='similarity'),
    Flag('fedcross_alpha_schedule', False,
         'FedCross dynamic alpha: 0.5 -> alpha over accel rounds.', kwarg='alpha_schedule'),
    Flag('fedcross_num_propellers', 1,
         'FedCross propeller models during the accel rounds (1 .. clients_per_round - 1).',
         kwarg='num_propellers'),
    Flag('fedcross_accel_rounds', 0, 'FedCross acceleration rounds.', non_negative,
         kwarg='accel_rounds'),
)


def _fedcross_check(c) -> Optional[str]:
  if not 1 <= c.fedcross_num_propellers < max(c.clients_per_round, 2):
    return (f'--fedcross_num_propellers must be in [1, clients_per_round - 1], got '
            f'{c.fedcross_num_propellers}')
  if c.fedcross_similarity != 'model' and c.fedcross_selection == 'in_order':
    return (f'--fedcross_similarity={c.fedcross_similarity} is read only by the similarity '
            'rules, not by --fedcross_selection=in_order; drop it or choose lowest_similarity '
            'or highest_similarity')
  return None


# ---- FedCDA (docs/algorithms.md#fedcda) ----
FEDCDA_SELECTIONS = ('batch_greedy', 'exact', 'newest', 'random')
FEDCDA_WARMUP_WEIGHTINGS = ('data_size', 'uniform')
FEDCDA_CACHE_DTYPES = ('float32', 'float16', 'bfloat16')  # cross_round_cache.CACHE_DTYPES
FEDCDA_FLAGS = (
    Flag('fedcda_cache_size', 3, 'FedCDA: models cached per client (K).', at_least(1),
         kwarg='cache_size'),
    Flag('fedcda_batches', 3, 'FedCDA: batches of the greedy selection (B).', at_least(1),
         kwarg='num_batches'),
    Flag('fedcda_warmup_rounds', 50, 'FedCDA: FedAvg rounds before selection.', non_negative,
         kwarg='warmup_rounds'),
    Flag('fedcda_smoothness', 1.0, 'FedCDA: L in eq. 8.', non_negative, kwarg='smoothness'),
    Flag('fedcda_selection', 'batch_greedy',
         'FedCDA selection: batch_greedy, exact, newest or random.', one_of(FEDCDA_SELECTIONS),
         kwarg='selection'),
    Flag('fedcda_warmup_weighting', 'data_size',
         'FedCDA: client weights of the warmup FedAvg: data_size (the paper) or uniform.',
         one_of(FEDCDA_WARMUP_WEIGHTINGS), kwarg='warmup_weighting'),
    Flag('fedcda_max_cache_gib', 4.0,
         'FedCDA: refuse a cache (b*N*K*D bytes) above this many GiB.', positive,
         kwarg='max_cache_gib'),
    Flag('fedcda_cache_dtype', 'float32',
         'FedCDA: dtype of the cached models: float32, or float16 / bfloat16 (b = 2 bytes per '
         'weight: half the memory; uploads are rounded as they enter the cache).',
         one_of(FEDCDA_CACHE_DTYPES), kwarg='cache_dtype'),
)


def _fedcda_check(c) -> Optional[str]:
  per_batch = 1 if c.fedcda_selection == 'exact' else c.fedcda_batches
  size = max(1, -(-c.clients_per_round // per_batch))
  if c.fedcda_selection in ('batch_greedy', 'exact') and c.fedcda_cache_size ** size > 1 << 20:
    return (f'--fedcda_selection={c.fedcda_selection} would search {c.fedcda_cache_size}^{size} '
            'combinations per batch; raise --fedcda_batches or lower --fedcda_cache_size')
  return None


def _fedcda_note(c) -> Optional[str]:
  if c.fedcda_warmup_rounds >= c.rounds:
    return (f'note: --fedcda_warmup_rounds={c.fedcda_warmup_rounds} >= --rounds={c.rounds}: '
            'this run is its warmup FedAvg throughout')
  return None


def _num_weights(weights) -> int:
  """D of a finished run's model weights (a structure of arrays)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return sum(int(np.asarray(w).size) for w in tf.nest.flatten(weights))


def _fedcda_summary(run: RunRecord) -> dict:
  """The cache's size: the formula's bytes beside the measured aggregator state."""
  from tff_algos.aggregators import cross_round_cache  # pylint: disable=g-import-not-at-top
  c = run.config
  d = _num_weights(run.model_weights)
  b = cross_round_cache.CACHE_DTYPES[c.fedcda_cache_dtype]
  return dict(
      fedcda_state_formula_bytes=cross_round_cache.state_size_bytes(
          run.num_clients, c.fedcda_cache_size, d, c.fedcda_cache_dtype),
      fedcda_cache_formula=(
          f'{b}*N*K*D = {b}*{run.num_clients}*{c.fedcda_cache_size}*{d} bytes '
          f'({c.fedcda_cache_dtype}) + 8*D running sum + 4*(3NK+2N+1) bookkeeping'))


# ---- SCAFFOLD (Karimireddy et al. 2020, option II; tff_algos/scaffold.py) ----
SCAFFOLD_CLIENT_WEIGHTINGS = ('uniform', 'num_examples')  # model_delta.CLIENT_WEIGHTINGS
SCAFFOLD_FLAGS = (
    Flag('scaffold_server_lr', 1.0, 'SCAFFOLD: global learning rate eta_g (x += eta_g * mean '
         'of y_i - x).', positive, kwarg='server_learning_rate'),
    Flag('scaffold_client_weighting', 'uniform',
         'SCAFFOLD: weights of the model-delta mean: uniform (the paper) or num_examples.',
         one_of(SCAFFOLD_CLIENT_WEIGHTINGS), kwarg='client_weighting'),
    Flag('scaffold_max_control_gib', 4.0,
         'SCAFFOLD: refuse control variates (4*N*D bytes) above this many GiB.', positive,
         kwarg='max_control_gib'),
)


def _scaffold_check(c) -> Optional[str]:
  if c.client_optimizer != 'sgdm' or c.client_momentum != 0:
    return ('--algorithm=scaffold needs plain client SGD (option II\'s control variate '
            '(x - y_i) / (K_i * lr) is the mean gradient of the local steps only without '
            'momentum or Adam): add --client_momentum=0 (and --client_optimizer=sgdm)')
  return None


def _scaffold_summary(run: RunRecord) -> dict:
  """The control variates' size: the formula's bytes beside the measured aggregator state."""
  from tff_algos.aggregators import control_variates  # pylint: disable=g-import-not-at-top
  d = _num_weights(run.model_weights.trainable)
  return dict(
      scaffold_state_formula_bytes=control_variates.state_size_bytes(run.num_clients, d),
      scaffold_control_formula=(f'4*N*D = 4*{run.num_clients}*{d} bytes of client control '
                                'variates + 4*D (c) + 4*N (update counts)'))


# ---- CADIS (docs/algorithms.md#cadis) ----
CADIS_REDUCTIONS = ('sum', 'mean')
CADIS_KD_STDS = ('population', 'sample')
CADIS_SIMILARITY_LAYERS = ('bias', 'kernel')
CADIS_CLOSURES = ('two_hop', 'components', 'oracle')
CADIS_FLAGS = (
    Flag('cadis_threshold', 0.975, 'CADIS: initial clustering threshold tau_0.',
         kwarg='threshold'),
    Flag('cadis_threshold_max', 0.985, 'CADIS: largest threshold.', kwarg='threshold_max'),
    Flag('cadis_kd_weight', 1.0, 'CADIS: lambda of the KD term (0 = off); the general '
         '--kd_weight, when given, sets it instead.',
         lambda v: None if v >= 0 and math.isfinite(v) else f' must be >= 0, got {v}',
         kwarg='kd_weight'),
    Flag('cadis_kd_reduction', 'sum', 'CADIS KD: sum or mean.', one_of(CADIS_REDUCTIONS),
         kwarg='kd_reduction'),
    Flag('cadis_kd_std', 'population', 'CADIS KD: sigma of the pairwise distances, '
         'population or sample (n - 1, the authors\' code).', one_of(CADIS_KD_STDS),
         kwarg='kd_std'),
    Flag('cadis_similarity_layer', 'bias',
         'CADIS: classifier bias or kernel delta for similarity.',
         one_of(CADIS_SIMILARITY_LAYERS), kwarg='similarity_layer'),
    Flag('cadis_sample_weighted', True, 'CADIS: weights (1/|C|)(n_i/n); false: 1/|C| only.',
         kwarg='sample_weighted'),
    Flag('cadis_closure', 'two_hop', 'CADIS: two_hop, components, or oracle (|C_i| from the '
         'partition\'s true clusters: a diagnosis; cluster-skewed partitions only).',
         one_of(CADIS_CLOSURES),
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


def _cadis_summary(run: RunRecord) -> dict:
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


def _cadis_check(c) -> Optional[str]:
  if not 0 <= c.cadis_threshold <= c.cadis_threshold_max <= 1:
    return (f'CADIS needs 0 <= --cadis_threshold <= --cadis_threshold_max <= 1, got '
            f'{c.cadis_threshold} and {c.cadis_threshold_max}')
  if c.cadis_closure == 'oracle' and not c.partition.startswith('cluster_'):
    return ('--cadis_closure=oracle takes the clusters from a cluster-skewed partition: add '
            '--partition=cluster_mc (or cluster_uc, cluster_bc)')
  return None


# ---- The plug-in client stages (tff_algos/client_work/plugins.py), general flags ----
PLUGIN_FLAGS = (
    Flag('guided', False, 'FedLEx\'s guidance on any --algorithm: an exploration phase '
         'builds the guidance matrix G (the --fedlex_* exploration flags), and every client '
         'gradient is multiplied by G before its step (fedlex_* are guided already).',
         kwarg='guided'),
    Flag('kd_weight', -1.0, 'lambda of CADIS\'s KD term on any --algorithm with local steps '
         '(the teacher: the model the client received); 0 = off, < 0 = the method\'s '
         'default (cadis: --cadis_kd_weight, others off).',
         lambda v: None if math.isfinite(v) else f' must be a finite number, got {v}',
         kwarg='kd_weight'),
)

# FedLEx's exploration (docs/algorithms.md#fedlex): read by every guided run (--guided or
# fedlex_*); general flags that kept their fedlex_ names, so recorded runs still resume.
FEDLEX_NORMALIZE = ('per_client', 'after_mean')
FEDLEX_GUIDANCE = ('exploration', 'placeholder')
FEDLEX_FLAGS = (
    Flag('fedlex_explorer_fraction', 0.2,
         'Fraction of clients exploring (the program picks them with the seed).',
         in_interval('(0, 1]', lambda v: 0 < v <= 1), target=PROGRAM),
    Flag('fedlex_exploration_epochs', 5, 'Exploration epochs (the program\'s exploration '
         'inputs).', at_least(1), target=PROGRAM),
    Flag('fedlex_exploration_lr', 0.0, 'Learning rate of the explorers\' (unguided) local '
         'SGD; 0 = --client_lr. A guided variant whose --client_lr is raised to make up for '
         'G\'s small entries should explore at its base\'s rate: explorers at a high rate '
         'make G collapse (the program\'s exploration optimizer).', non_negative,
         target=PROGRAM),
    Flag('fedlex_exploration_patience', 0, 'Early-stopping patience of explorers (0 = off).',
         lambda v: None if v >= 0 else ' must be >= 0 (0 = off)', target=EXPLORATION,
         kwarg='exploration_patience', transform=lambda v: v or None),
    Flag('fedlex_normalize', 'per_client', 'Guidance normalisation: per_client or after_mean.',
         lambda v: None if v in FEDLEX_NORMALIZE else f' must be one of {", ".join(FEDLEX_NORMALIZE)}',
         target=EXPLORATION, kwarg='normalize'),
    Flag('fedlex_guidance_floor', 0.0, 'Lower bound of guidance entries.',
         in_interval('[0, 1]', lambda v: 0 <= v <= 1), target=EXPLORATION,
         kwarg='guidance_floor'),
    Flag('fedlex_refresh', False,
         'Explorers taking part in a round refresh the guidance (the program\'s loop).',
         target=PROGRAM),
    Flag('fedlex_guidance', 'exploration',
         'Where G comes from: exploration (the paper) or placeholder, a diagnosis option: '
         'what the reference code at its HEAD does, G = minmax((1 - w)^2) per tensor of the '
         'model round 1 starts from (with --fedlex_explore_in_place: of the last explorer\'s '
         'tl_base), installed after an unguided round 1, no exploration '
         '(the program\'s loop; `fedlex.placeholder_guidance`).',
         one_of(FEDLEX_GUIDANCE), target=PROGRAM),
    Flag('fedlex_explore_in_place', False,
         'Diagnosis option (the reference code): the explorers train the global model in '
         'place one after another, so round 1 starts from the last one\'s model; each first '
         'trains one epoch with a fresh optimizer (the reference\'s tl_base), then explores '
         'with another; placeholder G from the last one\'s tl_base, explored G from each '
         'one\'s deviation from its own tl_base (the program; `fedlex.explore_in_place`).',
         target=PROGRAM),
)
# The flags the exploration alone reads: inert when nothing explores (placeholder G without
# --fedlex_explore_in_place), and --fedlex_normalize / --fedlex_refresh with any placeholder G.
_EXPLORER_FLAGS = ('fedlex_explorer_fraction', 'fedlex_exploration_epochs',
                   'fedlex_exploration_lr', 'fedlex_exploration_patience')


def _check_fedlex(config) -> Optional[str]:
  """A guided run's FedLEx flags that its --fedlex_guidance leaves inert (None or a message)."""
  if config.fedlex_guidance != 'placeholder':
    return None
  inert = ('fedlex_normalize', 'fedlex_refresh') + (
      () if config.fedlex_explore_in_place else _EXPLORER_FLAGS)
  for flag in FEDLEX_FLAGS:
    if flag.name in inert and getattr(config, flag.name) != flag.default:
      return (f'--{flag.name} is not read with --fedlex_guidance=placeholder (no exploration '
              'builds G); drop it')
  return None


def plugin_summary(method: Method, run: RunRecord) -> dict:
  """summary.json's entries of the plug-ins: the guidance's statistics of a guided run."""
  if not method.is_guided(run.config):
    return {}
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  return dict(guidance=fedlex.guidance_statistics(fedlex.get_guidance(run.state)))


def exploration_kwargs(config) -> dict:
  """The keywords of `tff_algos.fedlex.build_fedlex_exploration` from the exploration flags."""
  return {f.kwarg: f.transform(getattr(config, f.name)) for f in FEDLEX_FLAGS
          if f.target == EXPLORATION}


def _baseline(builder: str):
  return f'tff_algos.baselines:{builder}'


def _head(c, i) -> tuple:
  """(model_fn, client optimizer, batch size): the common head of the builders' arguments."""
  return (i.model_fn, i.client_optimizer, c.batch_size)


def _fedsgd_batch(c) -> int:
  # FedSGD takes one full-batch gradient per client; the batch size only bounds memory.
  return max(c.batch_size, 256)


def _fedlex(base: str, reads: tuple, kwargs: Callable) -> Method:
  def arguments(c, i):
    if base == 'sgd':
      return (i.model_fn, None, _fedsgd_batch(c), base), kwargs(c, i)
    return (i.model_fn, i.client_optimizer, c.batch_size, base), kwargs(c, i)
  return Method(f'fedlex_{base}', 'tff_algos.fedlex:build_fedlex', arguments, reads=reads,
                guided=True, local_steps=base != 'sgd')


METHODS = {m.name: m for m in (
    Method('fedavg', _baseline('build_fedavg'),
           lambda c, i: (_head(c, i), dict(server_optimizer_fn=i.server_optimizer)),
           reads=OPTIMIZER_FLAGS),
    Method('fedavgm', _baseline('build_fedavgm'),
           lambda c, i: (_head(c, i), dict(server_learning_rate=_lr_or(1.0)(c),
                                               server_momentum=c.server_momentum)),
           reads=('server_lr', 'server_momentum')),
    Method('fedadam', _baseline('build_fedadam'),
           lambda c, i: (_head(c, i), dict(server_learning_rate=_lr_or(1e-2)(c))),
           reads=('server_lr',)),
    Method('fedprox', _baseline('build_fedprox'),
           lambda c, i: (_head(c, i), dict(proximal_strength=c.proximal_strength,
                                               server_optimizer_fn=i.server_optimizer)),
           reads=SERVER_FLAGS),
    Method('fedsgd', _baseline('build_fedsgd'),
           lambda c, i: ((i.model_fn,), dict(server_optimizer_fn=i.server_optimizer,
                                             client_batch_size=_fedsgd_batch(c))),
           reads=OPTIMIZER_FLAGS, local_steps=False),
    Method('fedcross', 'tff_algos.fedcross:build_fedcross',
           lambda c, i: (_head(c, i) + (c.clients_per_round,), {}),
           flags=FEDCROSS_FLAGS, check=_fedcross_check, server_rate=False),
    Method('fedcda', 'tff_algos.fedcda:build_fedcda',
           lambda c, i: (_head(c, i) + (i.num_clients, c.clients_per_round),
                         dict(seed=c.seed)),
           flags=FEDCDA_FLAGS, check=_fedcda_check, errors=(ValueError,),
           note=_fedcda_note, summary=_fedcda_summary, server_rate=False),
    Method('cadis', 'tff_algos.cadis:build_cadis',
           lambda c, i: (_head(c, i) + (i.num_clients,),
                         dict(clients_per_round=c.clients_per_round,
                              true_clusters=i.true_clusters,
                              server_optimizer_fn=i.server_optimizer)),
           flags=CADIS_FLAGS, reads=OPTIMIZER_FLAGS, check=_cadis_check,
           errors=(ValueError, TypeError), error_prefix='--algorithm=cadis: ',
           summary=_cadis_summary),
    Method('scaffold', 'tff_algos.scaffold:build_scaffold',
           lambda c, i: (_head(c, i) + (i.num_clients, c.clients_per_round), {}),
           flags=SCAFFOLD_FLAGS, check=_scaffold_check, errors=(ValueError,),
           error_prefix='--algorithm=scaffold: ', summary=_scaffold_summary),
    _fedlex('avgm', ('server_lr', 'server_momentum'),
            lambda c, i: dict(server_learning_rate=_lr_or(1.0)(c),
                              server_momentum=c.server_momentum)),
    _fedlex('sgd', OPTIMIZER_FLAGS,
            lambda c, i: dict(server_optimizer_fn=i.server_optimizer)),
    _fedlex('opt', ('server_lr',),
            lambda c, i: dict(server_learning_rate=_lr_or(1e-2)(c))),
    _fedlex('prox', SERVER_FLAGS,
            lambda c, i: dict(proximal_strength=c.proximal_strength,
                              server_optimizer_fn=i.server_optimizer)),
)}
ALGORITHMS = tuple(METHODS)
BASELINE_ALGORITHMS = ('fedavg', 'fedavgm', 'fedadam', 'fedprox', 'fedsgd')
FEDLEX_ALGORITHMS = tuple(name for name in METHODS if name.startswith('fedlex_'))


def all_flags() -> tuple:
  """Every method's own flag once, in declaration order (docs/methods.md's table)."""
  seen = {}
  for method in METHODS.values():
    for flag in method.flags:
      seen.setdefault(flag.name, flag)
  return tuple(seen.values())


def registry_flags() -> tuple:
  """Every flag declared here: the methods' own, the plug-ins' and the exploration's (the
  last two are general flags, documented in docs/training_program.md)."""
  return all_flags() + PLUGIN_FLAGS + FEDLEX_FLAGS


def config_fields() -> list:
  """(name, type, dataclasses.field) of every flag declared here, for ExperimentConfig."""
  return [(f.name, type(f.default), dataclasses.field(default=f.default))
          for f in registry_flags()]


def define_absl_flags() -> dict:
  """Defines every flag declared here with absl; returns {name: FlagHolder}."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string}
  return {f.name: define[type(f.default)](f.name, f.default, f.help) for f in registry_flags()}


def _table_default(flag: Flag) -> str:
  if isinstance(flag.default, bool):
    return str(flag.default).lower()
  return str(flag.default)


def flag_table() -> str:
  """The table of method flags (docs/methods.md holds it between TABLE_BEGIN and TABLE_END)."""
  lines = ['| flag | default | method | sets | meaning |', '|---|---|---|---|---|']
  for flag in all_flags():
    users = [m for m in METHODS.values() if flag in m.flags]
    method = ', '.join(m.name for m in users)
    if flag.target == BUILDER:
      sets = f'`{users[0].builder.split(":")[1]}({flag.kwarg}=)`'
    elif flag.target == EXPLORATION:
      sets = f'`build_fedlex_exploration({flag.kwarg}=)`'
    else:
      sets = 'the program\'s loop'
    meaning = flag.help.replace('|', '\\|')
    lines.append(f'| `--{flag.name}` | {_table_default(flag)} | {method} | {sets} | {meaning} |')
  return '\n'.join(lines) + '\n'


TABLE_BEGIN = '<!-- method flags: generated by `python -m programs.methods`; do not edit -->'
TABLE_END = '<!-- end of method flags -->'
TABLE_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs',
                          'methods.md')


def page_with_table(text: str) -> str:
  """`text` (docs/methods.md) with the block between the table markers rewritten."""
  return pages.with_block(text, TABLE_BEGIN, TABLE_END, flag_table())


if __name__ == '__main__':
  with open(TABLE_PAGE) as f:
    before = f.read()
  after = page_with_table(before)
  if after != before:
    pages.write_text(TABLE_PAGE, after)
  print(f'{os.path.relpath(TABLE_PAGE)}: method flag table '
        f'{"rewritten" if after != before else "already current"}')
