"""FedCross: the cross-aggregation rules against NumPy, and the LearningProcess end to end."""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos import data
from tests import helpers
from tff_algos import execution
from tff_algos.aggregators import cross_aggregation as ca
from tff_algos.client_work import local_training, model_delta
from tff_algos.fedcross import build_fedcross
from tff_algos.models import make_model_fn, zoo

execution.initialize_runtime()

RULES = ('lowest_similarity', 'highest_similarity', 'in_order')


# --------------------------------------------------------------------------- #
# Independent NumPy reference
# --------------------------------------------------------------------------- #


def np_cosine(flat):
  flat = np.asarray(flat, np.float64)
  k = flat.shape[0]
  sim = np.zeros([k, k])
  for i in range(k):
    for j in range(k):
      ni, nj = np.linalg.norm(flat[i]), np.linalg.norm(flat[j])
      sim[i, j] = 0.0 if ni == 0 or nj == 0 else flat[i] @ flat[j] / (ni * nj)
  return sim


def np_layerwise(models):
  """The authors' code's similarity (PFLlib servercross.py), pair of models by pair: the
  tensors taken in order, every second one closing a group of two whose cosine is added; after
  the loop the last group (a pair, or a lone last tensor) is added once more."""
  k = models[0].shape[0]
  sim = np.zeros([k, k])
  for i in range(k):
    for j in range(k):
      s, sub_a, sub_b = 0.0, None, None
      for cnt, m in enumerate(models):
        a, b = m[i].reshape(-1).astype(np.float64), m[j].reshape(-1).astype(np.float64)
        if cnt % 2 == 0:
          sub_a, sub_b = a, b
        else:
          sub_a, sub_b = np.concatenate([sub_a, a]), np.concatenate([sub_b, b])
          s += np_cosine(np.stack([sub_a, sub_b]))[0, 1]
      sim[i, j] = s + np_cosine(np.stack([sub_a, sub_b]))[0, 1]
  return sim


def np_select(sim, rule, t, eligible=None):
  k = sim.shape[0]
  if k == 1:
    return np.array([-1])
  # Only this round's uploads (eligible) get a collaborator and are one; none: -1.
  ok = np.ones(k, bool) if eligible is None else np.asarray(eligible, bool)
  out = []
  for i in range(k):
    if rule == 'in_order':
      c = (i + (t % (k - 1)) + 1) % k
      out.append(c if ok[i] and ok[c] else -1)
      continue
    cands = [j for j in range(k) if j != i and ok[i] and ok[j]]
    if not cands:
      out.append(-1)
      continue
    best = cands[0]
    for j in cands[1:]:  # strict comparison: ties keep the lowest index
      if (rule == 'lowest_similarity' and sim[i, j] < sim[i, best]) or \
         (rule == 'highest_similarity' and sim[i, j] > sim[i, best]):
        best = j
    out.append(best)
  return np.array(out)


def np_cross(models, collab, alpha):
  return [np.stack([m[i] if c < 0 else alpha * m[i] + (1 - alpha) * m[c]
                    for i, c in enumerate(collab)]) for m in models]


def random_layers(rng, k, odd=False):
  """[K, ...] uploads of a small two-layer model (kernel, bias per layer; with `odd` a
  trailing scalar), each tensor at its own scale so that layers weigh differently."""
  shapes = [[3, 4], [4], [4, 2], [2]] + ([[]] if odd else [])
  return [(rng.normal(size=[k] + shape) * rng.uniform(0.1, 3.0) + rng.normal(size=shape))
          .astype(np.float32) for shape in shapes]


def random_models(rng, k):
  return [rng.normal(size=[k, 3, 4]).astype(np.float32),
          rng.normal(size=[k, 5]).astype(np.float32),
          rng.normal(size=[k]).astype(np.float32)]  # a scalar per model (e.g. a BN count)


def flat_np(models):
  return np.concatenate([m.reshape(m.shape[0], -1) for m in models], axis=1)


