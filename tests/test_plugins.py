"""The plug-in client stages (tff_algos/client_work/plugins.py) on every method.

FedLEx's guidance (`guided`) and CADIS's KD term (`kd_weight`) are options of the client works
every builder uses (model delta: the FedAvg family, FedSGD, CADIS; model upload: FedCross,
FedCDA; corrected training: SCAFFOLD), passed as one `ClientStages` value. Here: each option
changes every client work's upload (so it cannot be silently ignored), every builder takes
both through its one `client_stages` parameter, SCAFFOLD composes guidance
with its correction as documented (against NumPy), `fedlex_avgm` is `fedavgm --guided`, and
FedCross, FedCDA and SCAFFOLD still learn digits with each option.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top
import dataclasses
import functools
import inspect

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
import tff_algos
from programs import experiment
from programs import experiment_config
from programs import methods
from programs import run_results
from programs import run_directory
from tff_algos import fedlex
from tff_algos.client_work import corrected_training, model_delta, model_upload, plugins

FEATURES, HIDDEN, CLASSES = 5, 4, 3
SIZES = (8, 11)
BATCH, EPOCHS, LR = 4, 2, 0.2


pytestmark = pytest.mark.usefixtures('runtime')


def _as_tff_model(keras_model):
  """A TFF model of `keras_model` on [None, FEATURES] float features and int labels."""
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(x=tf.TensorSpec([None, FEATURES], tf.float32),
                                         y=tf.TensorSpec([None], tf.int32)))


def hidden_model_fn():
  """A hidden layer before the classifier: KD's representation is that layer's output, which
  the student's training moves (a classifier on the raw input would give KD no gradient)."""
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
      tf.keras.layers.Dense(HIDDEN, activation='tanh', kernel_initializer=
                            tf.keras.initializers.RandomNormal(stddev=0.7, seed=1)),
      tf.keras.layers.Dense(CLASSES, name='classifier', kernel_initializer=
                            tf.keras.initializers.RandomNormal(stddev=0.5, seed=2))])
  return _as_tff_model(keras_model)


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=LR)


def _inputs():
  rng = np.random.default_rng(0)
  return [data.client_input(rng.normal(size=(n, FEATURES)).astype(np.float32),
                            rng.integers(0, CLASSES, size=n).astype(np.int32), EPOCHS,
                            np.random.default_rng([1, i]), i, i)
          for i, n in enumerate(SIZES)]


# --------------------------------------------------------------------------- #
# Each option changes the upload of each client work
# --------------------------------------------------------------------------- #

OPTIONS = {'guided': plugins.ClientStages(guided=True), 'kd': plugins.ClientStages(kd_weight=1.0)}
KINDS = ('model_delta', 'model_upload', 'corrected_training')


@functools.lru_cache(maxsize=None)
def _work(kind, option=None):
  kwargs = dict(client_stages=OPTIONS[option]) if option else {}
  if kind == 'model_delta':
    return model_delta.build_model_delta_client_work(hidden_model_fn, sgd(), BATCH, **kwargs)
  if kind == 'model_upload':
    return model_upload.build_model_upload_client_work(hidden_model_fn, sgd(), BATCH, **kwargs)
  return corrected_training.build_corrected_client_work(hidden_model_fn, sgd(), BATCH,
                                                        **kwargs)


def _received(kind):
  weights = model_delta.initial_model_weights_fn(hidden_model_fn)()
  if kind != 'corrected_training':
    return weights
  rng = np.random.default_rng(5)   # some c and c_i, so the correction is not zero
  control = lambda: [rng.normal(scale=0.1, size=np.shape(t)).astype(np.float32)  # noqa: E731
                     for t in weights.trainable]
  return collections.OrderedDict(model=weights, server_control=control(),
                                 client_control=control())


