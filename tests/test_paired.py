"""programs.studies.paired: the paired t interval against scipy, the seeds runs share, the
margins and what n seeds resolve, and the rows and cells the pages write."""

import numpy as np
import pytest
from scipy import stats

from programs.studies import paired


@pytest.mark.parametrize('seed', range(4))
def test_t_half_width_is_the_95_percent_paired_interval(seed):
  values = np.random.default_rng(seed).normal(1, 2, 2 + seed)
  n = len(values)
  want = stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / np.sqrt(n)
  assert paired.t_half_width(values) == pytest.approx(want)
  # scipy's own interval of the mean has the same half-width
  low, high = stats.t.interval(0.95, n - 1, loc=np.mean(values), scale=stats.sem(values))
  assert paired.t_half_width(values) == pytest.approx((high - low) / 2)


def test_t_half_width_closed_form_and_one_value():
  # t(0.975, 2 degrees of freedom) = 4.302653; the values' std is 1
  assert paired.t_half_width([1.0, 2.0, 3.0]) == pytest.approx(4.302653 / np.sqrt(3), rel=1e-6)
  assert np.isnan(paired.t_half_width([1.0])) and np.isnan(paired.t_half_width([]))


@pytest.mark.parametrize('seed', range(3))
def test_resolution_is_the_half_width_at_a_given_std(seed):
  values = np.random.default_rng(seed).normal(0, 3, 3 + seed)
  std = np.std(values, ddof=1)
  assert paired.resolution(len(values), std) == pytest.approx(paired.t_half_width(values))
  assert paired.resolution(3) == pytest.approx(4.302653 / np.sqrt(3), rel=1e-6)
  assert np.isnan(paired.resolution(1))


def test_paired_seeds_are_the_seeds_every_side_holds_in_order():
  method, base, third = {2: 'm', 0: 'm', 1: 'm'}, {1: 'b', 2: 'b', 5: 'b'}, {2: 't'}
  assert paired.paired_seeds(method, base) == [1, 2]
  assert paired.paired_seeds(method, base, third) == [2]
  assert paired.paired_seeds(method) == [0, 1, 2]
  assert paired.paired_seeds(method, {}) == [] and paired.paired_seeds() == []


@pytest.mark.parametrize('seed', range(3))
def test_paired_margin_against_numpy(seed):
  rng = np.random.default_rng(seed)
  method, base = rng.uniform(0.6, 0.9, 3), rng.uniform(0.6, 0.9, 3)
  figure = paired.paired_margin(list(method), list(base), scale=100)
  np.testing.assert_allclose(figure['margins'], 100 * (method - base))
  assert figure['margin'] == pytest.approx(np.mean(100 * (method - base)))
  assert figure['half_width'] == pytest.approx(paired.t_half_width(100 * (method - base)))
  empty = paired.paired_margin([], [])
  assert empty['margins'] == [] and np.isnan(empty['margin']) and np.isnan(empty['half_width'])


def test_margin_text_writes_the_mean_its_interval_and_each_seed():
  figure = dict(margins=[1.0, 2.0, 3.0], margin=2.0, half_width=2.484)
  assert paired.margin_text(figure) == '+2.00 ± 2.48 (+1.00, +2.00, +3.00)'
  assert paired.margin_text(figure, per_seed=False) == '+2.00 ± 2.48'
  one = paired.paired_margin([0.5], [0.7], scale=100)
  assert paired.margin_text(one) == '-20.00 (one seed)'
  assert paired.margin_text(paired.paired_margin([], [])) == 'n/a'


def test_one_value_has_no_spread():
  """Over one seed there is no spread: NaN, shown as "(one seed)", never as "± 0.00"."""
  mean, std = paired.mean_std([0.5])
  assert mean == 0.5 and np.isnan(std) and all(np.isnan(paired.mean_std([])))
  assert paired.mean_and_spread(*paired.mean_std([50.0])) == '50.00 (one seed)'
  values = [0.61, 0.58, 0.64]
  assert paired.mean_std(values) == (pytest.approx(np.mean(values)),
                                     pytest.approx(np.std(values, ddof=1)))
  assert paired.over_seeds(values, scale=100) == (
      f'{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1):.2f}')
  assert paired.over_seeds([0.02], scale=100, signed=True) == '+2.00 (one seed)'
  assert paired.over_seeds([None, float('nan')]) == 'n/a'


def test_paired_row_over_the_paired_seeds():
  """A row's cells are computed over the seeds both runs finished, named in its second
  cell."""
  method, base = {0: 0.8, 1: 0.7, 2: 0.9}, {1: 0.6, 2: 0.5}
  seen = []

  def cells(seeds):
    seen.append(seeds)
    return [paired.over_seeds(paired.margins([method[s] for s in seeds],
                                             [base[s] for s in seeds]), scale=100,
                              signed=True), 'x']

  row = paired.paired_row('m vs b', (method, base), cells, 4)
  assert seen == [[1, 2]]
  margins = [0.7 - 0.6, 0.9 - 0.5]
  assert row == (f'| m vs b | 1, 2 | +{100 * np.mean(margins):.2f} ± '
                 f'{100 * np.std(margins, ddof=1):.2f} | x |')


@pytest.mark.parametrize('sides, text', [
    (({0: 1}, {1: 1}), 'no paired seed finished'),
    (({},), 'none finished'),
    (({0: 1}, {0: 1}, {}), 'no seed finished in all three'),
])
def test_paired_row_when_no_seed_pairs(sides, text):
  """No cell is computed; the row says so and keeps the table's width."""
  def cells(seeds):
    raise AssertionError(f'cells computed over {seeds}')

  row = paired.paired_row('m vs b', sides, cells, 6)
  assert row == f'| m vs b | {text} | | | | |'
  assert row.count('|') == 6 + 1
