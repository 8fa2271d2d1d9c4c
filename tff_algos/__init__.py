"""tff_algos: FedCross, FedCDA, CADIS and FedLEx for TensorFlow Federated, with their baselines
and SCAFFOLD.

Every method is built by a `build_<method>` function returning a
`tff.learning.templates.LearningProcess`; see README.md. Each takes the plug-in client stages
(FedLEx's guidance, CADIS's KD term) as one `ClientStages` value, `client_stages=`.

The builders are exported lazily (PEP 562): `import tff_algos` does not start TensorFlow, so a
program can validate its flags (e.g. against `tff_algos.models.catalog`) first.

Modules (docs/architecture.md has the whole map):

* `_lazy_exports`: PEP 562 lazy exports, so `import tff_algos` does not load TensorFlow.
* `baselines`: FedAvg, FedAvgM, FedAdam, FedProx, FedSGD on the shared client training.
* `cadis`: CADIS, `build_cadis`.
* `client_lr_decay`: a client learning rate decaying every round, on any process.
* `communication`: bytes on the wire: what a process's clients download and upload per
  round, from the TFF types that cross, split payload / overhead.
* `constants`: names shared with the programs, importable without TensorFlow.
* `evaluation`: central and per-client evaluation of a model's weights.
* `execution`: the runtime's public names (`initialize_runtime`, worker services, contexts),
  re-exported from `tff_algos/runtime/`.
* `fedcda`: FedCDA, `build_fedcda`.
* `fedcross`: FedCross, `build_fedcross`.
* `fedlex`: FedLEx, `build_fedlex`, `build_fedlex_exploration` and the guidance helpers.
* `learning_process`: the parts every hand-written `LearningProcess` here shares.
* `optimizers`: PyTorch's Adam (`build_torch_adam`) and coupled weight decay.
* `scaffold`: SCAFFOLD, `build_scaffold`.
* `schedules`: client and server learning-rate schedules (`Schedule`) on any process.
* `aggregators`: the stateful aggregation processes, exported.
* `client_work`: the client work processes, exported; `ClientStages` from its `plugins`.
* `models`: the model zoo and `model_fn`s, exported.
* `runtime`: TFF 0.87's runtime workarounds, one module each.
"""
from typing import TYPE_CHECKING

from tff_algos._lazy_exports import lazy_exports

from tff_algos import execution  # stdlib only; registers the worker shutdown at exit

_EXPORTS = {
    'tff_algos.baselines': (
        'BASELINES', 'build_baseline', 'build_fedadam', 'build_fedavg', 'build_fedavgm',
        'build_fedprox', 'build_fedsgd'),
    'tff_algos.cadis': ('build_cadis',),
    'tff_algos.client_lr_decay': ('with_client_lr_decay',),
    'tff_algos.client_work.plugins': ('ClientStages',),
    'tff_algos.evaluation': ('build_per_client_evaluation', 'client_evaluation_inputs',
                             'summarize_client_accuracies'),
    'tff_algos.fedcda': ('build_fedcda',),
    'tff_algos.fedcross': ('build_fedcross',),
    'tff_algos.fedlex': ('build_fedlex', 'build_fedlex_exploration'),
    'tff_algos.runtime.resident_state': ('ResidentProcess',),
    'tff_algos.scaffold': ('build_scaffold',),
    'tff_algos.schedules': ('Schedule', 'with_lr_schedules'),
}
_SUBMODULES = ('aggregators', 'baselines', 'cadis', 'client_lr_decay', 'client_work',
               'communication', 'evaluation', 'fedcda', 'fedcross', 'fedlex', 'models',
               'optimizers', 'runtime', 'scaffold', 'schedules')
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
__all__ = __all__ + ['execution']

if TYPE_CHECKING:  # static analysers and IDEs see the real names
  from tff_algos.baselines import (  # noqa: F401
      BASELINES, build_baseline, build_fedadam, build_fedavg, build_fedavgm, build_fedprox,
      build_fedsgd)
  from tff_algos.cadis import build_cadis  # noqa: F401
  from tff_algos.client_lr_decay import with_client_lr_decay  # noqa: F401
  from tff_algos.client_work.plugins import ClientStages  # noqa: F401
  from tff_algos.evaluation import (  # noqa: F401
      build_per_client_evaluation, client_evaluation_inputs, summarize_client_accuracies)
  from tff_algos.fedcda import build_fedcda  # noqa: F401
  from tff_algos.fedcross import build_fedcross  # noqa: F401
  from tff_algos.fedlex import build_fedlex, build_fedlex_exploration  # noqa: F401
  from tff_algos.runtime.resident_state import ResidentProcess  # noqa: F401
  from tff_algos.scaffold import build_scaffold  # noqa: F401
  from tff_algos.schedules import Schedule, with_lr_schedules  # noqa: F401
