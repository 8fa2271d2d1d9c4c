"""FedLEx (tff_algos.fedlex): guidance maths vs numpy, exploration, guided bases, checkpoints."""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_algos
from tff_algos import constants
from tff_algos import data
from tests import helpers
from tff_algos import fedlex

BATCH = 16
EXPLORATION_EPOCHS = 3
EXPLORERS = (0, 3, 7)
EXPLORATION_ROUND = 10**6  # seeds the explorers' orders apart from training rounds


# ------------------------------------------------------------------------------------------
# numpy references
# ------------------------------------------------------------------------------------------


def np_normalize(t):
  t = np.asarray(t, np.float64)
  lo, hi = t.min(), t.max()
  if hi == lo:
    return np.ones_like(t)
  return (t - lo) / (hi - lo)


def np_guidance(client_devs, normalize, floor):
  if normalize == 'per_client':
    client_devs = [[np_normalize(d) for d in devs] for devs in client_devs]
  mean = [np.mean(np.stack(ts), axis=0) for ts in zip(*client_devs)]
  if normalize == 'after_mean':
    mean = [np_normalize(m) for m in mean]
  return [np.maximum(m, floor) for m in mean]


def random_devs(rng, num_clients=3):
  shapes = [(3, 3, 1, 4), (4,), (5, 2), (1,)]
  return [[rng.uniform(0, 2, s).astype(np.float32) ** 2 for s in shapes]
          for _ in range(num_clients)]


# ------------------------------------------------------------------------------------------
# Pure TF functions
# ------------------------------------------------------------------------------------------


def test_deviation_is_squared_difference():
  rng = np.random.default_rng(0)
  a = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(4,)).astype(np.float32)]
  b = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(4,)).astype(np.float32)]
  got = fedlex.deviations(a, b)
  for g, x, y in zip(got, a, b):
    np.testing.assert_allclose(g.numpy(), (x - y) ** 2, rtol=1e-6)


def test_normalize_matches_numpy_per_tensor():
  rng = np.random.default_rng(1)
  devs = random_devs(rng, 1)[0]
  got = fedlex.normalize_deviations(devs)
  for g, d in zip(got, devs):
    np.testing.assert_allclose(g.numpy(), np_normalize(d), rtol=1e-5, atol=1e-6)
    assert g.numpy().min() >= 0.0 and g.numpy().max() <= 1.0


def test_constant_tensor_normalizes_to_ones_without_nan():
  for t in (np.zeros((3, 4), np.float32), np.full((5,), 2.5, np.float32),
            np.array([7.0], np.float32)):
    got = fedlex.normalize_tensor(t).numpy()
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, np.ones_like(t))


@pytest.mark.parametrize('normalize', constants.FEDLEX_NORMALIZATIONS)
@pytest.mark.parametrize('floor', [0.0, 0.25])
def test_global_guidance_matrix_matches_numpy(normalize, floor):
  rng = np.random.default_rng(2)
  devs = random_devs(rng)
  devs[1][3] = devs[0][3]  # single-entry tensors are constant per client
  got = fedlex.global_guidance_matrix(devs, normalize, floor)
  want = np_guidance(devs, normalize, floor)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)
    assert g.numpy().min() >= floor and g.numpy().max() <= 1.0


def test_orders_differ():
  rng = np.random.default_rng(3)
  devs = random_devs(rng)
  devs[1] = [10.0 * d for d in devs[1]]  # one explorer moves much more
  a = fedlex.global_guidance_matrix(devs, 'per_client')
  b = fedlex.global_guidance_matrix(devs, 'after_mean')
  assert not np.allclose(a[0].numpy(), b[0].numpy())


def test_bad_options_refused():
  with pytest.raises(ValueError, match='normalize'):
    fedlex.global_guidance_matrix([[np.ones(2)]], 'nope')
  with pytest.raises(ValueError, match='guidance_floor'):
    fedlex.global_guidance_matrix([[np.ones(2)]], 'per_client', 1.5)
  with pytest.raises(ValueError, match='base'):
    fedlex.build_fedlex(None, None, 8, base='adagrad')


# ------------------------------------------------------------------------------------------
# TFF: shared setup (the expensive part: processes are built once per module)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def env(runtime, digits, tiny_model_fn, sgd):
  del runtime
  fed = data.federate(digits, data.ClassesPerClientPartitioner(10, 2, seed=0))
  model_fn = tiny_model_fn
  opt = sgd()
  _, explorer_inputs = data.round_inputs(fed, EXPLORATION_ROUND, len(EXPLORERS),
                                         EXPLORATION_EPOCHS, 0, client_ids=EXPLORERS)
  return collections.OrderedDict(fed=fed, model_fn=model_fn, opt=opt,
                                 explorer_inputs=[[x] for x in explorer_inputs])