def _uploads(kind, work, state):
  """Each client's uploaded trainable weights or delta, as one flat float64 vector."""
  received = _received(kind)
  out = work.next(state, [received] * len(SIZES), [[x] for x in _inputs()])
  flat = []
  for result in out.result:
    update = result.update
    parts = {'model_delta': lambda u: u, 'model_upload': lambda u: u['model'].trainable,
             'corrected_training': lambda u: list(u['model_delta']) + list(
                 u['control_delta'])}[kind](update)
    flat.append(np.concatenate([np.ravel(p) for p in parts]).astype(np.float64))
  return flat, out.measurements['train']


def _guidance(state):
  rng = np.random.default_rng(3)
  return [rng.uniform(0.05, 1.0, size=np.shape(g)).astype(np.float32)
          for g in state['guidance']]


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('option', OPTIONS)
def test_each_option_changes_every_client_works_upload(kind, option):
  """The same clients from the same weights upload something else with the option on; an
  option a client work ignored would upload the plain one. Guidance at its initial value
  (all ones) is the plain upload bit for bit."""
  plain, _ = _uploads(kind, _work(kind), _work(kind).initialize())
  work = _work(kind, option)
  state = work.initialize()
  if option == 'guided':
    at_ones, _ = _uploads(kind, work, state)
    for a, b in zip(at_ones, plain):
      np.testing.assert_array_equal(a, b)
    state = collections.OrderedDict(state, guidance=_guidance(state))
  plugged, train = _uploads(kind, work, state)
  for a, b in zip(plugged, plain):
    assert np.max(np.abs(a - b)) > 1e-4, (kind, option)
  if option == 'kd':   # the term itself is reported beside the cross-entropy
    assert train['extra_loss'] > 0.0


BUILDERS = {
    'fedavg': lambda **kw: tff_algos.build_fedavg(hidden_model_fn, sgd(), BATCH, **kw),
    'fedavgm': lambda **kw: tff_algos.build_fedavgm(hidden_model_fn, sgd(), BATCH, **kw),
    'fedadam': lambda **kw: tff_algos.build_fedadam(hidden_model_fn, sgd(), BATCH, **kw),
    'fedprox': lambda **kw: tff_algos.build_fedprox(hidden_model_fn, sgd(), BATCH, **kw),
    'fedsgd': lambda **kw: tff_algos.build_fedsgd(hidden_model_fn, **kw),
    'fedcross': lambda **kw: tff_algos.build_fedcross(hidden_model_fn, sgd(), BATCH, 2, **kw),
    'fedcda': lambda **kw: tff_algos.build_fedcda(hidden_model_fn, sgd(), BATCH, 2, 2, **kw),
    'cadis': lambda **kw: tff_algos.build_cadis(hidden_model_fn, sgd(), BATCH, 2,
                                                clients_per_round=2, **kw),
    'scaffold': lambda **kw: tff_algos.build_scaffold(hidden_model_fn, sgd(), BATCH, 2, 2,
                                                      **kw),
    'fedlex_prox': lambda **kw: tff_algos.build_fedlex(hidden_model_fn, sgd(), BATCH, 'prox',
                                                       **kw),
}


@pytest.mark.parametrize('name', BUILDERS)
def test_every_builder_takes_both_options_into_its_client_work(name):
  """guided=True puts the guidance into the state (ones: the plain method until G is set);
  kd_weight > 0 makes the clients report the KD term, i.e. it reached their training.
  FedSGD refuses KD with the reason (no local step)."""
  if name == 'fedsgd':
    with pytest.raises(ValueError, match='^kd_weight > 0 needs local training steps, which '
                       r'full_gradient \(FedSGD\) does not take: its one gradient is at the '
                       'received model'):
      BUILDERS[name](client_stages=plugins.ClientStages(kd_weight=0.5))
    process = BUILDERS[name](client_stages=plugins.ClientStages(guided=True))
  else:
    process = BUILDERS[name](client_stages=plugins.ClientStages(guided=True, kd_weight=0.5))
  guidance = fedlex.get_guidance(process.initialize())
  assert [np.shape(g) for g in guidance] == [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES),
                                             (CLASSES,)]
  assert all(np.all(np.asarray(g) == 1.0) for g in guidance)
  train_metrics = process.next.type_signature.result.metrics.member['client_work']['train']
  assert ('extra_loss' in tff.structure.name_list(train_metrics)) == (name != 'fedsgd')


