"""The method registry's machinery: `Flag`, `Method`, the validation rules, and the general
flags every method takes (the plug-in client stages and FedLEx's exploration).

A method file (programs/methods/<method>.py) declares its `Method` with these; the package's
index (programs/methods/__init__.py) collects them. The plug-in client stages every method
takes (`--guided` with FedLEx's exploration flags, `--kd_weight`:
`tff_algos/client_work/plugins.py`) are declared here once, as general flags; they and a
method's own STAGES flags reach its builder as one `tff_algos.ClientStages`, `client_stages=`.

Importing this module imports neither TensorFlow nor TFF (flags are validated before TF
starts): a method's builder is imported when a process is built.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from tff_algos import constants

# Where a method flag's value goes.
BUILDER = 'builder'          # a keyword argument of the method's builder
STAGES = 'stages'            # a field of the builder's `client_stages=` (tff_algos.ClientStages)
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
  target: str = BUILDER      # BUILDER, STAGES, EXPLORATION or PROGRAM
  kwarg: Optional[str] = None  # the keyword (BUILDER, EXPLORATION) or ClientStages field
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
  flags' keywords, which are added from `flags`, and `client_stages=` (`plugin_kwargs`).
  `reads` are the general server flags (SERVER_FLAGS) the arguments use; any other one set
  away from its default is refused.
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
  builder: Callable          # the method file's `build_<method>`, which imports the real one
  arguments: Callable[[Any, BuildInputs], tuple]
  flags: tuple = ()
  reads: tuple = ()
  check: Callable[[Any], Optional[str]] = lambda config: None
  errors: tuple = ()
  error_prefix: str = ''
  note: Callable[[Any], Optional[str]] = lambda config: None
  summary: Callable[[Any], dict] = lambda run: {}
  guided: bool = False
  local_steps: bool = True
  server_rate: bool = True

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
    """The builder's `client_stages=`: one `tff_algos.ClientStages` from the plug-in flags
    (`--guided`, `--kd_weight`) and the method's STAGES flags (CADIS's `--cadis_kd_*`); {}
    when none sets a stage, so a plain run's call is as it was. Imports TensorFlow."""
    fields = self.builder_kwargs(config, STAGES)
    if config.kd_weight >= 0:   # < 0: the method's own default (CADIS: --cadis_kd_weight)
      fields['kd_weight'] = config.kd_weight
    if self.is_guided(config):
      fields['guided'] = True
    if not fields:
      return {}
    from tff_algos.client_work import plugins  # pylint: disable=g-import-not-at-top
    return dict(client_stages=plugins.ClientStages(**fields))

  def check_plugins(self, config) -> Optional[str]:
    """The plug-in flags' combinations with this method (None or a message)."""
    if config.kd_weight > 0 and not self.local_steps:
      return (f'--kd_weight does not apply to --algorithm={self.name}: FedSGD takes its one '
              'gradient at the received model, where the student is the teacher and the KD '
              'term and its gradient are 0; drop it')
    own_weight = [f for f in self.flags if f.target == STAGES and f.kwarg == 'kd_weight']
    if config.kd_weight >= 0 and any(getattr(config, f.name) != f.default for f in own_weight):
      own = own_weight[0].name
      return f'--kd_weight and --{own} both set the KD weight; drop --{own}'
    if not self.is_guided(config):
      for flag in FEDLEX_FLAGS:
        if getattr(config, flag.name) != flag.default:
          return (f'--{flag.name} is read only by a guided run (--guided or '
                  f'--algorithm=fedlex_*); add --guided or drop it')
      return None
    return _check_fedlex(config)


def lr_or(default):
  """--server_lr, or `default` when it is left at its 'algorithm default' value (< 0)."""
  return lambda config: config.server_lr if config.server_lr >= 0 else default


def head(config, i) -> tuple:
  """(model_fn, client optimizer, batch size): the common head of the builders' arguments."""
  return (i.model_fn, i.client_optimizer, config.batch_size)


def fedsgd_batch(config) -> int:
  # FedSGD takes one full-batch gradient per client; the batch size only bounds memory.
  return max(config.batch_size, 256)


def num_weights(weights) -> int:
  """D of a finished run's model weights (a structure of arrays)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return sum(int(np.asarray(w).size) for w in tf.nest.flatten(weights))


# ---- The plug-in client stages (tff_algos/client_work/plugins.py), general flags ----
PLUGIN_FLAGS = (
    Flag('guided', False, 'FedLEx\'s guidance on any --algorithm: an exploration phase '
         'builds the guidance matrix G (the --fedlex_* exploration flags), and every client '
         'gradient is multiplied by G before its step (fedlex_* are guided already).',
         target=STAGES, kwarg='guided'),
    Flag('kd_weight', -1.0, 'lambda of CADIS\'s KD term on any --algorithm with local steps '
         '(the teacher: the model the client received); 0 = off, < 0 = the method\'s '
         'default (cadis: --cadis_kd_weight, others off).',
         lambda v: None if math.isfinite(v) else f' must be a finite number, got {v}',
         target=STAGES, kwarg='kd_weight'),
)

# FedLEx's exploration (docs/algorithms.md#fedlex): read by every guided run (--guided or
# fedlex_*); general flags that kept their fedlex_ names, so recorded runs still resume.
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
         lambda v: (None if v in constants.FEDLEX_NORMALIZATIONS else
                    f' must be one of {", ".join(constants.FEDLEX_NORMALIZATIONS)}'),
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
         one_of(constants.FEDLEX_GUIDANCES), target=PROGRAM),
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