_BASE_KWARGS = dict(avgm={}, sgd={}, opt={}, prox=dict(proximal_strength=0.1))
_processes = {}
_explorations = {}


def exploration(env, normalize='per_client', floor=0.0, patience=None):
  key = (normalize, floor, patience)
  if key not in _explorations:
    _explorations[key] = fedlex.build_fedlex_exploration(
        env['model_fn'], env['opt'], BATCH, normalize=normalize, guidance_floor=floor,
        exploration_patience=patience)
  return _explorations[key]


def process(env, base, guided):
  key = (base, guided)
  if key not in _processes:
    _processes[key] = fedlex.build_fedlex(
        env['model_fn'], env['opt'], BATCH, base,
        client_stages=tff_algos.ClientStages(guided=guided), **_BASE_KWARGS[base])
  return _processes[key]


def run_rounds(proc, state, fed, rounds, start=0):
  metrics = []
  for r in range(start, start + rounds):
    _, inputs = data.round_inputs(fed, r, 2, 1, 0)
    out = proc.next(state, [[x] for x in inputs])
    state = out.state
    metrics.append(out.metrics)
  return state, metrics


def trainable(proc, state):
  return [np.asarray(t) for t in proc.get_model_weights(state).trainable]


# ------------------------------------------------------------------------------------------
# Exploration
# ------------------------------------------------------------------------------------------


def explorer_final_weights(env):
  """Each explorer's weights after its exploration, through the unguided FedAvgM process:
  one round with that client alone from the initial model moves the global model exactly
  to the client's model (first server-momentum step = the update), up to rounding."""
  proc = process(env, 'avgm', False)
  state0 = proc.initialize()
  w0 = trainable(proc, state0)
  finals = []
  for inp in env['explorer_inputs']:
    finals.append(trainable(proc, proc.next(state0, [inp]).state))
  return w0, finals


@pytest.mark.parametrize('normalize,floor', [('per_client', 0.0), ('after_mean', 0.1)])
def test_exploration_matches_numpy(env, normalize, floor):
  w0, finals = explorer_final_weights(env)
  devs = [[(a - b) ** 2 for a, b in zip(w0, wf)] for wf in finals]
  want = np_guidance(devs, normalize, floor)
  explore = exploration(env, normalize, floor)
  proc = process(env, 'avgm', True)
  result = explore(proc.get_model_weights(proc.initialize()), env['explorer_inputs'])
  assert float(result['client_epochs']) == len(EXPLORERS) * EXPLORATION_EPOCHS
  got = result['guidance']
  assert [np.shape(g) for g in got] == [w.shape for w in w0]
  for g, w in zip(got, want):
    # w0 - (w0 - w_final) only approximates w_final in float32, hence the tolerance.
    np.testing.assert_allclose(g, w, atol=2e-3)
    assert np.min(g) >= floor and np.max(g) <= 1.0


def empty_client(epochs):
  """A client without examples: its epoch loss is 0 every epoch, so it never improves."""
  return [collections.OrderedDict(
      x=np.zeros([0, 8, 8, 1], np.float32), y=np.zeros([0], np.int32),
      order=np.zeros([epochs, 0], np.int32), index=np.int32(0), slot=np.int32(0),
      work=np.float32(1.0))]


def test_empty_explorers_cost_nothing_and_leave_g_at_ones(env):
  # Epochs are counted from the steps run (as the training's client_epochs): an explorer
  # without examples runs none; nothing moves, every tensor is constant (zero deviation) and
  # G is all ones, not NaN.
  explore = exploration(env, patience=2)
  proc = process(env, 'avgm', True)
  result = explore(proc.get_model_weights(proc.initialize()),
                   [empty_client(10), empty_client(10)])
  assert float(result['client_epochs']) == 0
  for g in result['guidance']:
    assert not np.isnan(g).any()
    np.testing.assert_array_equal(g, np.ones_like(g))


def test_diverged_explorer_is_left_out(env):
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  explore = exploration(env)
  plain = explore(w, env['explorer_inputs'])
  bad = collections.OrderedDict(env['explorer_inputs'][0][0])
  bad['x'] = np.full_like(bad['x'], np.nan)
  with_bad = explore(w, env['explorer_inputs'] + [[bad]])
  assert float(with_bad['finite_explorers']) == len(EXPLORERS)
  assert float(with_bad['client_epochs']) == (len(EXPLORERS) + 1) * EXPLORATION_EPOCHS
  for a, b in zip(plain['guidance'], with_bad['guidance']):
    np.testing.assert_allclose(a, b, atol=1e-6)
  only_bad = explore(w, [[bad]])
  assert float(only_bad['finite_explorers']) == 0
  for g in only_bad['guidance']:
    np.testing.assert_array_equal(g, np.ones_like(g))


