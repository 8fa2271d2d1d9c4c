"""Your own model, data set or method, named by an import path 'package.module:attribute'.

`--model`, `--dataset` and `--algorithm` (and the same keys of a study file) take such a
path besides the built-in names (docs/your_own.md). This module resolves it: the form of the
string, the import, the attribute and that it is callable are checked by `resolve` before
TensorFlow starts (importing the user's module may start it: that is the module's); what the
callable returns is checked where the run calls it, each with one `ExperimentError` line
saying what was expected.

  model:   fn(input_shape, num_classes) -> tf.keras.Model (logits) or a
           tff.learning.models.FunctionalModel                                  `model_fn`
  dataset: fn() -> data.FederatedDataset | data.ArrayDataset | (x_train, y_train, x_test,
           y_test) | (ClientData, (x_test, y_test)); `seed=` / `data_dir=` if it declares them
                                                                                  `load_dataset`
  method:  builder(model_fn=, client_optimizer_fn=, ...STANDARD_KEYWORDS it declares,
           **method_kwargs) -> tff.learning.templates.LearningProcess               `method`

The run's config.json and summary.json record each path with the sha256 of its module's
file (`fingerprints`), and `--resume` refuses a run whose file changed (`changed`).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import json
import re
import sys
from typing import Callable

from programs import methods
from programs.methods import registry

# package.module:attribute
IMPORT_PATH = re.compile(r'[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*')
# The flags that take a built-in name or an import path.
PATH_FLAGS = ('algorithm', 'dataset', 'model')
# The keywords the program hands a method of the user's, each only if its builder declares
# it (or takes **kwargs); model_fn and client_optimizer_fn it must take.
STANDARD_KEYWORDS = {
    'model_fn': 'a no-arg callable returning a tff.learning.models.VariableModel',
    'client_optimizer_fn': 'the clients\' tff.learning.optimizers.Optimizer '
                           '(--client_optimizer, --client_lr, ...)',
    'server_optimizer_fn': 'the server\'s Optimizer from --server_optimizer/--server_lr/'
                           '--server_momentum (not passed when none of them is set)',
    'client_batch_size': '--batch_size',
    'num_clients': 'the clients of the federation',
    'clients_per_round': '--clients_per_round',
    'seed': '--seed',
}
REQUIRED_KEYWORDS = ('model_fn', 'client_optimizer_fn')
# What a data set of the user's may take (if it declares them).
DATASET_KEYWORDS = ('seed', 'data_dir')


def _error(message: str):
  from programs.experiment_config import ExperimentError  # pylint: disable=g-import-not-at-top
  return ExperimentError(' '.join(message.split()))   # one line, whatever the user's text


def _raised(e: BaseException) -> str:
  return f'{type(e).__name__}: {e}'


def is_path(name: str) -> bool:
  """Whether a --model/--dataset/--algorithm value is an import path (built-in names have no
  colon)."""
  return ':' in name


def resolve(flag: str, path: str) -> Callable:
  """The callable `path` names, imported now; ExperimentError (one line) if the string is not
  of the form package.module:attribute, the module does not import, has no such attribute
  or it is not callable."""
  if not IMPORT_PATH.fullmatch(path):
    raise _error(f'--{flag}={path!r} is not an import path; write package.module:attribute '
                 '(e.g. mypkg.models:small_cnn)')
  module_name, attribute = path.split(':')
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and (module_name == e.name or module_name.startswith(e.name + '.')):
      raise _error(f'--{flag}={path}: no module named {e.name}; put the folder that holds it '
                   'on PYTHONPATH (or pip install it)') from None
    raise _error(f'--{flag}={path}: importing {module_name} failed: {_raised(e)}') from None
  except Exception as e:  # pylint: disable=broad-except  (the user's module raised)
    raise _error(f'--{flag}={path}: importing {module_name} failed: {_raised(e)}') from None
  if not hasattr(module, attribute):
    close = difflib.get_close_matches(attribute, [n for n in dir(module)
                                                  if not n.startswith('_')], n=1)
    raise _error(f'--{flag}={path}: module {module_name} has no attribute {attribute}'
                 + (f' (did you mean {close[0]}?)' if close else ''))
  value = getattr(module, attribute)
  if not callable(value):
    raise _error(f'--{flag}={path} is {type(value).__name__}, not callable; name a function '
                 f'(see docs/your_own.md for the {flag}\'s signature)')
  return value


def check(config) -> None:
  """Resolves every import path of config `c` and checks a method's keywords
  (--method_kwargs); imports neither TensorFlow nor TFF itself."""
  for flag in PATH_FLAGS:
    if is_path(getattr(config, flag)):
      resolve(flag, getattr(config, flag))
  if config.method_kwargs and not is_path(config.algorithm):
    raise _error(f'--method_kwargs is read only by a method of your own (--algorithm='
                 f'package.module:builder), not by --algorithm={config.algorithm}; drop it')
  if is_path(config.dataset) and not config.model:
    raise _error(f'--dataset={config.dataset} is your own: name its model, --model=<a built-in '
                 'model taking its inputs> or --model=package.module:function')
  if is_path(config.algorithm):
    _keywords(config, resolve('algorithm', config.algorithm))


def method_kwargs(config) -> dict:
  """--method_kwargs: a JSON object of the extra keywords of a method of the user's."""
  if not config.method_kwargs:
    return {}
  try:
    value = json.loads(config.method_kwargs)
  except ValueError as e:
    raise _error(f'--method_kwargs is not JSON ({e}); give an object, e.g. '
                 '\'{"clip_norm": 1.0}\'') from None
  if not isinstance(value, dict):
    raise _error(f'--method_kwargs must be a JSON object (keyword: value), got {config.method_kwargs}')
  return value


