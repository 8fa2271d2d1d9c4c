"""benchmarks/report.py: verdicts, statistics, and the committed pages regenerate byte for byte."""

import csv
import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest

from benchmarks import fedprox_pull, report, suites


@pytest.mark.parametrize('paper, ours, spread, want, sign', [
    (6.8, 4.0, 1.0, 'reproduced', 0),    # paper's sign, >= half, above the spread
    (6.8, 3.4, 1.0, 'reproduced', 0),    # exactly half
    (6.8, 3.0, 1.0, 'smaller', 0),
    (6.8, 0.9, 1.0, 'within noise', 0),
    (6.8, -0.9, 1.0, 'within noise', 0),
    (6.8, -2.0, 1.0, 'opposite', 0),
    (-1.0, -2.0, 0.5, 'reproduced', 0),  # a paper that reports a loss: the sign is what counts
    (6.8, float('nan'), 1.0, 'not run', 0),
    (float('nan'), 3.0, 1.0, 'no paper figure', 0),
    (float('nan'), 3.0, 1.0, 'reproduced (sign)', 1),   # the paper's numbers were lost
    (float('nan'), -3.0, 1.0, 'opposite', 1),
])
def test_verdict(paper, ours, spread, want, sign):
  assert report.verdict(paper, ours, spread, sign) == want


@pytest.mark.parametrize('seed', range(4))
def test_verdict_spread_is_the_largest_of_three_stds(seed):
  rng = np.random.default_rng(seed)
  n = 2 + seed
  base = rng.uniform(60, 90, n)
  method = base + rng.normal(2, rng.uniform(0.1, 10), n)
  margins = method - base
  want = max(np.std(margins, ddof=1), np.std(base, ddof=1), np.std(method, ddof=1))
  assert report.verdict_spread(list(margins), list(base), list(method)) == pytest.approx(want)
  assert np.isnan(report.verdict_spread([1.0], [80.0], [81.0]))   # one seed: no spread


@pytest.mark.parametrize('margin, sign, want', [
    (6.82, 0, '+6.82'), (-1.5, 1, '-1.50'),      # a figure wins over the sign
    (float('nan'), 1, 'a gain (sign only)'), (float('nan'), -1, 'a loss (sign only)'),
    (float('nan'), 0, 'n/a')])
def test_paper_margin_text_states_a_sign_only_claim(margin, sign, want):
  assert report.paper_margin_text(dict(paper_margin=margin, paper_sign=sign)) == want


@pytest.mark.parametrize('figures, want', [
    (dict(paper_baseline=71.81, paper_method=78.63, paper_margin=6.82,
          paper_dataset='Fashion-MNIST'), '71.81 → 78.63 (+6.82, Fashion-MNIST)'),
    (dict(paper_baseline=None, paper_method=None, paper_margin=float('nan'), paper_sign=1,
          paper_dataset='CIFAR-10'), 'a gain (sign only); CIFAR-10'),
    (dict(paper_baseline=None, paper_method=None, paper_margin=float('nan'), paper_dataset=''),
     'n/a')])
def test_paper_text_gives_the_papers_figures_where_it_has_them(figures, want):
  assert report.paper_text(figures) == want


def _curve_run(rounds, accuracy) -> dict:
  """A loaded run's curve, as load_run gives it."""
  return dict(curve_rounds=list(rounds), curve_accuracy=list(accuracy))


def _evaluated(total, every, last=10) -> list:
  """The rounds a run of `total` rounds evaluates at --eval_every=every, --eval_last=last."""
  from programs import experiment  # pylint: disable=g-import-not-at-top
  config = experiment.ExperimentConfig(rounds=total, eval_every=every, eval_last=last)
  return [r for r in range(1, total + 1) if experiment.evaluated_round(r, config)]


def test_plateau_delta_is_the_move_between_the_last_two_windows():
  rng = np.random.default_rng(0)
  curves = [np.clip(np.linspace(0.2, 0.8, 200) + rng.normal(0, 0.01, 200), 0, 1)
            for _ in range(3)]
  w, moved = report.plateau_delta([_curve_run(range(1, 201), c) for c in curves])
  mean = np.mean(curves, axis=0) * 100
  assert w == 50
  assert moved == pytest.approx(mean[-50:].mean() - mean[-100:-50].mean())
  w, moved = report.plateau_delta([_curve_run(range(1, 41), np.full(40, 0.7))])
  assert (w, moved) == (10, 0.0)


def test_sparsely_evaluated_runs_are_read_by_round():
  """Runs evaluated every 5 rounds and each of their last 10: the windows, the mean curve,
  the last-10 means and the headline figures are by round, against numpy on random curves."""
  rng = np.random.default_rng(3)
  rounds = _evaluated(300, 5)
  assert rounds[:3] == [5, 10, 15] and rounds[-12:] == [285, 290] + list(range(291, 301))
  full = [rng.uniform(0.3, 0.9, 300) for _ in range(3)]
  runs = [_curve_run(rounds, f[np.array(rounds) - 1]) for f in full]
  x, mean, std = report.mean_curve(runs)
  np.testing.assert_array_equal(x, rounds)
  stacked = np.array([f[np.array(rounds) - 1] for f in full])
  np.testing.assert_allclose(mean, stacked.mean(0))
  np.testing.assert_allclose(std, stacked.std(0, ddof=1))
  w, moved = report.plateau_delta(runs)
  by_round = dict(zip(rounds, stacked.mean(0)))
  last = [v for r, v in by_round.items() if r > 250]
  before = [v for r, v in by_round.items() if 200 < r <= 250]
  assert w == 50 and len(before) == 10 and len(last) == 18
  assert moved == pytest.approx(100 * (np.mean(last) - np.mean(before)))
  # last-10 means: the last 10 evaluations up to the round (rounds 291-300 at the end,
  # 205-250 at round 250, which a run evaluated every round would read as 241-250)
  for end, window in ((300, range(291, 301)), (250, range(205, 251, 5)),
                      (253, range(205, 251, 5))):
    assert report.last10_at(runs[0], end) == pytest.approx(full[0][np.array(window) - 1].mean())
  figures = report._curve_figures(list(zip(rounds, runs[0]['curve_accuracy'])), 300)  # pylint: disable=protected-access
  assert figures['last10_mean_accuracy'] == pytest.approx(full[0][290:].mean())
  assert figures['final_accuracy'] == full[0][299]
  # the mean curve holds only the rounds every run evaluated
  x, _, _ = report.mean_curve([runs[0], _curve_run(range(1, 301), full[1])])
  np.testing.assert_array_equal(x, rounds)


# The toy suites' runs and their algorithms (what each run's config.json records).
TOY_ALGORITHMS = {'base': 'fedavg', 'new': 'fedcda'}


def _write_run(path, rounds, accuracy, seconds=1.0, summary_rounds=None, config=None,
               round_seconds=None, columns=None):
  """A run directory as the program writes it; config.json records `config`, by default
  the toy run's algorithm (from the directory's name) and `rounds`; metrics.csv has a
  round_seconds column when it is given (runs recorded before 2026-11-25 have none), and any
  further `columns` ({name: a value per round}); `seconds` is one value or one per round."""
  columns = columns or {}
  os.makedirs(path)
  if config is None:
    run = os.path.basename(str(path)).rsplit('_', 1)[0]
    config = dict(algorithm=TOY_ALGORITHMS[run]) if run in TOY_ALGORITHMS else {}
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(dict(config, rounds=rounds), f)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'seconds', 'test_accuracy']
                    + ([] if round_seconds is None else ['round_seconds']) + list(columns))
    for r, a in enumerate(accuracy, 1):
      writer.writerow([r, seconds if np.isscalar(seconds) else seconds[r - 1], a]
                      + ([] if round_seconds is None else [round_seconds])
                      + [v[r - 1] for v in columns.values()])
  with open(os.path.join(path, 'summary.json'), 'w') as f:
    json.dump(dict(rounds=summary_rounds or rounds, client_epochs_training=rounds), f)


def _paired_toy_suite(rounds, tmp_path, monkeypatch):
  """A suite of two runs, 'new' compared against 'base', whose runs live under tmp_path."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  return suites.Suite(
      name='toy', title='toy', common=dict(rounds=rounds), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg'), new=dict(algorithm='fedcda')),
      comparisons=(suites.Comparison('new', 'base', 'toy setting', 'toy'),))


def test_pages_name_runs_that_dropped_clients_and_give_each_seeds_margin(tmp_path,
                                                                         monkeypatch):
  """A run that left non-finite clients out of some rounds is named with those rounds; the
  headline margin lists each paired seed's margin after mean ± std (numpy's)."""
  suite = _paired_toy_suite(12, tmp_path, monkeypatch)
  rng = np.random.default_rng(21)
  acc = {(run, s): rng.uniform(0.3, 0.9, 12) for run in ('base', 'new') for s in (0, 1, 2)}
  for (run, s), a in acc.items():
    dropped = [0] * 12
    if (run, s) == ('new', 1):
      dropped[0], dropped[6] = 1, 2
    _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 12, a,
               columns={'dropped_clients': dropped})
  page, _, _ = report.suite_page(suite)
  assert ('Clients left out of a round because their update was not finite (the round '
          'aggregates the others; metrics.csv `dropped_clients`): `new` seed 1 (1 in round 1, '
          '2 in round 7).') in page
  diffs = [100 * (acc['new', s][2:].mean() - acc['base', s][2:].mean()) for s in (0, 1, 2)]
  text = (f'{np.mean(diffs):+.2f} ± {np.std(diffs, ddof=1):.2f} (per seed '
          + ', '.join(f'{d:+.2f}' for d in diffs) + ')')
  assert f'| {text} |' in page
  shutil.rmtree(tmp_path / 'toy' / 'runs' / 'new_s1')
  _write_run(tmp_path / 'toy' / 'runs' / 'new_s1', 12, acc['new', 1])
  assert 'not finite' not in report.suite_page(suite)[0]


def test_verdicts_name_the_seeds_that_never_left_chance(tmp_path, monkeypatch):
  """A finished run whose test accuracy never passed 11% (ten classes) stays in the means,
  and its comparison's verdict names it: one such seed sets the margin's spread. A run that
  passed it once is not named."""
  suite = _paired_toy_suite(12, tmp_path, monkeypatch)
  rng = np.random.default_rng(3)
  for run, s in [(run, s) for run in ('base', 'new') for s in (0, 1, 2)]:
    acc = rng.uniform(0.5, 0.9, 12)
    if (run, s) == ('new', 1):
      acc = np.full(12, 0.1)
    if (run, s) == ('base', 2):   # at chance but once, at 11.5%
      acc = np.full(12, 0.1)
      acc[4] = 0.115
    _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 12, acc)
  (row,) = report.compare_runs(suite, report.collect(suite), {})
  assert row['stuck'] == [('new', 1)] and row['seeds'] == [0, 1, 2]
  assert report.verdict_text(row) == f'**{row["verdict"]}** (new seed 1 never left chance)'
  page, _, _ = report.suite_page(suite)
  assert f'| {report.margin_text(row)} | {report.verdict_text(row)} |' in page
  row['stuck'] = []
  assert report.verdict_text(row) == f'**{row["verdict"]}**'


def test_verdicts_name_the_seeds_that_fell_back_to_chance(tmp_path, monkeypatch):
  """A finished run that learned, then ended at chance (a late blow-up), stays in the means,
  and its comparison's verdict names the round its last stretch at chance began; a run that
  dipped to chance and recovered, or one that never left it, is not named so."""
  suite = _paired_toy_suite(12, tmp_path, monkeypatch)
  rng = np.random.default_rng(4)
  for run, s in [(run, s) for run in ('base', 'new') for s in (0, 1, 2)]:
    acc = rng.uniform(0.5, 0.9, 12)
    if (run, s) == ('new', 2):   # learned to round 8, at chance from round 9 (1-based)
      acc[8:] = 0.1
      acc[3] = 0.1               # an earlier dip that recovered is not the stretch
    if (run, s) == ('base', 1):  # dipped to chance and recovered
      acc[5:8] = 0.1
    if (run, s) == ('new', 0):   # never left chance
      acc = np.full(12, 0.1)
    _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 12, acc)
  (row,) = report.compare_runs(suite, report.collect(suite), {})
  assert row['collapsed'] == [('new', 2, 9)] and row['stuck'] == [('new', 0)]
  assert report.verdict_text(row) == (f'**{row["verdict"]}** (new seed 0 never left chance; '
                                      'new seed 2 fell to chance at round 9)')
  page, _, _ = report.suite_page(suite)
  assert f'| {report.margin_text(row)} | {report.verdict_text(row)} |' in page


def test_margin_table_says_how_sparse_runs_are_read(tmp_path, monkeypatch):
  """With runs evaluated every 5 rounds, the margin-over-rounds text says a row reads the last
  10 evaluations (50 rounds), not the last 10 rounds; with every round evaluated, it does not."""
  suite = _paired_toy_suite(60, tmp_path, monkeypatch)
  rng = np.random.default_rng(4)
  for run, algorithm in TOY_ALGORITHMS.items():
    for s in (0, 1):
      a = rng.uniform(0.3, 0.9, 60)
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 60, a,
                 config=dict(algorithm=algorithm, eval_every=1))
  page = report.suite_page(suite)[0]
  assert 'Last-10-round mean test accuracy (%) of each baseline ending at each round' in page
  assert 'last 10 evaluations' not in page
  for run, algorithm in TOY_ALGORITHMS.items():
    for s in (0, 1):
      shutil.rmtree(tmp_path / 'toy' / 'runs' / f'{run}_s{s}')
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 60, rng.uniform(0.3, 0.9, 60),
                 config=dict(algorithm=algorithm, eval_every=5))
  page = report.suite_page(suite)[0]
  assert ('Mean test accuracy (%) over each run\'s last 10 evaluations up to each round: the '
          'last 10 rounds of a run evaluated every round, the last 50 rounds of one evaluated '
          'every 5 rounds') in page


def test_margins_start_where_every_run_has_ten_evaluations(tmp_path, monkeypatch):
  """A run evaluated every 5th round has 10 evaluations only from round 50: the margins over
  rounds (table and notes) start there, not at round 10 with a mean of two early rounds (a
  spike there was once reported as the "largest margin"); runs evaluated every round start
  at round 10 as before."""
  suite = _paired_toy_suite(100, tmp_path, monkeypatch)
  evaluated = _evaluated(100, 5)
  rng = np.random.default_rng(6)
  curves = {}
  for run, algorithm in TOY_ALGORITHMS.items():
    for s in (0, 1):
      a = np.linspace(0.3, 0.8, 100) + rng.normal(0, 0.01, 100) + (0.05 if run == 'new' else 0)
      if run == 'new':
        a[4:10] += 0.4   # a 40-point lead at rounds 5 and 10, gone by round 15
      curves[run, s] = a
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 100,
                 [f'{x}' if r in evaluated else '' for r, x in enumerate(a, 1)],
                 config=dict(algorithm=algorithm, eval_every=5))
  runs = report.collect(suite)
  comparisons = report.compare_runs(suite, runs, {})
  table = report.margins_over_rounds(runs, comparisons)['toy']
  assert [r['round'] for r in table] == [50, 60, 70, 80, 90, 100]
  every = report.margins_over_rounds(runs, comparisons, every_round=True)['toy']
  assert every[0]['round'] == 50 and every[-1]['round'] == 100
  for row in (table[0], every[-1]):
    tail = lambda run, s: curves[run, s][[r - 1 for r in evaluated if r <= row['round']][-10:]]
    diffs = [100 * (tail('new', s).mean() - tail('base', s).mean()) for s in (0, 1)]
    assert row['margin'] == pytest.approx(np.mean(diffs))
  (note,) = report.margin_notes(runs, comparisons)
  assert 'at round 10 ' not in note and max(r['margin'] for r in every) < 20  # not ~45
  dense = report.margins_over_rounds(
      {run: {s: dict(_curve_run(range(1, 101), curves[run, s]), rounds=100) for s in (0, 1)}
       for run in runs},
      comparisons)['toy']
  assert [r['round'] for r in dense] == list(range(10, 101, 10))


def test_a_pair_at_different_cadences_is_read_at_the_rounds_both_evaluated(tmp_path,
                                                                           monkeypatch):
  """A probe's method, evaluated every 5th round, against a baseline it keeps unchanged,
  evaluated every round: each seed's margin at a round is numpy's over the last 10 rounds
  both evaluated (the baseline's last 10 rounds would be 41-50 at round 50 while the
  method's are 5-50, its warmup included: a -4 point "margin" was once published so)."""
  suite = _paired_toy_suite(100, tmp_path, monkeypatch)
  sparse = _evaluated(100, 5)
  rng = np.random.default_rng(8)
  curves = {(run, s): np.linspace(0.3, 0.8, 100) + rng.normal(0, 0.02, 100)
            + (0.05 if run == 'new' else 0) for run in ('base', 'new') for s in (0, 1)}
  runs = {run: {s: dict(_curve_run(sparse if run == 'new' else range(1, 101),
                                   [curves[run, s][r - 1] for r in
                                    (sparse if run == 'new' else range(1, 101))]),
                        rounds=100) for s in (0, 1)} for run in ('base', 'new')}
  for seeds in runs.values():
    for r in seeds.values():
      r.update(finished=True, rounds_done=100, last10_mean_accuracy=np.mean(
          r['curve_accuracy'][-10:]), config={}, dir='')
  comparisons = [dict(label='toy', method='new', baseline='base', seeds=[0, 1])]
  rows = report.margins_over_rounds(runs, comparisons, every_round=True)['toy']
  assert rows[0]['round'] == 50
  for row in rows:
    common = [r - 1 for r in sparse if r <= row['round']][-10:]
    diffs = [100 * (curves['new', s][common].mean() - curves['base', s][common].mean())
             for s in (0, 1)]
    assert row['margin'] == pytest.approx(np.mean(diffs))
  assert rows[-1]['margin'] == pytest.approx(np.mean(   # the last 10 rounds: the headline's
      [100 * (curves['new', s][-10:].mean() - curves['base', s][-10:].mean()) for s in (0, 1)]))
  a, b = report.on_common_rounds(runs['base'][0], runs['new'][0])
  assert a['curve_rounds'] == b['curve_rounds'] == sparse
  assert a['best_accuracy'] == pytest.approx(curves['base', 0][[r - 1 for r in sparse]].max())
  assert runs['base'][0]['curve_rounds'] == list(range(1, 101))   # copies: the runs kept
  # A baseline stopped at round 70: no row after it (a frozen margin repeated to 100).
  stopped = [(r, a) for r, a in zip(runs['base'][1]['curve_rounds'],
                                    runs['base'][1]['curve_accuracy']) if r <= 70]
  runs['base'][1] = dict(runs['base'][1],
                         **report._curve_figures(stopped, 100))  # pylint: disable=protected-access
  assert report.margins_over_rounds(runs, comparisons, every_round=True)['toy'][-1]['round'] == 70


def test_common_evaluations_blank_what_the_other_run_did_not_evaluate():
  """A recorded NaN counts as evaluated (as load_run reads it); runs of different rounds are
  refused rather than paired by position."""
  one = [{'round': '1', 'test_accuracy': '0.5'}, {'round': '2', 'test_accuracy': ''},
         {'round': '3', 'test_accuracy': 'nan'}]
  two = [{'round': '1', 'test_accuracy': ''}, {'round': '2', 'test_accuracy': '0.7'},
         {'round': '3', 'test_accuracy': '0.6'}]
  a, b = report.common_evaluations(one, two)
  assert [r['test_accuracy'] for r in a] == ['', '', 'nan']
  assert [r['test_accuracy'] for r in b] == ['', '', '0.6']
  assert one[0]['test_accuracy'] == '0.5'   # copies
  with pytest.raises(ValueError, match='same rounds'):
    report.common_evaluations(one, two[:2])


def test_comparison_numbers_match_numpy(tmp_path, monkeypatch):
  """Three paired seeds of a synthetic suite: means, stds and the paired margin are numpy's,
  a stopped run is listed but left out, and an extra seed is shown, not dropped."""
  suite = _paired_toy_suite(30, tmp_path, monkeypatch)
  rng = np.random.default_rng(1)
  tails = {}
  for run, level in (('base', 0.6), ('new', 0.7)):
    for seed in (0, 1, 2):
      acc = np.clip(level + rng.normal(0, 0.02, 30), 0, 1)
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 30, acc)
      tails[run, seed] = acc[-10:].mean()
  _write_run(tmp_path / 'toy' / 'runs' / 'new_s7', 30, np.full(12, 0.5), summary_rounds=12)
  paper = {'toy setting': dict(dataset='D', baseline=50.0, method=60.0)}
  runs = report.collect(suite)
  (row,) = report.compare_runs(suite, runs, paper)
  diffs = [tails['new', s] - tails['base', s] for s in (0, 1, 2)]
  assert row['seeds'] == [0, 1, 2]
  assert row['margin'] == pytest.approx(100 * np.mean(diffs))
  assert row['margin_std'] == pytest.approx(100 * np.std(diffs, ddof=1))
  assert row['method_mean'] == pytest.approx(np.mean([tails['new', s] for s in (0, 1, 2)]))
  assert row['baseline_std'] == pytest.approx(
      np.std([tails['base', s] for s in (0, 1, 2)], ddof=1))
  assert row['paper_margin'] == 10.0
  assert row['verdict'] == 'reproduced'
  assert not runs['new'][7]['finished'] and runs['new'][7]['rounds_done'] == 12
  page, _, _ = report.suite_page(suite)
  assert '| new | 7 |' in page and 'stopped after round 12 of 30' in page