def test_patience_not_reached_equals_no_patience(env):
  # patience 2 with 3 epochs can never stop early: epoch by epoch == one pass.
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  plain = exploration(env)(w, env['explorer_inputs'])
  patient = exploration(env, patience=2)(w, env['explorer_inputs'])
  assert float(patient['client_epochs']) == float(plain['client_epochs'])
  for a, b in zip(plain['guidance'], patient['guidance']):
    np.testing.assert_allclose(a, b, atol=1e-6)


def np_patience_epochs(losses, patience):
  """Epochs an explorer runs under early stopping: it stops once `patience` epochs in a row
  have not lowered the best last-epoch loss so far."""
  best, since, run = np.inf, 0, 0
  for loss in losses:
    if since >= patience:
      break
    run += 1
    since = 0 if loss < best else since + 1
    best = min(best, loss)
  return run


@pytest.mark.parametrize('patience', [1, 2, 3])
def test_patience_stops_an_explorer_whose_loss_stalls(patience):
  """The early-stopping rule against a numpy count, on scripted epoch losses: a training
  function that reports the loss of the epoch it is handed (each row of `order` holds its
  epoch's index) and moves the weights by one per epoch."""
  losses = np.array([1.0, 0.5, 0.7, 0.6, 0.4, 0.45, 0.5, 0.42, 0.3], np.float32)
  out_type = collections.namedtuple(
      'Out', 'model_weights epochs_trained optimizer_state last_epoch_loss')

  def train(weights, element, optimizer_state, max_steps):
    del max_steps
    epoch = element['order'][0, 0]
    moved = tff.learning.models.ModelWeights(
        trainable=[t + 1.0 for t in weights.trainable], non_trainable=weights.non_trainable)
    return out_type(moved, tf.constant(1.0), optimizer_state, tf.gather(losses, epoch))

  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  explore = fedlex._explore_fn(train, optimizer, batch_size=4, patience=patience)  # pylint: disable=protected-access
  order = np.repeat(np.arange(len(losses), dtype=np.int32)[:, None], 4, axis=1)
  weights = tff.learning.models.ModelWeights(trainable=[tf.zeros([2])], non_trainable=[])
  final, epochs, reported = explore(
      weights, collections.OrderedDict(order=order, work=np.float32(1.0)))
  want = np_patience_epochs(losses, patience)
  assert want < len(losses)   # the script stops every patience tried here early
  assert float(epochs) == want and float(reported) == 1.0
  np.testing.assert_array_equal(final.trainable[0].numpy(), np.full([2], want, np.float32))


def with_work(inputs, work):
  """The explorer inputs with every explorer's `work` set to `work`."""
  return [[collections.OrderedDict(inp, work=np.float32(work))] for [inp] in inputs]


def test_an_explorer_that_drops_adds_nothing_to_g(env):
  """An explorer with work 0 trains nothing and is left out of G's mean (as a non-finite
  one, but counted apart); with every explorer gone G is all ones, i.e. no guidance."""
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  explore = exploration(env)
  plain = explore(w, env['explorer_inputs'])
  gone = with_work(env['explorer_inputs'][:1], 0.0)
  with_gone = explore(w, env['explorer_inputs'] + gone)
  assert float(with_gone['reported_explorers']) == len(EXPLORERS)
  assert float(with_gone['finite_explorers']) == len(EXPLORERS) + 1
  assert float(with_gone['client_epochs']) == float(plain['client_epochs'])
  for a, b in zip(plain['guidance'], with_gone['guidance']):
    np.testing.assert_allclose(a, b, atol=1e-6)
  nobody = explore(w, gone)
  assert float(nobody['reported_explorers']) == 0 and float(nobody['client_epochs']) == 0
  for g in nobody['guidance']:
    np.testing.assert_array_equal(g, np.ones_like(g))


def test_explorers_in_place_that_drop_leave_the_model_and_g_alone(env):
  proc = process(env, 'avgm', False)
  w0 = proc.get_model_weights(proc.initialize())
  gone = with_work(env['explorer_inputs'][:1], 0.0)
  weights, guidance, metrics = fedlex.explore_in_place(exploration(env), w0, gone)
  for a, b in zip(weights.trainable, w0.trainable):
    np.testing.assert_array_equal(a, b)
  for g in guidance:
    np.testing.assert_array_equal(g, np.ones_like(g))
  assert (metrics['num_explorers'], metrics['reported_explorers']) == (1, 0)
  plain = fedlex.explore_in_place(exploration(env), w0, env['explorer_inputs'])
  mixed = fedlex.explore_in_place(exploration(env), w0, gone + env['explorer_inputs'])
  for a, b in zip(plain[1] + plain[0].trainable, mixed[1] + mixed[0].trainable):
    np.testing.assert_array_equal(a, b)
  assert mixed[2]['exploration_client_epochs'] == plain[2]['exploration_client_epochs']