def test_bad_plugin_arguments_are_refused_in_one_line():
  for kwargs, message in ((dict(kd_weight=-1.0), 'kd_weight must be a finite number >= 0'),
                          (dict(kd_weight=float('nan')), 'kd_weight must be a finite number'),
                          (dict(kd_reduction='max'), 'kd_reduction must be one of'),
                          (dict(kd_std='bessel'), 'kd_std must be one of'),
                          (dict(guided='yes'), 'guided must be True or False')):
    with pytest.raises((ValueError, TypeError), match=message):
      plugins.ClientStages(**kwargs)
  # The stages' fields as a dict, not a ClientStages: one TypeError naming the type.
  for build in (BUILDERS['fedavg'], BUILDERS['cadis'],
                functools.partial(model_upload.build_model_upload_client_work, hidden_model_fn,
                                  sgd(), BATCH),
                functools.partial(corrected_training.build_corrected_client_work,
                                  hidden_model_fn, sgd(), BATCH)):
    with pytest.raises(TypeError, match=r'^client_stages must be a tff_algos.ClientStages, '
                       r'e.g. ClientStages\(guided=True, kd_weight=0.5\), got \{'):
      build(client_stages=dict(guided=True))


def test_every_builder_takes_the_stages_as_one_client_stages_parameter():
  """Each builder the registry names, and each client work, has one keyword-only plug-in
  parameter, `client_stages`, whose default is a ClientStages (CADIS's: KD at λ 1.0,
  FedLEx's: guided), and no stage field as a keyword of its own."""
  builders = {getattr(tff_algos, m.builder.__name__) for m in methods.METHODS.values()} | {
      model_delta.build_model_delta_client_work, model_upload.build_model_upload_client_work,
      corrected_training.build_corrected_client_work}
  fields = {f.name for f in dataclasses.fields(plugins.ClientStages)}
  presets = {'build_cadis': plugins.ClientStages(kd_weight=1.0),
             'build_fedlex': plugins.ClientStages(guided=True)}
  assert len(builders) == 13   # 10 registry builders (fedlex_* share one), 3 client works
  for builder in builders:
    parameters = inspect.signature(builder).parameters
    assert not fields & set(parameters), builder.__name__
    stages = parameters['client_stages']
    assert stages.kind == inspect.Parameter.KEYWORD_ONLY, builder.__name__
    assert stages.default == presets.get(builder.__name__, plugins.ClientStages())


# --------------------------------------------------------------------------- #
# SCAFFOLD: guidance first, then the correction (one local step against NumPy)
# --------------------------------------------------------------------------- #


def _linear_model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
      tf.keras.layers.Dense(CLASSES, name='classifier', kernel_initializer=
                            tf.keras.initializers.RandomNormal(stddev=0.5, seed=1))])
  return _as_tff_model(keras_model)


def _np_gradient(kernel, bias, x, y):
  """Mean softmax cross-entropy gradient of logits = x @ kernel + bias, float64."""
  logits = x @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.sum(axis=0) / len(y)]