# --------------------------------------------------------------------------- #
# Pure TF functions
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize('k', [2, 3, 5])
@pytest.mark.parametrize('rule', RULES)
@pytest.mark.parametrize('alpha', [0.5, 0.9, 0.99])
def test_rules_and_cross_aggregate_match_numpy(k, rule, alpha):
  rng = np.random.default_rng([k, len(rule), int(alpha * 100)])
  models = random_models(rng, k)
  for t in range(3):
    sim = ca.cosine_similarity_matrix(ca.flatten_models(models)).numpy()
    np.testing.assert_allclose(sim, np_cosine(flat_np(models)), atol=1e-5)
    collab = ca.select_collaborators(sim, rule, t).numpy()
    np.testing.assert_array_equal(collab, np_select(np_cosine(flat_np(models)), rule, t))
    assert np.all(collab != np.arange(k))
    new = ca.cross_aggregate(models, collab, alpha)
    for got, want in zip(new, np_cross(models, collab, alpha)):
      np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    # the whole server step agrees too
    stepped, meas = ca.cross_aggregation_step(
        models, t, num_models=k, alpha=alpha, selection=rule, alpha_schedule=False,
        num_propellers=1, accel_rounds=0)
    np.testing.assert_array_equal(meas['collaborators'].numpy(), collab)
    for got, want in zip(stepped, new):
      np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    models = [m.numpy() for m in new]


@pytest.mark.parametrize('k', [2, 3, 5])
@pytest.mark.parametrize('odd', [False, True])
def test_layerwise_similarity_and_choice_match_numpy(k, odd):
  rng = np.random.default_rng([k, odd])
  for t in range(3):
    models = random_layers(rng, k, odd)
    sim = np_layerwise(models)
    got = ca.layerwise_similarity_matrix(models).numpy()
    np.testing.assert_allclose(got, sim, atol=1e-5)
    # 2 pairs, the last counted twice (3), or 2 pairs and a lone scalar counted once (3)
    np.testing.assert_allclose(np.diag(got), 3.0, atol=1e-5)
    for rule in RULES:
      _, meas = ca.cross_aggregation_step(
          models, t, num_models=k, alpha=0.9, selection=rule, alpha_schedule=False,
          num_propellers=1, accel_rounds=0, similarity='layerwise')
      np.testing.assert_allclose(meas['similarity'].numpy(), sim, atol=1e-5)
      np.testing.assert_array_equal(meas['collaborators'].numpy(), np_select(sim, rule, t))
  # one tensor: its cosine, counted once
  one = models[:1]
  np.testing.assert_allclose(ca.layerwise_similarity_matrix(one).numpy(),
                             np_cosine(flat_np(one)), atol=1e-6)
  # a zero pair has cosine 0
  zeros = [np.zeros_like(m) for m in models[:2]] + models[2:]
  np.testing.assert_allclose(ca.layerwise_similarity_matrix(zeros).numpy(),
                             np_layerwise(zeros), atol=1e-5)


def test_layerwise_and_model_similarity_choose_differently():
  """The option is read: on random uploads the two similarities pick other collaborators."""
  k = 5
  differ = []
  for seed in range(10):
    models = random_layers(np.random.default_rng(seed), k)
    picks = {}
    for similarity in constants.FEDCROSS_SIMILARITIES:
      _, meas = ca.cross_aggregation_step(
          models, 0, num_models=k, alpha=0.9, selection='lowest_similarity',
          alpha_schedule=False, num_propellers=1, accel_rounds=0, similarity=similarity)
      picks[similarity] = meas['collaborators'].numpy()
    np.testing.assert_array_equal(
        picks['model'], np_select(np_cosine(flat_np(models)), 'lowest_similarity', 0))
    np.testing.assert_array_equal(
        picks['layerwise'], np_select(np_layerwise(models), 'lowest_similarity', 0))
    differ.append(not np.array_equal(picks['model'], picks['layerwise']))
  assert differ[0] and sum(differ) >= 3, differ
  # the default step is the whole-model cosine
  _, meas = ca.cross_aggregation_step(
      models, 0, num_models=k, alpha=0.9, selection='lowest_similarity', alpha_schedule=False,
      num_propellers=1, accel_rounds=0)
  np.testing.assert_allclose(meas['similarity'].numpy(), np_cosine(flat_np(models)), atol=1e-5)