def test_straggling_explorer_runs_the_same_steps_with_patience(env):
  """work 0.5 of 3 epochs: 1.5 epochs, its second one partial, whether it trains in one
  call or epoch by epoch under a patience it does not reach; not the full exploration."""
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  lagging = with_work(env['explorer_inputs'], 0.5)
  plain = exploration(env)(w, lagging)
  patient = exploration(env, patience=3)(w, lagging)
  full = exploration(env)(w, env['explorer_inputs'])
  steps = [math.ceil(0.5 * EXPLORATION_EPOCHS * math.ceil(len(inp['y']) / BATCH))
           for [inp] in lagging]
  expected_epochs = sum(k / math.ceil(len(inp['y']) / BATCH)
                        for k, [inp] in zip(steps, lagging))
  np.testing.assert_allclose(float(plain['client_epochs']), expected_epochs, rtol=1e-6)
  np.testing.assert_allclose(float(patient['client_epochs']), expected_epochs, rtol=1e-6)
  for a, b in zip(plain['guidance'], patient['guidance']):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert not np.allclose(plain['guidance'][0], full['guidance'][0], atol=1e-3)


def adam_explorer_plain_tf(element, epochs, lr, b1=0.9, b2=0.999, eps=1e-7):
  """One explorer's weights after `epochs` epochs of its batch order with one Adam (moments
  and step count running on across epochs), on the Keras tiny_cnn in plain TF."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  keras = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  w = keras.trainable_variables
  w0 = [v.numpy() for v in w]
  m = [np.zeros_like(a) for a in w0]
  v2 = [np.zeros_like(a) for a in w0]
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y, order = element['x'], element['y'], element['order']
  t = 0
  for e in range(epochs):
    for start in range(0, order.shape[1], BATCH):
      idx = order[e, start:start + BATCH]
      with tf.GradientTape() as tape:
        loss = loss_fn(y[idx], keras(x[idx], training=True))
      grads = [g.numpy() for g in tape.gradient(loss, w)]
      t += 1
      rate = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
      for i, (var, g) in enumerate(zip(w, grads)):
        m[i] = b1 * m[i] + (1 - b1) * g
        v2[i] = b2 * v2[i] + (1 - b2) * g * g
        var.assign(var.numpy() - rate * m[i] / (np.sqrt(v2[i]) + eps))
  return w0, [v.numpy() for v in w]


def test_patient_explorer_keeps_its_adam_moments(env):
  # Patience 5 never stops 3 epochs: epoch by epoch must be one continuous Adam run (its
  # moments and step count are not re-initialised each epoch), as computed in plain TF.
  adam = tff.learning.optimizers.build_adam(learning_rate=0.01)
  explorer = env['explorer_inputs'][:1]
  w0, wk = adam_explorer_plain_tf(explorer[0][0], EXPLORATION_EPOCHS, 0.01)
  want = [np_normalize((a - b) ** 2) for a, b in zip(w0, wk)]
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  for patience in (None, 5):
    result = fedlex.build_fedlex_exploration(env['model_fn'], adam, BATCH,
                                             exploration_patience=patience)(w, explorer)
    assert float(result['client_epochs']) == EXPLORATION_EPOCHS
    for g, target in zip(result['guidance'], want):
      np.testing.assert_allclose(g, target, atol=2e-3)


def sgd_explorer_plain_tf(element, lr):
  """One explorer under plain SGD on the Keras tiny_cnn in plain TF, epoch by epoch over its
  batch order: (initial weights, weights after each epoch, each epoch's mean batch loss
  weighted by batch size, as `last_epoch_loss` reports it)."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  keras = models.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  w = keras.trainable_variables
  w0 = [v.numpy() for v in w]
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y, order = element['x'], element['y'], element['order']
  after, losses = [], []
  for e in range(order.shape[0]):
    total = count = 0.0
    for start in range(0, order.shape[1], BATCH):
      idx = order[e, start:start + BATCH]
      with tf.GradientTape() as tape:
        loss = loss_fn(y[idx], keras(x[idx], training=True))
      total, count = total + float(loss) * len(idx), count + len(idx)
      for var, g in zip(w, tape.gradient(loss, w)):
        var.assign_sub(lr * g)
    after.append([v.numpy() for v in w])
    losses.append(total / count)
  return w0, after, np.array(losses)