def test_a_part_made_comparison_shows_both_runs_over_the_paired_seeds(tmp_path, monkeypatch):
  """While a suite is part made (two seeds of the baseline, one of the method) the shown
  baseline and method are over the paired seed, so that method - baseline is the margin."""
  suite = _paired_toy_suite(20, tmp_path, monkeypatch)
  for run, seed, level in (('base', 0, 0.8), ('base', 1, 0.6), ('new', 0, 0.7)):
    _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 20, np.full(20, level))
  (row,) = report.compare_runs(suite, report.collect(suite), {})
  assert row['seeds'] == [0] and row['margin'] == pytest.approx(-10.0)
  assert row['baseline_mean'] == pytest.approx(0.8)
  assert row['method_mean'] - row['baseline_mean'] == pytest.approx(row['margin'] / 100)


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_committed_suite_pages_regenerate_byte_for_byte(name):
  page, comparisons, _ = report.suite_page(suites.SUITES[name])
  with open(os.path.join(suites.suite_dir(name), 'results.md')) as f:
    assert f.read() == page, f'run python -m benchmarks.report: {name}/results.md is stale'
  with open(os.path.join(suites.suite_dir(name), 'results.json')) as f:
    assert f.read() == comparisons


def test_committed_reproduction_page_regenerates_byte_for_byte():
  with open(report.REPRODUCTION) as f:
    assert f.read() == report.reproduction_page()


def test_cadis_diagnosis_regenerates_byte_for_byte():
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  with open(cadis_diagnosis.OUT) as f:
    assert f.read() == cadis_diagnosis.page()


def test_fedcross_diagnosis_regenerates_byte_for_byte():
  from benchmarks import fedcross_diagnosis  # pylint: disable=g-import-not-at-top
  with open(fedcross_diagnosis.OUT) as f:
    assert f.read() == fedcross_diagnosis.page(), 'run python -m benchmarks.fedcross_diagnosis'


def test_fedcda_diagnosis_regenerates_byte_for_byte():
  from benchmarks import fedcda_diagnosis  # pylint: disable=g-import-not-at-top
  with open(fedcda_diagnosis.OUT) as f:
    assert f.read() == fedcda_diagnosis.page(), 'run python -m benchmarks.fedcda_diagnosis'


@pytest.mark.parametrize('seed', range(3))
def test_fedcda_diagnosis_statistics_on_random_rows(seed):
  """fedcda_diagnosis's window figures and selection statistics against direct numpy on
  random recorded rounds (some not evaluated, some in warmup)."""
  from benchmarks import fedcda_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  n, warmup = 120, 25
  acc = rng.uniform(0.5, 0.9, n)
  acc[rng.random(n) < 0.4] = np.nan
  acc[-1] = 0.8
  uploads = rng.integers(1, 5, n).astype(float)
  switched = np.floor(rng.random(n) * (uploads + 1))
  before = rng.uniform(1.0, 5.0, n)
  after = before * rng.uniform(0.9, 1.0, n)
  rows = [{'round': str(r + 1), 'test_accuracy': '' if np.isnan(acc[r]) else repr(acc[r]),
           'aggregator/warmup': '1.0' if r < warmup else '0.0',
           'aggregator/uploads': repr(uploads[r]), 'aggregator/switched': repr(switched[r]),
           'aggregator/objective_before': repr(before[r]),
           'aggregator/objective_after': repr(after[r])} for r in range(n)]
  post = slice(warmup, n)
  assert fedcda_diagnosis.older_model_share(rows) == pytest.approx(
      switched[post].sum() / uploads[post].sum())
  assert fedcda_diagnosis.objective_lowered(rows) == pytest.approx(
      np.mean(1 - after[post] / before[post]))
  assert np.isnan(fedcda_diagnosis.older_model_share(rows[:warmup]))
  evaluated = acc[np.isfinite(acc)]
  assert fedcda_diagnosis.best_round(rows) == pytest.approx(evaluated.max())
  assert fedcda_diagnosis.last10(rows) == pytest.approx(evaluated[-10:].mean())
  assert report.window_marks(n, warmup) == [25, 50, 100, 120]
  assert report.window_marks(600, 50) == list(range(50, 601, 50))
  assert report.window_marks(120) == [50, 100, 120]
  for start, stop in ((0, 25), (25, 50), (50, 100), (100, 120)):
    window = acc[start:stop]
    rounds = np.flatnonzero(np.isfinite(window)).astype(float)
    values = window[np.isfinite(window)]
    design = np.stack([rounds, np.ones_like(rounds)], axis=1)
    fit, *_ = np.linalg.lstsq(design, values, rcond=None)
    mean, swing = report.window_accuracy(rows, start, stop)
    assert mean == pytest.approx(values.mean())
    assert swing == pytest.approx(np.std(values - design @ fit))


def test_fedcda_diagnosis_reads_a_pair_at_the_rounds_both_evaluated():
  """A probe's FedCDA evaluated every 5th round beside the unchanged FedAvg evaluated every
  round: the window levels, margins and best rounds are over the rounds both evaluated (the
  warmup, FedAvg in both, then differs by ~0, not by FedAvg's first four rounds)."""
  from benchmarks import fedcda_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(4)
  sparse = set(_evaluated(60, 5))
  avg = np.linspace(0.2, 0.8, 60) + rng.normal(0, 0.03, 60)
  cda = avg + 0.05
  def rows(acc, every):
    return [{'round': str(r), 'test_accuracy': repr(acc[r - 1]) if every or r in sparse
             else ''} for r in range(1, 61)]
  pair = fedcda_diagnosis._pair(  # pylint: disable=protected-access
      'cda', 'avg', {'cda': {0: rows(cda, False)}, 'avg': {0: rows(avg, True)}})
  (c,), (a,) = (list(side.values()) for side in pair)
  keep = np.array([r in sparse for r in range(1, 61)])
  for start, stop in ((0, 25), (25, 50), (50, 60)):
    mask = keep[start:stop]
    assert report.window_accuracy(a, start, stop)[0] == pytest.approx(avg[start:stop][mask].mean())
    rounds = np.flatnonzero(mask).astype(float)
    values = avg[start:stop][mask]
    fit = np.polyval(np.polyfit(rounds, values, 1), rounds)
    assert report.window_accuracy(a, start, stop)[1] == pytest.approx(np.std(values - fit))
    assert report.window_accuracy(c, start, stop)[0] - report.window_accuracy(a, start, stop)[0] \
        == pytest.approx(0.05)
  assert fedcda_diagnosis.best_round(a[:45]) == pytest.approx(avg[:45][keep[:45]].max())
  assert fedcda_diagnosis.last10(a) == pytest.approx(avg[-10:].mean())   # the headline's


def test_fedlex_diagnosis_regenerates_byte_for_byte():
  from benchmarks import fedlex_diagnosis  # pylint: disable=g-import-not-at-top
  with open(fedlex_diagnosis.OUT) as f:
    assert f.read() == fedlex_diagnosis.page(), 'run python -m benchmarks.fedlex_diagnosis'


def test_a_chosen_value_on_the_grid_edge_is_said():
  suite = suites.SUITES['fedcda']
  top = {k: max(v) for k, v in suite.grid['fedcda_dir0.1'].items()}
  inner = {k: sorted(v)[1] for k, v in suite.grid['fedavg_dir0.1'].items()}
  edges = report.grid_edges(suite, {'fedcda': top, 'fedavg': inner})
  assert len(edges) == 1 and edges[0].startswith(
      f'fedcda: client_lr={top["client_lr"]:g} is the largest')
  assert report.grid_edges(suite, None) == []


def test_a_run_shorter_than_its_suite_is_not_finished(tmp_path, monkeypatch):
  """A suite lengthened after its runs were made (--rounds raised): the runs show as stopped
  at their old length, and the tuning runs stay finished at their own length."""
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=40), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
      grid=dict(base=dict(client_lr=[0.1, 0.3])), tuning_rounds=20)
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  _write_run(tmp_path / 'toy' / 'runs' / 'base_s0', 20, np.full(20, 0.5))
  for lr in (0.1, 0.3):
    _write_run(tmp_path / 'toy' / 'tuning' / suites.tuning_name('base', dict(client_lr=lr)), 20,
               np.full(20, lr))
  run = report.collect(suite)['base'][0]
  assert not run['finished'] and (run['rounds_done'], run['rounds']) == (20, 40)
  assert report.load_run(str(tmp_path / 'toy' / 'runs' / 'base_s0'))['finished']
  page, _, _ = report.suite_page(suite)
  assert 'stopped after round 20 of 40' in page
  assert 'the first 20 rounds of the schedule' in page and 'stopped at round' not in page


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_tuning_runs_are_the_first_rounds_of_the_reported_runs(name):
  """A tuning run differs from its reported run only in the grid's values and its length."""
  suite = suites.SUITES[name]
  for run, grid in suite.grid.items():
    full = suite.config_overrides(run)
    for values in report.grid_points(grid):
      short = suite.tuning_overrides(run, values)
      differing = {k for k in set(full) | set(short) if full.get(k) != short.get(k)}
      assert differing <= set(values) | {'rounds'}
      assert short['rounds'] <= full['rounds']


def test_a_diverging_grid_point_is_shown_and_skipped(tmp_path, monkeypatch):
  """compare.tune: a grid point whose training diverges is recorded, not chosen, and does not
  stop the grid; the page names it."""
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=20), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
      grid=dict(base=dict(client_lr=[0.1, 0.3, 1.0])))
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  level = {0.1: 0.5, 0.3: 0.6}

  def fake_run(config):
    if compare._finished(config):  # pylint: disable=protected-access
      return
    recorded = dataclasses.asdict(config)
    if config.client_lr == 1.0:   # as the program does: the marker, then the error
      _write_run(config.experiment_dir, 20, np.full(4, 0.3), config=recorded)
      with open(os.path.join(config.experiment_dir, experiment.DIVERGED), 'w') as f:
        f.write('training diverged at round 5 (train loss nan)\n')
      raise experiment.ExperimentError(
          'training diverged at round 5 (train loss nan); start a new run with a lower '
          '--client_lr (now 1.0) or server learning rate')
    _write_run(config.experiment_dir, 20, np.full(20, level[config.client_lr]),
               config=recorded)

  monkeypatch.setattr(compare, '_run', fake_run)
  assert compare.tune(suite) == {'fedavg': dict(client_lr=0.3)}
  assert compare.tune(suite) == {'fedavg': dict(client_lr=0.3)}   # rerun: nothing new to do
  page, _, _ = report.suite_page(suite)
  assert '| base | client_lr=1 | training diverged at round 5 (train loss nan) |  |' in page
  # The declaration changes after the grid ran: its finished points are other settings' now,
  # an error naming the directory and the setting, not taken for the new grid's points.
  suite.common['client_momentum'] = 0.9
  with pytest.raises(experiment.ExperimentError,
                     match=r'base_client_lr0\.1 holds a finished run of other settings \(it '
                           r'was run with --client_momentum=0\.5 \(now --client_momentum=0\.9\)'
                           r'\); move it away'):
    compare.tune(suite)


def test_one_seed_gets_no_spread_and_no_verdict(tmp_path, monkeypatch):
  """With one paired seed there is no spread: the page says "(one seed)", never "± 0.00",
  and gives no verdict however large the margin."""
  suite = _paired_toy_suite(20, tmp_path, monkeypatch)
  _write_run(tmp_path / 'toy' / 'runs' / 'base_s0', 20, np.full(20, 0.5))
  _write_run(tmp_path / 'toy' / 'runs' / 'new_s0', 20, np.full(20, 0.9))
  paper = {'toy setting': dict(dataset='D', baseline=50.0, method=60.0)}
  (row,) = report.compare_runs(suite, report.collect(suite), paper)
  assert row['verdict'] == 'one seed' and row['margin'] == pytest.approx(40.0)
  assert report.margin_text(row) == '+40.00 (one seed)'
  assert report.pm(row['baseline_mean'], row['baseline_std']) == '50.00 (one seed)'
  page, _, _ = report.suite_page(suite)
  assert '± 0.00' not in page and '**one seed**' in page


@pytest.mark.parametrize('rounds, want', [
    (200, list(range(20, 201, 20))), (300, list(range(50, 301, 50))),
    (150, list(range(25, 151, 25))), (100, list(range(10, 101, 10))), (7, [7])])
def test_checkpoint_rounds(rounds, want):
  assert report.checkpoint_rounds(rounds) == want


def test_margins_over_rounds_match_numpy(tmp_path, monkeypatch):
  """The table's margins are numpy's paired last-10 differences at its checkpoints; the
  notes read every round: the peak and the first round at which our baseline reaches the
  paper's fall between checkpoints here and must be found exactly."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(3)
  curves = {}
  for seed in (0, 1, 2):
    # The baseline climbs from 0.40 to 0.79; the method is 0.05 ahead, 0.20 ahead in round 23.
    base = np.linspace(0.40, 0.79, 40) + rng.normal(0, 0.002, 40)
    method = base + 0.05
    method[22] += 0.15
    curves['base', seed], curves['new', seed] = base, method
    for run in ('base', 'new'):
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 40, curves[run, seed])
  runs = report.collect(suite)
  paper = {'toy setting': dict(dataset=suites.OUR_DATASET, baseline=55.0, method=60.0)}
  comparisons = report.compare_runs(suite, runs, paper)

  def last10(run, end):
    return [curves[run, s][end - 10:end].mean() for s in (0, 1, 2)]

  rows = report.margins_over_rounds(runs, comparisons)['toy']
  assert [r['round'] for r in rows] == [10, 20, 30, 40]
  for row in rows:
    diffs = 100 * (np.array(last10('new', row['round'])) - last10('base', row['round']))
    assert row['margin'] == pytest.approx(diffs.mean())
    assert row['margin_std'] == pytest.approx(diffs.std(ddof=1))
    assert row['baseline'] == pytest.approx(100 * np.mean(last10('base', row['round'])))
  assert rows[-1]['margin'] == pytest.approx(comparisons[0]['margin'])  # the headline's row
  every = {e: 100 * np.mean(np.array(last10('new', e)) - last10('base', e)) for e in range(10, 41)}
  peak = max(every, key=every.get)
  reached = next(e for e in range(10, 41) if 100 * np.mean(last10('base', e)) >= 55.0)
  assert peak not in (10, 20, 30, 40) and reached not in (10, 20, 30, 40)
  (note,) = report.margin_notes(runs, comparisons)
  assert f'largest margin {every[peak]:+.2f} at round {peak} ' in note
  assert f'reaches the paper\'s (55.00%) at round {reached}, where our margin is ' \
         f'{every[reached]:+.2f} (paper: +5.00)' in note
  # A paper figure on another data set is not compared level for level.
  comparisons[0]['paper_dataset'] = 'CIFAR-10'
  (note,) = report.margin_notes(runs, comparisons)
  assert 'reaches' not in note
  comparisons[0]['paper_dataset'] = suites.OUR_DATASET
  comparisons[0]['paper_baseline'] = 95.0
  (note,) = report.margin_notes(runs, comparisons)
  assert "ours never reaches the paper's baseline (95.00%)" in note
  page, _, _ = report.suite_page(suite)
  row40 = rows[-1]
  assert (f'| 40 | {row40["baseline"]:.2f} | {row40["margin"]:+.2f} ± '
          f'{row40["margin_std"]:.2f} |') in page


def test_margin_notes_say_when_the_method_is_behind_throughout(monkeypatch):
  rows = [dict(round=r, margin=m, baseline=50.0 + r) for r, m in ((10, -4.0), (20, -1.5),
                                                                   (30, -2.0))]
  monkeypatch.setattr(report, 'margins_over_rounds', lambda *a, **k: {'toy': rows})
  comparison = dict(label='toy', paper_dataset='CIFAR-10', paper_baseline=None)
  (note,) = report.margin_notes({}, [comparison])
  assert note == ('- toy: behind at every round, closest -1.50 at round 20 '
                  '(baseline there 70.00%), -2.00 at the end.')
  rows[0]['margin'] = 0.5
  (note,) = report.margin_notes({}, [comparison])
  assert note.startswith('- toy: largest margin +0.50 at round 10 ')


def test_margin_notes_say_since_when_the_verdict_has_held(tmp_path, monkeypatch):
  """The verdict read at every round (numpy's last-10 means, paired margin, spread = the
  largest of the margin's, the baseline's and the method's stds; the rules written out
  here) has been the end's since the round the note names, and the note names the verdict
  at the round before; a probe's notes (no verdicts) say nothing of it."""
  suite = _paired_toy_suite(60, tmp_path, monkeypatch)
  rng = np.random.default_rng(11)
  curves = {}
  for seed in (0, 1, 2):
    # the method leads by 6 points over rounds 1-30, then by 1: a paper margin of +4 makes
    # that reproduced, then smaller or within noise as the lead shrinks
    base = np.linspace(0.40, 0.80, 60) + rng.normal(0, 0.004, 60)
    method = base + np.where(np.arange(60) < 30, 0.06, 0.01) + rng.normal(0, 0.004, 60)
    curves['base', seed], curves['new', seed] = base, method
    for run in ('base', 'new'):
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 60, curves[run, seed])
  runs = report.collect(suite)
  paper = {'toy setting': dict(dataset='CIFAR-10', baseline=50.0, method=54.0)}
  (comparison,) = report.compare_runs(suite, runs, paper)

  def read(end):
    base = np.array([100 * curves['base', s][end - 10:end].mean() for s in (0, 1, 2)])
    method = np.array([100 * curves['new', s][end - 10:end].mean() for s in (0, 1, 2)])
    margin = method - base
    spread = max(margin.std(ddof=1), base.std(ddof=1), method.std(ddof=1))
    if abs(margin.mean()) <= spread:
      return 'within noise'
    if margin.mean() < 0:
      return 'opposite'
    return 'reproduced' if margin.mean() >= 2.0 else 'smaller'

  verdicts = {end: read(end) for end in range(10, 61)}
  assert verdicts[60] == comparison['verdict'] and verdicts[30] == 'reproduced'
  since = 60
  while verdicts[since - 1] == verdicts[60]:
    since -= 1
  assert 30 < since < 60
  (note,) = report.margin_notes(runs, [comparison])
  assert note.endswith(f'; verdict {verdicts[60]} at every round since round {since} '
                       f'({verdicts[since - 1]} at round {since - 1}).')
  (note,) = report.margin_notes(runs, [comparison], verdicts=False)
  assert 'verdict' not in note
  # one verdict throughout: said so, from the first round read
  rows = [dict(round=r, margin=5.0, spread=1.0, baseline=50.0) for r in (10, 20, 30)]
  monkeypatch.setattr(report, 'margins_over_rounds', lambda *a, **k: {'toy': rows})
  (note,) = report.margin_notes(runs, [dict(comparison, verdict='reproduced')])
  assert note.endswith('; verdict reproduced at every round read (from round 10).')


