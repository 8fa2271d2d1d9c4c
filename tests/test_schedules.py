"""tff_algos.schedules: each schedule's factors against factors written out by hand; a scheduled
process against the same process whose rates are set by hand through TFF's hparams API before
each round (FedAvgM: client and server; SCAFFOLD: corrected client steps and its global rate;
FedCross: client, its server refused); a process stopped and rebuilt mid-schedule against the
unbroken one, bit for bit. (The program's flags: tests/test_method_flags.py; the program's
resume with schedules: tests/test_resume_methods.py.)
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest

from tff_algos import schedules
from tff_algos.schedules import Schedule

BATCH = 16
SIZES = (40, 13)
ROUNDS = 4
LR = 0.1


# --------------------------------------------------------------------------- #
# The factors
# --------------------------------------------------------------------------- #

def _cosine_by_hand(floor, span, s):
  """The cosine's factor in its round s of span (1-based), from the textbook formula."""
  return floor + (1 - floor) * (1 + np.cos(np.pi * min(s - 1, span - 1) / (span - 1))) / 2


# (schedule, its factors for rounds 1, 2, ... written out by hand)
BY_HAND = [
    (Schedule(), [1.0] * 12),
    (Schedule('exponential', decay=0.9), [0.9**k for k in range(40)]),
    (Schedule('step', decay=0.5, every=3),
     [1, 1, 1, .5, .5, .5, .25, .25, .25, .125, .125, .125, .0625]),
    (Schedule('step', decay=2.0, every=1), [2.0**k for k in range(20)]),
    (Schedule('cosine', floor=0.0, rounds=5), [1.0, (1 + np.sqrt(.5)) / 2, .5,
                                               (1 - np.sqrt(.5)) / 2, 0.0, 0.0, 0.0]),
    (Schedule('cosine', floor=0.1, rounds=50),
     [_cosine_by_hand(0.1, 50, s) for s in range(1, 60)]),
    (Schedule('cosine', floor=0.3, rounds=1), [1.0, 0.3, 0.3]),
    (Schedule(warmup_rounds=3), [.25, .5, .75] + [1.0] * 10),
    (Schedule('exponential', decay=0.5, warmup_rounds=1), [.5, 1, .5, .25, .125]),
    (Schedule('step', decay=0.1, every=2, warmup_rounds=4),
     [.2, .4, .6, .8, 1, 1, .1, .1, .01, .01, .001]),
    (Schedule('cosine', floor=0.2, rounds=7, warmup_rounds=2),
     [1 / 3, 2 / 3] + [_cosine_by_hand(0.2, 5, s) for s in range(1, 8)]),
]