def _patient_exploration(env, sgd, through, lr, patience):
  """FedLEx's exploration at SGD `lr` under `patience` (None: off), built through the
  builder's keyword or through the program's flag (--fedlex_exploration_patience, 0 = off)."""
  if through == 'keyword':
    return fedlex.build_fedlex_exploration(env['model_fn'], sgd(learning_rate=lr), BATCH,
                                           exploration_patience=patience)
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  from programs import fedlex_exploration  # pylint: disable=g-import-not-at-top
  config = experiment_config.ExperimentConfig(
      algorithm='fedlex_avgm', dataset='digits', batch_size=BATCH, client_momentum=0.0,
      fedlex_exploration_lr=lr, fedlex_exploration_patience=patience or 0)
  return fedlex_exploration.exploration_computation(config, env['model_fn'], 10)[0]


@pytest.mark.parametrize('through', ['keyword', 'flag'])
def test_exploration_patience_stops_a_real_explorer(env, sgd, through):
  """Through the builder's keyword and through --fedlex_exploration_patience: an explorer at
  SGD lr 0.5 over 6 epochs whose loss rises stops where a numpy count over plain-TF epoch
  losses says, with the guidance of the weights it stopped at; without patience it runs
  all 6."""
  epochs, lr = 6, 0.5
  _, [element] = data.round_inputs(env['fed'], EXPLORATION_ROUND, 1, epochs, 0,
                                   client_ids=EXPLORERS[:1])
  w0, after, losses = sgd_explorer_plain_tf(element, lr)
  want = np_patience_epochs(losses, 1)
  assert want < epochs   # the premise: this explorer's loss stalls
  gaps = np.abs(np.diff(losses[:want])) / losses[:want - 1]
  assert gaps.min() > 1e-3   # no comparison float32 could decide the other way
  proc = process(env, 'avgm', True)
  w = proc.get_model_weights(proc.initialize())
  for patience, runs in ((1, want), (None, epochs)):
    result = _patient_exploration(env, sgd, through, lr, patience)(w, [[element]])
    assert float(result['client_epochs']) == runs
    for g, a, b in zip(result['guidance'], w0, after[runs - 1]):
      np.testing.assert_allclose(g, np_normalize((a - b) ** 2), atol=2e-3)