def test_a_run_made_at_other_settings_is_left_out_and_named(tmp_path, monkeypatch):
  """A run whose config.json records another value of a declared field (e.g. made before its
  tuned rate changed) is not shown as a run of the new settings."""
  suite = _paired_toy_suite(20, tmp_path, monkeypatch)
  for run, level in (('base', 0.5), ('new', 0.6)):
    for seed in (0, 1):
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 20, np.full(20, level))
      path = tmp_path / 'toy' / 'runs' / f'{run}_s{seed}' / 'config.json'
      path.write_text(json.dumps(dict(rounds=20, algorithm='fedavg' if run == 'base' else
                                      'fedcda')))
  path = tmp_path / 'toy' / 'runs' / 'new_s1' / 'config.json'
  path.write_text(json.dumps(dict(rounds=20, algorithm='fedprox')))
  runs = report.collect(suite)
  assert runs['new'][1]['stale'] == ['algorithm=fedprox (declared: fedcda)']
  (row,) = report.compare_runs(suite, runs, {})
  assert row['seeds'] == [0]
  page, _, _ = report.suite_page(suite)
  assert '`new` seed 1: made at other settings than declared now' in page


def test_a_run_evaluated_on_another_schedule_is_a_run_of_the_declared_settings(tmp_path,
                                                                                monkeypatch):
  """--eval_every / --eval_last do not change the training: a suite that declares a sparser
  evaluation (to lengthen its runs faster) still reads the runs made evaluating every round,
  while an algorithm that differs is still refused."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=20, eval_every=5, eval_last=10),
      scaled='nothing', runs=dict(base=dict(algorithm='fedavg'), new=dict(algorithm='fedcda')),
      comparisons=(suites.Comparison('new', 'base', 'toy setting', 'toy'),))
  for run, level in (('base', 0.5), ('new', 0.6)):
    for seed in (0, 1):
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 20, np.full(20, level),
                 config=dict(algorithm=TOY_ALGORITHMS[run], eval_every=1,
                             **(dict(eval_last=3) if seed else {})))
  runs = report.collect(suite)
  assert all(r['stale'] == [] and report.usable(r) for seeds in runs.values()
             for r in seeds.values())
  (row,) = report.compare_runs(suite, runs, {})
  assert row['seeds'] == [0, 1] and row['margin'] == pytest.approx(10.0)


def test_a_suite_naming_an_unknown_run_is_refused():
  with pytest.raises(ValueError, match="names 'nwe'"):
    suites.Suite(name='toy', title='toy', common={}, scaled='', runs=dict(base={}, new={}),
                 comparisons=(suites.Comparison('nwe', 'base', 'p', 'l'),))
  with pytest.raises(ValueError, match="probe 'p' names"):
    suites.Suite(name='toy', title='toy', common={}, scaled='', runs=dict(base={}),
                 comparisons=(), probes=(suites.Probe('p', 'q', {}, ('base', 'other')),))
  two = dict(runs=dict(base={}, new={}, third={}),
             comparisons=(suites.Comparison('new', 'base', 'p', 'l'),))
  for unchanged in ('third', 'new'):   # in no comparison with a changed run; changed itself
    with pytest.raises(ValueError, match=f"keeps \\['{unchanged}'\\] unchanged"):
      suites.Suite(name='toy', title='toy', common={}, scaled='', **two,
                   probes=(suites.Probe('p', 'q', {}, ('new',), unchanged=(unchanged,)),))


def test_a_probe_row_gives_swing_and_seconds_over_the_seeds_its_margin_is_over(tmp_path,
                                                                               monkeypatch):
  """A probe whose method is made on seed 0 only sets it beside the unchanged baseline's seed
  0: the row's baseline s/round and swing are that seed's, not its other seeds' too."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  probe = suites.Probe('new_only', 'the method alone?', dict(rounds=20), ('new',),
                       seeds=(0, 1), unchanged=('base',))
  suite = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), probes=(probe,))
  rng = np.random.default_rng(11)
  for seed in (0, 1):   # the reported base runs, seed 1 five times as slow
    _write_run(tmp_path / 'toy' / 'runs' / f'base_s{seed}', 20,
               np.clip(0.4 + rng.normal(0, 0.03, 20), 0, 1),
               config=dict(suite.config_overrides('base'), seed=seed), seconds=1.0 + 4 * seed)

  def fake_run(config):   # seed 1 of the probe is not made
    if config.seed == 0:
      _write_run(config.experiment_dir, config.rounds,
                 np.clip(0.5 + rng.normal(0, 0.03, 20), 0, 1),
                 config=dataclasses.asdict(config), seconds=3.0)

  monkeypatch.setattr(compare, '_run', fake_run)
  compare.run_probes(suite, {})
  page, _, _ = report.suite_page(suite)
  (row,) = [l for l in page.split('\n') if l.startswith('| toy | 1 | ')]
  assert row.endswith(' | 1.00 | 3.00 |'), row   # not the median of 1 and 5
  swings = row.split(' | ')[-4:-2]
  assert all('±' not in s for s in swings), row   # one seed each side


def test_a_probes_unmade_seeds_follow_its_dropped_clients_paragraph_as_a_list(tmp_path,
                                                                                monkeypatch):
  """In a probe's section, the runs' not-run-yet lines come after the dropped-clients
  paragraph with a blank line between, so Markdown renders them as a list of their own."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  probe = suites.Probe('longer', 'does it hold?', dict(rounds=20), ('base', 'new'),
                       seeds=(0, 1))
  suite = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), probes=(probe,))
  rng = np.random.default_rng(5)

  def fake_run(config):   # seed 1 is not made; new seed 0 leaves a client out in round 2
    if config.seed == 0:
      _write_run(config.experiment_dir, config.rounds, rng.uniform(0.4, 0.6, 20),
                 config=dataclasses.asdict(config),
                 columns={'dropped_clients': [0, 1] + [0] * 18})

  monkeypatch.setattr(compare, '_run', fake_run)
  compare.run_probes(suite, {})
  lines = report.suite_page(suite)[0].split('\n')
  (at,) = [i for i, l in enumerate(lines) if l.startswith('Clients left out of a round')]
  assert '`new` seed 0 (1 in round 2)' in lines[at], lines[at]
  assert lines[at + 1:at + 4] == ['', '- `base`: seed 1 not run yet.',
                                  '- `new`: seed 1 not run yet.'], lines[at:at + 4]


def test_probes_run_the_tuned_runs_with_their_changes_and_are_reported(tmp_path, monkeypatch):
  """compare.run_probes: each probe run is the suite's tuned run with the probe's changes,
  under probes/<name>/; the page's probe table holds numpy's paired margin."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  probe = suites.Probe('more_epochs', 'does it hold at E = 5?', dict(local_epochs=5, rounds=30),
                       ('base', 'new'), seeds=(0, 1))
  suite = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), probes=(probe,))
  rng = np.random.default_rng(5)
  made, tails, curves = [], {}, {}

  def fake_run(config):
    made.append(config)
    acc = np.clip((0.5 if config.algorithm == 'fedavg' else 0.6) +
                  rng.normal(0, 0.03, config.rounds), 0, 1)
    _write_run(config.experiment_dir, config.rounds, acc, config=dataclasses.asdict(config),
               seconds=1.0 + config.seed + 2 * (config.algorithm == 'fedcda'))
    tails[config.algorithm, config.seed] = acc[-10:].mean()
    curves[config.algorithm, config.seed] = acc

  monkeypatch.setattr(compare, '_run', fake_run)
  page, _, _ = report.suite_page(suite)   # before any probe run: one line a run
  assert '\n- `base`: seeds 0, 1 not run yet.\n- `new`: seeds 0, 1 not run yet.\n' in page
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedavg', 0), ('fedcda', 0),
                                                  ('fedavg', 1), ('fedcda', 1)]
  assert all(c.local_epochs == 5 and c.rounds == 30 for c in made)
  assert [c.client_lr for c in made if c.algorithm == 'fedcda'] == [0.3, 0.3]   # tuned
  assert made[0].experiment_dir.endswith(os.path.join('toy', 'probes', 'more_epochs', 'base_s0'))
  (row,) = report.compare_runs(suite, report.collect_probe(suite, probe), {})
  diffs = [100 * (tails['fedcda', s] - tails['fedavg', s]) for s in (0, 1)]
  assert row['margin'] == pytest.approx(np.mean(diffs))
  assert row['margin_std'] == pytest.approx(np.std(diffs, ddof=1))
  page, _, _ = report.suite_page(suite)
  assert '### more_epochs: does it hold at E = 5?' in page
  assert '| toy | 2 | ' in page and report.margin_text(row) in page
  # s/round: the median over seeds of each run's seconds a round (base 1 and 2, new 3 and 4)
  (table_row,) = [l for l in page.split('\n') if l.startswith('| toy | 2 | ')]
  assert table_row.endswith(' | 1.50 | 3.50 |'), table_row
  # moved: the seeds' mean curve over its last W = 30 // 4 rounds against the W before
  for algorithm, cell in zip(('fedavg', 'fedcda'), table_row.split(' | ')[5:7]):
    mean = 100 * np.mean([curves[algorithm, s] for s in (0, 1)], axis=0)
    assert cell.startswith(f'7, {mean[-7:].mean() - mean[-14:-7].mean():+.2f}'), table_row
    assert 'per seed' in cell, table_row
  (line,) = report.probe_summaries(suite, {})
  assert line.startswith('- Probe more_epochs') and report.margin_text(row) in line

  # A probe that changes only the method (a setting its baseline does not read) runs only it
  # and is compared with the suite's reported runs of the baseline it names unchanged, on the
  # probe's seeds; without that name, it has no comparison.
  only_new = suites.Probe('new_only', 'the method alone?', dict(rounds=20), ('new',),
                          seeds=(0, 1), unchanged=('base',))
  suite = dataclasses.replace(suite, probes=(only_new,))
  for seed in (0, 1, 2):   # the reported base runs (seed 2 is not the probe's)
    acc = np.clip(0.4 + rng.normal(0, 0.03, 20), 0, 1)
    _write_run(tmp_path / 'toy' / 'runs' / f'base_s{seed}', 20, acc,
               config=dict(suite.config_overrides('base'), seed=seed))
    tails['reported', seed] = acc[-10:].mean()
  made.clear()
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedcda', 0), ('fedcda', 1)]
  runs = report.collect_probe(suite, only_new)
  assert sorted(runs['base']) == [0, 1]
  (row,) = report.compare_runs(suite, runs, {})
  diffs = [100 * (tails['fedcda', s] - tails['reported', s]) for s in (0, 1)]
  assert row['margin'] == pytest.approx(np.mean(diffs))
  page, _, _ = report.suite_page(suite)
  assert 'seeds 0, 1; compared with the unchanged reported runs of base.' in page
  # At a length shorter than the suite's, the page says which making is read: the reported
  # runs' first rounds, or that length's making kept in earlier_runs/ when there is one.
  short = dataclasses.replace(only_new, overrides=dict(rounds=10))
  assert report.unchanged_text(suite, short) == (
      '; compared with the unchanged reported runs of base over their first 10 rounds')
  _write_run(tmp_path / 'toy' / 'earlier_runs' / 'rounds10' / 'base_s1', 10,
             np.full(10, 0.3), config=dict(suite.config_overrides('base'), seed=1, rounds=10))
  assert report.unchanged_text(suite, short) == (
      '; compared with the unchanged base as made at 10 rounds before the suite was '
      'lengthened (`earlier_runs/rounds10/`)')
  assert report.collect_probe(suite, short)['base'][1]['last10_mean_accuracy'] == (
      pytest.approx(0.3))
  shutil.rmtree(tmp_path / 'toy' / 'earlier_runs')
  alone = dataclasses.replace(only_new, unchanged=())
  assert sorted(report.collect_probe(suite, alone)) == ['new']
  assert report.compare_runs(suite, report.collect_probe(suite, alone), {}, partial=True) == []

  # And one that changes only the baseline (e.g. another rate) against the reported method.
  only_base = suites.Probe('base_only', 'the baseline alone?', dict(rounds=20), ('base',),
                           seeds=(1, 2), unchanged=('new',))
  suite = dataclasses.replace(suite, probes=(only_base,))
  for seed in (0, 1, 2):
    acc = np.clip(0.5 + rng.normal(0, 0.03, 20), 0, 1)
    _write_run(tmp_path / 'toy' / 'runs' / f'new_s{seed}', 20, acc,
               config=dict(suite.config_overrides('new'), seed=seed))
    tails['reported new', seed] = acc[-10:].mean()
  made.clear()
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedavg', 1), ('fedavg', 2)]
  runs = report.collect_probe(suite, only_base)
  assert sorted(runs) == ['base', 'new'] and sorted(runs['new']) == [1, 2]
  (row,) = report.compare_runs(suite, runs, {})
  diffs = [100 * (tails['reported new', s] - tails['fedavg', s]) for s in (1, 2)]
  assert row['margin'] == pytest.approx(np.mean(diffs))
  page, _, _ = report.suite_page(suite)
  assert 'seeds 1, 2; compared with the unchanged reported runs of new.' in page


def test_readme_reproduction_status_is_current():
  """README.md's one line per method is what `python -m benchmarks.report` writes from the
  committed runs: a changed digit there, or a new finished run, fails here."""
  with open(report.README) as f:
    text = f.read()
  assert report.readme_with_status(text) == text, 'run python -m benchmarks.report'
  assert len(report.status_lines()) == len(suites.SUITES)


@pytest.mark.parametrize('argv, want', [
    # seed by seed: a suite cut short holds whole comparisons of its first seeds
    ([], [('fedavg', 0), ('fedcda', 0), ('fedavg', 1), ('fedcda', 1), ('fedavg', 2),
          ('fedcda', 2)]),
    (['--seeds=1,2'], [('fedavg', 1), ('fedcda', 1), ('fedavg', 2), ('fedcda', 2)]),
    (['--only=new', '--seeds=0'], [('fedcda', 0)]),
    (['--probes'], [('fedavg', 0), ('fedcda', 0), ('fedavg', 5)]),
    (['--probe=p2'], [('fedavg', 5)]),
    (['--probes', '--probe=p'], [('fedavg', 0), ('fedcda', 0)]),
    (['--probe=p', '--only=new'], [('fedcda', 0)]),
    (['--report'], []),
    (['--tune'], [('fedavg', 100), ('fedavg', 100)]),
])
def test_compare_flags_choose_what_runs(tmp_path, monkeypatch, argv, want):
  """benchmarks.compare's flags, through its main: which runs (algorithm, seed) are made."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  probes = (suites.Probe('p', 'q?', dict(local_epochs=5), ('base', 'new')),
            suites.Probe('p2', 'q2?', dict(local_epochs=2), ('base',), seeds=(5,)))
  toy = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), name='fedcda',
                            probes=probes, grid=dict(base=dict(client_lr=[0.1, 0.3])))
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  for name in list(suites.SUITES):
    if name != 'fedcda':
      monkeypatch.delitem(suites.SUITES, name)
  (tmp_path / 'fedcda').mkdir()
  if '--tune' not in argv:   # the reported runs need the suite's tuned rates
    (tmp_path / 'fedcda' / 'tuned.json').write_text('{"fedavg": {"client_lr": 0.3}}')
  readme = tmp_path / 'README.md'
  shutil.copy(report.README, readme)
  monkeypatch.setattr(report, 'README', str(readme))
  monkeypatch.setattr(report, 'REPRODUCTION', str(tmp_path / 'REPRODUCTION.md'))
  made = []

  def fake_run(config):
    made.append((config.algorithm, config.seed))
    _write_run(config.experiment_dir, config.rounds, np.full(config.rounds, 0.5),
               config=dataclasses.asdict(config))

  monkeypatch.setattr(compare, '_run', fake_run)
  try:
    flags.FLAGS(['compare', '--suite=fedcda'] + argv)
    assert compare.main([]) == 0
  finally:
    flags.FLAGS.unparse_flags()
  assert made == want
  assert (tmp_path / 'fedcda' / 'results.md').exists()
  if '--tune' in argv:
    assert json.loads((tmp_path / 'fedcda' / 'tuned.json').read_text()) == {
        'fedavg': {'client_lr': 0.1}}   # equal scores: the first grid point stays


def test_compare_plan_lists_the_runs_left_and_their_recorded_cost(tmp_path, monkeypatch, capsys):
  """--plan trains nothing: it lists each run the same command would make, with its rounds
  left (a stopped run from its last checkpoint) at the recorded seconds per round of runs of
  the same cost, and the total."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  toy = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), name='fedcda')
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  dirs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(toy, None)}
  # base's cost is recorded with whole rounds (round_seconds), new's with training only
  _write_run(dirs['base_s0'].experiment_dir, 20, np.full(20, 0.5), seconds=40.0,
             round_seconds=60.0, config=dataclasses.asdict(dirs['base_s0']))
  # new_s0 stopped after round 8, checkpointed after round 5: it resumes there
  _write_run(dirs['new_s0'].experiment_dir, 20, np.full(8, 0.6), seconds=36.0, summary_rounds=8,
             config=dataclasses.asdict(dirs['new_s0']))
  os.makedirs(os.path.join(dirs['new_s0'].experiment_dir, 'checkpoints', 'program_state_5'))
  monkeypatch.setattr(compare, '_run', lambda config: pytest.fail('--plan made a run'))

  def plan_lines(argv):
    try:
      flags.FLAGS(['compare', '--suite=fedcda', '--plan'] + argv)
      assert compare.main([]) == 0
    finally:
      flags.FLAGS.unparse_flags()
    return capsys.readouterr().out.splitlines()

  rel = lambda name: os.path.relpath(dirs[name].experiment_dir)
  lines = plan_lines(['--seeds=0,1'])
  assert lines[:3] == [
      f'  {rel("new_s0")}: 15 rounds left (resumes after round 5); ~9 min at 36.00 s/round '
      '(training only); its own 7 rounds so far: a median 36.00 s of training (~9 min at that '
      'pace)',
      f'  {rel("base_s1")}: 20 rounds left (starts at round 1); ~20 min at 60.00 s/round',
      f'  {rel("new_s1")}: 20 rounds left (starts at round 1); ~12 min at 36.00 s/round '
      '(training only)']
  assert lines[3].startswith('3 of 4 runs to make, 55 rounds: ~41 min as recorded')
  assert '; 2 runs sized by training time only' in lines[3]
  assert len(lines) == 4
  lines = plan_lines(['--only=new', '--seeds=2'])
  assert lines[0].endswith('20 rounds left (starts at round 1); ~12 min at 36.00 s/round '
                           '(training only)')
  # A run declared at another --eval_every than any recorded: its training is the same, so
  # it is sized by the recorded training seconds of its cost, and says so.
  every5 = dataclasses.replace(toy, common=dict(toy.common, eval_every=5))
  monkeypatch.setitem(suites.SUITES, 'fedcda', every5)
  lines = plan_lines(['--only=base', '--seeds=1'])
  assert lines[0] == (f'  {rel("base_s1")}: 20 rounds left (starts at round 1); ~13 min at '
                      '40.00 s/round (training only, recorded at another --eval_every)')
  assert lines[1].startswith('1 of 1 runs to make, 20 rounds: ~13 min as recorded (') and (
      '1 run sized by training time only (recorded before whole rounds were, or at '
      'another --eval_every)' in lines[1]), lines
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  monkeypatch.setattr(compare, 'recorded_seconds_per_round', lambda name: {})
  monkeypatch.setattr(compare, 'recorded_training_seconds', lambda name: {})
  lines = plan_lines(['--only=base'])
  assert lines[0].endswith('no round of this cost recorded yet')
  assert '2 of 3 runs to make, 40 rounds: ~0 min as recorded, plus 2 runs ' \
         'of a cost not recorded yet' in lines[-1] and 'training time only' not in lines[-1]
  # What the command itself would stop at is listed as blocked, with the reason: a stopped run
  # recorded with other settings (its checkpoint cannot resume), a finished one likewise.
  other = dict(dataclasses.asdict(dirs['base_s2']), batch_size=dirs['base_s2'].batch_size + 1)
  _write_run(dirs['base_s2'].experiment_dir, 20, np.full(4, 0.5), summary_rounds=4,
             config=other)
  os.makedirs(os.path.join(dirs['base_s2'].experiment_dir, 'checkpoints', 'program_state_4'))
  _write_run(dirs['new_s2'].experiment_dir, 20, np.full(20, 0.5),
             config=dict(dataclasses.asdict(dirs['new_s2']), batch_size=7))
  lines = plan_lines(['--seeds=2'])
  assert lines[0].startswith(f'  {rel("base_s2")}: blocked: cannot resume '
                             f'{dirs["base_s2"].experiment_dir}: it was run with --batch_size='
                             ), lines
  assert lines[1].startswith(f'  {rel("new_s2")}: blocked: ') and (
      'holds a finished run of other settings' in lines[1]), lines
  assert lines[2].startswith('0 of 2 runs to make, 0 rounds: ') and '; 2 blocked' in lines[2]
  # ... and a stopped run whose record lost rounds its checkpoint holds (the run's own check)
  _write_run(dirs['base_s1'].experiment_dir, 20, np.full(3, 0.5), summary_rounds=3,
             config=dataclasses.asdict(dirs['base_s1']))
  os.makedirs(os.path.join(dirs['base_s1'].experiment_dir, 'checkpoints', 'program_state_5'))
  lines = plan_lines(['--seeds=1', '--only=base'])
  assert lines[0].startswith(f'  {rel("base_s1")}: blocked: cannot resume ') and (
      'its metrics.csv lacks 2 of those rounds (from round 4)' in lines[0]), lines
  for argv in (['--tune'], ['--probes']):   # the suite has neither: the usual error
    try:
      flags.FLAGS(['compare', '--suite=fedcda', '--plan'] + argv)
      assert compare.main([]) == 2
    finally:
      flags.FLAGS.unparse_flags()


