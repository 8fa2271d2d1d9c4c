"""Playing the TFF user: their own ClientData and model_fn into every method, unchanged.

The user has a `tff.simulation.datasets.TestClientData` with string ids whose datasets are
batched `OrderedDict(x, y)`, and a `from_keras_model` model_fn of their own (a Keras model
with seeded initialisers, so `initialize()` is reproducible). Each builder runs through
`tff.simulation.run_training_process` (with `data.client_selection_fn`, the one call we
ship) and through `tff.learning.programs.train_model` with a `FileProgramStateManager`,
killed after round 1 and resumed with a fresh data source: the resumed run must end on the
same model as the unbroken `run_training_process` run, which checks at once that both paths
hand the processes the same clients, indices, slots and batch orders, and that the id map
and round counter survive the checkpoint.

Cost: one process per builder (~15 s each on this machine) plus a few small ones for the
compositions; 2 rounds of 3 clients x 24 digits examples each.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import collections  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import data
from tff_algos.data import client_data_adapter as cdi
from tests import helpers
import tff_algos
from tff_algos import evaluation as central_evaluation
from tff_algos import execution
from tff_algos.aggregators import clustered_aggregation
from tff_algos.aggregators import factories as aggregator_factories
from tff_algos.client_work import local_training
from tff_algos.client_work import model_delta

IDS = ('alice', 'bob', 'carol', 'dave', 'erin', 'frank')
PER_CLIENT = 24
BATCH = 8
P = 3            # clients per round
ROUNDS = 2
EPOCHS = 1


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=0.1)


pytestmark = pytest.mark.usefixtures('runtime')


@pytest.fixture(scope='module')
def raw():
  """The user's per-client examples (digits), keyed by string id."""
  ds = data.load_digits()
  return collections.OrderedDict(
      (cid, collections.OrderedDict(
          x=ds.x_train[i * PER_CLIENT:(i + 1) * PER_CLIENT],
          y=ds.y_train[i * PER_CLIENT:(i + 1) * PER_CLIENT]))
      for i, cid in enumerate(IDS))


@pytest.fixture(scope='module')
def client_data(raw):
  return tff.simulation.datasets.TestClientData(raw).preprocess(lambda d: d.batch(BATCH))


def user_keras_model():
  init = tf.keras.initializers.GlorotUniform(seed=1)
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer((8, 8, 1)),
      tf.keras.layers.Conv2D(4, 3, activation='relu', kernel_initializer=init),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(10, kernel_initializer=init, name='classifier'),
  ])