@pytest.mark.parametrize('schedule, expected', BY_HAND)
def test_factors_match_factors_written_by_hand(schedule, expected):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rounds = np.arange(1, len(expected) + 1)
  np.testing.assert_allclose([schedule.factor_np(t) for t in rounds], expected, rtol=1e-12,
                             atol=1e-15)
  np.testing.assert_allclose(schedule.factor(tf.constant(rounds, tf.int32)).numpy(), expected,
                             rtol=1e-12, atol=1e-15)
  # The TF form over many rounds is its NumPy twin.
  many = np.arange(1, 301)
  np.testing.assert_allclose(schedule.factor(tf.constant(many)).numpy(),
                             [schedule.factor_np(t) for t in many], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize('kwargs, message', [
    (dict(kind='linear'), "kind='linear' is unknown"),
    (dict(kind='exponential', decay=0.0), 'decay must be a finite number > 0'),
    (dict(kind='exponential', decay=float('nan')), 'decay must be a finite number > 0'),
    (dict(kind='step', decay=0.5, every=0), 'every must be at least 1'),
    (dict(kind='step', decay=0.5, every=1.5), 'every must be a whole number'),
    (dict(kind='cosine', floor=1.5, rounds=3), r'floor must be in \[0, 1\]'),
    (dict(warmup_rounds=-1), 'warmup_rounds must be at least 0'),
    (dict(kind='cosine', rounds=3, warmup_rounds=3), 'needs rounds > warmup_rounds'),
    (dict(kind='step', rounds=3), 'rounds is read by a cosine schedule only'),
    (dict(kind='cosine', rounds=3, decay=0.5), 'decay is read by a exponential or step'),
    (dict(kind='exponential', decay=0.5, every=2), 'every is read by a step schedule only'),
    (dict(kind='step', decay=0.5, floor=0.1), 'floor is read by a cosine schedule only'),
])
def test_bad_schedules_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    Schedule(**kwargs)


# --------------------------------------------------------------------------- #
# Processes
# --------------------------------------------------------------------------- #

@pytest.fixture(scope='module')
def round_inputs(digits):
  """ROUNDS lists of two digits clients' inputs (one-element sequences; fresh batch orders
  every round; slot and index the client's position)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  cuts = np.cumsum((0,) + SIZES)
  return [[[data.client_input(digits.x_train[a:b], digits.y_train[a:b], 1,
                              np.random.default_rng([1, r, c]), c, c)]
           for c, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))] for r in range(ROUNDS)]


CLIENT = Schedule('step', decay=0.5, every=1, warmup_rounds=1)
SERVER = Schedule('cosine', floor=0.2, rounds=ROUNDS, warmup_rounds=1)


def _build(name, model_fn, sgd):
  """(process, client schedule, server schedule) of one method per kind of state."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  from tff_algos import fedcross  # pylint: disable=g-import-not-at-top
  from tff_algos import scaffold  # pylint: disable=g-import-not-at-top
  if name == 'fedavgm':   # TFF's composed process: client work and a server optimizer
    return (baselines.build_fedavgm(model_fn, sgd(LR, 0.5), BATCH, server_learning_rate=1.0,
                                    server_momentum=0.9), CLIENT, SERVER)
  if name == 'scaffold':   # its own next: corrected client steps, global rate eta_g
    return (scaffold.build_scaffold(model_fn, sgd(LR), BATCH, len(SIZES), len(SIZES),
                                    server_learning_rate=0.8), CLIENT, SERVER)
  return fedcross.build_fedcross(model_fn, sgd(LR), BATCH, len(SIZES)), CLIENT, None


def _rates(process, state) -> dict:
  hparams = process.get_hparams(state)
  return {part: np.float32(hparams[part]['learning_rate'])
          for part in ('client_work', 'finalizer') if 'learning_rate' in hparams[part]}


def _by_hand(process, inputs, client, server):
  """`process` with its rates set by hand (NumPy) before each round; (state, rates used)."""
  state = process.initialize()
  base = _rates(process, state)
  used = []
  for t, clients in enumerate(inputs, start=1):
    hparams = process.get_hparams(state)
    for part, schedule in (('client_work', client), ('finalizer', server)):
      if schedule is not None:
        hparams[part]['learning_rate'] = np.float32(
            np.float64(base[part]) * schedule.factor_np(t))
    state = process.set_hparams(state, hparams)
    used.append(_rates(process, state))
    state = process.next(state, clients).state
  return state, used


def _run(process, state, inputs, keep_after=None):
  """(state after `inputs`' rounds, the rates each trained at[, the state after round
  `keep_after`])."""
  rates, kept = [], None
  for t, clients in enumerate(inputs, start=1):
    rates.append(_rates(process, state))
    out = process.next(state, clients)
    if 'learning_rate' in out.metrics:   # a schedule's metrics: the rates the round used
      part = dict(client='client_work', server='finalizer')
      for side, rate in out.metrics['learning_rate'].items():
        assert np.float32(rate) == rates[-1][part[side]]
    state = out.state
    kept = state if t == keep_after else kept
  return (state, rates) if keep_after is None else (state, rates, kept)


def _assert_same_weights(process_a, state_a, process_b, state_b):
  got, want = (p.get_model_weights(s).trainable
               for p, s in ((process_a, state_a), (process_b, state_b)))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


@pytest.mark.usefixtures('runtime')
@pytest.mark.parametrize('name', ['fedavgm', 'scaffold', 'fedcross'])
def test_scheduled_rounds_equal_rates_set_by_hand_and_resume_exactly(
    name, round_inputs, tiny_model_fn, sgd):
  plain, client, server = _build(name, tiny_model_fn, sgd)
  scheduled = schedules.with_lr_schedules(plain, client=client, server=server)
  state, rates, half = _run(scheduled, scheduled.initialize(), round_inputs, keep_after=2)
  reference, by_hand = _by_hand(plain, round_inputs, client, server)
  assert rates == by_hand
  assert 'learning_rate' in dir(scheduled.next.type_signature.result.metrics.member)
  # The rates do follow the schedules (not the built rates throughout).
  assert len({r['client_work'] for r in rates}) == 3
  if server is not None:
    assert len({r['finalizer'] for r in rates}) == ROUNDS
  _assert_same_weights(scheduled, state, plain, reference)
  # Stopped after round 2 and continued by a process built anew: the unbroken run's bits.
  rebuilt = schedules.with_lr_schedules(_build(name, tiny_model_fn, sgd)[0], client=client,
                                        server=server)
  resumed, rest = _run(rebuilt, half, round_inputs[2:])
  assert rest == rates[2:]
  _assert_same_weights(rebuilt, resumed, scheduled, state)
  assert _rates(rebuilt, resumed) == _rates(scheduled, state)


@pytest.mark.usefixtures('runtime')
def test_state_carries_the_round_and_the_built_rates(tiny_model_fn, sgd):
  """The wrapped state: the process's, its distributor beside the round number and the
  built rates; the weights, hparams and set_model_weights are the process's."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  plain = baselines.build_fedavg(tiny_model_fn, sgd(LR), BATCH)
  scheduled = schedules.with_lr_schedules(plain, client=Schedule(warmup_rounds=1))
  state = scheduled.initialize()
  assert int(state.distributor['round_num']) == 0
  assert float(state.distributor['base_rates']['client_work']) == pytest.approx(LR)
  assert _rates(scheduled, state)['client_work'] == np.float32(LR / 2)
  weights = plain.get_model_weights(plain.initialize())
  zeros = weights._replace(trainable=[np.zeros_like(w) for w in weights.trainable])
  moved = scheduled.set_model_weights(state, zeros)
  assert all(not np.any(w) for w in scheduled.get_model_weights(moved).trainable)
  assert int(moved.distributor['round_num']) == 0
  # A rate set through set_hparams trains the next round; the schedule's follows it.
  hparams = scheduled.get_hparams(state)
  hparams['client_work']['learning_rate'] = np.float32(0.3)
  assert _rates(scheduled, scheduled.set_hparams(state, hparams))['client_work'] == np.float32(0.3)


@pytest.mark.usefixtures('runtime')
def test_the_schedule_sets_any_client_optimizers_rate(tiny_model_fn):
  """PyTorch's Adam with coupled weight decay (tff_algos.optimizers): only its rate moves."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  from tff_algos import optimizers  # pylint: disable=g-import-not-at-top
  adam = optimizers.with_weight_decay(optimizers.build_torch_adam(3e-4), 1e-5)
  plain = baselines.build_fedavg(tiny_model_fn, adam, BATCH)
  scheduled = schedules.with_lr_schedules(plain, client=Schedule(warmup_rounds=3))
  got = scheduled.get_hparams(scheduled.initialize())['client_work']
  want = plain.get_hparams(plain.initialize())['client_work']
  assert got['learning_rate'] == np.float32(np.float64(np.float32(3e-4)) / 4)
  assert {k: v for k, v in got.items() if k != 'learning_rate'} == {
      k: v for k, v in want.items() if k != 'learning_rate'}


@pytest.mark.usefixtures('runtime')
def test_rates_a_process_lacks_are_refused(tiny_model_fn, sgd):
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  from tff_algos import fedcross  # pylint: disable=g-import-not-at-top
  step = Schedule('step', decay=0.5, every=2)
  fedsgd = baselines.build_fedsgd(tiny_model_fn, client_batch_size=BATCH)
  with pytest.raises(ValueError, match='no local step, so no client rate'):
    schedules.with_lr_schedules(fedsgd, client=step)
  cross = fedcross.build_fedcross(tiny_model_fn, sgd(LR), BATCH, 2)
  with pytest.raises(ValueError, match='FedCross and FedCDA take no server step'):
    schedules.with_lr_schedules(cross, server=step)
  with pytest.raises(TypeError, match='must be a tff_algos.schedules.Schedule'):
    schedules.with_lr_schedules(cross, client='cosine')
  # Constant schedules leave the process as it is; a client exponential one without
  # warm-up is --client_lr_decay's (the rate multiplied in the state, its type unchanged).
  assert schedules.with_lr_schedules(fedsgd, client=Schedule(), server=None) is fedsgd
  decayed = schedules.with_lr_schedules(cross, client=Schedule('exponential', decay=0.5))
  assert decayed.initialize.type_signature == cross.initialize.type_signature