def test_scaffold_guided_step_is_guidance_then_correction():
  """One local step (one epoch, one batch) of guided SCAFFOLD is
  y = x - lr * (G * g + c - c_i), and the uploaded control delta is (x - y) / lr - c, as
  corrected_training's module doc states; guiding the corrected direction instead,
  G * (g + c - c_i), is a different upload (so the test tells the orders apart)."""
  n = 6
  rng = np.random.default_rng(11)
  x = rng.normal(size=(n, FEATURES)).astype(np.float32)
  y = rng.integers(0, CLASSES, size=n).astype(np.int32)
  work = corrected_training.build_corrected_client_work(
      _linear_model_fn, sgd(), n, client_stages=plugins.ClientStages(guided=True))
  weights = model_delta.initial_model_weights_fn(_linear_model_fn)()
  shapes = [np.shape(t) for t in weights.trainable]
  c = [rng.normal(scale=0.2, size=s).astype(np.float32) for s in shapes]
  ci = [rng.normal(scale=0.2, size=s).astype(np.float32) for s in shapes]
  g_matrix = [rng.uniform(0.0, 1.0, size=s).astype(np.float32) for s in shapes]
  state = collections.OrderedDict(work.initialize(), guidance=g_matrix)
  received = collections.OrderedDict(model=weights, server_control=c, client_control=ci)
  element = data.client_input(x, y, 1, np.random.default_rng(0), 0, 0)
  (result,) = work.next(state, [received], [[element]]).result
  upload = result.update

  w0 = [np.asarray(t, np.float64) for t in weights.trainable]
  grad = _np_gradient(*w0, x.astype(np.float64), y)
  step = [gm * g + ct - cit for gm, g, ct, cit in zip(g_matrix, grad, c, ci)]
  expected_delta = [LR * s for s in step]                       # x - y
  expected_control = [d / LR - ct for d, ct in zip(expected_delta, c)]   # = G*g - c_i
  for got, want in zip(list(upload['model_delta']) + list(upload['control_delta']),
                       expected_delta + expected_control):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)
  other_order = [LR * gm * (g + ct - cit) for gm, g, ct, cit in zip(g_matrix, grad, c, ci)]
  assert max(np.max(np.abs(np.asarray(got) - want))
             for got, want in zip(upload['model_delta'], other_order)) > 1e-3


# --------------------------------------------------------------------------- #
# Through the training program
# --------------------------------------------------------------------------- #

RUN = dict(dataset='digits', num_clients=10, clients_per_round=5, local_epochs=2,
           batch_size=16, client_lr=0.1, progress=False, eval_every=100, eval_last=1)


def _run(tmp_path, name, **changes):
  config = experiment_config.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name=name,
                                       **dict(RUN, **changes))
  summary = experiment.run_experiment(config)
  weights = run_results.load_final_weights(str(tmp_path / name))
  rows = run_directory.csv_rows(str(tmp_path / name / 'metrics.csv'))
  return summary, weights, rows


def test_fedlex_avgm_is_fedavgm_guided(tmp_path):
  """The preset and the plug-in are one run: same explorers, same G, same final weights."""
  runs = [_run(tmp_path, name, rounds=2, **changes) for name, changes in (
      ('preset', dict(algorithm='fedlex_avgm')),
      ('plugin', dict(algorithm='fedavgm', guided=True)))]
  (preset, preset_weights, preset_rows), (plugin, plugin_weights, plugin_rows) = runs
  assert preset['guidance'] == plugin['guidance'] and preset['guidance']['guidance_mean'] < 1
  assert preset['exploration_client_epochs'] == plugin['exploration_client_epochs'] > 0
  for a, b in zip(preset_weights, plugin_weights):
    np.testing.assert_array_equal(a, b)
  assert [r['client_work/train/loss'] for r in preset_rows] == [
      r['client_work/train/loss'] for r in plugin_rows]


LEARNING_RUNS = {
    'fedcross': dict(algorithm='fedcross'),
    'fedcda': dict(algorithm='fedcda', fedcda_warmup_rounds=2),
    'scaffold': dict(algorithm='scaffold', client_momentum=0.0),
}
PLUGIN_RUNS = {'guided': dict(guided=True, client_lr=0.3), 'kd': dict(kd_weight=0.5)}


@pytest.mark.parametrize('option', PLUGIN_RUNS)
@pytest.mark.parametrize('method', LEARNING_RUNS)
def test_digits_run_with_the_option_learns(tmp_path, method, option):
  """A few rounds with the option on reach an accuracy far above chance (0.1), and the run
  shows the option was on: the explored guidance, or the KD term in every round."""
  summary, _, rows = _run(tmp_path, 'r', rounds=8,
                          **dict(LEARNING_RUNS[method], **PLUGIN_RUNS[option]))
  assert summary['final_accuracy'] > 0.6, summary
  if option == 'guided':
    assert summary['guidance']['guidance_mean'] < 1.0 and summary['exploration_client_epochs']
  else:
    assert all(float(r['client_work/train/extra_loss']) > 0 for r in rows)
