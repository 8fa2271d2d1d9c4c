"""Tests for data.client_faults: the seeded draw of each client's `work`, and round_inputs
filling it."""

import numpy as np
import pytest

from tff_algos.data.client_faults import ClientFaults
from tff_algos.data.round_sampling import client_input, round_inputs


def np_work(p, f, w, seed, round_num, client):
  """The definition, written out: three uniforms from default_rng([seed, round, client, 2])."""
  u = np.random.default_rng([seed, round_num, client, 2]).uniform(size=3)
  if u[0] < p:
    return 0.0
  if u[1] < f:
    return w + (1 - w) * u[2]
  return 1.0


def test_work_matches_its_definition_on_random_rates():
  rng = np.random.default_rng(0)
  for _ in range(20):
    p, f, w = rng.uniform(0, 0.99), rng.uniform(), rng.uniform(0.01, 1)
    faults = ClientFaults(p, f, w)
    for _ in range(20):
      seed, t, n = (int(v) for v in rng.integers(0, 1000, 3))
      assert faults.work(seed, t, n) == pytest.approx(np_work(p, f, w, seed, t, n), abs=0)


def test_rates_are_what_is_drawn():
  faults = ClientFaults(client_dropout=0.3, straggler_fraction=0.5, straggler_min_work=0.25)
  works = np.array([faults.work(1, t, n) for t in range(100) for n in range(50)])
  assert np.mean(works == 0) == pytest.approx(0.3, abs=0.03)
  lagging = works[(works > 0) & (works < 1)]
  assert len(lagging) / np.sum(works > 0) == pytest.approx(0.5, abs=0.03)
  assert lagging.min() >= 0.25 and lagging.max() < 1


def test_no_faults_is_full_work():
  faults = ClientFaults()
  assert {faults.work(s, t, n) for s in range(3) for t in range(5) for n in range(7)} == {1.0}


def test_work_depends_only_on_seed_round_and_client():
  faults = ClientFaults(0.4, 0.5)
  a = {(t, n): faults.work(3, t, n) for t in range(10) for n in range(10)}
  np.random.seed(99)   # no global or shared state is read: any call order gives the same
  b = {(t, n): faults.work(3, t, n) for n in reversed(range(10)) for t in reversed(range(10))}
  assert a == b
  assert a != {(t, n): faults.work(4, t, n) for t in range(10) for n in range(10)}


def test_paired_runs_see_the_same_clients():
  """Always three draws: the dropout-only run drops the clients the combined run drops, and
  the straggler-only run lags (by the same share) the combined run's stragglers."""
  both = ClientFaults(0.3, 0.4, 0.5)
  dropout_only = ClientFaults(0.3)
  stragglers_only = ClientFaults(straggler_fraction=0.4, straggler_min_work=0.5)
  for t in range(20):
    for n in range(20):
      w = both.work(0, t, n)
      assert (dropout_only.work(0, t, n) == 0) == (w == 0)
      if w > 0:
        assert stragglers_only.work(0, t, n) == w


@pytest.mark.parametrize('kwargs, match', [
    (dict(client_dropout=1.0), 'client_dropout must be in \\[0, 1\\)'),
    (dict(client_dropout=-0.1), 'client_dropout'),
    (dict(straggler_fraction=1.5), 'straggler_fraction must be in \\[0, 1\\]'),
    (dict(straggler_min_work=0.0), 'straggler_min_work must be in \\(0, 1\\]'),
    (dict(straggler_min_work=float('nan')), 'straggler_min_work must be a finite number'),
    (dict(client_dropout='0.1'), 'client_dropout must be a finite number'),
])
def test_bad_rates_are_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ClientFaults(**kwargs)


class _FakeFederated:
  num_clients = 6

  def client_arrays(self, n):
    return np.full([5, 2], n, np.float32), np.full([5], n, np.int32)


def test_round_inputs_fill_work_from_the_faults():
  faults = ClientFaults(0.3, 0.5)
  ids, inputs = round_inputs(_FakeFederated(), 4, 5, 1, seed=2, faults=faults)
  for n, inp in zip(ids, inputs):
    assert list(inp)[-1] == 'work' and inp['work'].dtype == np.float32
    assert inp['work'] == np.float32(np_work(0.3, 0.5, 0.5, 2, 4, int(n)))
  _, plain = round_inputs(_FakeFederated(), 4, 5, 1, seed=2)
  assert all(inp['work'] == 1 for inp in plain)
  for a, b in zip(inputs, plain):   # the faults change nothing else
    for key in ('x', 'y', 'order', 'index', 'slot'):
      np.testing.assert_array_equal(a[key], b[key])


def test_client_input_refuses_work_outside_0_1():
  with pytest.raises(ValueError, match='work must be in \\[0, 1\\]'):
    client_input(np.zeros([3, 2]), np.zeros([3]), 1, np.random.default_rng(0), 0, 0, 1.5)
