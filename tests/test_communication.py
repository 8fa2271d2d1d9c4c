"""tff_algos/communication.py: bytes per client from TFF types, each method's formula, and the
program's bytes columns (metrics.csv, TensorBoard, summary.json)."""

import collections
import csv
import json

import numpy as np
import pytest

from programs import computations
from programs import experiment
from programs import experiment_config
from programs import fedlex_exploration
from programs import methods
from programs import run_results

pytestmark = pytest.mark.usefixtures('runtime')

DTYPES = (np.float32, np.float64, np.int32, np.int64, np.float16, np.bool_, np.uint8)


def _random_type(rng, depth=0):
  """(a random tff type of tensors and structs, the NumPy arrays of one value of it)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if depth < 2 and rng.random() < 0.5:
    members = [_random_type(rng, depth + 1) for _ in range(rng.integers(0, 4))]
    return (tff.StructType([(f'f{i}', t) for i, (t, _) in enumerate(members)]),
            [a for _, arrays in members for a in arrays])
  dtype = DTYPES[rng.integers(len(DTYPES))]
  shape = tuple(int(d) for d in rng.integers(0, 5, size=rng.integers(0, 4)))
  return tff.TensorType(dtype, shape), [np.zeros(shape, dtype)]


def test_type_bytes_is_the_nbytes_of_a_value_of_the_type():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for _ in range(50):
    type_spec, arrays = _random_type(rng)
    expected = sum(a.nbytes for a in arrays)
    assert communication.type_bytes(type_spec) == expected
    assert communication.type_bytes(tff.FederatedType(type_spec, tff.CLIENTS)) == expected


@pytest.mark.parametrize('type_spec', ['unknown_dim', 'string', 'sequence'])
def test_type_bytes_refuses_values_without_a_fixed_size(type_spec):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  type_spec = dict(unknown_dim=tff.TensorType(np.float32, [None, 3]),
                   string=tff.TensorType(np.str_),
                   sequence=tff.SequenceType(np.float32))[type_spec]
  with pytest.raises(ValueError, match='no fixed size'):
    communication.type_bytes(type_spec)


def test_a_select_counts_each_key_and_an_upload_splits_payload_from_overhead():
  """A hand-made round: 3 keys of a 2x5 float32 table row each down; up, a weighted mean of
  a model-shaped value (weight: overhead), a keyed upload (index: overhead, the rule's loss:
  payload) and a sum of an int64 metric (overhead)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  weights_type = tff.StructType([
      ('trainable', tff.StructType([tff.TensorType(np.float32, [2, 5]),
                                    tff.TensorType(np.float32, [5])])),
      ('non_trainable', tff.StructType([tff.TensorType(np.int64, [3])]))])
  table_type = tff.TensorType(np.float32, [7, 2, 5])

  @tff.tensorflow.computation(tff.TensorType(np.int32))
  def keys(i):
    return tf.stack([i, i + 1, i + 2])

  @tff.tensorflow.computation(table_type, tff.TensorType(np.int32))
  def row(table, key):
    return tf.gather(table, key)

  @tff.tensorflow.computation(tff.TensorType(np.int32))
  def upload(i):
    del i
    return (collections.OrderedDict(client_index=np.int32(0), last_epoch_loss=np.float32(0)),
            np.int64(1))

  @tff.tensorflow.computation(tff.TensorType(np.int32))
  def model_like(i):
    del i
    return [tf.zeros([2, 5]), tf.zeros([5])], tf.constant(1.0)

  @tff.federated_computation(tff.FederatedType(table_type, tff.SERVER),
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def round_fn(table, ids):
    selected = tff.federated_select(tff.federated_map(keys, ids),
                                    tff.federated_value(7, tff.SERVER), table, row)
    values, weight = tff.federated_map(model_like, ids)
    keyed, metric = tff.federated_map(upload, ids)
    return (selected, tff.federated_mean(values, weight), tff.federated_sum(metric),
            tff.federated_sum(keyed))

  traffic = communication.computation_traffic(round_fn, weights_type)
  trainable_bytes = 4 * (10 + 5)
  assert (traffic.down_payload, traffic.down_overhead) == (0, 3 * 4 * 10)
  assert traffic.up_payload == trainable_bytes + 4     # the values, the rule's loss
  assert traffic.up_overhead == 4 + 8 + 4               # weight, metric, client index
  rows = communication.describe(traffic)
  # The weighted mean's value and weight are two crossings.
  assert sorted((r['direction'], r['intrinsic'], r['count']) for r in rows) == [
      ('down', 'federated_select', 3), ('up', 'federated_sum', 1), ('up', 'federated_sum', 1),
      ('up', 'federated_weighted_mean', 1), ('up', 'federated_weighted_mean', 1)]
  assert sum(r['payload'] + r['overhead'] for r in rows if r['direction'] == 'up') == (
      traffic.up_payload + traffic.up_overhead)


def _d(model_fn) -> tuple[int, int]:
  """(float32 bytes of the model's weights, of its trainable weights), from Keras."""
  model = model_fn()
  trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  return 4 * (trainable + sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)), \
      4 * trainable