def test_builders_refuse_layerwise_similarity_with_in_order():
  """The builders refuse what the program's flag check refuses: in_order reads no
  similarity; the similarity rules take layerwise."""
  weights_type = model_delta.model_weights_type(MODEL_FN)
  message = "^similarity='layerwise' is read only by the similarity rules, not by selection="
  with pytest.raises(ValueError, match=message):
    ca.build_cross_aggregation_process(weights_type, 3, selection='in_order',
                                       similarity='layerwise')
  with pytest.raises(ValueError, match=message):
    build_fedcross(MODEL_FN, optimizer(), BATCH, 3, selection='in_order',
                   similarity='layerwise')
  ca.build_cross_aggregation_process(weights_type, 3, selection='in_order')
  ca.build_cross_aggregation_process(weights_type, 3, selection='highest_similarity',
                                     similarity='layerwise')


def test_program_refuses_layerwise_similarity_with_in_order():
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  config = experiment_config.ExperimentConfig(
      algorithm='fedcross', dataset='digits', fedcross_similarity='layerwise')
  experiment_config.validate(config)
  with pytest.raises(experiment_config.ExperimentError, match=(
      '^--fedcross_similarity=layerwise is read only by the similarity rules, not by '
      '--fedcross_selection=in_order; drop it')):
    experiment_config.validate(dataclasses.replace(config, fedcross_selection='in_order'))


def test_ties_go_to_lowest_index_and_eligibility():
  sim = np.array([[1.0, 0.2, 0.2, 0.2],
                  [0.2, 1.0, 0.5, 0.5],
                  [0.2, 0.5, 1.0, 0.5],
                  [0.2, 0.5, 0.5, 1.0]], np.float32)
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'lowest_similarity', 0).numpy(), [1, 0, 0, 0])
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'highest_similarity', 0).numpy(), [1, 2, 1, 1])
  # model 0 did not report: it has no collaborator and is nobody's
  eligible = np.array([False, True, True, True])
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'lowest_similarity', 0, eligible).numpy(), [-1, 2, 1, 1])
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'lowest_similarity', 0, eligible).numpy(),
      np_select(sim, 'lowest_similarity', 0, eligible))
  # the only upload has no other upload to cross with: none (not a stale model)
  only0 = np.array([True, False, False, False])
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'highest_similarity', 0, only0).numpy(), [-1, -1, -1, -1])
  # in_order: a partner that did not report is none too
  np.testing.assert_array_equal(
      ca.select_collaborators(sim, 'in_order', 1, eligible).numpy(), [-1, 3, -1, 1])
  rng = np.random.default_rng(3)
  for t in range(4):
    sim = rng.normal(size=[5, 5]).astype(np.float32)
    ok = rng.uniform(size=5) < 0.6
    for rule in constants.FEDCROSS_SELECTIONS:
      np.testing.assert_array_equal(ca.select_collaborators(sim, rule, t, ok).numpy(),
                                    np_select(sim, rule, t, ok))


@pytest.mark.parametrize('k', [2, 3, 4, 5, 7])
def test_in_order_pairs_every_model_with_every_other_once(k):
  seen = collections.Counter()
  for t in range(k - 1):
    c = ca.in_order_collaborators(k, t).numpy()
    assert np.all(c != np.arange(k))
    assert sorted(c) == list(range(k))  # a permutation: every model is someone's collaborator
    seen.update((i, int(c[i])) for i in range(k))
  assert set(seen) == {(i, j) for i in range(k) for j in range(k) if i != j}
  assert set(seen.values()) == {1}
  # and the schedule repeats with period K-1
  np.testing.assert_array_equal(ca.in_order_collaborators(k, k - 1).numpy(),
                                ca.in_order_collaborators(k, 0).numpy())