def _parameters(fn: Callable) -> tuple[set, bool]:
  """(the keyword parameters of `fn`, whether it takes **kwargs)."""
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return set(), True   # no signature to read (a builtin): hand it everything
  names = {p.name for p in parameters
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  return names, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _keywords(config, builder: Callable) -> set:
  """The standard keywords `builder` takes; refuses a builder missing a required one and
  --method_kwargs it does not take or that clash with the standard ones."""
  names, any_keyword = _parameters(builder)
  missing = [k for k in REQUIRED_KEYWORDS if k not in names and not any_keyword]
  if missing:
    raise _error(f'--algorithm={config.algorithm} must take the keyword arguments '
                 f'{", ".join(REQUIRED_KEYWORDS)} (it lacks {", ".join(missing)}); see '
                 'docs/your_own.md')
  for key in method_kwargs(config):
    if key in STANDARD_KEYWORDS:
      raise _error(f'--method_kwargs: {key} is set by the program ({STANDARD_KEYWORDS[key]}); '
                   'drop it')
    if key not in names and not any_keyword:
      close = difflib.get_close_matches(key, sorted(names - set(STANDARD_KEYWORDS)), n=1)
      raise _error(f'--method_kwargs: {config.algorithm} takes no keyword {key}'
                   + (f' (did you mean {close[0]}?)' if close else '')
                   + f'; it takes {", ".join(sorted(names)) or "none"}')
  return {k for k in STANDARD_KEYWORDS if k in names or any_keyword}


def _check_user_method(config):
  if config.guided or config.kd_weight >= 0:
    return (f'--guided and --kd_weight are the project\'s client stages; a method of your '
            f'own (--algorithm={config.algorithm}) builds its own client work: drop them')
  return None


def method(name: str):
  """The `registry.Method` of --algorithm=`name`: the registry's, or one for a builder of the
  user's (imported now), which reads the server-optimizer flags only if it takes
  server_optimizer_fn."""
  if not is_path(name):
    return methods.METHODS[name]
  builder = resolve('algorithm', name)
  names, any_keyword = _parameters(builder)
  takes_server = 'server_optimizer_fn' in names or any_keyword

  def arguments(config, i):
    values = dict(model_fn=i.model_fn, client_optimizer_fn=i.client_optimizer,
                  server_optimizer_fn=i.server_optimizer, client_batch_size=config.batch_size,
                  num_clients=i.num_clients, clients_per_round=config.clients_per_round,
                  seed=config.seed)
    kwargs = {k: values[k] for k in _keywords(config, builder)
              if not (k == 'server_optimizer_fn' and i.server_optimizer is None)}
    kwargs.update(method_kwargs(config))
    return (), kwargs

  return registry.Method(name, builder, arguments,
                         reads=registry.OPTIMIZER_FLAGS if takes_server else (),
                         check=_check_user_method, errors=(ValueError, TypeError),
                         error_prefix=f'--algorithm={name}: ')


def check_process(config, process) -> None:
  """A method of the user's built a LearningProcess whose clients take the program's input
  (`data.round_sampling.client_input`); fault flags need it to read `work`."""
  if not is_path(config.algorithm):
    return
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if not isinstance(process, tff.learning.templates.LearningProcess):
    raise _error(f'--algorithm={config.algorithm} returned {type(process).__name__}; expected a '
                 'tff.learning.templates.LearningProcess')
  element = process.next.type_signature.parameter[1].member.element
  names = {name for name, _ in tff.structure.iter_elements(element)} if isinstance(
      element, tff.StructType) else set()
  wanted = {'x', 'y', 'order', 'index', 'slot', 'work'}
  if 'work' not in names and (config.client_dropout or config.straggler_fraction):
    raise _error(f'--client_dropout/--straggler_fraction: the clients of --algorithm='
                 f'{config.algorithm} do not read `work` (the share of its local steps a client '
                 'runs; 0 = it does not report), so faults would be ignored; build its client '
                 'work on tff_algos.client_work (docs/your_own.md) or drop the fault flags')
  if names != wanted:
    raise _error(f'--algorithm={config.algorithm}: its clients take {element}, but the program '
                 f'hands each client one element with fields {", ".join(sorted(wanted))} '
                 '(data.round_sampling.client_input); build its client work on '
                 'tff_algos.client_work (docs/your_own.md)')


def model_fn(path: str, x_spec, num_classes: int, seed: int):
  """The no-arg model_fn of a model of the user's: `fn(input_shape, num_classes)` returns a
  Keras model giving `num_classes` logits (trained with sparse categorical cross-entropy) or
  a FunctionalModel; `tf.keras.utils.set_random_seed(seed)` before each call. Checked once
  now in a throwaway graph (type and output size)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  fn = resolve('model', path)
  input_shape = tuple(int(d) for d in x_spec.shape)
  call = f'--model={path}: {path.split(":")[1]}({input_shape}, {num_classes})'
  with tf.Graph().as_default():
    try:
      model = fn(input_shape, num_classes)
    except Exception as e:  # pylint: disable=broad-except  (the user's code)
      raise _error(f'{call} raised {_raised(e)}') from None
    functional = isinstance(model, tff.learning.models.FunctionalModel)
    if not (functional or isinstance(model, tf.keras.Model)):
      raise _error(f'{call} returned {type(model).__name__}; expected a tf.keras.Model (or a '
                   'tff.learning.models.FunctionalModel)')
    x = tf.zeros([1, *input_shape], x_spec.dtype)
    try:
      out = (model.predict_on_batch(model.initial_weights, x, training=False) if functional
             else model(x))
    except Exception as e:  # pylint: disable=broad-except
      raise _error(f'{call}: the model cannot take the data\'s inputs {x_spec.dtype.name}'
                   f'{list(input_shape)}: {_raised(e)}') from None
    if out.shape[-1] != num_classes:
      raise _error(f'{call} gives {out.shape[-1]} outputs per example; expected one logit '
                   f'per class ({num_classes})')
  if functional:
    return lambda: tff.learning.models.model_from_functional(model)
  spec = (tf.TensorSpec([None, *input_shape], x_spec.dtype), tf.TensorSpec([None], tf.int32))

  def user_model_fn():
    tf.keras.utils.set_random_seed(seed)   # Python's, NumPy's and TF's: Keras's unseeded
                                           # initialisers draw their seeds from Python's
    return tff.learning.models.from_keras_model(
        fn(input_shape, num_classes),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=dict(x=spec[0], y=spec[1]),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy])
  return user_model_fn


def load_dataset(config):
  """A data set of the user's as `data.load_dataset` gives the built-in ones: a
  FederatedDataset (used as it is), or an ArrayDataset (partitioned by --partition)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  fn = resolve('dataset', config.dataset)
  names, any_keyword = _parameters(fn)
  given = dict(seed=config.seed, data_dir=config.data_dir)
  try:
    loaded = fn(**{k: v for k, v in given.items() if k in names or any_keyword})
  except Exception as e:  # pylint: disable=broad-except
    raise _error(f'--dataset={config.dataset} raised {_raised(e)}') from None
  expected = ('expected a tff_algos.data.FederatedDataset, a tff_algos.data.ArrayDataset, '
              '(x_train, y_train, x_test, y_test) arrays or (ClientData, (x_test, y_test))')
  if isinstance(loaded, (data.FederatedDataset, data.ArrayDataset)):
    return loaded
  if type(loaded).__name__ in ('FederatedDataset', 'ArrayDataset'):
    raise _error(f'--dataset={config.dataset} returned {type(loaded).__module__}.'
                 f'{type(loaded).__name__}, another copy of the class; import it as '
                 '`from tff_algos import data` (not `import data`)')
  if isinstance(loaded, tuple) and len(loaded) == 4:
    try:
      x_train, y_train, x_test, y_test = (np.asarray(a) for a in loaded)
      return data.ArrayDataset(config.dataset, x_train, y_train.astype(np.int32), x_test,
                               y_test.astype(np.int32),
                               int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1)
    except ValueError as e:
      raise _error(f'--dataset={config.dataset}: {e}') from None
  if (isinstance(loaded, tuple) and len(loaded) == 2
      and isinstance(loaded[0], tff.simulation.datasets.ClientData)
      and isinstance(loaded[1], tuple) and len(loaded[1]) == 2):
    return _federated(config.dataset, loaded[0], *loaded[1])
  raise _error(f'--dataset={config.dataset} returned {type(loaded).__name__}; {expected}')


def _federated(name: str, client_data, x_test, y_test):
  """A FederatedDataset of a TFF ClientData (each client read once into arrays by
  `data.ClientDataInputs`, in its client_ids order) and a central test set."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  try:
    inputs = data.ClientDataInputs(client_data)
    clients = {str(n): inputs.client_arrays(n) for n in range(inputs.num_clients)}
    y_test = np.asarray(y_test).astype(np.int32)
    labels = [y for _, y in clients.values()] + [y_test]
    num_classes = int(max(y.max(initial=0) for y in labels)) + 1
    return data.FederatedDataset(name, data.ArrayClientData(clients), np.asarray(x_test),
                                 y_test, num_classes,
                                 info=dict(client_names=list(inputs.client_ids)))
  except (TypeError, ValueError) as e:
    raise _error(f'--dataset={name}: its ClientData: {e}') from None


def fingerprint(path: str) -> dict:
  """{path, file, sha256} of an import path (file: its module's, relative to nothing: the
  file as imported), for config.json and summary.json."""
  module = sys.modules.get(path.split(':')[0])
  file = getattr(module, '__file__', None)
  if not file:
    return dict(path=path, file=None, sha256=None)
  with open(file, 'rb') as f:
    return dict(path=path, file=file, sha256=hashlib.sha256(f.read()).hexdigest())


def fingerprints(c) -> dict:
  """{flag: fingerprint} of the config's import paths (resolved first)."""
  out = {}
  for flag in PATH_FLAGS:
    if is_path(getattr(c, flag)):
      resolve(flag, getattr(c, flag))
      out[flag] = fingerprint(getattr(c, flag))
  return out


def changed(saved: dict, c) -> str:
  """'' when the import paths' files are those a run recorded (config.json's `user_code`),
  else what changed, for `--resume`'s refusal."""
  now = fingerprints(c)
  for flag, mine in now.items():
    before = saved.get(flag) or {}
    if before.get('path') == mine['path'] and before.get('sha256') != mine['sha256']:
      return (f'--{flag}={mine["path"]}\'s file {mine["file"]} changed since the run started '
              f'(sha256 {str(before.get("sha256"))[:12]}, now {str(mine["sha256"])[:12]})')
  return ''