# ------------------------------------------------------------------------------------------
# Guided bases
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize('base', fedlex.BASES)
def test_all_ones_guidance_is_the_base_bit_for_bit(env, base):
  guided, plain = process(env, base, True), process(env, base, False)
  gstate = guided.initialize()
  for g in fedlex.get_guidance(gstate):
    np.testing.assert_array_equal(g, np.ones_like(g))
  gstate, _ = run_rounds(guided, gstate, env['fed'], 2)
  pstate, _ = run_rounds(plain, plain.initialize(), env['fed'], 2)
  for a, b in zip(trainable(guided, gstate), trainable(plain, pstate)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('base', ['avgm', 'sgd', 'prox'])
def test_zero_entry_freezes_parameter(env, base):
  proc = process(env, base, True)
  state = proc.initialize()
  guidance = [np.ones_like(g) for g in fedlex.get_guidance(state)]
  guidance[0][0, 0, 0, 0] = 0.0
  guidance[1][:] = 0.0  # a whole tensor
  state = fedlex.set_guidance(proc, state, guidance)
  before = trainable(proc, state)
  state, _ = run_rounds(proc, state, env['fed'], 2)
  after = trainable(proc, state)
  assert after[0][0, 0, 0, 0] == before[0][0, 0, 0, 0]
  np.testing.assert_array_equal(after[1], before[1])
  assert not np.array_equal(after[0], before[0])  # the rest still trains
  assert not np.array_equal(after[2], before[2])


def test_set_guidance_checks_shapes(env):
  proc = process(env, 'avgm', True)
  state = proc.initialize()
  with pytest.raises(ValueError, match='match'):
    fedlex.set_guidance(proc, state, [np.ones(3)])


@pytest.mark.parametrize('base', fedlex.BASES)
def test_end_to_end_on_digits(env, base):
  proc = process(env, base, True)
  explore = exploration(env, 'after_mean', 0.1)
  state, metrics = fedlex.explore_and_initialize(proc, explore, env['explorer_inputs'])
  assert metrics['exploration_client_epochs'] == len(EXPLORERS) * EXPLORATION_EPOCHS
  assert metrics['num_explorers'] == metrics['finite_explorers'] == len(EXPLORERS)
  assert 0.1 <= metrics['guidance_min'] <= metrics['guidance_max'] <= 1.0
  guidance = fedlex.get_guidance(state)
  state, round_metrics = run_rounds(proc, state, env['fed'], 3)
  for m in round_metrics:
    train = m['client_work']['train']
    assert np.isfinite(train['loss']) and train['non_finite_clients'] == 0
  for a, b in zip(fedlex.get_guidance(state), guidance):  # guidance persists in the state
    np.testing.assert_array_equal(a, b)
  # refresh with this round's explorer participants (program-level, paper III-E)
  state2, refresh_metrics = fedlex.refresh_guidance(proc, explore, state,
                                                    env['explorer_inputs'][:1])
  assert refresh_metrics['exploration_client_epochs'] == EXPLORATION_EPOCHS
  assert not all(np.array_equal(a, b) for a, b in
                 zip(fedlex.get_guidance(state2), guidance))
  same, none = fedlex.refresh_guidance(proc, explore, state, [])
  assert same is state and none['exploration_client_epochs'] == 0.0



def test_checkpoint_round_trip_keeps_guidance(env, tmp_path):
  proc = process(env, 'avgm', True)
  state = proc.initialize()
  guidance = [np.random.default_rng(i).uniform(size=np.shape(g)).astype(np.float32)
              for i, g in enumerate(fedlex.get_guidance(state))]
  state = fedlex.set_guidance(proc, state, guidance)
  state, _ = run_rounds(proc, state, env['fed'], 1)
  manager = tff.program.FileProgramStateManager(str(tmp_path))
  helpers.run_async(manager.save(state, 1))
  loaded = helpers.run_async(manager.load(1, proc.initialize()))
  flat_a, flat_b = tf.nest.flatten(state), tf.nest.flatten(loaded)
  assert len(flat_a) == len(flat_b)
  for a, b in zip(flat_a, flat_b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(fedlex.get_guidance(loaded), guidance):
    np.testing.assert_array_equal(a, b)
  # the loaded state trains on exactly like the original
  a_state, _ = run_rounds(proc, state, env['fed'], 1, start=1)
  b_state, _ = run_rounds(proc, loaded, env['fed'], 1, start=1)
  for a, b in zip(trainable(proc, a_state), trainable(proc, b_state)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('base', ['sgd', 'avgm'])
def test_fractional_guidance_scales_the_update_once(env, base):
  """One round whose update is linear in each client's gradient (FedSGD's full-batch
  gradient; FedAvgM with one plain-SGD local step per client, first server step) must move
  the weights by exactly G times the unguided move, elementwise: G·g, never G²·g."""
  _, inputs = data.round_inputs(env['fed'], 0, 2, 1, 0)
  inputs = [[x] for x in inputs]
  if base == 'sgd':
    guided, plain = process(env, base, True), process(env, base, False)
  else:  # a batch as large as any client's data: one local step
    whole = max(int(np.shape(x[0]['order'])[1]) for x in inputs)
    guided, plain = (fedlex.build_fedlex(env['model_fn'], env['opt'], whole, base,
                                         client_stages=tff_algos.ClientStages(guided=g))
                     for g in (True, False))
  state = guided.initialize()
  rng = np.random.default_rng(7)
  guidance = [rng.uniform(0.2, 0.9, size=np.shape(g)).astype(np.float32)
              for g in fedlex.get_guidance(state)]
  state = fedlex.set_guidance(guided, state, guidance)
  w0 = trainable(guided, state)
  g_after = trainable(guided, guided.next(state, inputs).state)
  p_after = trainable(plain, plain.next(plain.initialize(), inputs).state)
  for g, a, b, w in zip(guidance, g_after, p_after, w0):
    plain_move = w - b
    assert np.abs(plain_move).max() > 1e-4  # not a comparison between zeros
    np.testing.assert_allclose(w - a, g * plain_move, rtol=1e-3, atol=1e-7)


def test_fedlex_prox_guides_the_proximal_gradient_too(env):
  """docs/algorithms.md#fedlex: G multiplies every gradient of the client's local objective, and
  FedProx's objective includes (mu/2)||w - w_t||^2, so the step is w -= lr G (g + mu d).
  One client, two plain-SGD steps: the first has d = 0 (both mu give the same w1); the
  second then differs between mu = 1 and mu = 0 by lr * mu * G * (w1 - w0) exactly, where
  G (g + mu d) is the rule and lr * mu * (w1 - w0) would be G g + mu d."""
  _, inputs = data.round_inputs(env['fed'], 0, 1, 1, 0)
  client = inputs[0]
  n = int(np.shape(client['order'])[1])
  half = (n + 1) // 2
  assert n - half > 0  # two steps
  mu, lr = 1.0, 0.1
  opt = tff.learning.optimizers.build_sgdm(learning_rate=lr)
  prox, plain = (fedlex.build_fedlex(env['model_fn'], opt, half, 'prox', proximal_strength=m)
                 for m in (mu, 0.0))
  state = prox.initialize()
  rng = np.random.default_rng(11)
  guidance = [rng.uniform(0.2, 0.9, size=np.shape(g)).astype(np.float32)
              for g in fedlex.get_guidance(state)]
  state = fedlex.set_guidance(prox, state, guidance)
  first = collections.OrderedDict(client)  # the first step's batch alone: w1
  idx = np.asarray(client['order'])[0, :half]
  first.update(x=np.asarray(client['x'])[idx], y=np.asarray(client['y'])[idx],
               order=np.arange(half, dtype=np.int32)[None])
  w0 = trainable(prox, state)
  w1 = trainable(prox, prox.next(state, [[first]]).state)
  w2_mu = trainable(prox, prox.next(state, [[client]]).state)
  w2_0 = trainable(plain, plain.next(fedlex.set_guidance(plain, plain.initialize(), guidance),
                                     [[client]]).state)
  for g, a, b, c, d in zip(guidance, w0, w1, w2_mu, w2_0):
    drift = b - a
    assert np.abs(drift).max() > 1e-4
    np.testing.assert_allclose(d - c, lr * mu * g * drift, rtol=2e-2, atol=2e-7)


def test_guidance_statistics_match_numpy():
  rng = np.random.default_rng(3)
  guidance = [rng.uniform(0, 0.05, size=(3, 4)), np.zeros(5), rng.uniform(0, 1, size=7)]
  flat = np.concatenate([g.ravel() for g in guidance])
  stats = fedlex.guidance_statistics(guidance)
  assert stats['guidance_mean'] == pytest.approx(flat.mean())
  assert stats['guidance_median'] == pytest.approx(np.median(flat))
  assert stats['guidance_below_0_01'] == pytest.approx(np.mean(flat < 0.01))
  assert stats['guidance_zero_fraction'] == pytest.approx(5 / 24)
  assert (stats['guidance_min'], stats['guidance_max']) == (flat.min(), flat.max())
  # A float32 G floored at 0.01 holds float32(0.01) (below the float64 0.01): none is below.
  floored = [np.maximum(np.float32(rng.uniform(0, 0.05, size=20)), np.float32(0.01))]
  assert (floored[0] == np.float32(0.01)).any()
  assert fedlex.guidance_statistics(floored)['guidance_below_0_01'] == 0.0


# ------------------------------------------------------------------------------------------
# Diagnosis options: the reference code's behaviour
# ------------------------------------------------------------------------------------------


def test_placeholder_guidance_matches_numpy_and_stays_in_the_state(env):
  """--fedlex_guidance=placeholder: G = minmax((1 - w)^2) per tensor of the model round 1
  starts from, put in the state after round 1 and carried (and checkpointed) from there."""
  proc = process(env, 'avgm', True)
  state = proc.initialize()
  w0 = trainable(proc, state)
  got = fedlex.placeholder_guidance(w0, floor=0.05)
  want = [np.maximum(np_normalize((1.0 - w) ** 2), 0.05) for w in w0]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  state, _ = run_rounds(proc, state, env['fed'], 1)   # round 1: unguided (G ones)
  state = fedlex.set_guidance(proc, state, got)
  state, _ = run_rounds(proc, state, env['fed'], 2, start=1)
  for g, w in zip(fedlex.get_guidance(state), want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# --fedlex_explore_in_place against a NumPy transcription of the reference code's order
# (ChristianInterno/FedLEx: the server's `_create_clients` runs `create_scout` on its own
# model for each explorer in client order), on softmax regression under PyTorch's Adam.
LIN_FEATURES, LIN_CLASSES, LIN_BATCH, LIN_LR = 6, 3, 4, 0.05
LIN_SIZES = (11, 7, 9)        # partial last batches
LIN_EPOCHS = 2                # exploration epochs; the order holds one more (tl_base)


def linear_model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(LIN_FEATURES,)),
      tf.keras.layers.Dense(LIN_CLASSES)])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(x=tf.TensorSpec([None, LIN_FEATURES], tf.float32),
                                         y=tf.TensorSpec([None], tf.int32)))