def user_model_fn(input_spec):
  def model_fn():
    return tff.learning.models.from_keras_model(
        user_keras_model(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


@pytest.fixture(scope='module')
def model_fn(client_data):
  return user_model_fn(client_data.element_type_structure)


BUILDERS = collections.OrderedDict(
    fedavg=lambda m: tff_algos.build_fedavg(m, sgd(), BATCH),
    fedprox=lambda m: tff_algos.build_fedprox(m, sgd(), BATCH, 0.01),
    fedsgd=lambda m: tff_algos.build_fedsgd(m, client_batch_size=BATCH),
    fedlex_avgm=lambda m: tff_algos.build_fedlex(m, sgd(), BATCH, 'avgm'),
    fedcross=lambda m: tff_algos.build_fedcross(m, sgd(), BATCH, num_models=P),
    fedcda=lambda m: tff_algos.build_fedcda(m, sgd(), BATCH, len(IDS), P, warmup_rounds=1),
    cadis=lambda m: tff_algos.build_cadis(m, sgd(), BATCH, len(IDS), clients_per_round=P),
)


# --------------------------------------------------------------------------- #
# The adapter alone (no TFF computation)
# --------------------------------------------------------------------------- #


def test_index_map_arrays_and_slots(raw, client_data):
  inputs = data.ClientDataInputs(client_data, epochs=2, seed=3)
  assert inputs.client_ids == tuple(client_data.client_ids) and inputs.num_clients == 6
  for cid in IDS:  # batched datasets concatenate back to the user's examples
    x, y = inputs.client_arrays(inputs.index_of(cid))
    np.testing.assert_array_equal(x, raw[cid]['x'])
    np.testing.assert_array_equal(y, raw[cid]['y'])
    assert y.dtype == np.int32
  sampled = inputs.sample(round_num=5, clients_per_round=4)
  assert sampled == inputs.sample(5, 4) and len(set(sampled)) == 4
  expected = [inputs.client_ids[n] for n in data.sample_clients(6, 4, 5, 3)]
  assert sampled == expected
  clients = inputs.round_inputs(5, sampled)
  for slot, (cid, [inp]) in enumerate(zip(sampled, clients)):
    n = inputs.index_of(cid)
    assert list(inp) == ['x', 'y', 'order', 'index', 'slot', 'work']
    assert inp['slot'] == slot and inp['index'] == n   # slot = position in the sample
    rng = np.random.default_rng([3, 5, n, 1])
    np.testing.assert_array_equal(inp['order'], np.stack([rng.permutation(PER_CLIENT)
                                                          for _ in range(2)]))
  with pytest.raises(ValueError, match='distinct'):
    inputs.round_inputs(1, ['bob', 'bob'])
  with pytest.raises(ValueError, match='not in this ClientData'):
    inputs.index_of('zoe')


def test_unbatched_tuple_elements_and_saved_order(raw, tmp_path):
  tuples = tff.simulation.datasets.TestClientData(raw).preprocess(
      lambda d: d.map(lambda e: (e['x'], tf.cast(e['y'], tf.int64))))
  order = list(reversed(IDS))
  inputs = data.ClientDataInputs(tuples, client_ids=order)
  assert inputs.index_of('frank') == 0
  x, y = inputs.client_arrays(0)
  np.testing.assert_array_equal(x, raw['frank']['x'])
  assert y.dtype == np.int32 and np.array_equal(y, raw['frank']['y'])
  path = str(tmp_path / 'ids.json')
  inputs.save_client_ids(path)
  assert data.load_client_ids(path) == order
  with pytest.raises(ValueError, match='not in this ClientData'):
    data.ClientDataInputs(tuples, client_ids=['zoe'] + order)
  bad = tff.simulation.datasets.TestClientData(raw).preprocess(
      lambda d: d.map(lambda e: collections.OrderedDict(pixels=e['x'], label=e['y'])))
  with pytest.raises(TypeError, match=r'OrderedDict\(x=\.\.\., y=\.\.\.\) or \(x, y\)'):
    data.ClientDataInputs(bad)
  with pytest.raises(TypeError, match='ClientDataInputs'):
    data.round_inputs(tuples, 0, 2, 1, 0)


def test_iterator_bytes_hold_the_id_map(client_data):
  source = data.federated_data_source(client_data, epochs=1, seed=4)
  iterator = source.iterator()
  first = iterator.select(P)
  restored = cdi.ClientDataSourceIterator.from_bytes(iterator.to_bytes())
  assert restored == iterator and restored.next_round == 2
  second = restored.select(P)
  fresh = source.iterator()
  fresh.select(P)
  expected = fresh.select(P)
  for [a], [b] in zip(second, expected):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert [c[0]['slot'] for c in first] == list(range(P))
  saved = iterator.to_bytes()
  cdi._SOURCES.clear()  # a new process that did not create the source yet
  with pytest.raises(ValueError, match='create the same'):
    cdi.ClientDataSourceIterator.from_bytes(saved)
  data.federated_data_source(client_data, epochs=2, seed=4)  # same ids, other epochs
  with pytest.raises(ValueError, match='another id map, epochs or seed'):
    cdi.ClientDataSourceIterator.from_bytes(saved)


def test_faults_reach_the_clients_through_the_adapter(model_fn, client_data):
  """`faults=` fills each client's `work` from ClientFaults's draw (client index n, round t,
  the adapter's seed); a dropped client's upload is left out of FedAvg's mean; the data
  source's bytes hold the faults."""
  faults = data.ClientFaults(client_dropout=0.4, straggler_fraction=0.5)
  inputs = data.ClientDataInputs(client_data, seed=3, faults=faults)
  assert inputs.element_type().work == tff.TensorType(np.float32)
  select = data.client_selection_fn(client_data, P, seed=3, faults=faults)
  works = collections.defaultdict(list)
  for t in range(1, 8):
    for cid, [inp] in zip(inputs.sample(t, P), select(t)):
      assert inp['work'] == np.float32(faults.work(3, t, inputs.index_of(cid)))
      works[t].append(float(inp['work']))
  every = sum(works.values(), [])
  assert 0.0 in every and any(0 < w < 1 for w in every)
  t = next(t for t, w in works.items() if 0 < w.count(0.0) < P)
  process = tff_algos.build_fedavg(model_fn, sgd(), BATCH)
  state = process.initialize()
  clients = select(t)
  reporting = [c for c in clients if c[0]['work'] > 0]
  out = process.next(state, clients)
  alone = process.next(state, reporting)
  for a, b in zip(process.get_model_weights(out.state).trainable,
                  process.get_model_weights(alone.state).trainable):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  train = out.metrics['client_work']['train']
  assert (train['reported_clients'], train['unreported_clients']) == (
      len(reporting), P - len(reporting))
  iterator = data.federated_data_source(client_data, seed=3, faults=faults).iterator()
  saved = iterator.to_bytes()
  data.federated_data_source(client_data, seed=3)   # same ids and seed, no faults
  with pytest.raises(ValueError, match='faults='):
    cdi.ClientDataSourceIterator.from_bytes(saved)


# --------------------------------------------------------------------------- #
# Every builder through run_training_process and train_model (kill + resume)
# --------------------------------------------------------------------------- #


@pytest.fixture(scope='module')
def program_context():
  """What a TFF program installs: a `tff.program.NativeFederatedContext` (train_model
  checks for one), here over the runtime `initialize_runtime` installed."""
  return execution.program_context()


def test_program_context_starts_no_second_worker(model_fn, client_data, tmp_path):
  """TFF's own async local context would start a second C++ worker; ours runs the program
  on the worker already running, and gives what the synchronous context gives."""
  process = tff_algos.build_fedavg(model_fn, sgd(), BATCH)
  expected = process.get_model_weights(tff.simulation.run_training_process(
      process, data.client_selection_fn(client_data, P, epochs=EPOCHS, seed=0),
      total_rounds=1))
  workers = execution.worker_pids()
  assert len(workers) == 1
  released, _ = _run_train_model(process, client_data, str(tmp_path / 'state'), 1,
                                 execution.program_context())
  assert execution.worker_pids() == workers
  for a, b in zip(tf.nest.flatten(process.get_model_weights(released[-1])),
                  tf.nest.flatten(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _run_train_model(process, client_data, root_dir, total_rounds, context):
  """One `train_model` invocation as a restarted program does it: a fresh data source."""
  model_output = tff.program.MemoryReleaseManager()
  train_metrics = tff.program.MemoryReleaseManager()
  with tff.framework.get_context_stack().install(context):
    helpers.run_async(tff.learning.programs.train_model(
        train_process=process,
        train_data_source=data.federated_data_source(client_data, epochs=EPOCHS, seed=0),
        train_per_round_clients=P,
        train_total_rounds=total_rounds,
        program_state_manager=tff.program.FileProgramStateManager(root_dir),
        model_output_manager=model_output,
        train_metrics_manager=train_metrics,
        evaluation_manager=None,
        evaluation_periodicity=1))
  return list(model_output.values().values()), train_metrics.values()


_BUILT = {}


def _built(name, model_fn):
  """BUILDERS[name]'s process, built once for the module (building one traces and compiles
  its computations: 10-60 s each here)."""
  if name not in _BUILT:
    _BUILT[name] = BUILDERS[name](model_fn)
  return _BUILT[name]


@pytest.mark.parametrize('name', list(BUILDERS))
def test_builder_through_tff_loops(name, model_fn, client_data, program_context, tmp_path):
  process = _built(name, model_fn)
  source_type = data.federated_data_source(client_data).federated_type
  assert process.next.type_signature.parameter[1].is_assignable_from(source_type)
  metrics = tff.program.MemoryReleaseManager()
  state = tff.simulation.run_training_process(
      process, data.client_selection_fn(client_data, P, epochs=EPOCHS, seed=0),
      total_rounds=ROUNDS, metrics_managers=[metrics])
  for round_num in range(1, ROUNDS + 1):
    train = metrics.values()[round_num]['client_work']['train']
    assert train['num_clients'] == P and train['num_examples'] == P * PER_CLIENT
    assert np.isfinite(train['loss'])
    # The model's own Keras metric, summed and finalised as TFF does, beside ours.
    assert train['sparse_categorical_accuracy'] == pytest.approx(train['accuracy'], abs=1e-6)
  if name == 'fedcross':  # every slot received its client: P distinct middleware models
    assert metrics.values()[1]['aggregator']['eligible'].tolist() == [1.0] * P
  if name == 'fedcda':
    assert metrics.values()[ROUNDS]['aggregator']['warmup'] == 0
  if name == 'cadis':  # participants are the sampled clients' indices in the id map
    inputs = data.ClientDataInputs(client_data, seed=0)
    sampled = sorted(inputs.index_of(c) for c in inputs.sample(1, P))
    assert metrics.values()[1]['aggregator']['participants'].tolist() == sampled
  expected = process.get_model_weights(state)
  initial_state = process.initialize()
  initial = process.get_model_weights(initial_state)
  assert not np.allclose(initial.trainable[-1], expected.trainable[-1])
  hparams = process.get_hparams(initial_state)  # TFF's hparams API reaches the client lr
  assert list(hparams) == ['client_work', 'finalizer']   # compose_learning_process's keys
  if name == 'fedsgd':
    assert not hparams['client_work']  # no client optimizer, as TFF's FedSGD
  else:
    assert hparams['client_work']['learning_rate'] == pytest.approx(0.1)
    hparams['client_work']['learning_rate'] = 0.0
    frozen = process.next(process.set_hparams(initial_state, hparams),
                          data.client_selection_fn(client_data, P)(1)).state
    for a, b in zip(process.get_model_weights(frozen).trainable, initial.trainable):
      np.testing.assert_allclose(a, b, atol=1e-7)

  root = str(tmp_path / 'program_state')
  _run_train_model(process, client_data, root, 1, program_context)  # "killed" after round 1
  cdi._SOURCES.clear()                                                # the process died
  released, train_metrics = _run_train_model(process, client_data, root, 2, program_context)
  assert list(train_metrics) == [2]                                 # resumed at round 2
  # train_model releases the whole train state; its model weights are what must match.
  final = process.get_model_weights(released[-1])
  assert len(tf.nest.flatten(final)) == len(tf.nest.flatten(expected))
  for a, b in zip(tf.nest.flatten(final), tf.nest.flatten(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_build_fed_eval_on_the_users_data(model_fn, client_data):
  process = tff_algos.build_fedavg(model_fn, sgd(), BATCH)
  state = process.initialize()
  state = process.next(state, data.client_selection_fn(client_data, P)(1)).state
  evaluation = tff.learning.algorithms.build_fed_eval(model_fn)
  eval_state = evaluation.set_model_weights(evaluation.initialize(),
                                            process.get_model_weights(state))
  out = evaluation.next(eval_state, [client_data.create_tf_dataset_for_client(c)
                                     for c in IDS])
  metrics = out.metrics['client_work']['eval']['current_round_metrics']
  assert metrics['num_examples'] == len(IDS) * PER_CLIENT
  central = central_evaluation.build_central_evaluation(model_fn)
  inputs = data.ClientDataInputs(client_data)
  x = np.concatenate([inputs.client_arrays(n)[0] for n in range(len(IDS))])
  y = np.concatenate([inputs.client_arrays(n)[1] for n in range(len(IDS))])
  ours = central(process.get_model_weights(state), x, y)
  assert metrics['sparse_categorical_accuracy'] == pytest.approx(ours['accuracy'], abs=1e-6)
  assert metrics['loss'] == pytest.approx(ours['loss'], rel=1e-4)


def test_labels_shaped_n_by_1_are_class_labels(raw, model_fn, client_data):
  """Keras's [n, 1] label layout (TFF's image tutorials) is classification, not a sequence
  with padding id 0: training accuracy and central evaluation equal the [n] layout's."""
  columns = tff.simulation.datasets.TestClientData(collections.OrderedDict(
      (c, collections.OrderedDict(x=d['x'], y=d['y'][:, None])) for c, d in raw.items()))
  columns = columns.preprocess(lambda d: d.batch(BATCH))
  column_fn = user_model_fn(columns.element_type_structure)
  assert columns.element_type_structure['y'].shape.as_list() == [None, 1]
  runs = []
  for fn, cd in ((model_fn, client_data), (column_fn, columns)):
    process = tff_algos.build_fedavg(fn, sgd(), BATCH)
    out = process.next(process.initialize(), data.client_selection_fn(cd, P)(1))
    runs.append((out.metrics['client_work']['train'], process.get_model_weights(out.state)))
  (flat, weights), (column, _) = runs
  assert 0.0 < column['accuracy'] <= 1.0
  assert column['accuracy'] == pytest.approx(flat['accuracy'], abs=1e-6)
  inputs = data.ClientDataInputs(client_data)
  x = np.concatenate([inputs.client_arrays(n)[0] for n in range(len(IDS))])
  y = np.concatenate([inputs.client_arrays(n)[1] for n in range(len(IDS))])
  want = central_evaluation.build_central_evaluation(model_fn)(weights, x, y)
  got = central_evaluation.build_central_evaluation(column_fn)(weights, x, y[:, None])
  assert got['accuracy'] == pytest.approx(want['accuracy'], abs=1e-6)
  assert got['loss'] == pytest.approx(want['loss'], rel=1e-5)
  # the rule alone, on random logits against numpy
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(50, 10)).astype(np.float32)
  labels = rng.integers(0, 10, size=50).astype(np.int32)
  hits, counted = local_training.accuracy_terms(tf.constant(logits),
                                                tf.constant(labels[:, None]))
  assert (float(hits), float(counted)) == (float(np.sum(logits.argmax(-1) == labels)), 50.0)


# --------------------------------------------------------------------------- #
# Their aggregators and their models
# --------------------------------------------------------------------------- #


def test_unweighted_dp_factory_in_fedavg_equals_uniform_fedavg(model_fn, client_data):
  dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=P, clip=1e6)
  with pytest.raises(ValueError, match="client_weighting='uniform'"):
    tff_algos.build_fedavg(model_fn, sgd(), BATCH, model_aggregator=dp,
                           client_weighting='num_examples')
  private = tff_algos.build_fedavg(model_fn, sgd(), BATCH, model_aggregator=dp)
  uniform = tff_algos.build_fedavg(model_fn, sgd(), BATCH, client_weighting='uniform')
  clients = data.client_selection_fn(client_data, P)(1)
  a = private.get_model_weights(private.next(private.initialize(), clients).state)
  b = uniform.get_model_weights(uniform.next(uniform.initialize(), clients).state)
  for u, v in zip(a.trainable, b.trainable):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_methods_that_cannot_take_a_factory_say_why(model_fn):
  mean = tff.aggregators.MeanFactory()
  calls = [
      ('FedCross', 'each upload replaces its own middleware model',
       lambda: tff_algos.build_fedcross(model_fn, sgd(), BATCH, P, model_aggregator=mean)),
      ('FedCDA', "enters its own client's cache",
       lambda: tff_algos.build_fedcda(model_fn, sgd(), BATCH, 6, P, model_aggregator=mean)),
  ]
  for method, why, call in calls:
    with pytest.raises(ValueError, match=f'{method} cannot take model_aggregator=MeanFactory'
                       ) as info:
      call()
    assert why in str(info.value)


def test_cadis_with_a_wrapped_mean_factory_equals_default_cadis(model_fn, client_data):
  """The factory aggregates the deltas with CADIS's p_i: clipping at a norm no delta
  reaches around MeanFactory gives default CADIS's model (tests/test_cadis.py checks real
  clipping and DP against NumPy)."""
  wrapped = tff.aggregators.clipping_factory(1e6, tff.aggregators.MeanFactory())
  with pytest.raises(TypeError, match='model_aggregator must be a tff.aggregators'):
    tff_algos.build_cadis(model_fn, sgd(), BATCH, len(IDS), clients_per_round=P,
                          model_aggregator=tff.aggregators.MeanFactory)
  models, metrics = [], []
  for factory in (None, wrapped):
    process = _built('cadis', model_fn) if factory is None else tff_algos.build_cadis(
        model_fn, sgd(), BATCH, len(IDS), clients_per_round=P, model_aggregator=factory)
    manager = tff.program.MemoryReleaseManager()
    state = tff.simulation.run_training_process(
        process, data.client_selection_fn(client_data, P, epochs=EPOCHS, seed=0),
        total_rounds=ROUNDS, metrics_managers=[manager])
    models.append(process.get_model_weights(state))
    metrics.append(manager.values()[ROUNDS]['aggregator'])
  for a, b in zip(models[0].trainable, models[1].trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics[1]['aggregation_weights'],
                             metrics[0]['aggregation_weights'], rtol=1e-5)
  assert metrics[1]['delta_aggregator']['clipped_count'] == 0


def test_clustered_aggregator_with_num_clients_refuses_anonymous_uploads(model_fn):
  with pytest.raises(ValueError, match='num_clients=6 asks for the Q and F'):
    tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, sgd(), model_aggregator=clustered_aggregation.ClusteredAggregator(6, P))
  # TFF's wrappers refuse the keyed value (int32 client_index) with their own message.
  weights_type = model_delta.model_weights_type(model_fn)
  with pytest.raises(TypeError, match='floating'):
    tff.aggregators.clipping_factory(1.0, clustered_aggregation.ClusteredAggregator(6, P)
                                     ).create(model_delta.keyed_update_type(
                                         weights_type.trainable), tff.TensorType(np.float32))


def test_tuple_input_spec_and_what_is_not_a_model_fn(raw, client_data, model_fn, functional):
  spec = client_data.element_type_structure
  tuple_fn = user_model_fn((spec['x'], spec['y']))
  tuples = tff.simulation.datasets.TestClientData(raw).preprocess(
      lambda d: d.map(lambda e: (e['x'], e['y'])).batch(BATCH))
  reference = tff_algos.build_fedavg(model_fn, sgd(), BATCH)
  with_tuple = tff_algos.build_fedavg(tuple_fn, sgd(), BATCH)
  expected = reference.get_model_weights(reference.next(
      reference.initialize(), data.client_selection_fn(client_data, P)(1)).state)
  state = with_tuple.set_model_weights(with_tuple.initialize(),
                                       reference.get_model_weights(reference.initialize()))
  got = with_tuple.get_model_weights(with_tuple.next(
      state, data.client_selection_fn(tuples, P)(1)).state)
  for u, v in zip(got.trainable, expected.trainable):
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  with pytest.raises(TypeError, match='FunctionalModel itself'):
    tff_algos.build_fedavg(lambda: functional, sgd(), BATCH)
  # A Keras model is callable but is not a model_fn; neither is a VariableModel instance.
  for name, build in BUILDERS.items():
    with pytest.raises(TypeError, match='not a Keras model: wrap it'):
      build(user_keras_model())
    with pytest.raises(TypeError, match='got int'):
      build(3)
  # What from_keras_model accepts but one-tensor x / one-tensor y training cannot take
  # (several inputs), refused with the forms that are supported:
  for bad in ((spec['x'], spec['y'], spec['y']), ((spec['x'], spec['x']), spec['y']),
              collections.OrderedDict(x=spec['x'], y=spec['y'], w=spec['y'])):
    with pytest.raises(TypeError, match=r'\(x, y\) tuple of TensorSpecs'):
      local_training.client_element_type(bad)


@pytest.fixture(scope='module')
def functional(client_data):
  """The user's Keras model as a FunctionalModel (its seeded initial weights captured)."""
  return tff.learning.models.functional_model_from_keras(
      user_keras_model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=client_data.element_type_structure)


# Every builder that takes a model, called as a user would. docs/tff_integration.md lists
# the same names as those that take a FunctionalModel (test_docs_list_what_takes_a_...).
def _process(build):
  return lambda m: ('process', build(m))


MODEL_BUILDERS = collections.OrderedDict(
    build_fedavg=_process(lambda m: tff_algos.build_fedavg(m, sgd(), BATCH)),
    build_fedavgm=_process(lambda m: tff_algos.build_fedavgm(m, sgd(), BATCH)),
    build_fedadam=_process(lambda m: tff_algos.build_fedadam(m, sgd(), BATCH)),
    build_fedprox=_process(lambda m: tff_algos.build_fedprox(m, sgd(), BATCH, 0.01)),
    build_fedsgd=_process(lambda m: tff_algos.build_fedsgd(m, client_batch_size=BATCH)),
    build_fedcross=_process(lambda m: tff_algos.build_fedcross(m, sgd(), BATCH, num_models=P)),
    build_fedcda=_process(lambda m: tff_algos.build_fedcda(m, sgd(), BATCH, len(IDS), P,
                                                           warmup_rounds=1)),
    build_scaffold=_process(lambda m: tff_algos.build_scaffold(m, sgd(), BATCH, len(IDS), P)),
    **{f'build_fedlex-{base}': _process(
        lambda m, base=base: tff_algos.build_fedlex(m, sgd(), BATCH, base))
       for base in ('avgm', 'sgd', 'opt', 'prox')},
    build_fedlex_exploration=lambda m: (
        'computation', tff_algos.build_fedlex_exploration(m, sgd(), BATCH)),
    build_per_client_evaluation=lambda m: (
        'computation', tff_algos.build_per_client_evaluation(m, len(IDS))),
)
FUNCTIONAL_REFUSED = ('build_cadis',)


def _rounds(process, client_data):
  """The initial and the final global weights after ROUNDS rounds on the same clients."""
  state = process.initialize()
  initial = process.get_model_weights(state)
  for round_num in range(1, ROUNDS + 1):
    state = process.next(state, data.client_selection_fn(client_data, P, seed=0)(round_num)
                         ).state
  return initial, process.get_model_weights(state)


def _computed(computation, name, client_data):
  """The computation's result on the user's Keras model's initial weights."""
  weights = tff.learning.models.ModelWeights.from_model(user_keras_model())
  weights = tff.learning.models.ModelWeights(
      [w.numpy() for w in weights.trainable], [w.numpy() for w in weights.non_trainable])
  if name == 'build_per_client_evaluation':
    inputs = data.ClientDataInputs(client_data)
    return computation(weights, tff_algos.client_evaluation_inputs(
        [inputs.client_arrays(n) for n in range(inputs.num_clients)]))
  return computation(weights, data.client_selection_fn(client_data, P, seed=0)(1))


# The FedAvg family's other builders share build_fedavg's client work and aggregation.
SAME_PATH_AS_FEDAVG = ('build_fedavgm', 'build_fedadam', 'build_fedprox', 'build_fedlex-avgm',
                       'build_fedlex-sgd', 'build_fedlex-opt', 'build_fedlex-prox')


@pytest.mark.parametrize('name', [
    pytest.param(n, marks=pytest.mark.slow) if n in SAME_PATH_AS_FEDAVG else n
    for n in MODEL_BUILDERS])
def test_functional_model_trains_as_its_keras_model(name, model_fn, functional, client_data):
  """The same Keras model as a from_keras_model model_fn and as a FunctionalModel: the same
  initial weights, and after ROUNDS rounds on the same clients the same model (float32)."""
  runs = []
  for model in (model_fn, functional):
    kind, built = MODEL_BUILDERS[name](model)
    runs.append(_rounds(built, client_data) if kind == 'process'
                else _computed(built, name, client_data))
  keras_run, functional_run = runs
  for a, b in zip(tf.nest.flatten(keras_run), tf.nest.flatten(functional_run)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  if kind == 'process':   # it trained: the final model is not the initial one
    assert not np.allclose(keras_run[0].trainable[0], keras_run[1].trainable[0])


def test_cadis_refuses_a_functional_model(functional):
  with pytest.raises(TypeError, match='Keras'):
    tff_algos.build_cadis(functional, sgd(), BATCH, len(IDS), clients_per_round=P)


def test_docs_list_what_takes_a_functional_model():
  """docs/tff_integration.md's two lists are the builders tested above, and every exported
  builder whose first argument is model_fn is in one of them."""
  import inspect  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  text = (pathlib.Path(__file__).parents[1] / 'docs' / 'tff_integration.md').read_text()
  lists = {}
  for key in ('Take a FunctionalModel', 'Refuse a FunctionalModel'):
    line = re.search(rf'^- \*\*{key}\*\*:(.*?)(?=\n- |\n\n)', text, re.M | re.S).group(1)
    lists[key] = set(re.findall(r'`(build_\w+)', line))
  tested = {n.split('-')[0] for n in MODEL_BUILDERS}
  assert lists['Take a FunctionalModel'] == tested
  assert lists['Refuse a FunctionalModel'] == set(FUNCTIONAL_REFUSED)
  taking_a_model = {name for name in tff_algos.__all__ if name.startswith('build_') and
                    next(iter(inspect.signature(getattr(tff_algos, name)).parameters))
                    == 'model_fn'}
  assert taking_a_model == tested | set(FUNCTIONAL_REFUSED)


def test_plain_tf_data_clients_are_refused_naming_the_adapter(model_fn, client_data):
  """TFF's own processes take batched tf.data clients; ours take the adapter's inputs, and
  a plain dataset gets one sentence naming it instead of TFF's serialization error."""
  process = _built('fedavg', model_fn)
  clients = [client_data.create_tf_dataset_for_client(cid) for cid in IDS[:P]]
  with pytest.raises(TypeError) as info:
    process.next(process.initialize(), clients)
  message = str(info.value)
  assert message.startswith("this process's clients are one-element sequences of "
                            'OrderedDict(x, y, order, index, slot, work), not plain tf.data')
  assert 'data.client_selection_fn(client_data, clients_per_round)(round_num)' in message
  assert '\n' not in message and 'Cannot serialize' in str(info.value.__cause__)


def test_tff_argument_habits_get_one_clear_error(model_fn):
  """What code ported from TFF's builders passes: a server optimizer third (TFF's order), a
  zero batch, a Keras optimizer factory; and TFF's ClientWeighting enum, which is taken."""
  server = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  keras_factory = lambda: tf.keras.optimizers.SGD(0.1)
  builders = (  # (client optimizer, batch size) -> process
      lambda o, b: tff_algos.build_fedavg(model_fn, o, b),
      lambda o, b: tff_algos.build_fedprox(model_fn, o, b, 0.01),
      lambda o, b: tff_algos.build_fedlex(model_fn, o, b, 'avgm'),
      lambda o, b: tff_algos.build_fedcross(model_fn, o, b, num_models=P),
      lambda o, b: tff_algos.build_fedcda(model_fn, o, b, len(IDS), P),
      lambda o, b: tff_algos.build_cadis(model_fn, o, b, len(IDS), clients_per_round=P))
  for build in builders:
    with pytest.raises(TypeError, match='server_optimizer_fn=...'):
      build(sgd(), server)
    with pytest.raises(ValueError, match='client_batch_size must be a positive integer'):
      build(sgd(), 0)
    with pytest.raises(TypeError, match='not a Keras optimizer'):
      build(keras_factory, BATCH)
  with pytest.raises(ValueError, match='client_batch_size must be a positive integer'):
    tff_algos.build_fedsgd(model_fn, client_batch_size=0)
  weighting = tff.learning.ClientWeighting
  for enum, text in ((weighting.UNIFORM, 'uniform'), (weighting.NUM_EXAMPLES, 'num_examples')):
    assert aggregator_factories.resolve_client_weighting(enum, None) == text


def test_batchnorm_statistics_are_averaged(client_data):
  """With the client learning rate at 0 (set through TFF's hparams API) only BatchNorm's
  moving statistics move; BN on the raw input makes them a numpy computation: per client,
  m <- 0.99 m + 0.01 mean(batch) over its batches in `order`, and the new global moving
  mean is the example-weighted mean of the clients' m."""
  spec = client_data.element_type_structure

  def bn_model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer((8, 8, 1)),
        tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, name='classifier')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=spec)

  with pytest.raises(ValueError, match='non-trainable weights'):
    tff_algos.build_cadis(bn_model_fn, sgd(), BATCH, len(IDS), clients_per_round=P)
  process = tff_algos.build_fedavg(bn_model_fn, sgd(), BATCH)
  state = process.initialize()
  hparams = process.get_hparams(state)
  hparams['client_work']['learning_rate'] = 0.0
  state = process.set_hparams(state, hparams)
  clients = data.client_selection_fn(client_data, P, seed=5)(1)
  new = process.get_model_weights(process.next(state, clients).state)
  means, sizes = [], []
  for [inp] in clients:
    m = 0.0
    for start in range(0, PER_CLIENT, BATCH):
      m = 0.99 * m + 0.01 * inp['x'][inp['order'][0, start:start + BATCH]].mean()
    means.append(m)
    sizes.append(len(inp['y']))
  moving_mean = new.non_trainable[0]
  np.testing.assert_allclose(moving_mean, [np.average(means, weights=sizes)], rtol=1e-5)
  assert not np.allclose(new.non_trainable[1], 1.0)  # the moving variance moved too


def test_per_client_evaluation_is_tffs_fed_eval_client_by_client(model_fn, client_data):
  """Each client's accuracy is what TFF's own build_fed_eval reports on that client alone,
  and the computation runs in a tff.program context too (which refuses CLIENTS-placed
  results: ours are server-placed)."""
  process = tff_algos.build_fedavg(model_fn, sgd(), BATCH)
  state = process.initialize()
  state = process.next(state, data.client_selection_fn(client_data, P)(1)).state
  weights = process.get_model_weights(state)
  inputs = data.ClientDataInputs(client_data)
  evaluate = tff_algos.build_per_client_evaluation(model_fn, inputs.num_clients)
  client_inputs = tff_algos.client_evaluation_inputs(
      [inputs.client_arrays(n) for n in range(inputs.num_clients)])
  ours = evaluate(weights, client_inputs)
  fed_eval = tff.learning.algorithms.build_fed_eval(model_fn)
  eval_state = fed_eval.set_model_weights(fed_eval.initialize(), weights)
  theirs = []
  for n, cid in enumerate(inputs.client_ids):
    out = fed_eval.next(eval_state, [client_data.create_tf_dataset_for_client(cid)])
    theirs.append(float(out.metrics['client_work']['eval']['current_round_metrics'][
        'sparse_categorical_accuracy']))
    assert ours['count'][n] == PER_CLIENT
  np.testing.assert_allclose(ours['accuracy'], theirs, atol=1e-6)
  assert len(set(theirs)) > 1   # the clients differ

  async def in_a_program():   # the native context invokes on the running loop
    return await tff.program.materialize_value(evaluate(weights, client_inputs))

  with tff.framework.get_context_stack().install(execution.program_context()):
    in_program = helpers.run_async(in_a_program())
  np.testing.assert_allclose(in_program['accuracy'], ours['accuracy'], atol=1e-6)
