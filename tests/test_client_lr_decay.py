"""tff_algos.client_lr_decay: the client rate times `decay` after every round, in the state.

The decayed process is checked against the plain process whose rate is set by hand through
TFF's hparams API before each round (the same rounds, clients and batch orders), on our FedAvg
and on TFF's own `build_weighted_fed_avg`; the program's flag and its resume are in
tests/test_method_flags.py and tests/test_resume_methods.py.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import baselines
from tff_algos import client_lr_decay
from tff_algos import data

BATCH = 16
SIZES = (40, 13)
ROUNDS = 3
LR = 0.1
DECAY = 0.5

pytestmark = pytest.mark.usefixtures('runtime')


@pytest.fixture(scope='module')
def round_inputs(digits):
  """ROUNDS lists of two digits clients' data (one-element sequences; fresh batch orders
  every round)."""
  ds = digits
  cuts = np.cumsum((0,) + SIZES)
  return [[[data.client_input(ds.x_train[a:b], ds.y_train[a:b], 2,
                              np.random.default_rng([0, r, c]), c, c)]
           for c, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))] for r in range(ROUNDS)]


def _client_lr(process, state) -> float:
  return float(process.get_hparams(state)['client_work']['learning_rate'])


def _by_hand(process, inputs):
  """`process` with its client rate set to LR * DECAY**(t - 1) before round t."""
  state = process.initialize()
  for t, clients in enumerate(inputs):
    hparams = process.get_hparams(state)
    hparams['client_work']['learning_rate'] = np.float32(LR * DECAY**t)
    state = process.next(process.set_hparams(state, hparams), clients).state
  return state


def _decayed(process, inputs):
  state = process.initialize()
  rates = []
  for clients in inputs:
    rates.append(_client_lr(process, state))
    state = process.next(state, clients).state
  return state, rates


def test_bad_arguments_are_refused(tiny_model_fn, sgd):
  process = baselines.build_fedavg(tiny_model_fn, sgd(LR), BATCH)
  for bad in (0.0, -0.5, float('inf'), float('nan'), True, '0.9'):
    with pytest.raises(ValueError, match='decay must be a finite number > 0'):
      client_lr_decay.with_client_lr_decay(process, bad)
  with pytest.raises(TypeError, match='wraps a tff.learning.templates.LearningProcess'):
    client_lr_decay.with_client_lr_decay(sgd(LR), 0.9)
  assert client_lr_decay.with_client_lr_decay(process, 1.0) is process


def test_a_process_without_a_client_rate_is_refused(tiny_model_fn):
  fedsgd = baselines.build_fedsgd(tiny_model_fn, client_batch_size=BATCH)
  with pytest.raises(ValueError, match='no local step, so no client rate'):
    client_lr_decay.with_client_lr_decay(fedsgd, 0.9)


def test_decay_equals_setting_the_rate_by_hand_each_round(round_inputs, tiny_model_fn, sgd):
  plain = baselines.build_fedavg(tiny_model_fn, sgd(LR), BATCH)
  decayed = client_lr_decay.with_client_lr_decay(plain, DECAY)
  assert decayed.next.type_signature == plain.next.type_signature
  assert decayed.initialize.type_signature == plain.initialize.type_signature
  state, rates = _decayed(decayed, round_inputs)
  expected = [np.float32(LR) * np.float32(DECAY)**t for t in range(ROUNDS + 1)]
  np.testing.assert_allclose(rates + [_client_lr(decayed, state)], expected, rtol=1e-6)
  reference = _by_hand(plain, round_inputs)
  got, want = (p.get_model_weights(s).trainable
               for p, s in ((decayed, state), (plain, reference)))
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
  # The decay reaches training: the constant rate ends elsewhere.
  constant = plain.initialize()
  for clients in round_inputs:
    constant = plain.next(constant, clients).state
  assert max(np.max(np.abs(g - c)) for g, c in
             zip(got, plain.get_model_weights(constant).trainable)) > 1e-3


def test_decay_on_tffs_own_process(round_inputs, tiny_model_fn, sgd):
  """Any LearningProcess with TFF's hparams API: TFF's FedAvg on `tf.data` clients."""
  from tests import helpers  # pylint: disable=g-import-not-at-top
  process = client_lr_decay.with_client_lr_decay(
      tff.learning.algorithms.build_weighted_fed_avg(tiny_model_fn, client_optimizer_fn=sgd(LR)),
      DECAY)
  state = process.initialize()
  for clients in round_inputs[:2]:
    state = process.next(state, [helpers.as_tff_dataset(c[0], BATCH) for c in clients]).state
  assert _client_lr(process, state) == pytest.approx(LR * DECAY**2, rel=1e-6)
  assert tf.nest.flatten(process.get_model_weights(state).trainable)