def np_adam_epochs(w, x, y, orders, b1=0.9, b2=0.999, eps=1e-8):
  """A fresh torch.optim.Adam(lr=LIN_LR) over the epochs `orders` (one row each, batches of
  LIN_BATCH, the last partial) of mean softmax cross-entropy, w = [kernel, bias], float64."""
  w = [np.array(t, np.float64) for t in w]
  m, v = [np.zeros_like(t) for t in w], [np.zeros_like(t) for t in w]
  t = 0
  for row in orders:
    for start in range(0, len(row), LIN_BATCH):
      idx = row[start:start + LIN_BATCH]
      logits = x[idx] @ w[0] + w[1]
      p = np.exp(logits - logits.max(axis=1, keepdims=True))
      p /= p.sum(axis=1, keepdims=True)
      p[np.arange(len(idx)), y[idx]] -= 1.0
      p /= len(idx)
      t += 1
      for i, g in enumerate((x[idx].T @ p, p.sum(axis=0))):
        m[i] = b1 * m[i] + (1 - b1) * g
        v[i] = b2 * v[i] + (1 - b2) * g * g
        w[i] = w[i] - LIN_LR * (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps)
  return w


def np_reference_in_place(w0, elements, tl_base_epoch=True):
  """The reference's exploration, in its order: for each explorer, `create_scout` on the one
  global model: a fresh Adam trains one epoch (its `tl_base`, saved over the previous
  explorer's), then another fresh Adam the exploration epochs. Returns (final weights, last
  tl_base, each explorer's (tl_base - final)^2). Without `tl_base_epoch`: the exploration
  epochs alone, from the previous explorer's model."""
  w, devs = list(w0), []
  for el in elements:
    x, y, order = el['x'].astype(np.float64), el['y'], el['order']
    if tl_base_epoch:
      w = np_adam_epochs(w, x, y, order[:1])
    tl_base = w
    w = np_adam_epochs(w, x, y, order[1:])
    devs.append([(a - b) ** 2 for a, b in zip(tl_base, w)])
  return w, tl_base, devs