def test_k1_has_no_collaborator():
  models = random_models(np.random.default_rng(0), 1)
  sim = ca.cosine_similarity_matrix(ca.flatten_models(models))
  for rule in RULES:
    c = ca.select_collaborators(sim, rule, 3).numpy()
    np.testing.assert_array_equal(c, [-1])
    for got, want in zip(ca.cross_aggregate(models, c, 0.7), models):
      np.testing.assert_array_equal(got.numpy(), want)


def test_alpha_schedule_and_propellers():
  np.testing.assert_allclose(
      [ca.alpha_for_round(0.9, t, 4, True).numpy() for t in range(6)],
      [0.5, 0.6, 0.7, 0.8, 0.9, 0.9], rtol=1e-6)
  assert ca.alpha_for_round(0.9, 0, 4, False).numpy() == pytest.approx(0.9)
  assert ca.alpha_for_round(0.9, 0, 0, True).numpy() == pytest.approx(0.9)

  k, p = 5, 3
  np.testing.assert_array_equal(ca.in_order_propellers(k, p, 0).numpy(),
                                [[(i + d) % k for d in (1, 2, 3)] for i in range(k)])
  for t in range(6):
    props = ca.in_order_propellers(k, p, t).numpy()
    np.testing.assert_array_equal(props[:, 0], ca.in_order_collaborators(k, t).numpy())
    for i in range(k):
      assert len(set(props[i])) == p and i not in props[i]
  with pytest.raises(ValueError):
    ca.in_order_propellers(k, k, 0)

  rng = np.random.default_rng(1)
  models = random_models(rng, k)
  props = ca.in_order_propellers(k, p, 2).numpy()
  new = ca.propeller_aggregate(models, props, 0.8)
  for got, m in zip(new, models):
    want = np.stack([0.8 * m[i] + 0.2 * m[props[i]].mean(axis=0) for i in range(k)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)

  # in the server step: propellers + dynamic alpha during accel, the rule afterwards
  opts = dict(num_models=k, alpha=0.9, selection='lowest_similarity', alpha_schedule=True,
              num_propellers=p, accel_rounds=2)
  stepped, meas = ca.cross_aggregation_step(models, 1, **opts)
  props1 = ca.in_order_propellers(k, p, 1).numpy()
  assert meas['propellers_used'].numpy() == 1.0
  assert meas['alpha'].numpy() == pytest.approx(0.7)
  for got, m in zip(stepped, models):
    want = np.stack([0.7 * m[i] + 0.3 * m[props1[i]].mean(axis=0) for i in range(k)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
  # models 1 and 3 did not report: they keep their models, and the others' means are over
  # their propellers that did report (none: the model keeps its upload)
  ok = np.array([True, False, True, False, True])
  stepped, meas = ca.cross_aggregation_step(models, 1, eligible=ok, **opts)
  for got, m in zip(stepped, models):
    want = []
    for i in range(k):
      present = [j for j in props1[i] if ok[j]]
      want.append(0.7 * m[i] + 0.3 * m[present].mean(axis=0) if ok[i] and present else m[i])
    np.testing.assert_allclose(got.numpy(), np.stack(want), rtol=1e-5, atol=1e-6)
  first = [next((j for j in props1[i] if ok[j]), -1) if ok[i] else -1 for i in range(k)]
  np.testing.assert_array_equal(meas['collaborators'].numpy(), first)
  stepped, meas = ca.cross_aggregation_step(models, 2, **opts)
  assert meas['propellers_used'].numpy() == 0.0
  collab = np_select(np_cosine(flat_np(models)), 'lowest_similarity', 2)
  np.testing.assert_array_equal(meas['collaborators'].numpy(), collab)
  for got, want in zip(stepped, np_cross(models, collab, 0.9)):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_bad_options_are_refused():
  mf = make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
  opt = tff.learning.optimizers.build_sgdm(0.1)
  for kwargs in (dict(selection='random'), dict(alpha=1.5), dict(num_propellers=5),
                 dict(accel_rounds=-1), dict(similarity='cosine')):
    with pytest.raises(ValueError):
      build_fedcross(mf, opt, 16, 5, **kwargs)
  with pytest.raises(ValueError):
    build_fedcross(mf, opt, 16, 0)


def test_aggregation_process_on_its_own():
  """The stage alone: keyed upload by slot; a missing slot and one that did not report
  (weight 0) keep their models exactly and are nobody's collaborator; result = mean of the
  new models, round counter advances."""
  k, alpha = 4, 0.8
  weights_type = tff.StructWithPythonType(
      [('trainable', tff.StructWithPythonType(
          [tff.TensorType(np.float32, [4]), tff.TensorType(np.float32, [2, 2])], list)),
       ('non_trainable', tff.StructWithPythonType([tff.TensorType(np.float32, [])], list))],
      tff.learning.models.ModelWeights)

  @tff.tensorflow.computation
  def initial():
    return tff.learning.models.ModelWeights(
        trainable=[tf.ones([4]), tf.ones([2, 2])], non_trainable=[tf.constant(1.0)])

  proc = ca.build_cross_aggregation_process(
      weights_type, k, alpha=alpha, selection='lowest_similarity', initial_weights_fn=initial)
  state = proc.initialize()
  rng = np.random.default_rng(5)
  models = [[rng.normal(size=[4]).astype(np.float32),
             rng.normal(size=[2, 2]).astype(np.float32), np.float32(rng.normal())]
            for _ in range(k)]

  def value(slot):
    m = models[slot]
    return collections.OrderedDict(
        client_index=np.int32(slot), slot=np.int32(slot),
        model=tff.learning.models.ModelWeights(trainable=[m[0], m[1]], non_trainable=[m[2]]),
        last_epoch_loss=np.float32(0.0))

  # clients arrive in any order; slot 3 is missing, slot 2 did not report (weight 0)
  arrivals = [value(2), value(1), value(0)]
  weights = [np.float32(0.0), np.float32(2.0), np.float32(5.0)]
  out = proc.next(state, arrivals, weights)
  uploaded = [np.stack([models[0][i], models[1][i], np.ones_like(models[0][i]),
                        np.ones_like(models[0][i])]) for i in range(3)]
  sim = np_cosine(flat_np(uploaded))
  eligible = np.array([True, True, False, False])
  collab = np_select(sim, 'lowest_similarity', 0, eligible)
  np.testing.assert_array_equal(collab, [1, 0, -1, -1])
  np.testing.assert_array_equal(out.measurements['collaborators'], collab)
  np.testing.assert_array_equal(out.measurements['eligible'], eligible)
  np.testing.assert_allclose(out.measurements['similarity'], sim, atol=1e-5)
  want = np_cross(uploaded, collab, alpha)
  got = [np.asarray(t) for t in list(out.state['models'].trainable) +
         list(out.state['models'].non_trainable)]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g[2:], np.ones_like(g[2:]))  # pre-round, bit for bit
  result = [np.asarray(t) for t in list(out.result.trainable) + list(out.result.non_trainable)]
  for r, w in zip(result, want):
    np.testing.assert_allclose(r, w.mean(axis=0), rtol=1e-5, atol=1e-6)
  assert out.state['round_num'] == 1
  # the layer-wise similarity, same uploads
  proc_lw = ca.build_cross_aggregation_process(
      weights_type, k, alpha=alpha, selection='lowest_similarity', initial_weights_fn=initial,
      similarity='layerwise')
  out_lw = proc_lw.next(proc_lw.initialize(), arrivals, weights)
  sim_lw = np_layerwise(uploaded)
  np.testing.assert_allclose(out_lw.measurements['similarity'], sim_lw, atol=1e-5)
  np.testing.assert_array_equal(out_lw.measurements['collaborators'],
                                np_select(sim_lw, 'lowest_similarity', 0, eligible))
  # two uploads to one slot would overwrite one model and skip another: the round fails
  with pytest.raises(Exception, match='same slot'):
    proc.next(state, [value(0), collections.OrderedDict(value(1), slot=np.int32(0))],
              [np.float32(1.0), np.float32(1.0)])
  # a slot past K (a round of more clients than num_models) names the fix, not a gather
  with pytest.raises(Exception, match=r'outside \[0, num_models=4\).*at most 4 clients'):
    proc.next(state, [value(0), collections.OrderedDict(value(1), slot=np.int32(4))],
              [np.float32(1.0), np.float32(1.0)])


# --------------------------------------------------------------------------- #
# The LearningProcess
# --------------------------------------------------------------------------- #

MODEL_FN = make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
BATCH = 16


def optimizer():
  return tff.learning.optimizers.build_sgdm(learning_rate=0.1, momentum=0.5)


@pytest.fixture(scope='module')
def fed():
  return data.federate(data.load_digits(), data.IidPartitioner(10, seed=0))


@pytest.fixture(scope='module')
def process5():
  proc = build_fedcross(MODEL_FN, optimizer(), BATCH, 5)
  execution.initialize_runtime()
  return proc


@pytest.fixture(scope='module')
def local_train():
  """Reference: the shared loop run on one client from given weights (no federation)."""
  weights_type = model_delta.model_weights_type(MODEL_FN)
  data_type = local_training.client_data_type(model_delta.model_input_spec(MODEL_FN))

  @tff.tensorflow.computation(weights_type, data_type)
  def train(weights, dataset):
    model = MODEL_FN()
    run = local_training.build_local_training(model, optimizer(), BATCH)
    return run(weights, local_training.single_element(dataset)).model_weights

  execution.initialize_runtime()
  return train


def as_list(weights):
  return [np.asarray(t) for t in tf.nest.flatten(
      [list(weights.trainable), list(weights.non_trainable)])]


def stack_of(state):
  models = state.aggregator['models']
  return [np.asarray(t) for t in list(models.trainable) + list(models.non_trainable)]


run = helpers.run_async


def intrinsics_of(comp):
  from tensorflow_federated.python.core.impl.compiler import building_blocks, tree_analysis
  found = []

  def visit(bb):
    if isinstance(bb, building_blocks.Intrinsic):
      found.append((bb.uri, bb.type_signature))

  tree_analysis.visit_postorder(comp.to_building_block(), visit)
  return found


def test_one_model_down_and_one_up_per_client(process5):
  weights_type = model_delta.model_weights_type(MODEL_FN)
  intrinsics = intrinsics_of(process5.next)
  uris = [u for u, _ in intrinsics]
  assert 'federated_select' in uris
  # The model goes down only through federated_select; what is broadcast is the client
  # optimizer's hyperparameters (scalars), never a tensor of the model.
  broadcast = [leaf for uri, t in intrinsics if uri == 'federated_broadcast'
               for leaf in tff.structure.flatten(t.result.member)]
  assert broadcast and all(leaf.shape == () for leaf in broadcast), broadcast
  (select_type,) = [t for u, t in intrinsics if u == 'federated_select']
  # federated_select(keys@CLIENTS, max_key@SERVER, stack[K,...]@SERVER, fn) -> one model
  assert select_type.parameter[2].member.trainable[0].shape[0] == 5
  sent = select_type.result.member.element
  assert sent.is_equivalent_to(weights_type)
  assert select_type.parameter[0].member.shape == (1,)  # one key per client
  aggregates = [t for u, t in intrinsics if u == 'federated_aggregate']
  assert len(aggregates) == 1
  uploaded = aggregates[0].parameter[0].member
  assert uploaded[0]['model'].is_equivalent_to(weights_type)  # one model up per client
  assert uploaded[0]['slot'].dtype == np.int32
  acc = aggregates[0].parameter[1]
  # O(K·D) accumulator: K separate rows of one model each (accumulate_then_step.put_row), typed
  # with open sizes (they start empty: the zero accumulator TFF serialises holds no model)
  assert len(acc['models']) == 5
  assert all(row.is_assignable_from(weights_type) and not row.is_equivalent_to(weights_type)
             for row in acc['models'])
  # and the stage's own signature
  agg = ca.build_cross_aggregation_process(weights_type, 5)
  assert isinstance(agg, tff.templates.AggregationProcess)
  assert agg.is_weighted
  meas = agg.next.type_signature.result.measurements.member
  assert meas['similarity'].shape == (5, 5) and meas['collaborators'].shape == (5,)


def test_a_round_of_more_clients_than_models_names_the_fix(process5, fed):
  _, inputs = data.round_inputs(fed, 0, 6, 1, 0)  # slots 0..5 for K = 5
  with pytest.raises(Exception, match=r'outside \[0, num_models=5\).*at most 5 clients'):
    process5.next(process5.initialize(), [[x] for x in inputs])


def test_end_to_end_and_program_state_roundtrip(process5, fed, tmp_path):
  state = process5.initialize()
  init_global = as_list(process5.get_model_weights(state))
  for t in range(3):
    _, inputs = data.round_inputs(fed, t, 5, 1, seed=0)
    out = process5.next(state, [[x] for x in inputs])
    state = out.state
  m = out.metrics
  assert m['client_work']['train']['num_clients'] == 5
  assert np.isfinite(m['client_work']['train']['loss'])
  assert m['distributor']['dispatch_select'] == 1.0
  assert m['aggregator']['similarity'].shape == (5, 5)
  assert np.all(m['aggregator']['collaborators'] != np.arange(5))
  assert m['aggregator']['alpha'] == pytest.approx(0.99)
  assert state.aggregator['round_num'] == 3
  # the global model is the mean of the middleware models, and has moved
  glob = as_list(process5.get_model_weights(state))
  for g, s in zip(glob, stack_of(state)):
    np.testing.assert_allclose(g, s.mean(axis=0), rtol=1e-5, atol=1e-7)
  assert any(not np.allclose(a, b) for a, b in zip(glob, init_global))
  # the middleware models differ from each other
  assert not np.allclose(stack_of(state)[0][0], stack_of(state)[0][1])

  manager = tff.program.FileProgramStateManager(str(tmp_path))
  run(manager.save(state, 3))
  restored, version = run(manager.load_latest(process5.initialize()))
  assert version == 3
  for a, b in zip(tf.nest.flatten(stack_of(state)), tf.nest.flatten(stack_of(restored))):
    np.testing.assert_array_equal(a, b)
  assert restored.aggregator['round_num'] == 3
  _, inputs = data.round_inputs(fed, 3, 5, 1, seed=0)
  out_a = process5.next(state, [[x] for x in inputs])
  out_b = process5.next(restored, [[x] for x in inputs])
  for a, b in zip(stack_of(out_a.state), stack_of(out_b.state)):
    np.testing.assert_array_equal(a, b)

  # set_model_weights sets all K models (and the global model)
  reset = process5.set_model_weights(state, process5.get_model_weights(process5.initialize()))
  for s, w in zip(stack_of(reset), init_global):
    for k in range(5):
      np.testing.assert_array_equal(s[k], w)
  for a, b in zip(as_list(process5.get_model_weights(reset)), init_global):
    np.testing.assert_array_equal(a, b)


def test_learns_digits(process5, fed):
  state = process5.initialize()
  keras_model = zoo.build_keras_model('tiny_cnn', (8, 8, 1), 10, seed=0)
  acc = 0.0
  for t in range(10):
    _, inputs = data.round_inputs(fed, t, 5, 2, seed=1)
    state = process5.next(state, [[x] for x in inputs]).state
    if t >= 4:
      process5.get_model_weights(state).assign_weights_to(keras_model)
      acc = (keras_model.predict(fed.x_test, verbose=0).argmax(-1) == fed.y_test).mean()
      if acc > 0.5:
        break
  assert acc > 0.5, acc


def test_dispatch_upload_and_cross_match_reference(process5, fed, local_train):
  """K=5, alpha=0.99, one client without data: every step against an independent reference.

  Two rounds with different slot orders: each client must train the middleware model of
  its slot, and its upload must land in that slot.
  """
  k, alpha = 5, 0.99
  state = process5.initialize()
  x0, y0 = fed.client_arrays(0)
  empty = data.client_input(x0[:0], y0[:0], 1, np.random.default_rng(0), 9, 0)
  for t, order in enumerate([(0, 1, 2, 3, 4), (3, 0, 4, 2, 1)]):
    # client c (c < 4: data of client c; c = 4: no data) sits at slot order[c]
    inputs = [None] * k
    for c, s in enumerate(order):
      if c < 4:
        x, y = fed.client_arrays(c)
        inputs[s] = data.client_input(x, y, 1, np.random.default_rng([t, c]), c, s)
      else:
        inputs[s] = collections.OrderedDict(empty)
        inputs[s]['slot'] = np.int32(s)
    s_e = order[4]
    before = stack_of(state)
    out = process5.next(state, [[x] for x in inputs])
    # reference uploads: local training of the model at each client's slot
    uploads = [None] * k
    for s in range(k):
      if s == s_e:
        uploads[s] = [b[s] for b in before]  # the empty client returns what it received
      else:
        w = tff.learning.models.ModelWeights(trainable=[b[s] for b in before],
                                             non_trainable=[])
        uploads[s] = as_list(local_train(w, [inputs[s]]))
    uploaded = [np.stack([uploads[s][i] for s in range(k)]) for i in range(len(before))]
    eligible = np.array([s != s_e for s in range(k)])
    sim = np_cosine(flat_np(uploaded))
    np.testing.assert_allclose(out.metrics['aggregator']['similarity'], sim, atol=1e-4)
    collab = np_select(sim, 'lowest_similarity', t, eligible)
    np.testing.assert_array_equal(out.metrics['aggregator']['collaborators'], collab)
    assert s_e not in collab  # the untrained model is nobody's collaborator
    np.testing.assert_array_equal(out.metrics['aggregator']['eligible'], eligible)
    for got, want in zip(stack_of(out.state), np_cross(uploaded, collab, alpha)):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert out.metrics['client_work']['train']['num_clients'] == k
    assert out.metrics['client_work']['train']['num_examples'] == sum(
        len(inputs[s]['y']) for s in range(k))
    state = out.state


def test_build_fedcross_layerwise_similarity(fed):
  """The builder's `similarity` reaches the stage: tiny_cnn has 3 kernel/bias pairs, so a
  model's layer-wise similarity with itself is 3 + 1 (the last pair twice), not 1."""
  k = 3
  proc = build_fedcross(MODEL_FN, optimizer(), BATCH, k, similarity='layerwise')
  _, inputs = data.round_inputs(fed, 0, k, 1, seed=0)
  meas = proc.next(proc.initialize(), [[x] for x in inputs]).metrics['aggregator']
  sim = np.asarray(meas['similarity'])
  np.testing.assert_allclose(np.diag(sim), 4.0, atol=1e-5)
  np.testing.assert_array_equal(meas['collaborators'],
                                np_select(sim, 'lowest_similarity', 0))


def test_k1_equals_local_training(fed, local_train):
  proc = build_fedcross(MODEL_FN, optimizer(), BATCH, 1)
  state = proc.initialize()
  weights = proc.get_model_weights(state)
  for t in range(2):
    _, inputs = data.round_inputs(fed, t, 1, 1, seed=3)
    state = proc.next(state, [[inputs[0]]]).state
    weights = local_train(weights, [inputs[0]])
    for a, b in zip(as_list(proc.get_model_weights(state)), as_list(weights)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