def test_compare_plan_shows_a_stopped_runs_own_pace_and_leaves_paused_rounds_out(
    tmp_path, monkeypatch):
  """A stopped run's line adds its own rounds' median seconds (the pace of the machine it runs
  on); a round over PAUSED_ROUND times its run's median (a process stopped while CI ran) is not
  part of the recorded cost; a run with fewer than MIN_OWN_ROUNDS rounds after its first shows
  no pace of its own."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  toy = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), name='toypace')
  dirs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(toy, None)}
  _write_run(dirs['base_s0'].experiment_dir, 20, np.full(20, 0.5), round_seconds=60.0,
             config=dataclasses.asdict(dirs['base_s0']))
  # base_s1 ran on a slower machine: 120 s a round after its first, round 10 paused 9000 s
  own = [500.0] + [120.0] * 8 + [9000.0]
  _write_run(dirs['base_s1'].experiment_dir, 20, np.full(10, 0.5), summary_rounds=10,
             config=dataclasses.asdict(dirs['base_s1']), columns=dict(round_seconds=own))
  os.makedirs(os.path.join(dirs['base_s1'].experiment_dir, 'checkpoints', 'program_state_5'))
  # new_s1 stopped after round 3: two rounds after its first are too few for a pace
  _write_run(dirs['new_s1'].experiment_dir, 20, np.full(3, 0.5), summary_rounds=3,
             config=dataclasses.asdict(dirs['new_s1']), round_seconds=30.0)
  os.makedirs(os.path.join(dirs['new_s1'].experiment_dir, 'checkpoints', 'program_state_3'))
  lines = compare.plan(toy, [dirs['base_s1'], dirs['new_s1']])
  recorded = (19 * 60.0 + 8 * 120.0) / 27   # the paused round left out
  assert lines[0] == (
      f'  {os.path.relpath(dirs["base_s1"].experiment_dir)}: 15 rounds left (resumes after '
      f'round 5); ~19 min at {recorded:.2f} s/round; its own 9 rounds so far: a median '
      '120.00 s (~30 min at that pace)')
  assert lines[1] == (
      f'  {os.path.relpath(dirs["new_s1"].experiment_dir)}: 17 rounds left (resumes after '
      'round 3); ~8 min at 30.00 s/round')
  assert compare.own_seconds_per_round(dirs['base_s1'].experiment_dir) == (120.0, 9, True)
  assert compare.own_seconds_per_round(dirs['new_s1'].experiment_dir) is None
  assert compare.own_seconds_per_round(dirs['new_s0'].experiment_dir) is None   # not begun


def test_recorded_cost_is_the_mean_whole_round_per_evaluation_schedule(tmp_path, monkeypatch):
  """A run evaluated every 5th round costs its mean whole round (evaluated rounds counted as
  often as they come), and is not the cost of one evaluated every round."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  toy = dataclasses.replace(_paired_toy_suite(20, tmp_path, monkeypatch), name='toycost')
  config = compare.run_configs(toy, None, only=('base',), seeds=(0,))[0]
  rng = np.random.default_rng(4)
  whole = {}
  for every, name in ((1, 'base_s0'), (5, 'base_s1')):
    path = tmp_path / 'toycost' / 'runs' / name
    os.makedirs(path)
    (path / 'config.json').write_text(json.dumps(dict(dataclasses.asdict(config),
                                                      eval_every=every)))
    seconds = rng.uniform(1, 2, 20)
    whole[every] = seconds + np.where(np.arange(1, 21) % every == 0, 3.0, 0.0)
    with open(path / 'metrics.csv', 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['round', 'seconds', 'round_seconds'])
      writer.writerows([r + 1, s, w] for r, (s, w) in enumerate(zip(seconds, whole[every])))
  got = compare.recorded_seconds_per_round('toycost')
  key = tuple(getattr(config, f) for f in compare.COST_FIELDS[:-1])
  assert got[key + (1,)] == (pytest.approx(whole[1][1:].mean()), True)
  assert got[key + (5,)] == (pytest.approx(whole[5][1:].mean()), True)


@pytest.mark.parametrize('argv, message', [
    (['--tune', '--probes'], 'choose one of --tune, --probes (or --probe), --report'),
    (['--probe=no_such_probe'], "--probe names unknown probes ['no_such_probe']"),
    (['--probes', '--only=fedavg_shards2'], 'no probe run is named in --only=fedavg_shards2'),
    (['--plan', '--report'], '--plan lists runs to make; --report makes none'),
])
def test_compare_refuses_bad_flag_combinations(capsys, argv, message):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  try:
    flags.FLAGS(['compare', '--suite=fedcda'] + argv)
    assert compare.main([]) == 2
  finally:
    flags.FLAGS.unparse_flags()
  assert message in capsys.readouterr().err


def test_paper_context_rows_come_from_the_extraction(monkeypatch):
  """The 'paper's margins by data set' table: the extraction's FedAvg and method rows for
  each named setting, their difference; a setting the extraction lacks is refused."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  results = [dict(model='CNN', dataset='D1', setting='s', method='FedAvg', accuracy=40.0),
             dict(model='CNN', dataset='D1', setting='s', method='FedCross', accuracy=47.5),
             dict(model='CNN', dataset='D1', setting='s', method='FedProx', accuracy=41.0),
             dict(model='CNN', dataset='D2', setting='s', method='FedAvg', accuracy=80.0)]
  monkeypatch.setattr(suites, 'load_paper_results', lambda name: results)
  suite = dataclasses.replace(suites.SUITES['fedcross'], paper_context=(('CNN', 'D1', 's'),))
  assert report.paper_context_rows(suite) == [('CNN', 'D1', 's', 40.0, 47.5, 7.5)]
  with pytest.raises(ValueError, match='no FedAvg and FedCross results'):
    report.paper_context_rows(dataclasses.replace(suite, paper_context=(('CNN', 'D2', 's'),)))


def test_cadis_diagnosis_statistics_on_random_rows():
  """cadis_diagnosis's per-run statistics against direct numpy on random recorded rounds."""
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  n = 80
  weights = rng.dirichlet(np.full(10, 0.3), size=n) * rng.uniform(0.5, 2.0, size=(n, 1))
  acc, kd, ce = rng.uniform(0.2, 0.9, n), rng.uniform(0, 0.1, n), rng.uniform(0.1, 2.0, n)
  kd[::7] = np.nan   # rounds without the KD term (recorded empty)
  rows = [{'aggregator/aggregation_weights': json.dumps(list(w)), 'test_accuracy': str(a),
           'client_work/train/extra_loss': '' if np.isnan(k) else str(k),
           'client_work/train/loss': str(c)} for w, a, k, c in zip(weights, acc, kd, ce)]
  p = weights / weights.sum(axis=1, keepdims=True)
  top, change = p.max(axis=1), acc[1:] - acc[:-1]
  heavy = top[1:] > 0.3
  got = cadis_diagnosis.weight_effects(rows)
  np.testing.assert_allclose(got['effective'], np.mean(1 / (p ** 2).sum(axis=1)))
  np.testing.assert_allclose(got['heavy_share'], np.mean(top > 0.3))
  np.testing.assert_allclose(got['corr'], np.corrcoef(top[1:], change)[0, 1])
  np.testing.assert_allclose(got['change_heavy'], change[heavy].mean())
  np.testing.assert_allclose(got['change_light'], change[~heavy].mean())
  assert 0 < heavy.mean() < 1   # both branches exercised
  np.testing.assert_allclose(cadis_diagnosis.round_to_round_change(rows),
                             np.abs(np.diff(acc[-51:])).mean())
  keep = ~np.isnan(kd)
  np.testing.assert_allclose(cadis_diagnosis.kd_to_cross_entropy(rows),
                             kd[keep].mean() / ce[keep].mean())
  np.testing.assert_allclose(cadis_diagnosis.effective_participants([1, 1, 1, 1]), 4.0)
  # A run evaluated every 5th round and over its last 30: the accuracy changes are read
  # only between consecutive rounds both evaluated (NaN would otherwise reach every mean).
  evaluated = np.zeros(n, bool)
  evaluated[4::5] = evaluated[-30:] = True
  sparse = [dict(r, test_accuracy=r['test_accuracy'] if e else '')
            for r, e in zip(rows, evaluated)]
  pair = evaluated[1:] & evaluated[:-1]
  got = cadis_diagnosis.weight_effects(sparse)
  np.testing.assert_allclose(got['heavy_share'], np.mean(top > 0.3))
  np.testing.assert_allclose(got['corr'], np.corrcoef(top[1:][pair], change[pair])[0, 1])
  np.testing.assert_allclose(got['change_heavy'], change[pair & heavy].mean())
  np.testing.assert_allclose(got['change_light'], change[pair & ~heavy].mean())
  assert 0 < (pair & heavy).sum() < pair.sum()
  window = pair[-50:]
  np.testing.assert_allclose(cadis_diagnosis.round_to_round_change(sparse),
                             np.abs(np.diff(acc[-51:]))[window].mean())
  assert np.isnan(cadis_diagnosis.round_to_round_change(
      [dict(r, test_accuracy='') for r in rows]))


def _random_similarity_record(rng, n, rounds):
  """Q and F as CADIS accumulates them: each round a random subset of clients adds its
  pairwise cosines in [-1, 1] (1 on the diagonal) and one co-participation per pair."""
  q, f = np.zeros((n, n)), np.zeros((n, n))
  for _ in range(rounds):
    ids = rng.choice(n, size=4, replace=False)
    s = rng.uniform(-0.3, 1.0, (4, 4))
    s = (s + s.T) / 2
    np.fill_diagonal(s, 1.0)
    q[np.ix_(ids, ids)] += s
    f[np.ix_(ids, ids)] += 1
  return q, f


def test_cadis_rescaled_similarity_is_the_aggregators():
  """The diagnosis's numpy Q-matrix equals the aggregator's own TF steps (average, then
  min-max rescale over positive seen entries) on random records, unseen pairs included."""
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import clustered_aggregation  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(8)
  for rounds in (3, 40):
    q, f = _random_similarity_record(rng, 12, rounds)
    assert (f == 0).any() == (rounds == 3)   # unseen pairs in the short record
    want = clustered_aggregation.rescale_similarity(
        clustered_aggregation.average_similarity(q.astype(np.float32), f.astype(np.float32)),
        f.astype(np.float32)).numpy()
    np.testing.assert_allclose(cadis_diagnosis.rescaled_similarity(q, f), want, atol=1e-5)


def test_cadis_similarity_statistics_against_pair_loops():
  """Same-cluster similarities before, within and after a window of rounds, and the shares
  above τ, against plain loops over the pairs of two random snapshots."""
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(9)
  n = 16
  clusters = rng.integers(0, 3, n)
  qa, fa = _random_similarity_record(rng, n, 30)
  qw, fw = _random_similarity_record(rng, n, 30)
  tau = 0.6
  a = dict(q=qa, f=fa, tau=0.55)
  b = dict(q=qa + qw, f=fa + fw, tau=tau)
  got = cadis_diagnosis.similarity_statistics(a, b, clusters)
  avg_b = {(i, j): b['q'][i, j] / b['f'][i, j] for i in range(n) for j in range(n)
           if b['f'][i, j] > 0}
  positive = [v for v in avg_b.values() if v > 0]
  lo, hi = min(positive), max(positive)

  def rescale(v):
    return (v - lo) / (hi - lo) if v > 0 else 0.0

  same = [(i, j) for i in range(n) for j in range(n) if i != j and clusters[i] == clusters[j]]
  other = [(i, j) for i in range(n) for j in range(n) if clusters[i] != clusters[j]]
  before = [qa[i, j] / fa[i, j] for i, j in same if fa[i, j] > 0]
  window = [qw[i, j] / fw[i, j] for i, j in same if fw[i, j] > 0]
  a_vals = {(i, j): qa[i, j] / fa[i, j] for i in range(n) for j in range(n) if fa[i, j] > 0}
  a_pos = [v for v in a_vals.values() if v > 0]
  a_lo, a_hi = min(a_pos), max(a_pos)
  assert got['same_before'] == pytest.approx(np.mean(before))
  assert got['same_window'] == pytest.approx(np.mean(window))
  assert got['above_before'] == pytest.approx(np.mean(
      [v > 0 and (v - a_lo) / (a_hi - a_lo) > tau for v in before]))
  assert got['above_window'] == pytest.approx(np.mean([(v - lo) / (hi - lo) > tau
                                                       for v in window]))
  assert got['above_after'] == pytest.approx(np.mean([rescale(avg_b[p]) > tau
                                                      for p in same if p in avg_b]))
  assert got['other_above_after'] == pytest.approx(np.mean([rescale(avg_b[p]) > tau
                                                            for p in other if p in avg_b]))
  assert 0 < got['above_after'] < 1 and 0 < got['same_window'] < 1


def test_cadis_record_similarity_reads_checkpoints_and_keeps_snapshots(tmp_path, capsys,
                                                                        monkeypatch):
  """--record_similarity reads Q, F, τ and the round from program-state checkpoints by
  variable name (here SavedModels with the program state's layout), adds them to
  <run>_s<seed>.npz beside the snapshots there, in round order, with the seed's clusters;
  a directory that is not a checkpoint is one error line."""
  import data  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(10)

  def node(**children):
    m = tf.Module()
    for k, v in children.items():
      setattr(m, k, v)
    return m

  def checkpoint(round_num):
    q, f = rng.uniform(-1, 1, (100, 100)), rng.integers(0, 5, (100, 100)).astype(float)
    path = tmp_path / 'cadis_reference_weights_s1' / 'checkpoints' / f'program_state_{round_num}'
    aggregator = node(q=tf.Variable(q, dtype=tf.float32), f=tf.Variable(f, dtype=tf.float32),
                      tau=tf.Variable(0.985), round_num=tf.Variable(round_num))
    tf.saved_model.save(node(_value=node(round=tf.Variable(round_num),
                                         state=node(aggregator=aggregator))), str(path))
    return str(path), q, f

  out = tmp_path / 'similarity'
  p600, q600, f600 = checkpoint(600)
  p450, q450, f450 = checkpoint(450)
  assert cadis_diagnosis.record_similarity([p600], str(out)) == [
      str(out / 'cadis_reference_weights_s1.npz')]
  monkeypatch.setattr(cadis_diagnosis, 'SIMILARITY', str(out))
  assert cadis_diagnosis.main(['--record_similarity', p450]) == 0
  with np.load(out / 'cadis_reference_weights_s1.npz') as z:
    assert list(z['rounds']) == [450, 600]
    np.testing.assert_allclose(z['q'], np.stack([q450, q600]), rtol=1e-6)
    np.testing.assert_allclose(z['f'], np.stack([f450, f600]))
    np.testing.assert_allclose(z['tau'], [0.985, 0.985], rtol=1e-6)
    labels = data.load_fashion_mnist().y_train
    want = data.ClusterSkewPartitioner(100, 'mc', seed=1).partition(labels).true_clusters
    np.testing.assert_array_equal(z['true_clusters'], want)
  assert cadis_diagnosis.main(['--record_similarity', str(tmp_path)]) == 2
  assert 'not one: ' + str(tmp_path) in capsys.readouterr().err
  assert cadis_diagnosis.main(['--bogus']) == 2
  assert 'unknown arguments' in capsys.readouterr().err