# Each method's payload per client and round, down and up, in W (bytes of the model's
# weights, non-trainable ones included) and T (bytes of its trainable weights), float32.
# The keyed uploads' `loss` is the client's last-epoch loss (4 bytes) beside its model.
def _payload_formula(name, w, t):
  loss = 4
  if name.startswith('fedlex_'):
    return w + t, w                 # the model and the guidance G; the base method's delta
  return dict(fedavg=(w, w), fedavgm=(w, w), fedadam=(w, w), fedprox=(w, w),
              fedsgd=(w, w),                       # the gradient, shaped like the delta
              cadis=(w, t),                        # the trainable delta keyed by index
              fedcross=(w, w + loss),              # one middleware model; the trained model
              fedcda=(w, w + loss),                # the global model; the trained model
              scaffold=(w + 2 * t, w + t),         # x, c, c_i; the model and control deltas
              )[name]


@pytest.fixture(scope='module')
def bn_model_fn():
  """A model with non-trainable weights (BatchNorm's moving statistics): W != T."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  spec = models.input_spec_for('tiny_cnn', (8, 8, 1))

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer((8, 8, 1)), tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(10, name='classifier')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=spec)

  return model_fn


# Per-client overhead bytes of each method's keyed upload (index, slot, aggregation weight).
KEYED_OVERHEAD = dict(fedcross=12, fedcda=12, scaffold=12, cadis=8)


@pytest.mark.parametrize('model', ['tiny_cnn', 'batchnorm'])
@pytest.mark.parametrize('name', list(methods.METHODS))
def test_every_method_moves_its_formula(name, model, tiny_model_fn, bn_model_fn):
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  if name == 'cadis' and model == 'batchnorm':
    pytest.skip('CADIS refuses non-trainable weights (its keyed delta is the trainable one)')
  model_fn = tiny_model_fn if model == 'tiny_cnn' else bn_model_fn
  config = experiment_config.ExperimentConfig(algorithm=name, num_clients=6, clients_per_round=6,
                                       batch_size=10, client_momentum=0.0,
                                       fedcda_warmup_rounds=0)
  process = computations.build_process(config, model_fn, 6)
  traffic = communication.process_traffic(process)
  w, t = _d(model_fn)
  assert (w > t) == (model == 'batchnorm')
  assert (traffic.down_payload, traffic.up_payload) == _payload_formula(name, w, t)
  # Down overhead: the client work's hyperparameters (its optimizer's), broadcast.
  hparams = process.get_hparams(process.initialize())['client_work']
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert traffic.down_overhead == sum(np.asarray(x).nbytes for x in tf.nest.flatten(hparams))
  keyed = [x for x in traffic.crossings if x.intrinsic == 'federated_aggregate']
  if name in KEYED_OVERHEAD:
    assert [x.overhead for x in keyed] == [KEYED_OVERHEAD[name]]
  else:
    assert not keyed
  assert 0 < traffic.up_overhead < 200   # metrics and weights: O(1), not O(D)


def test_round_bytes_count_sampled_clients_down_and_reporters_up():
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  traffic = communication.ClientTraffic(100, 3, 70, 11, ())
  assert traffic.round_bytes(5, 2) == dict(bytes_down_payload=500, bytes_down_overhead=15,
                                           bytes_up_payload=140, bytes_up_overhead=22)
  assert traffic.round_bytes(5) == traffic.round_bytes(5, 5)
  # Without a reported_clients metric every sampled client uploads; with it, those reporting.
  first = run_results.bytes_columns(traffic, 5, {'client_work/train/loss': 1.0}, None)
  assert (first['cumulative_bytes_down'], first['cumulative_bytes_up']) == (515, 405)
  previous = {k: str(v) for k, v in first.items()}   # as metrics.csv gives them back
  second = run_results.bytes_columns(
      traffic, 5, {'client_work/train/reported_clients': 3.0}, previous)
  assert second['bytes_up_payload'] == 210 and second['bytes_down_payload'] == 500
  assert (second['cumulative_bytes_down'], second['cumulative_bytes_up']) == (1030, 648)


def test_a_guided_run_writes_its_bytes_columns_totals_and_exploration(tmp_path, tiny_model_fn):
  """2 rounds of FedLEx-AvgM with --fedlex_refresh and half the clients dropping: each
  round's columns are the formula's bytes times the 4 sampled clients down and its reporting
  ones up, the running totals add up, TensorBoard has them, and the exploration bytes are
  the explorers' (before round 1 and the refreshes) times one explorer's: the model down to
  each; its deviation and final model up (with 20 bytes: the two means' weights, the epochs,
  the finite and the reporting counts) from each that reports."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  config = experiment_config.ExperimentConfig(
      algorithm='fedlex_avgm', dataset='digits', num_clients=10, clients_per_round=4,
      local_epochs=1, batch_size=16, client_lr=0.1, rounds=2, progress=False,
      fedlex_refresh=True, client_dropout=0.5, root_output_dir=str(tmp_path),
      experiment_name='g')
  summary = experiment.run_experiment(config, log=lambda _: None)
  exp_dir = tmp_path / 'g'
  with open(exp_dir / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  w, t = _d(tiny_model_fn)   # digits' default model
  per_client = summary['bytes_per_client_round']
  assert (per_client['down_payload'], per_client['up_payload']) == (w + t, w)
  totals = [0, 0]
  for row in rows:
    assert int(row['bytes_down_payload']) == 4 * (w + t)
    reported = int(float(row['reported_clients']))
    assert int(row['bytes_up_payload']) == reported * w
    assert int(row['bytes_down_overhead']) == 4 * per_client['down_overhead']
    assert int(row['bytes_up_overhead']) == reported * per_client['up_overhead']
    totals[0] += int(row['bytes_down_payload']) + int(row['bytes_down_overhead'])
    totals[1] += int(row['bytes_up_payload']) + int(row['bytes_up_overhead'])
    assert [int(row['cumulative_bytes_down']), int(row['cumulative_bytes_up'])] == totals
  assert [summary['cumulative_bytes_down'], summary['cumulative_bytes_up']] == totals
  assert summary['bytes_up_payload'] == sum(int(float(r['reported_clients'])) for r in rows) * w
  assert 0 < summary['bytes_up_payload'] < 2 * 4 * w
  explorers = fedlex_exploration.fedlex_explorers(config, 10)
  exploring = [(0, explorers)] + [
      (r, np.intersect1d(data.sample_clients(10, 4, r, config.seed), explorers)) for r in (1, 2)]
  # an explorer reports unless the first of its draw's uniforms falls below the dropout rate
  reporting = sum(np.random.default_rng([config.seed + 1, r, int(n), 2]).random(3)[0] >= 0.5
                  for r, ids in exploring for n in ids)
  explored = sum(len(ids) for _, ids in exploring)
  assert 0 < reporting < explored
  assert summary['exploration_bytes_down'] == explored * w
  assert summary['exploration_bytes_up'] == reporting * (t + w + 20)
  assert int(rows[-1]['exploration_bytes_up']) == summary['exploration_bytes_up']
  tags = set()
  for path in (exp_dir / 'tensorboard').iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      tags.update(v.tag for v in event.summary.value)
  assert {'bytes_down_payload', 'cumulative_bytes_up', 'exploration_bytes_down'} <= tags
  assert json.loads((exp_dir / 'summary.json').read_text())['cumulative_bytes_down'] == totals[0]