@pytest.fixture(scope='module')
def in_place(runtime):
  """Random data and weights, the explorers' inputs and the in-place exploration's result
  for each `guidance` and normalisation: (w0, elements, exploration result by key)."""
  del runtime
  from tff_algos import optimizers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  elements = [data.client_input(
      rng.normal(size=(n, LIN_FEATURES)).astype(np.float32),
      rng.integers(0, LIN_CLASSES, n), 1 + LIN_EPOCHS, rng, index, index)
      for index, n in enumerate(LIN_SIZES)]
  w0 = [rng.normal(0, 0.5, (LIN_FEATURES, LIN_CLASSES)).astype(np.float32),
        rng.normal(0, 0.1, LIN_CLASSES).astype(np.float32)]
  weights = tff.learning.models.ModelWeights(trainable=w0, non_trainable=[])
  results = {}
  for normalize in constants.FEDLEX_NORMALIZATIONS:
    explore = fedlex.build_fedlex_exploration(
        linear_model_fn, optimizers.build_torch_adam(LIN_LR), LIN_BATCH, normalize=normalize,
        guidance_floor=0.05)
    for guidance in ('exploration', 'placeholder'):
      results[normalize, guidance] = fedlex.explore_in_place(
          explore, weights, [[el] for el in elements], normalize, 0.05, guidance)
  return w0, elements, results


def test_explore_in_place_trains_the_explorers_in_sequence(in_place):
  """--fedlex_explore_in_place equals the NumPy transcription of the reference's order to
  float32 rounding: the model round 1 starts from, G = guidance of each explorer's
  deviation from its own tl_base (exploration) or minmax((1 - tl_base)^2) of the last
  explorer's tl_base (placeholder), both floored at 0.05; every epoch is counted."""
  w0, elements, results = in_place
  final, tl_base, devs = np_reference_in_place(w0, elements)
  for (normalize, guidance), (weights, got, metrics) in results.items():
    assert metrics['exploration_client_epochs'] == len(LIN_SIZES) * (1 + LIN_EPOCHS)
    assert metrics['reported_explorers'] == len(LIN_SIZES)
    for a, b in zip(weights.trainable, final):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    want = np_guidance(devs, normalize, 0.05) if guidance == 'exploration' else \
        [np.maximum(np_normalize((1.0 - t) ** 2), 0.05) for t in tl_base]
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, atol=1e-4)


def test_explore_in_place_without_its_tl_base_epoch_is_another_model(in_place):
  """The tl_base epoch matters: the reference's order without it ends far from what
  explore_in_place gives (far beyond the tolerance above), and so does its G."""
  w0, elements, results = in_place
  final, tl_base, devs = np_reference_in_place(w0, elements, tl_base_epoch=False)
  weights, got, _ = results['per_client', 'exploration']
  assert max(np.abs(a - b).max() for a, b in zip(weights.trainable, final)) > 1e-2
  want = np_guidance(devs, 'per_client', 0.05)
  assert max(np.abs(g - w).max() for g, w in zip(got, want)) > 1e-2
  _, placeholder, _ = results['per_client', 'placeholder']
  want = [np.maximum(np_normalize((1.0 - t) ** 2), 0.05) for t in tl_base]
  assert max(np.abs(g - w).max() for g, w in zip(placeholder, want)) > 1e-2


def test_explore_in_place_needs_its_tl_base_epoch(env):
  proc = process(env, 'avgm', False)
  one_epoch = [[collections.OrderedDict(inp, order=inp['order'][:1])]
               for [inp] in env['explorer_inputs']]
  with pytest.raises(ValueError, match='tl_base epoch'):
    fedlex.explore_in_place(exploration(env), proc.get_model_weights(proc.initialize()),
                            one_epoch)