def test_cadis_diagnosis_sampled_together_against_sets():
  """Which same-cluster pairs the program's sampling put in one round, against a plain set
  walk over the sampled rounds, on random clusters of 30 clients."""
  import data  # pylint: disable=g-import-not-at-top
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(11)
  for seed, rounds in ((0, 12), (7, 30)):
    clusters = rng.integers(0, 4, 30)
    clusters[:4] = np.arange(4)   # every cluster has a member
    clusters[4] = 0               # and cluster 0 two, so some pair exists
    every, shares = cadis_diagnosis.sampled_together(clusters, rounds, seed)
    pairs = {(i, j) for i in range(30) for j in range(30) if i != j and clusters[i] == clusters[j]}
    met, first_all = set(), None
    for r in range(1, rounds + 1):
      ids = [int(i) for i in data.sample_clients(30, cadis_diagnosis.PER_ROUND, r, seed)]
      met |= {(i, j) for i in ids for j in ids} & pairs
      assert shares[r - 1] == pytest.approx(len(met) / len(pairs))
      mates = {i for i, _ in met}
      alone = {i for i in range(30) if not any(clusters[j] == clusters[i] for j in range(30)
                                                if j != i)}
      if first_all is None and mates | alone == set(range(30)) and not alone:
        first_all = r
    assert (np.isnan(every) and first_all is None) or every == first_all
    assert len(shares) == rounds and shares == sorted(shares)


def test_compare_leaves_a_run_another_process_holds_for_last_and_then_makes_it(tmp_path,
                                                                              monkeypatch):
  """Two `compare` commands share a suite's runs: a run another process holds is skipped,
  the free ones are made, then the held one is waited for and made (resumed) after."""
  import threading  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  made = []

  def fake_run(config):   # what run_experiment does first: hold the directory, or refuse
    with experiment.exclusive_run_directory(config.experiment_dir):
      made.append(config.experiment_name)

  monkeypatch.setattr(compare, '_run', fake_run)
  configs = []
  for name in ('held', 'free'):
    (tmp_path / name).mkdir()
    configs.append(experiment.ExperimentConfig(root_output_dir=str(tmp_path),
                                               experiment_name=name))
  holding, release = threading.Event(), threading.Event()

  def other_process():
    with experiment.exclusive_run_directory(str(tmp_path / 'held')):
      holding.set()
      release.wait(30)

  other = threading.Thread(target=other_process)
  other.start()
  holding.wait(30)
  threading.Timer(0.5, release.set).start()
  compare.run_all(configs)
  other.join()
  assert made == ['free', 'held']


def test_tuned_as_gives_an_algorithm_another_ones_tuned_values():
  suite = suites.SUITES['cadis']
  tuned = {'fedavg': {'client_lr': 0.7}, 'cadis': {'client_lr': 0.2}}
  assert suite.config_overrides('fedprox', tuned)['client_lr'] == 0.7   # FedAvg's
  assert suite.config_overrides('cadis_no_kd', tuned)['client_lr'] == 0.2
  assert suite.config_overrides('fedprox')['client_lr'] == suite.common['client_lr']
  with pytest.raises(ValueError, match='fedprox takes the tuned values of fedcda'):
    dataclasses.replace(suite, tuned_as=dict(fedprox='fedcda'))


def test_cadis_diagnosis_tables_on_toy_runs():
  """The per-run and over-rounds tables: the clusters match only once every client has been
  seen (`clusters_match` alone covers the clients seen so far), seeds that never match are
  counted, and accuracies are window means."""
  from benchmarks import cadis_diagnosis  # pylint: disable=g-import-not-at-top

  def rows(acc, match, seen, kd):
    return [{'round': str(r + 1), 'test_accuracy': str(a), 'aggregator/clusters_match': str(m),
             'aggregator/seen_clients': str(s), 'aggregator/tau': '0.98',
             'aggregator/num_clusters': '5', 'aggregator/cluster_pair_accuracy': '1.0',
             'aggregator/aggregation_weights': json.dumps([1.0, 1.0, 2.0]),
             'client_work/train/extra_loss': str(kd), 'client_work/train/loss': '1.0'}
            for r, (a, m, s) in enumerate(zip(acc, match, seen))]

  n = cadis_diagnosis.NUM_CLIENTS
  runs = {'fedavg': {0: [{'test_accuracy': str(a)} for a in (0.2, 0.4, 0.6, 0.8)]},
          'cadis': {0: rows((0.1, 0.3, 0.5, 0.7), (1, 1, 1, 1), (50, 60, n, n), 0.5),
                    1: rows((0.3, 0.5, 0.7, 0.9), (1, 0, 0, 0), (n, n, n, n), 0.1)}}
  text = '\n'.join(cadis_diagnosis._suite_lines(runs, {}))  # pylint: disable=protected-access
  assert 'did not evaluate' not in text
  # runs whose unevaluated rounds were read from a kept making say so
  filled = {('cadis', 0): (600, 480), ('cadis', 1): (600, 432)}
  assert ('read from their 600-round makings in `earlier_runs/rounds600/` for 2 runs (432 to '
          '480 rounds each)') in '\n'.join(cadis_diagnosis._suite_lines(runs, filled))  # pylint: disable=protected-access
  row = next(l for l in text.splitlines() if l.startswith('| cadis | 0, 1 |'))
  # seed 0 matches from round 3 (round 1-2: matching among the clients seen, not all);
  # seed 1 matches at round 1 with every client seen
  assert '| 2 ± 1 |' in row, row
  # a seed whose clusters never match is named
  never = dict(runs, cadis=dict(runs['cadis'], **{'2': rows((0.1,) * 4, (0,) * 4, (n,) * 4,
                                                           0.1)}))
  text_never = '\n'.join(cadis_diagnosis._suite_lines(never, {}))  # pylint: disable=protected-access
  assert '| 2 ± 1 (never on seed 2) |' in text_never, text_never
  assert '| 0.300 ± 0.283 |' in row, row            # λ·KD / cross-entropy: 0.5 and 0.1
  assert '| 2.67 ± 0.00 |' in row, row    # effective participants: 1/Σp² of (1, 1, 2)/4
  last = text.splitlines()[-1]
  assert last.startswith('| 4 |') and '| 1 of 2 |' in last, last
  assert '| 50.00 | 50.00 |' in last, last        # window means: cadis (0.1..0.9) and FedAvg


def test_fedcross_diagnosis_spread_on_random_rounds():
  """One round's spread and choices against direct numpy on random similarity matrices."""
  from benchmarks import fedcross_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  for _ in range(5):
    k = int(rng.integers(3, 11))
    a = rng.normal(size=(k, 40)) + 5.0   # rows pointing the same way, as the models do
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    sim = a @ a.T
    chosen = rng.integers(-1, k, size=k)   # -1: a slot without a collaborator
    chosen[0] = k - 1
    got = fedcross_diagnosis.round_spread({'aggregator/similarity': json.dumps(sim.tolist()),
                                           'aggregator/collaborators': json.dumps(
                                               chosen.tolist())})
    pairs = [1 - sim[i, j] for i in range(k) for j in range(i + 1, k)]
    picked = [c for c in chosen if c >= 0]
    np.testing.assert_allclose(got['median_distance'], np.median(pairs), rtol=1e-12)
    np.testing.assert_allclose(got['max_distance'], max(pairs), rtol=1e-12)
    assert got['distinct'] == len(set(picked))
    np.testing.assert_allclose(got['top_share'],
                               max(picked.count(c) for c in set(picked)) / len(picked))


def test_fedcross_diagnosis_reads_sparsely_evaluated_runs_as_the_report_does():
  """last-10 and the peak margin over the last 10 evaluated rounds (report.last10_at)."""
  from benchmarks import fedcross_diagnosis  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(8)
  rounds = _evaluated(120, 5)
  cross_full, avg_full = rng.uniform(0.4, 0.9, (2, 3, 120))
  def column(full):
    out = np.full(120, np.nan)
    out[np.array(rounds) - 1] = full[np.array(rounds) - 1]
    return out
  for c, a in zip(cross_full, avg_full):
    assert report.last10_of(column(c)) == pytest.approx(c[110:].mean())
    assert report.last10_of(column(c)[:100]) == pytest.approx(c[np.arange(54, 100, 5)].mean())
  margins = [column(c) - column(a) for c, a in zip(cross_full, avg_full)]
  mean = np.mean(margins, axis=0)
  runs = _curve_run(rounds, mean[np.array(rounds) - 1])
  best = max(((report.last10_at(runs, r), r) for r in rounds[9:]), key=lambda w: w[0])
  assert fedcross_diagnosis.peak_margin(margins) == f'{100 * best[0]:+.2f} (round {best[1]})'


def test_swing_is_the_scatter_about_the_windows_line():
  """swing: the std of the residuals of a least-squares line through the evaluated rounds,
  against numpy's lstsq on random windows evaluated every round and every few rounds; a
  loaded run's swing over its last W rounds reads only those rounds."""
  rng = np.random.default_rng(11)
  for every in (1, 3, 5):
    acc = 0.5 + 0.002 * np.arange(50) + rng.normal(0, 0.02, 50)
    acc[np.arange(50) % every != every - 1] = np.nan
    x = np.flatnonzero(np.isfinite(acc)) + 1.0   # rounds: the line's offset does not matter
    y = acc[np.isfinite(acc)]
    coef, *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], axis=1), y, rcond=None)
    residual = y - (coef[0] * x + coef[1])
    assert report.swing(acc) == pytest.approx(np.sqrt(np.mean(residual ** 2)))
  # a straight rise has no swing; under three evaluated rounds there is no line to speak of
  assert report.swing(0.3 + 0.01 * np.arange(20)) == pytest.approx(0, abs=1e-12)
  assert np.isnan(report.swing(np.array([0.5, np.nan, 0.6, np.nan])))
  rounds = list(range(5, 101, 5))   # a 100-round run evaluated every 5 rounds
  acc = list(rng.uniform(0.4, 0.9, len(rounds)))
  run = dict(rounds=100, curve_rounds=rounds, curve_accuracy=acc)
  x = np.array([r for r in rounds if r > 60], np.float64)
  y = np.array([a for r, a in zip(rounds, acc) if r > 60])
  coef = np.polyfit(x, y, 1)
  assert report.run_swing(run, 40) == pytest.approx(np.std(y - np.polyval(coef, x)))


def test_fedcross_diagnosis_tables_on_toy_runs():
  """Margins pair each seed with FedAvg's same seed; the peak is the largest last-10 margin of
  the seeds' mean curves and names the round its window ends at; spreads skip the first 50
  rounds (acceleration)."""
  from benchmarks import fedcross_diagnosis  # pylint: disable=g-import-not-at-top
  n = 60
  sim_early, sim_late = np.full((3, 3), 0.999), np.full((3, 3), 0.9998)   # 1 − cos: 10, 2 e-4

  def rows(acc, collaborators=(1, 2, 1)):
    return [{'test_accuracy': str(a), 'aggregator/alpha': '0.99',
             'aggregator/similarity': json.dumps((sim_early if r < 50 else sim_late).tolist()),
             'aggregator/collaborators': json.dumps(list(collaborators))}
            for r, a in enumerate(acc)]

  base = np.full(n, 0.5)
  bump = base.copy()
  bump[20:30] += 0.1   # the margin's peak: the window of rounds 21-30
  cross = {0: rows(bump + 0.02), 1: rows(base - 0.02)}
  avg = {0: rows(base), 1: rows(base)}
  # pylint: disable=protected-access
  text = '\n'.join(fedcross_diagnosis._summary_lines([('toy', cross, avg, 50)], 3))
  row = next(l for l in text.splitlines() if l.startswith('| toy |'))
  cells = [c.strip() for c in row.strip('|').split('|')]
  assert cells[1] == '0, 1'
  assert cells[2] == '2.0 ± 0.0', row               # rounds 51-60 only
  assert cells[4] == '2.0 ± 0.0' and cells[5] == '0.67 ± 0.00', row
  assert cells[8] == '+0.00 ± 2.83', row            # +2 and -2 points
  assert cells[9] == '+5.00 (round 30)', row       # seed 0: +12, seed 1: -2
  over = '\n'.join(fedcross_diagnosis._rounds_lines([('toy', cross, avg, 50)]))
  # seed 0: 0.52 with ten rounds 0.1 higher, seed 1: 0.48; FedAvg flat (no swing), FedCross's
  # swing that of seed 0's bump about its line (seed 1 flat), averaged over the two seeds
  bump_swing = report.swing(bump[:50])
  assert (f'| 1-50, acceleration | 0.990 | 10.0 | 2.0 | 50.00 | 51.00 | +1.00 ± 4.24 | 0.00 | '
          f'{50 * bump_swing:.2f} |') in over, over
  assert '| 51-60 | 0.990 | 2.0 | 2.0 | 50.00 | 50.00 | +0.00 ± 2.83 | 0.00 | 0.00 |' in over, over
  # Short runs, and runs evaluated every other round, give n/a, never an error.
  short = {0: rows(base[:5])}
  text = '\n'.join(fedcross_diagnosis._summary_lines([('short', short, short, 50)], 3))
  assert text.splitlines()[-1].endswith('| +0.00 (one seed) | n/a |'), text
  assert text.splitlines()[-1].split('|')[3].strip() == 'n/a'   # no round after the acceleration
  sparse = {0: rows(np.where(np.arange(n) % 2, bump, np.nan))}
  text = '\n'.join(fedcross_diagnosis._summary_lines([('sparse', sparse, avg, 50)], 3))
  # the last 10 evaluated rounds: at round 30 rounds 12-30 (even), five of them bumped
  assert '| +5.00 (round 30) |' in text, text
  over = '\n'.join(fedcross_diagnosis._rounds_lines([('sparse', sparse, avg, 50)]))
  assert 'nan' not in text + over


def _fedlex_guidance(rng) -> dict:
  keys = ('guidance_mean', 'guidance_median', 'guidance_below_0_01', 'guidance_zero_fraction',
          'guidance_max')
  return {k: float(v) for k, v in zip(keys, rng.uniform(1e-4, 0.9, 5))}


def test_fedlex_diagnosis_groups_g_by_explorer_rate_and_scales_steps(tmp_path, monkeypatch):
  """G rows group runs by the explorers' rate (--fedlex_exploration_lr, else --client_lr) and
  seed and say whether they agree; the reported runs' G × rate and window margins are numpy's."""
  from benchmarks import fedlex_diagnosis as fd  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  rng = np.random.default_rng(11)
  g_a, g_b = _fedlex_guidance(rng), _fedlex_guidance(rng)

  def write(path, config, accuracy, guidance=None):
    _write_run(path, len(accuracy), accuracy, config=config)
    metrics = os.path.join(path, 'metrics.csv')
    with open(metrics) as f:   # a round not evaluated has no accuracy, as the program writes
      text = f.read().replace(',nan\n', ',\n')
    with open(metrics, 'w') as f:
      f.write(text)
    with open(os.path.join(path, 'summary.json'), 'w') as f:
      json.dump(dict(rounds=len(accuracy), client_epochs_training=1,
                     **({'guidance': guidance} if guidance else {})), f)

  earlier = tmp_path / 'fedlex' / 'earlier_runs' / 'tuning'
  flat = np.full(50, 0.5)
  write(earlier / 'fedlex_avgm_client_lr3', dict(algorithm='fedlex_avgm', client_lr=3.0,
                                                 seed=100), flat, g_a)
  write(earlier / 'fedlex_prox_client_lr3', dict(algorithm='fedlex_prox', client_lr=3.0,
                                                 seed=100), flat, g_a)
  write(tmp_path / 'fedlex' / 'tuning' / 'fedlex_avgm_client_lr3',
        dict(algorithm='fedlex_avgm', client_lr=3.0, fedlex_exploration_lr=0.1, seed=100), flat,
        g_b)
  write(tmp_path / 'fedlex' / 'tuning' / 'fedlex_avgm_client_lr10',
        dict(algorithm='fedlex_avgm', client_lr=10.0, fedlex_exploration_lr=0.1, seed=100), flat,
        g_a)   # another G at the same explorers' rate: the row says so
  text = '\n'.join(fd._g_by_rate_lines(fd.recorded_runs()))  # pylint: disable=protected-access
  assert '| 3 | 100 | 2 (superseded tuning) | yes | ' in text, text
  assert '| 0.1 | 100 | 2 (tuning) | no | ' in text, text
  # A superseded point whose explorers trained at 0.1 is the new rule's point of its name:
  # its row shows the new one's accuracy; one explored at another rate shows none.
  twin = dict(algorithm='fedlex_prox', client_lr=0.1, seed=100)
  write(earlier / 'fedlex_prox_client_lr0.1', twin, np.full(50, 0.4), g_a)
  write(tmp_path / 'fedlex' / 'tuning' / 'fedlex_prox_client_lr0.1',
        dict(twin, fedlex_exploration_lr=0.1), np.full(50, 0.4), g_a)
  write(tmp_path / 'fedlex' / 'tuning' / 'fedlex_prox_client_lr3',
        dict(algorithm='fedlex_prox', client_lr=3.0, fedlex_exploration_lr=0.1, seed=100), flat,
        g_b)
  text = '\n'.join(fd._superseded_lines(fd.recorded_runs()))  # pylint: disable=protected-access
  row = {l.split('|')[1].strip(): l for l in text.splitlines() if l.startswith('| fedlex_')}
  assert row['fedlex_prox_client_lr0.1'].startswith('| fedlex_prox_client_lr0.1 | 0.1 | finished '
                                                    '| 40.00 | ')
  assert row['fedlex_prox_client_lr0.1'].endswith('| 40.00 |'), text    # the twin's accuracy
  assert row['fedlex_prox_client_lr3'].startswith('| fedlex_prox_client_lr3 | 3 | finished | '
                                                  '50.00 |')
  assert row['fedlex_prox_client_lr3'].endswith(' |  |'), text
  # At the same mean step: the guided variant's best point (fedlex_prox at 3, 50%, its G
  # g_b's) beside the base's point nearest 3·Ḡ on a log scale, and the base's best.
  rates = (0.01, 0.1, 0.3, 1.0, 3.0)
  for rate, level in zip(rates, (0.2, 0.3, 0.7, 0.6, 0.1)):
    write(tmp_path / 'fedlex' / 'tuning' / f'fedprox_client_lr{rate:g}',
          dict(algorithm='fedprox', client_lr=rate, seed=100), np.full(50, level))
  target = 3.0 * g_b['guidance_mean']
  nearest = min(rates, key=lambda r: abs(np.log(r / target)))
  text = '\n'.join(fd._equal_step_lines(fd.recorded_runs()))  # pylint: disable=protected-access
  level = dict(zip(rates, ('20.00', '30.00', '70.00', '60.00', '10.00')))[nearest]
  assert (f'| fedlex_prox vs fedprox | 3, 50.00 | {target:.2g} | '
          f'{3.0 * g_b["guidance_max"]:.2g} | {level} at {nearest:g} | 0.3, 70.00 |') in text, text
  # The rate a method's step is scaled by: FedSGD's server rate, else the client's.
  assert fd.step_rate(dict(algorithm='fedlex_sgd', server_lr=3.0, client_lr=0.01)) == 3.0
  assert fd.step_rate(dict(algorithm='fedsgd', server_lr=0.1, client_lr=0.01)) == 0.1
  assert fd.step_rate(dict(algorithm='fedlex_prox', server_lr=1.0, client_lr=30.0)) == 30.0

  # Reported runs: two seeds of one comparison, curves with every other round evaluated.
  suite = fd.SUITE
  rounds = suite.common['rounds']
  curves, guid = {}, {}
  for seed in (0, 1):
    for run, extra in (('fedavgm', dict(client_lr=0.1)),
                       ('fedlex_avgm', dict(client_lr=30.0))):
      acc = rng.uniform(0.3, 0.8, rounds)
      acc[1::2] = np.nan
      curves[run, seed] = acc
      guid[run, seed] = _fedlex_guidance(rng) if run == 'fedlex_avgm' else None
      write(tmp_path / 'fedlex' / 'runs' / f'{run}_s{seed}',
            dict(suite.config_overrides(run), seed=seed, **extra), acc, guid[run, seed])
  text = '\n'.join(fd._runs_lines())  # pylint: disable=protected-access
  row = next(l for l in text.splitlines() if l.startswith('| fedlex_avgm vs fedavgm | 0, 1 |'))
  cells = [c.strip() for c in row.strip('|').split('|')]
  products = [30.0 * guid['fedlex_avgm', s]['guidance_mean'] for s in (0, 1)]
  assert cells[7] == f'{np.mean(products):.2g} ± {np.std(products, ddof=1):.2g}', row
  assert cells[5:7] == ['0.1', '30'], row
  width = report.plateau_window(rounds)
  margins = [[np.nanmean(curves['fedlex_avgm', s][a:a + width]) -
              np.nanmean(curves['fedavgm', s][a:a + width]) for a in range(0, rounds, width)]
             for s in (0, 1)]
  window_row = next(l for l in text.splitlines() if l.startswith('| fedlex_avgm vs fedavgm | ')
                    and '±' in l and l.count('|') == rounds // width + 2)
  first = 100 * np.array([m[0] for m in margins])
  assert window_row.split('|')[2].strip() == (
      f'{first.mean():+.2f} ± {first.std(ddof=1):.2f}'), window_row
  # Each run's window means per seed, and those of a probe made at the same length (the
  # suite's probes are all shorter than its runs: one is set to their length here); a probe
  # of another length is left out, its windows not these.
  (probe,) = [p for p in suite.probes if p.name == 'fedavgm_lower_rate']
  probe = dataclasses.replace(probe, overrides=dict(probe.overrides, rounds=rounds))
  other = dataclasses.replace(probe, name='shorter', overrides=dict(probe.overrides,
                                                                    rounds=rounds // 2))
  monkeypatch.setattr(fd, 'SUITE', dataclasses.replace(suite, probes=(probe, other)))
  probe_acc = rng.uniform(0.3, 0.8, rounds)
  write(tmp_path / 'fedlex' / 'probes' / probe.name / 'fedavgm_s1',
        dict(suite.probe_overrides(probe, 'fedavgm'), seed=1), probe_acc)
  write(tmp_path / 'fedlex' / 'probes' / other.name / 'fedavgm_s1',
        dict(suite.probe_overrides(other, 'fedavgm'), seed=1), probe_acc[:rounds // 2])
  text = '\n'.join(fd._runs_lines())  # pylint: disable=protected-access
  assert '(probe `shorter`)' not in text, text
  for start, acc in (('| fedlex_avgm | 1 | ', curves['fedlex_avgm', 1]),
                     ('| fedavgm (probe `fedavgm_lower_rate`) | 1 | ', probe_acc)):
    row = next(l for l in text.splitlines() if l.startswith(start))
    assert row == start + ' | '.join(f'{100 * np.nanmean(acc[a:a + width]):.2f}'
                                     for a in range(0, rounds, width)) + ' |', row


def test_fedlex_diagnosis_floor_probe_and_runs_stuck_at_chance(tmp_path, monkeypatch):
  """The guidance_floor probe's row pairs floored, unfloored guided and base runs by seed
  (differences numpy's); a finished run that never left chance is named with its round-1
  client training loss, in the reported runs' section and the probe's."""
  from benchmarks import fedlex_diagnosis as fd  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  suite = fd.SUITE
  (probe,) = [p for p in suite.probes if p.name == 'guidance_floor']
  rounds = probe.overrides['rounds']
  rng = np.random.default_rng(5)
  last10 = {}

  def write(path, config, level, first_loss=0.5, length=rounds):
    acc = np.full(length, level)
    acc[rounds:] += 0.2   # rounds past the probe's length: not in its comparison
    _write_run(path, length, acc, config=config)
    metrics = os.path.join(path, 'metrics.csv')
    with open(metrics) as f:
      rows = list(csv.reader(f))
    with open(metrics, 'w', newline='') as f:   # with the program's client loss column
      csv.writer(f).writerows([rows[0] + ['client_work/train/loss']] +
                              [row + [first_loss if i == 1 else 0.5]
                               for i, row in enumerate(rows) if i])
    with open(os.path.join(path, 'summary.json'), 'w') as f:
      json.dump(dict(rounds=length, client_epochs_training=1,
                     guidance=_fedlex_guidance(rng)), f)

  # The reported runs were lengthened past the probe's 100 rounds; seed 1's guided run is
  # missing, so only seeds 0 and 2 pair.
  monkeypatch.setitem(suite.common, 'rounds', 2 * rounds)
  for seed in (0, 1, 2):
    for kind, run in (('base', 'fedprox'), ('guided', 'fedlex_prox')):
      if (kind, seed) == ('guided', 1):
        continue
      last10[kind, seed] = rng.uniform(0.4, 0.8)
      write(tmp_path / 'fedlex' / 'runs' / f'{run}_s{seed}',
            dict(suite.config_overrides(run), seed=seed,
                 client_lr=0.1 if kind == 'base' else 10.0), last10[kind, seed],
            length=2 * rounds)
    # seed 1's floored run learned nothing: a first step that killed the network
    last10['floored', seed] = 0.1 if seed == 1 else rng.uniform(0.4, 0.8)
    write(tmp_path / 'fedlex' / 'probes' / probe.name / f'fedlex_prox_s{seed}',
          dict(suite.probe_overrides(probe, 'fedlex_prox'), seed=seed, client_lr=10.0),
          last10['floored', seed],
          first_loss=4.6e25 if seed == 1 else 0.5)
  text = '\n'.join(fd._floor_probe_lines())  # pylint: disable=protected-access
  row = next(l for l in text.splitlines() if l.startswith('| fedlex_prox |'))
  cells = [c.strip() for c in row.strip('|').split('|')]
  assert cells[1] == '0, 2'
  for column, other in ((7, 'guided'), (8, 'base')):
    d = 100 * np.array([last10['floored', s] - last10[other, s] for s in (0, 2)])
    assert cells[column] == f'{d.mean():+.2f} ± {d.std(ddof=1):.2f}', row
  assert 'fedlex_avgm | no seed finished in all three' in text
  assert 'at the probe\'s length (100 rounds;' in text
  assert 'Stuck at chance with G floored (test accuracy never above 11%): fedlex_prox seed 1 ' \
         '(round-1 client train loss 4.6e+25).' in text, text
  assert fd.stuck_at_chance(report.collect(suite)) == []   # the reported runs all learned


def test_at_length_reads_a_longer_run_over_its_first_rounds(tmp_path):
  """report.at_length: a 30-round run read at 20 rounds is its first 20 (last-10 = rounds
  11-20, numpy's), finished; read at 40 it is not finished; at its own length it is itself."""
  rng = np.random.default_rng(2)
  acc = rng.uniform(0.2, 0.9, 30)
  _write_run(tmp_path / 'r', 30, acc, config=dict(algorithm='fedavg'))
  run = report.load_run(str(tmp_path / 'r'))
  short = report.at_length(run, 20)
  assert short['finished'] and short['rounds'] == 20 and short['curve_rounds'] == list(
      range(1, 21))
  assert short['last10_mean_accuracy'] == pytest.approx(acc[10:20].mean())
  assert short['best_accuracy'] == pytest.approx(acc[:20].max())
  assert short['final_accuracy'] == pytest.approx(acc[19])
  assert not report.at_length(run, 40)['finished']
  assert report.at_length(run, 30) is run
  # its training seconds a round too: the median over rounds 2-20, not the whole run's
  _write_run(tmp_path / 'timed', 50, rng.uniform(0.2, 0.9, 50), config=dict(algorithm='fedavg'),
             seconds=np.r_[9.0, [2.0] * 19, [5.0] * 30])
  timed = report.load_run(str(tmp_path / 'timed'))
  assert (report.at_length(timed, 20)['seconds_per_round'], timed['seconds_per_round']) == (
      2.0, 5.0)


def _every_fifth(acc, last=10):
  """A run's accuracies as a making evaluated every 5th round and each of its last `last`
  records them ('' where not evaluated)."""
  n = len(acc)
  return [a if (r % 5 == 0 or r > n - last) else '' for r, a in enumerate(acc, 1)]


def test_a_length_is_read_from_the_shortest_kept_making_at_least_that_long(tmp_path,
                                                                          monkeypatch):
  """A suite made again at 40 rounds, evaluated every 5th round, whose 30-round makings
  (evaluated every round) are kept in earlier_runs/rounds30/: at 20 rounds its runs are read
  over the 30-round makings' first 20 rounds (last-10 = rounds 11-20, numpy's), not over the
  new making's every-5th evaluations; a seed without a kept making from runs/; a probe at 20
  rounds says which making it compares with."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(5)
  base = tmp_path / 'toy'
  acc = {s: rng.uniform(0.3, 0.9, 40) for s in (0, 1, 2)}
  for s in (0, 1, 2):
    config = dict(suite.config_overrides('base'), seed=s)
    _write_run(base / 'runs' / f'base_s{s}', 40, _every_fifth(acc[s]), config=config)
    if s < 2:
      _write_run(base / 'earlier_runs' / 'rounds30' / f'base_s{s}', 30, acc[s][:30],
                 config=dict(config, rounds=30))
  at20 = report.collect_at(suite, 20)['base']
  for s in (0, 1):
    assert at20[s]['dir'].endswith(os.path.join('rounds30', f'base_s{s}'))
    assert at20[s]['finished'] and at20[s]['rounds'] == 20
    assert at20[s]['last10_mean_accuracy'] == pytest.approx(acc[s][10:20].mean())
  assert at20[2]['dir'].endswith(os.path.join('runs', 'base_s2'))
  assert at20[2]['last10_mean_accuracy'] == pytest.approx(acc[2][[4, 9, 14, 19]].mean())
  assert report.collect_at(suite, 30)['base'][0]['dir'].endswith(
      os.path.join('rounds30', 'base_s0'))
  at40 = report.collect_at(suite)['base']
  assert all(r['dir'].endswith(os.path.join('runs', f'base_s{s}')) for s, r in at40.items())
  short = suites.Probe('short', 'shorter?', dict(rounds=20), ('new',), seeds=(0, 1),
                       unchanged=('base',))
  assert report.unchanged_text(suite, short) == (
      '; compared with the unchanged base as made at 30 rounds before the suite was '
      'lengthened (`earlier_runs/rounds30/`) over their first 20 rounds')


def test_with_kept_evaluations_fills_unevaluated_rounds_from_an_identical_making(tmp_path,
                                                                                monkeypatch):
  """report.with_kept_evaluations: a run evaluated every 5th round takes the test figures of
  the rounds it did not evaluate from its kept shorter making, evaluated every round, when
  every other value of the rounds both ran agrees (timing aside); a making whose training
  loss differs in one round lends nothing."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(8)
  base = tmp_path / 'toy'
  acc = {s: rng.uniform(0.3, 0.9, 40).round(6) for s in (0, 1)}
  loss = {s: rng.uniform(0.1, 2.0, 40).round(6) for s in (0, 1)}
  for s in (0, 1):
    _write_run(base / 'runs' / f'new_s{s}', 40, _every_fifth(acc[s]),
               columns={'client_work/train/loss': loss[s]})
    kept_loss = loss[s][:30].copy()
    if s == 1:
      kept_loss[17] += 1e-6   # another making's last bits: not the same run
    _write_run(base / 'earlier_runs' / 'rounds30' / f'new_s{s}', 30, acc[s][:30],
               seconds=7.0, columns={'client_work/train/loss': kept_loss})
  metrics = {'new': {s: report.metrics_rows(base / 'runs' / f'new_s{s}') for s in (0, 1)}}
  got, filled = report.with_kept_evaluations(suite, metrics)
  assert filled == {('new', 0): (30, 24)}   # 30 rounds, every 5th evaluated: 24 filled
  col = report.metrics_column(got['new'][0], 'test_accuracy')
  np.testing.assert_allclose(col[:30], acc[0][:30])
  want = np.array([np.nan if a == '' else a for a in _every_fifth(acc[0])], np.float64)
  np.testing.assert_array_equal(np.isnan(col[30:]), np.isnan(want[30:]))
  np.testing.assert_allclose(col[30:][~np.isnan(want[30:])], want[30:][~np.isnan(want[30:])])
  assert got['new'][1] == metrics['new'][1]
  assert metrics['new'][0][0]['test_accuracy'] == ''   # the input rows are left as they were


def test_compute_hours_sum_every_kind_of_run(tmp_path, monkeypatch):
  """Each kind's hours are its directories' round seconds summed (unfinished runs too)."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  rng = np.random.default_rng(3)
  want = {}
  for kind, path in (('reported runs', 'runs/base_s0'), ('reported runs', 'runs/new_s1'),
                     ('tuning', 'tuning/base_client_lr0.1'), ('probes', 'probes/p/base_s0'),
                     ('superseded runs', 'earlier_runs/tuning/base_client_lr1')):
    rounds, seconds = int(rng.integers(3, 30)), float(rng.uniform(0.5, 9))
    _write_run(tmp_path / 'toy' / path, rounds + 5, np.full(rounds, 0.5), seconds=seconds)
    want[kind] = want.get(kind, 0.0) + rounds * seconds / 3600
  got = report.compute_hours('toy')
  assert set(got) == set(want)
  for kind in want:
    np.testing.assert_allclose(got[kind], want[kind], rtol=1e-12)


def test_suite_notes_links_are_relinked_for_the_reproduction_page():
  text = ('see [d](diagnosis.md), [r](runs/a/metrics.csv), [w](https://x.org/a), [s](#top), '
          '[a](/abs.md), [p](../fedprox_pull.md)')
  assert report._relinked(text, 'cadis') == (  # pylint: disable=protected-access
      'see [d](cadis/diagnosis.md), [r](cadis/runs/a/metrics.csv), [w](https://x.org/a), '
      '[s](#top), [a](/abs.md), [p](fedprox_pull.md)')
  page = report.reproduction_page()
  for name, suite in suites.SUITES.items():
    if os.path.exists(os.path.join(suites.HERE, f'{name}_diagnosis.py')):
      assert f'diagnosis: [{name}/diagnosis.md]({name}/diagnosis.md)' in page
  # Every relative link of the page leads to a committed file.
  for target in re.findall(r'\]\((?![a-z]+:|/|#)([^)]+)\)', page):
    assert os.path.exists(os.path.join(suites.HERE, target)), target


def test_compare_stops_at_a_signal_like_the_program(tmp_path, monkeypatch):
  """benchmarks.compare hands its StopRequests to each run (SIGTERM/SIGINT stop the run at
  its next round boundary, checkpointed) and a stopped run ends the command: no later run
  starts."""
  import signal  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  stop = experiment.StopRequests()
  monkeypatch.setattr(compare, '_STOP', stop)
  started = []

  def fake_run_experiment(config, stop=None):
    started.append(config.experiment_name)
    assert stop is compare._STOP  # pylint: disable=protected-access
    raise experiment.Interrupted(signal.SIGTERM, 3, config.experiment_dir)

  monkeypatch.setattr(experiment, 'run_experiment', fake_run_experiment)
  configs = [experiment.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name=n)
             for n in ('a', 'b')]
  with pytest.raises(experiment.Interrupted):
    compare.run_all(configs)
  assert started == ['a']


def test_compare_stopped_while_waiting_for_a_run_does_not_start_it(tmp_path, monkeypatch):
  """A signal that arrives while compare waits for another process's run ends the command
  before that run is started, naming its last checkpointed round."""
  import signal  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  stop = experiment.StopRequests()
  stop.signum = signal.SIGTERM   # recorded while waiting
  monkeypatch.setattr(compare, '_STOP', stop)
  monkeypatch.setattr(experiment, 'run_experiment',
                      lambda *a, **k: pytest.fail('a run was started after the signal'))
  config = experiment.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name='r')
  os.makedirs(os.path.join(config.experiment_dir, 'checkpoints', 'program_state_7'))
  with open(os.path.join(config.experiment_dir, 'config.json'), 'w') as f:
    json.dump(dict(rounds=30), f)
  with pytest.raises(experiment.Interrupted) as info:
    compare._run(config)  # pylint: disable=protected-access
  assert info.value.last_round == 7 and info.value.signum == signal.SIGTERM


def test_the_tuning_table_shows_the_suites_summary_columns(tmp_path, monkeypatch):
  """Each grid point's own summary values (e.g. FedLEx's guidance statistics, which change
  with the learning rate) are shown beside its accuracy."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=20), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
      grid=dict(base=dict(client_lr=[0.1, 0.3, 1.0])),
      summary_columns=(('G median', ('guidance', 'guidance_median'), '.2g'),))
  for lr, median in ((0.1, 3.5e-14), (0.3, None)):
    path = tmp_path / 'toy' / 'tuning' / suites.tuning_name('base', dict(client_lr=lr))
    _write_run(path, 20, np.full(20, 0.5), config=dict(algorithm='fedavg'))
    if median is not None:
      summary = json.loads((path / 'summary.json').read_text())
      summary['guidance'] = dict(guidance_median=median)
      (path / 'summary.json').write_text(json.dumps(summary))
  lines = report._tuning_lines(suite, None)  # pylint: disable=protected-access
  assert '| run | values | last-10 mean (%) | G median | chosen |' in lines
  assert '| base | client_lr=0.1 | 50.00 | 3.5e-14 |  |' in lines
  assert '| base | client_lr=0.3 | 50.00 | n/a |  |' in lines
  assert '| base | client_lr=1 | not run yet |  |  |' in lines


def test_compare_waiting_for_another_process_stops_at_a_signal(tmp_path, monkeypatch):
  """While another process holds a run for hours, a recorded signal ends the waiting compare
  within about a second (the wait polls; a blocking flock would ignore the signal)."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  stop = experiment.StopRequests()
  monkeypatch.setattr(compare, '_STOP', stop)

  def fake_run(config):
    with experiment.exclusive_run_directory(config.experiment_dir):
      pass

  monkeypatch.setattr(compare, '_run', fake_run)
  (tmp_path / 'held').mkdir()
  config = experiment.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name='held')
  holding, release = threading.Event(), threading.Event()

  def other_process():
    with experiment.exclusive_run_directory(config.experiment_dir):
      holding.set()
      release.wait(60)

  other = threading.Thread(target=other_process)
  other.start()
  holding.wait(30)
  threading.Timer(0.5, lambda: setattr(stop, 'signum', signal.SIGTERM)).start()
  started = time.time()
  try:
    with pytest.raises(experiment.Interrupted):
      compare.run_all([config])
    assert time.time() - started < 5
  finally:
    release.set()
    other.join()


def test_remade_runs_compare_each_shorter_run_with_its_new_making(tmp_path, monkeypatch):
  """A shorter run kept in earlier_runs/rounds<N>/ beside its new, longer making: the first
  round that differs, the largest one-round gap and both last-10 means over N, as numpy's;
  an identical making has no first difference; a making not yet N rounds long is left out."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(11)
  earlier = rng.uniform(0.3, 0.9, 20)
  again = np.concatenate([earlier[:12], rng.uniform(0.3, 0.9, 28)])   # differs from round 13
  base = tmp_path / 'toy'
  _write_run(base / 'earlier_runs' / 'rounds20' / 'new_s0', 20, earlier, seconds=2.0)
  _write_run(base / 'runs' / 'new_s0', 40, again, seconds=np.r_[9.0, [5.0] * 19, [7.0] * 20])
  _write_run(base / 'earlier_runs' / 'rounds20' / 'base_s0', 20, earlier)
  _write_run(base / 'runs' / 'base_s0', 40, np.concatenate([earlier, again[20:]]))
  _write_run(base / 'earlier_runs' / 'rounds20' / 'base_s1', 20, earlier)
  _write_run(base / 'runs' / 'base_s1', 40, earlier[:15], summary_rounds=15)   # still running
  _write_run(base / 'earlier_runs' / 'rounds20' / 'new_s2', 20, earlier)   # other settings:
  _write_run(base / 'runs' / 'new_s2', 40, again, config=dict(algorithm='fedcda', batch_size=7))
  got = {(r['run'], r['seed']): r for r in report.remade_runs(suite)}
  assert sorted(got) == [('base', 0), ('new', 0)]
  new = got['new', 0]
  assert new['length'] == 20 and new['first_difference'] == 13
  np.testing.assert_allclose(new['largest_gap'], np.abs(earlier - again[:20]).max(), rtol=1e-6)
  np.testing.assert_allclose(new['earlier'], earlier[10:].mean(), rtol=1e-6)
  np.testing.assert_allclose(new['again'], again[10:20].mean(), rtol=1e-6)
  assert got['base', 0]['first_difference'] is None and got['base', 0]['largest_gap'] == 0
  text = '\n'.join(report._remade_lines(report.remade_runs(suite)))  # pylint: disable=protected-access
  assert '`earlier_runs/rounds20/`' in text
  assert (f'| new | 0 | 20 | 40 | round 13 | {100 * np.abs(earlier - again[:20]).max():.2f} | '
          f'10 | {100 * earlier[10:].mean():.2f} | {100 * again[10:20].mean():.2f} | ') in text
  assert '| base | 0 | 20 | 40 | none | 0.00 |' in text
  # each making's training seconds over rounds 2-20: 2.00 and 5.00 (round 1's 9 and the
  # rounds after 20 left out)
  assert [(r['earlier_seconds'], r['again_seconds']) for r in [new]] == [(2.0, 5.0)]
  assert re.search(r'\| new \| 0 \| 20 \| 40 \| round 13 \|[^\n]*\| 2\.00 \| 5\.00 \|$', text,
                   re.M)
  # Made again twice (at 30, then 40): each shorter making is compared with the next longer
  # one, the 20-round making with the 30-round one (where it first differs) and that with
  # the reported 40-round run (the same bit for bit).
  _write_run(base / 'earlier_runs' / 'rounds30' / 'new_s0', 30, again[:30], seconds=3.0)
  got = {(r['run'], r['seed'], r['length']): r for r in report.remade_runs(suite)}
  assert sorted(got) == [('base', 0, 20), ('new', 0, 20), ('new', 0, 30)]
  assert (got['new', 0, 20]['again_rounds'], got['new', 0, 20]['first_difference']) == (30, 13)
  assert got['new', 0, 20]['again_seconds'] == 3.0
  assert (got['new', 0, 30]['again_rounds'], got['new', 0, 30]['first_difference']) == (40, None)
  assert got['base', 0, 20]['again_rounds'] == 40


def test_verdicts_at_each_length_read_the_runs_as_made_there(tmp_path, monkeypatch):
  """A suite lengthened from 20 to 40 rounds, its method ahead by 20 points over the first 20
  rounds and behind by 20 after: at 20 its comparison reads seed 0 (made again longer, and
  differently) from its 20-round making in earlier_runs/rounds20/ and seeds 1-2 (continued)
  over their first 20 rounds; each row's figures, verdict and plateau moves (baseline and
  method, mean and per seed) are numpy's; while the suite is being lengthened further the
  length reported now has one row; a suite without earlier lengths has no such section, and
  bad earlier lengths are refused."""
  suite = dataclasses.replace(_paired_toy_suite(40, tmp_path, monkeypatch),
                              earlier_lengths=(20,))
  monkeypatch.setattr(suites, 'load_paper_numbers', lambda: {
      'toy': {'toy setting': dict(baseline=50.0, method=60.0, dataset='X')}})
  rng = np.random.default_rng(13)
  ahead = np.where(np.arange(40) < 20, 0.2, -0.2)
  acc = {('base', s): rng.uniform(0.3, 0.7, 40) for s in (0, 1, 2)}
  acc.update({('new', s): acc['base', s] + ahead + rng.normal(0, 0.005, 40) for s in (0, 1, 2)})
  kept = {'base': rng.uniform(0.3, 0.7, 20)}   # seed 0's first making
  kept['new'] = kept['base'] + 0.2 + rng.normal(0, 0.005, 20)
  base = tmp_path / 'toy'
  for (run, s), a in acc.items():
    _write_run(base / 'runs' / f'{run}_s{s}', 40, a)
  for run, a in kept.items():
    _write_run(base / 'earlier_runs' / 'rounds20' / f'{run}_s0', 20, a)
  at20 = {(run, s): kept[run] if s == 0 else acc[run, s][:20] for run, s in acc}

  def moved(curves, run, w):
    per = [100 * (curves[run, s][-w:].mean() - curves[run, s][-2 * w:-w].mean())
           for s in (0, 1, 2)]
    mean = np.mean(per)   # every seed evaluated every round: the mean curve's move
    return (f'{w}, {mean:+.2f} ({"not plateaued; " * (abs(mean) >= 0.5)}per seed '
            + ', '.join(f'{p:+.2f}' for p in per) + ')')

  def rows(page):
    section = page[page.index('## The verdicts at each length'):].split('\n\n')[2]
    return [r for r in section.split('\n') if r[:6] in ('| 20 |', '| 40 |')]

  got = rows(report.suite_page(suite)[0])
  assert [r[:6] for r in got] == ['| 20 |', '| 40 |']
  for row, curves, w, word in ((got[0], at20, 5, 'reproduced'), (got[1], acc, 10, 'opposite')):
    last10 = {k: a[-10:].mean() for k, a in curves.items()}
    margins = [100 * (last10['new', s] - last10['base', s]) for s in (0, 1, 2)]
    b = [100 * last10['base', s] for s in (0, 1, 2)]
    m = [100 * last10['new', s] for s in (0, 1, 2)]
    assert row == (
        f'| {len(curves["base", 0])} | toy (new) | 3 | {np.mean(b):.2f} ± '
        f'{np.std(b, ddof=1):.2f} | {np.mean(m):.2f} ± {np.std(m, ddof=1):.2f} | '
        f'{np.mean(margins):+.2f} ± {np.std(margins, ddof=1):.2f} (per seed '
        + ', '.join(f'{x:+.2f}' for x in margins) + f') | **{word}** | '
        f'{moved(curves, "base", w)} | {moved(curves, "new", w)} |'), row
  # Declared 60 rounds, none made yet: the pages report 40, once.
  longer = dataclasses.replace(suite, common=dict(rounds=60), earlier_lengths=(20, 40))
  assert [r[:6] for r in rows(report.suite_page(longer)[0])] == ['| 20 |', '| 40 |']
  page, _, _ = report.suite_page(dataclasses.replace(suite, earlier_lengths=()))
  assert '## The verdicts at each length' not in page
  for lengths in ((20, 10), (20, 20), (40,)):
    with pytest.raises(ValueError, match='earlier_lengths'):
      dataclasses.replace(suite, earlier_lengths=lengths)


def test_a_run_made_again_evaluating_less_often_is_compared_where_both_evaluated(
    tmp_path, monkeypatch):
  """A run made again longer evaluating every 5th round (and its last 10): its missing test
  figures are no difference; the last-10 means are over the shorter run's last 10 rounds that
  the new making evaluated (rounds 15 and 20 of 11-20); a real difference is still found."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(12)
  earlier = rng.uniform(0.3, 0.9, 20)
  rounds = _evaluated(40, 5)
  base = tmp_path / 'toy'
  for seed, again in ((0, np.concatenate([earlier, rng.uniform(0.3, 0.9, 20)])),
                      (1, np.concatenate([earlier[:6], rng.uniform(0.3, 0.9, 34)]))):
    _write_run(base / 'earlier_runs' / 'rounds20' / f'new_s{seed}', 20, earlier)
    path = base / 'runs' / f'new_s{seed}'
    _write_run(path, 40, again, config=dict(algorithm='fedcda', eval_every=5))
    with open(path / 'metrics.csv', 'w', newline='') as f:   # test figures every 5th round
      writer = csv.writer(f)
      writer.writerow(['round', 'seconds', 'test_accuracy'])
      writer.writerows([r, 1.0, again[r - 1] if r in rounds else ''] for r in range(1, 41))
  got = {r['seed']: r for r in report.remade_runs(suite)}
  assert got[0]['first_difference'] is None and got[0]['largest_gap'] == 0
  np.testing.assert_allclose([got[0]['earlier'], got[0]['again']],
                             [earlier[[14, 19]].mean()] * 2, rtol=1e-6)
  assert got[1]['first_difference'] == 10   # rounds 7-9 were not evaluated again
  np.testing.assert_allclose(got[1]['earlier'], earlier[[14, 19]].mean(), rtol=1e-6)
  # The page says the means are over 2 rounds, not 10.
  assert got[0]['tail_rounds'] == 2
  text = '\n'.join(report._remade_lines(report.remade_runs(suite)))  # pylint: disable=protected-access
  assert f'| new | 0 | 20 | 40 | none | 0.00 | 2 | {100 * earlier[[14, 19]].mean():.2f} |' in text


def test_compare_keeps_a_shorter_run_it_makes_again(tmp_path, monkeypatch, capsys):
  """A finished run shorter than the suite's rounds, with no checkpoint, is made again from
  round 1: compare first moves it to earlier_runs/rounds<N>/ (its page then compares the two),
  --plan says so; a stopped run with a checkpoint resumes in place; a name already kept
  there is an error naming both, and nothing moves."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  configs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(suite, None)}
  shorter = np.linspace(0.3, 0.6, 20)
  for name in ('new_s0', 'new_s1', 'base_s0'):
    _write_run(configs[name].experiment_dir, 20, shorter,
               config=dict(dataclasses.asdict(configs[name]), rounds=20))
  os.makedirs(os.path.join(configs['base_s0'].experiment_dir, 'checkpoints', 'program_state_20'))
  kept = tmp_path / 'toy' / 'earlier_runs' / 'rounds20'
  _write_run(kept / 'new_s1', 20, shorter)   # new_s1's name is taken there already
  _write_run(configs['base_s1'].experiment_dir, 20, shorter,   # a shorter run, other settings
             config=dict(dataclasses.asdict(configs['base_s1']), rounds=20, batch_size=7))

  plan = compare.plan(suite, [configs[n] for n in ('new_s0', 'base_s0', 'new_s1', 'base_s1')])
  assert (f'40 rounds left (starts at round 1; its shorter run moves to '
          f'{os.path.relpath(kept)}/new_s0); ') in plan[0], plan
  assert 'resumes after round 20)' in plan[1], plan
  assert 'blocked: ' in plan[2] and 'already keeps a run of that name' in plan[2], plan
  assert 'blocked: ' in plan[3] and 'holds a shorter finished run (20 rounds) of other ' \
      'settings (it was run with --batch_size=7' in plan[3], plan
  # the blocked runs' rounds are not in the total: new_s0's 40 and base_s0's 20 only
  assert plan[4].startswith('2 of 4 runs to make, 60 rounds: ') and '; 2 blocked' in plan[4], plan
  made = []

  def fake_run_experiment(config, stop=None):
    del stop
    made.append((os.path.basename(config.experiment_dir), config.resume))
    if not config.resume:
      _write_run(config.experiment_dir, config.rounds, np.full(config.rounds, 0.7),
                 config=dataclasses.asdict(config))

  monkeypatch.setattr(experiment, 'run_experiment', fake_run_experiment)
  compare._run(configs['new_s0'])   # pylint: disable=protected-access
  compare._run(configs['base_s0'])   # pylint: disable=protected-access
  assert made == [('new_s0', False), ('base_s0', True)]
  assert 'its shorter run is kept in' in capsys.readouterr().err
  np.testing.assert_allclose(report.load_run(str(kept / 'new_s0'))['curve_accuracy'], shorter)
  assert report.load_run(configs['new_s0'].experiment_dir)['rounds_done'] == 40
  assert not (kept / 'base_s0').exists()
  assert [(r['run'], r['seed']) for r in report.remade_runs(suite)] == [('new', 0)]
  with pytest.raises(experiment.ExperimentError, match='already keeps a run of that name'):
    compare._run(configs['new_s1'])   # pylint: disable=protected-access
  assert report.load_run(configs['new_s1'].experiment_dir)['rounds_done'] == 20
  with pytest.raises(experiment.ExperimentError,
                     match=r'holds a shorter finished run \(20 rounds\) of other settings'):
    compare._run(configs['base_s1'])   # pylint: disable=protected-access
  assert report.load_run(configs['base_s1'].experiment_dir)['rounds_done'] == 20
  assert made == [('new_s0', False), ('base_s0', True)]   # neither of those two was made

  # Two compare processes on one run: the other moved it between this one's look and its
  # lock. The directory is gone, so this one makes the run anew instead of failing.
  new_s2 = configs['new_s2']
  _write_run(new_s2.experiment_dir, 20, shorter,
             config=dict(dataclasses.asdict(new_s2), rounds=20))
  lock = experiment.exclusive_run_directory

  def moved_first(exp_dir, wait=False):
    if os.path.isdir(exp_dir):
      os.rename(exp_dir, str(kept / 'new_s2'))   # what the other process did
    return lock(exp_dir, wait)

  monkeypatch.setattr(experiment, 'exclusive_run_directory', moved_first)
  compare._run(new_s2)   # pylint: disable=protected-access
  assert made[-1] == ('new_s2', False)
  assert report.load_run(new_s2.experiment_dir)['rounds_done'] == 40


def test_compare_reading_a_run_the_other_process_moves_makes_it_anew(tmp_path, monkeypatch):
  """The other compare process moves a shorter run away (`_keep_shorter_run`) while this one
  reads it in `_finished`, before either holds the run: the run is free, so this one makes it
  anew instead of failing on the missing files. (Every later look is under the run's lock; a
  move just before this one takes it: test_compare_keeps_a_shorter_run_it_makes_again.)"""
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  kept = tmp_path / 'toy' / 'earlier_runs' / 'rounds20'
  made = []
  monkeypatch.setattr(experiment, 'run_experiment',
                      lambda config, stop=None: made.append(os.path.basename(
                          config.experiment_dir)))
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  _write_run(config.experiment_dir, 20, np.full(20, 0.5),
             config=dict(dataclasses.asdict(config), rounds=20))
  load_run = report.load_run
  calls = []

  def moved_while_read(exp_dir, rounds=None):
    calls.append(exp_dir)
    if len(calls) == 1:
      os.makedirs(kept)
      os.rename(exp_dir, str(kept / 'new_s0'))   # what the other process did
    return load_run(exp_dir, rounds)

  monkeypatch.setattr(report, 'load_run', moved_while_read)
  compare._run(config)   # pylint: disable=protected-access
  assert made == ['new_s0'] and len(calls) == 1


def test_compare_takes_a_longer_run_as_finished_and_keeps_other_shorter_records(
    tmp_path, monkeypatch):
  """A finished run longer than the suite now declares is finished, read over its first
  rounds as its page reads it (not made again shorter over its record); a probe's finished
  run shorter than its probe declares, with no checkpoint, is refused with one line instead
  of being made again from round 1 over its record (only reported runs have a place to keep
  a shorter making)."""
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = _paired_toy_suite(20, tmp_path, monkeypatch)
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  _write_run(config.experiment_dir, 30, np.full(30, 0.5),
             config=dict(dataclasses.asdict(config), rounds=30))
  monkeypatch.setattr(experiment, 'run_experiment', lambda *a, **k: pytest.fail('made'))
  compare._run(config)   # pylint: disable=protected-access
  (total,) = compare.plan(suite, [config])
  assert total.startswith('0 of 1 runs to make, 0 rounds: ')
  assert report.load_run(config.experiment_dir)['rounds_done'] == 30
  probe = dataclasses.replace(config, root_output_dir=str(tmp_path / 'toy' / 'probes' / 'runs'))
  _write_run(probe.experiment_dir, 10, np.full(10, 0.5),
             config=dict(dataclasses.asdict(probe), rounds=10))
  with pytest.raises(experiment.ExperimentError,
                     match='holds a finished run of 10 rounds and no checkpoint to continue it '
                           'to 20: move it away'):
    compare._run(probe)   # pylint: disable=protected-access
  assert report.load_run(probe.experiment_dir)['rounds_done'] == 10


def test_compare_waiting_for_a_run_the_other_process_moved_makes_it(tmp_path, monkeypatch):
  """run_all leaves a run another compare process holds for last and waits for it; if that
  process moved the run's directory away (a shorter run kept, `_keep_shorter_run`) the
  missing directory is free, not an error."""
  from benchmarks import compare  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  os.makedirs(config.experiment_dir)
  calls = []

  def fake_run(c):
    calls.append(c.experiment_dir)
    if len(calls) == 1:   # held by the other process, which then moves the directory away
      os.rename(c.experiment_dir, str(tmp_path / 'moved'))
      raise experiment.RunDirectoryBusy('held')

  monkeypatch.setattr(compare, '_run', fake_run)
  compare.run_all([config])
  assert calls == [config.experiment_dir] * 2


def test_a_comparison_not_yet_made_at_the_new_length_says_so(tmp_path, monkeypatch):
  """Lengthened 20 -> 40 with seed 0 of `base` and `a` made at 40 and `b` still going: the
  section's table gives `a` its one-seed margin and `b` "not made yet", not "not run"."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=40), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg'), a=dict(algorithm='fedcda'),
                b=dict(algorithm='fedprox')),
      comparisons=(suites.Comparison('a', 'base', 'toy a', 'A'),
                   suites.Comparison('b', 'base', 'toy b', 'B')))
  rng = np.random.default_rng(5)
  for run in ('base', 'a', 'b'):
    config = suite.runs[run]
    for s in (0, 1, 2):
      folder = 'earlier_runs/rounds20' if (s == 0 and run != 'b') else 'runs'
      _write_run(tmp_path / 'toy' / folder / f'{run}_s{s}', 20, rng.uniform(0.3, 0.9, 20),
                 config=config)
    if run != 'b':
      _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s0', 40, rng.uniform(0.3, 0.9, 40),
                 config=config)
  page, _, _ = report.suite_page(suite)
  assert '## At 40 rounds so far' in page
  (row_a,) = [line for line in page.splitlines() if line.startswith('| A (a) | 1 |')]
  (row_b,) = [line for line in page.splitlines() if line.startswith('| B (b) | 0 |')]
  assert row_a.endswith('**one seed** |') and row_b.endswith('**not made yet** |')
  assert '**not run**' not in page


def test_a_suite_being_lengthened_reports_its_last_complete_length(tmp_path, monkeypatch):
  """A suite lengthened from 20 to 40 rounds and made again seed by seed: until every run has
  every seed at 40, its numbers are at 20 (the seeds made again read from their 20-round
  makings in earlier_runs/rounds20/, the rest from runs/), and a section shows the seeds
  finished at 40 so far and what is under way or not made yet; once all are, 40 it is."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(12)
  base = tmp_path / 'toy'
  short = {(run, s): rng.uniform(0.3, 0.9, 20) for run in ('base', 'new') for s in (0, 1, 2)}
  long = {(run, s): np.concatenate([short[run, s], rng.uniform(0.3, 0.9, 20)])
          for run in ('base', 'new') for s in (0, 1, 2)}
  for (run, s), acc in short.items():
    if s == 2:      # not made again yet: still the 20-round run in runs/
      _write_run(base / 'runs' / f'{run}_s{s}', 20, acc)
    else:
      _write_run(base / 'earlier_runs' / 'rounds20' / f'{run}_s{s}', 20, acc)
  for run in ('base', 'new'):
    _write_run(base / 'runs' / f'{run}_s0', 40, long[run, 0])
  _write_run(base / 'runs' / 'base_s1', 40, long['base', 1][:15], summary_rounds=15)   # going
  assert report.reported_rounds(suite) == 20
  runs = report.collect(suite)
  for (run, s), acc in short.items():
    assert runs[run][s]['finished']
    np.testing.assert_allclose(runs[run][s]['last10_mean_accuracy'], acc[10:].mean(), rtol=1e-6)
  assert runs['base'][0]['dir'].endswith(os.path.join('earlier_runs', 'rounds20', 'base_s0'))
  assert [len(rows) for rows in report.suite_metrics(suite)['base'].values()] == [20] * 3
  summary = report.suite_summary(suite)
  (row,) = summary['comparisons']
  diffs = [short['new', s][10:].mean() - short['base', s][10:].mean() for s in (0, 1, 2)]
  np.testing.assert_allclose(row['margin'], 100 * np.mean(diffs), rtol=1e-6)
  np.testing.assert_allclose(row['margin_std'], 100 * np.std(diffs, ddof=1), rtol=1e-6)
  (longer,) = summary['longer_comparisons']
  assert longer['seeds'] == [0] and longer['verdict'] == 'one seed'
  np.testing.assert_allclose(
      longer['margin'], 100 * (long['new', 0][30:].mean() - long['base', 0][30:].mean()),
      rtol=1e-6)
  page, _, _ = report.suite_page(suite)
  assert 'These figures are at 20 rounds' in page and '## At 40 rounds so far' in page
  assert '(2 of 6 runs finished there so far)' in page
  assert ('Under way at 40 rounds (stopped ones continue from their last checkpoint): '
          '`base` seed 1 (round 15).') in page
  assert 'Not made at 40 rounds yet: `base` seed 2, `new` seed 1, `new` seed 2.' in page
  assert '| toy (new) | 1 |' in page and '## Not finished yet' not in page
  assert 'not made yet' not in page
  assert ('Being lengthened: the settings above are the 40-round making\'s; the tables below '
          'are read at `rounds=20` until every run has every seed at 40 rounds') in page
  # A lengthened making evaluated more sparsely says how the tables' runs were evaluated.
  suite.common['eval_every'] = 5
  assert ('read at `rounds=20`, from runs evaluated every round (`eval_every=1`) until'
          in report.suite_page(suite)[0])
  del suite.common['eval_every']
  monkeypatch.setattr(suites, 'SUITES', {'toy': suite})
  (status,) = report.status_lines()
  assert ('6 of 6 runs finished at 20 rounds (being lengthened to 40: 2 of 6 runs finished '
          'there)') in status
  # every seed made at 40 (one diverged: deterministic, so done): the suite reports 40
  shutil.rmtree(base / 'runs' / 'base_s1')
  _write_run(base / 'runs' / 'base_s1', 40, long['base', 1])
  _write_run(base / 'runs' / 'new_s1', 40, long['new', 1])
  for run in ('base', 'new'):
    shutil.rmtree(base / 'runs' / f'{run}_s2')
  _write_run(base / 'runs' / 'base_s2', 40, long['base', 2])
  _write_run(base / 'runs' / 'new_s2', 40, long['new', 2][:33], summary_rounds=33)
  (base / 'runs' / 'new_s2' / 'diverged.txt').write_text('training diverged at round 34\n')
  assert report.reported_rounds(suite) == 40
  page, _, _ = report.suite_page(suite)
  assert 'These figures are at' not in page and 'rounds so far' not in page
  assert 'Being lengthened' not in page
  assert 'training diverged at round 34' in page


def test_at_length_a_divergence_past_the_length_does_not_count(tmp_path):
  """A 30-round run that diverged in round 26 (25 rounds recorded) read at 20 rounds is
  finished and not diverged there; at 30 it is the diverged run."""
  acc = np.random.default_rng(3).uniform(0.2, 0.9, 25)
  _write_run(tmp_path / 'r', 30, acc, config=dict(algorithm='fedavg'), summary_rounds=25)
  (tmp_path / 'r' / 'diverged.txt').write_text('training diverged at round 26 (NaN)\n')
  run = report.load_run(str(tmp_path / 'r'))
  assert run['diverged'] and not run['finished']
  short = report.at_length(run, 20)
  assert short['finished'] and short['diverged'] is None and short['rounds_done'] == 20
  assert report.usable(short)


def test_a_lengthened_suite_keeps_probe_baselines_and_summaries_at_their_lengths(
    tmp_path, monkeypatch):
  """While a suite declared at 40 rounds reports at 20: a probe of 30 rounds that leaves the
  baseline unchanged reads the baseline's runs at 30 (usable where they got there), not
  cut to the pages' 20; a run extended in place (checkpoints kept, nothing in earlier_runs/)
  read at 20 drops its summary, which is the longer making's (n/a on the page)."""
  probe = suites.Probe('p', 'q?', dict(rounds=30), ('new',), seeds=(0, 1, 2),
                       unchanged=('base',))
  suite = dataclasses.replace(_paired_toy_suite(40, tmp_path, monkeypatch), probes=(probe,))
  base = tmp_path / 'toy'
  rng = np.random.default_rng(13)
  long = {s: rng.uniform(0.3, 0.9, 40) for s in (0, 1, 2)}
  for s in (0, 1, 2):
    _write_run(base / 'runs' / f'new_s{s}', 20, np.full(20, 0.6))
    _write_run(base / 'probes' / 'p' / f'new_s{s}', 30, np.full(30, 0.6))
  _write_run(base / 'runs' / 'base_s0', 40, long[0])   # extended in place, finished
  _write_run(base / 'runs' / 'base_s1', 40, long[1][:33], summary_rounds=20)   # extending
  _write_run(base / 'runs' / 'base_s2', 20, long[2][:20])
  assert report.reported_rounds(suite) == 20
  runs = report.collect(suite)['base']
  assert runs[0]['summary'] == {} and runs[0]['client_epochs_training'] is None
  assert runs[1]['summary']['rounds'] == 20   # its summary is still the 20-round making's
  page, _, _ = report.suite_page(suite)
  assert '| base | 3 |' in page and '| n/a | 0.0 MiB |' in page
  got = report.collect_probe(suite, probe)['base']
  assert [report.usable(got[s]) for s in (0, 1, 2)] == [True, True, False]
  for s in (0, 1):
    np.testing.assert_allclose(got[s]['last10_mean_accuracy'], long[s][20:30].mean(), rtol=1e-6)
  # probe_metrics: the probe's own runs, and the unchanged ones from their own directories
  rows = report.probe_metrics(suite, probe)
  assert sorted(rows['base']) == [0, 1] and sorted(rows['new']) == [0, 1, 2]
  for s in (0, 1):
    np.testing.assert_allclose(report.metrics_column(rows['base'][s], 'test_accuracy'),
                               long[s][:30], rtol=1e-6)


def test_a_run_read_short_of_its_making_sums_its_costs_from_its_rows(tmp_path, monkeypatch):
  """A run extended in place past the length the pages read (its summary is the longer
  making's) gets its client-epochs and exploration cost over the rounds read, summed from
  metrics.csv as the program sums them into summary.json; without the column it is n/a."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  base = tmp_path / 'toy'
  rng = np.random.default_rng(29)
  epochs = rng.integers(0, 9, 40).astype(float)
  explored = np.cumsum(rng.integers(0, 4, 40)).astype(float)
  for s in (0, 1, 2):
    _write_run(base / 'runs' / f'base_s{s}', 40, rng.uniform(0.3, 0.9, 40),
               columns={'client_work/train/client_epochs': epochs,
                        'exploration_client_epochs': explored})
    _write_run(base / 'runs' / f'new_s{s}', 20, rng.uniform(0.3, 0.9, 20))
  runs = report.collect(suite)
  assert report.reported_rounds(suite) == 20
  for s in (0, 1, 2):
    assert runs['base'][s]['summary'] == {}
    assert runs['base'][s]['client_epochs_training'] == int(epochs[:20].sum())
    assert runs['base'][s]['exploration_client_epochs'] == explored[19]
    assert runs['new'][s]['client_epochs_training'] == 20   # its own summary's
  page, _, _ = report.suite_page(suite)
  assert '| base | 3 |' in page
  row = [l for l in page.split('\n') if l.startswith('| base | 3 |')][0]
  assert f'| {int(epochs[:20].sum())} | 0.0 MiB |' in row
  # rows short of a round's cost (an older making) give no figure
  rows = [dict(round=str(r), **{'client_work/train/client_epochs': '2'}) for r in (1, 2, 3)]
  rows[1]['client_work/train/client_epochs'] = ''
  assert report._costs_from_rows(rows, 3)['client_epochs_training'] is None
  assert report._costs_from_rows(rows[:1], 1)['client_epochs_training'] == 2


def test_whole_round_ratio_sums_the_rounds_that_record_both(tmp_path, monkeypatch):
  """report.whole_round_ratio: round_seconds over seconds, summed over every round but the
  first of the runs that record both; NaN when none does."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  _write_run(tmp_path / 'toy' / 'runs' / 'old_s0', 5, np.full(5, 0.5), seconds=1.0)
  assert np.isnan(report.whole_round_ratio('toy'))
  _write_run(tmp_path / 'toy' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
             round_seconds=3.0)
  _write_run(tmp_path / 'toy' / 'tuning' / 'b_lr1', 3, np.full(3, 0.5), seconds=1.0,
             round_seconds=4.0)
  assert report.whole_round_ratio('toy') == pytest.approx((4 * 3.0 + 2 * 4.0) / (4 * 2.0 + 2))
  # which runs the ratio comes from, and how long their rounds trained (median of 2,2,2,2,1,1)
  ratio, kinds, median = report.whole_round_record('toy')
  assert kinds == ('reported runs', 'tuning') and median == pytest.approx(2.0)
  line = report._compute_line('toy')
  assert ('the rounds that record both, in the suite\'s reported runs and tuning (a median 2.0 s '
          'of training a round), took 2.0 times') in line


def test_evaluation_seconds_compares_evaluated_rounds_with_the_others(tmp_path, monkeypatch):
  """report.evaluation_seconds: median (whole - training) of evaluated rounds less that of the
  others, and the median training seconds, over runs evaluated every few rounds only."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  _write_run(tmp_path / 'toy' / 'runs' / 'dense_s0', 5, np.full(5, 0.5), seconds=7.0,
             round_seconds=9.0)   # every round evaluated: says nothing about the difference
  assert all(np.isnan(report.evaluation_seconds('toy')))
  path = tmp_path / 'toy' / 'runs' / 'sparse_s0'
  os.makedirs(path)
  with open(path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'seconds', 'test_accuracy', 'round_seconds'])
    for r, (train, acc, whole) in enumerate([(5.0, 0.1, 9.0), (2.0, '', 2.1), (3.0, '', 3.1),
                                             (2.0, 0.5, 3.6), (2.5, '', 2.7), (2.0, 0.6, 3.3)],
                                            1):
      writer.writerow([r, train, acc, whole])
  evaluation, training = report.evaluation_seconds('toy')
  # rounds 2-6: evaluated extras 1.6, 1.3 (median 1.45); others 0.1, 0.1, 0.2 (median 0.1)
  assert evaluation == pytest.approx(1.45 - 0.1)
  assert training == pytest.approx(np.median([2.0, 3.0, 2.0, 2.5, 2.0]))


def test_whole_round_example_cites_a_suite_that_records_whole_rounds(tmp_path, monkeypatch):
  """For a suite without whole rounds recorded, the pages and --plan cite the ratio measured on
  another suite (computed from its runs, not a constant), with how often its runs evaluate,
  preferring one evaluated every round; none recorded says so."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))

  def suite(name, **common):
    return suites.Suite(name=name, title=name, common=dict(rounds=5, **common), scaled='-',
                        runs=dict(a=dict(algorithm='fedavg')), comparisons=())

  monkeypatch.setattr(suites, 'SUITES', {'old': suite('old'), 'dense': suite('dense'),
                                         'sparse': suite('sparse', eval_every=5)})
  _write_run(tmp_path / 'old' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=1.0)
  assert report.whole_round_example() == 'no suite records it yet'
  _write_run(tmp_path / 'sparse' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
             round_seconds=3.0)
  assert report.whole_round_example() == (
      'e.g. the sparse suite\'s recorded rounds, evaluated every 5 rounds, took 1.5 times their '
      'training')
  _write_run(tmp_path / 'dense' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
             round_seconds=5.0)
  assert report.whole_round_example() == (
      'e.g. the dense suite\'s recorded rounds, evaluated every round, took 2.5 times their '
      'training')
  assert report.whole_round_example(besides='dense').startswith('e.g. the sparse suite')
  shutil.rmtree(tmp_path / 'dense')
  assert report.whole_round_example(besides='sparse') == 'no suite records it yet'


def test_fedprox_pull_arithmetic_against_numpy():
  rng = np.random.default_rng(3)
  update = [rng.normal(size=(3, 4)), rng.normal(size=5)]
  reference = [rng.normal(size=(3, 4)), rng.normal(size=5)]
  flat = lambda ts: np.concatenate([t.ravel() for t in ts])  # noqa: E731
  assert fedprox_pull.relative_difference(update, reference) == pytest.approx(
      np.linalg.norm(flat(update) - flat(reference)) / np.linalg.norm(flat(reference)))
  # 7 examples at batch 3: 3 steps an epoch; 6 examples: 2
  assert fedprox_pull.local_steps([7, 6], batch_size=3, epochs=2) == pytest.approx(5.0)
  assert ('fedcross', 'fedprox_beta0.1', 'fedavg_beta0.1') in fedprox_pull.PAIRS
  assert ('cadis', 'fedprox', 'fedavg') in fedprox_pull.PAIRS


def _fedprox_pull_configs(tmp_path, monkeypatch, **prox):
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  common = dict(dataset='digits', num_clients=6, clients_per_round=3, batch_size=16,
                client_lr=0.1, client_momentum=0.5, rounds=2, seed=0)
  for run, extra in (('fedavg', {}), ('fedprox', dict(dict(proximal_strength=0.5), **prox))):
    os.makedirs(tmp_path / 'toy' / 'runs' / f'{run}_s0')
    (tmp_path / 'toy' / 'runs' / f'{run}_s0' / 'config.json').write_text(
        json.dumps(dict(common, algorithm=run, **extra)))


def test_fedprox_pull_refuses_runs_that_differ_in_more_than_the_proximal_term(
    tmp_path, monkeypatch):
  _fedprox_pull_configs(tmp_path, monkeypatch, client_lr=0.2)
  with pytest.raises(ValueError, match=r"differ in \['client_lr'\]"):
    fedprox_pull.measure('toy', 'fedprox', 'fedavg')


def test_fedprox_pull_measures_zero_at_mu_zero_and_a_difference_otherwise(tmp_path,
                                                                          monkeypatch):
  """End to end on digits: FedProx at μ = 0 is FedAvg (difference exactly 0: the two rounds
  start from the same model, clients and batch orders), at μ = 0.5 it is not; the yardstick
  (other batch orders) is never 0."""
  monkeypatch.setattr(fedprox_pull, 'MEASURED_ROUNDS', (1, 2))
  _fedprox_pull_configs(tmp_path, monkeypatch)
  pulled = fedprox_pull.measure('toy', 'fedprox', 'fedavg')
  (tmp_path / 'toy' / 'runs' / 'fedprox_s0' / 'config.json').write_text(
      (tmp_path / 'toy' / 'runs' / 'fedprox_s0' / 'config.json').read_text().replace(
          '"proximal_strength": 0.5', '"proximal_strength": 0.0'))
  same = fedprox_pull.measure('toy', 'fedprox', 'fedavg')
  assert [r['round'] for r in pulled['rows']] == [1, 2] and pulled['mu'] == 0.5
  assert all(r['relative_difference'] == 0.0 for r in same['rows'])
  assert all(r['relative_difference'] > 1e-4 for r in pulled['rows'])
  assert all(r['reshuffled'] > 1e-3 for r in pulled['rows'] + same['rows'])
  page = fedprox_pull.page([pulled])
  assert '| toy | `fedprox` vs `fedavg` | 0.5 | 0.1 (0.5) |' in page


def test_fedprox_pull_page_regenerates_from_its_measurements():
  with open(fedprox_pull.OUT_JSON) as f:
    results = json.load(f)
  with open(fedprox_pull.OUT) as f:
    assert fedprox_pull.page(results) == f.read()


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_every_kept_length_is_an_earlier_length_of_its_suite(name):
  """A length whose makings are kept in earlier_runs/rounds<N>/ was reported: its verdicts
  belong in results.md's 'The verdicts at each length'."""
  suite = suites.SUITES[name]
  kept = report.kept_lengths(suites.suite_dir(name))
  assert set(kept) <= set(suite.earlier_lengths), (kept, suite.earlier_lengths)


def test_every_run_gives_each_seeds_plateau_move(tmp_path, monkeypatch):
  """'Every run' gives the mean curve's move over its last W rounds against the W before,
  '(not plateaued)' past 0.5 points, and each seed's own move, all as numpy's."""
  suite = _paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(14)
  acc = {('base', s): np.linspace(0.5, 0.6, 40) + rng.normal(0, 0.01, 40) for s in (0, 1, 2)}
  acc.update({('new', s): 0.7 + rng.normal(0, 0.0005, 40) for s in (0, 1, 2)})
  for (run, s), a in acc.items():
    _write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 40, a)
  page, _, _ = report.suite_page(suite)
  for run, flag in (('base', 'not plateaued; '), ('new', '')):
    per = [100 * (acc[run, s][30:].mean() - acc[run, s][20:30].mean()) for s in (0, 1, 2)]
    row = f'| {run} | 3 | '
    line = [l for l in page.split('\n') if l.startswith(row)][0]
    assert (f'| 10, {np.mean(per):+.2f} ({flag}per seed '
            + ', '.join(f'{p:+.2f}' for p in per) + ') |') in line, line


def test_every_committed_table_row_has_its_headers_cells():
  """A bar inside a cell (e.g. 1/|C_i| in a label) splits it in two on GitHub unless escaped
  as \\|: every row of every table in the committed pages has as many cells as its header."""
  pages = [os.path.join(root, name) for root, _, names in os.walk(suites.HERE)
           for name in names if name.endswith('.md')]
  pages.append(os.path.join(os.path.dirname(suites.HERE), 'README.md'))
  bad = []
  for page in pages:
    with open(page, encoding='utf-8') as f:
      header = None
      for number, line in enumerate(f.read().split('\n'), 1):
        cells = len(re.findall(r'(?<!\\)\|', line)) if line.startswith('|') else None
        header = header if cells and header else cells
        if cells and cells != header:
          bad.append(f'{os.path.relpath(page, suites.HERE)}:{number}')
  assert not bad, bad
