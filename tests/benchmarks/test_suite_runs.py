"""benchmarks/suite_runs.py: reading run directories (lengths, kept makings, borrowed runs, costs)
and the statistics read from them, against numpy on toy runs."""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from benchmarks import suite_runs
from benchmarks import suites
from programs.studies import declaration
from programs.studies import records
from tests.benchmarks.toy_runs import (curve_run, evaluated, every_fifth, paired_toy_suite,
                                       write_run)


def test_plateau_delta_is_the_move_between_the_last_two_windows():
  rng = np.random.default_rng(0)
  curves = [np.clip(np.linspace(0.2, 0.8, 200) + rng.normal(0, 0.01, 200), 0, 1)
            for _ in range(3)]
  w, moved = suite_runs.plateau_delta([curve_run(range(1, 201), c) for c in curves])
  mean = np.mean(curves, axis=0) * 100
  assert w == 50
  assert moved == pytest.approx(mean[-50:].mean() - mean[-100:-50].mean())
  w, moved = suite_runs.plateau_delta([curve_run(range(1, 41), np.full(40, 0.7))])
  assert (w, moved) == (10, 0.0)


def test_sparsely_evaluated_runs_are_read_by_round():
  """Runs evaluated every 5 rounds and each of their last 10: the windows, the mean curve,
  the last-10 means and the headline figures are by round, against numpy on random curves."""
  rng = np.random.default_rng(3)
  rounds = evaluated(300, 5)
  assert rounds[:3] == [5, 10, 15] and rounds[-12:] == [285, 290] + list(range(291, 301))
  full = [rng.uniform(0.3, 0.9, 300) for _ in range(3)]
  runs = [curve_run(rounds, f[np.array(rounds) - 1]) for f in full]
  x, mean, std = records.mean_curve(runs)
  np.testing.assert_array_equal(x, rounds)
  stacked = np.array([f[np.array(rounds) - 1] for f in full])
  np.testing.assert_allclose(mean, stacked.mean(0))
  np.testing.assert_allclose(std, stacked.std(0, ddof=1))
  w, moved = suite_runs.plateau_delta(runs)
  by_round = dict(zip(rounds, stacked.mean(0)))
  last = [v for r, v in by_round.items() if r > 250]
  before = [v for r, v in by_round.items() if 200 < r <= 250]
  assert w == 50 and len(before) == 10 and len(last) == 18
  assert moved == pytest.approx(100 * (np.mean(last) - np.mean(before)))
  # last-10 means: the last 10 evaluations up to the round (rounds 291-300 at the end,
  # 205-250 at round 250, which a run evaluated every round would read as 241-250)
  for end, window in ((300, range(291, 301)), (250, range(205, 251, 5)),
                      (253, range(205, 251, 5))):
    assert suite_runs.last10_at(runs[0], end) == pytest.approx(full[0][np.array(window) - 1].mean())
  figures = records.curve_figures(list(zip(rounds, runs[0]['curve_accuracy'])), 300)
  assert figures['last10_mean_accuracy'] == pytest.approx(full[0][290:].mean())
  assert figures['final_accuracy'] == full[0][299]
  # the mean curve holds only the rounds every run evaluated
  x, _, _ = records.mean_curve([runs[0], curve_run(range(1, 301), full[1])])
  np.testing.assert_array_equal(x, rounds)


def test_load_run_records_the_rounds_that_dropped_clients(tmp_path):
  """A run that left non-finite clients out of some rounds records (round, how many) of
  each, up to the length it is read at; a run that dropped none records none."""
  dropped = [0] * 12
  dropped[0], dropped[6] = 1, 2
  write_run(tmp_path / 'new_s1', 12, np.full(12, 0.5), columns={'dropped_clients': dropped})
  assert records.load_run(str(tmp_path / 'new_s1'))['dropped_clients'] == [(1, 1), (7, 2)]
  assert records.load_run(str(tmp_path / 'new_s1'), 6)['dropped_clients'] == [(1, 1)]
  write_run(tmp_path / 'new_s2', 12, np.full(12, 0.5))
  assert records.load_run(str(tmp_path / 'new_s2'))['dropped_clients'] == []


def test_runs_that_never_left_chance_are_told_apart(tmp_path, monkeypatch):
  """A finished run whose test accuracy never passed 11% (ten classes) never left chance;
  one that passed it once did; both stay in the suite's runs (no seed is dropped)."""
  suite = paired_toy_suite(12, tmp_path, monkeypatch)
  rng = np.random.default_rng(3)
  for run, s in [(run, s) for run in ('base', 'new') for s in (0, 1, 2)]:
    acc = rng.uniform(0.5, 0.9, 12)
    if (run, s) == ('new', 1):
      acc = np.full(12, 0.1)
    if (run, s) == ('base', 2):   # at chance but once, at 11.5%
      acc = np.full(12, 0.1)
      acc[4] = 0.115
    write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 12, acc)
  runs = suite_runs.collect(suite)
  assert all(records.usable(r) for seeds in runs.values() for r in seeds.values())
  assert [(run, s) for run, seeds in runs.items() for s, r in seeds.items()
          if suite_runs.never_left_chance(r)] == [('new', 1)]


def test_runs_that_fell_back_to_chance_give_the_round_their_last_stretch_began(tmp_path,
                                                                              monkeypatch):
  """A finished run that learned, then ended at chance (a late blow-up), falls to chance at
  the round its last stretch at chance began; a run that dipped to chance and recovered, or
  one that never left it, does not."""
  suite = paired_toy_suite(12, tmp_path, monkeypatch)
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
    write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{s}', 12, acc)
  runs = suite_runs.collect(suite)
  assert {(run, s): suite_runs.fell_to_chance(r) for run, seeds in runs.items()
          for s, r in seeds.items() if suite_runs.fell_to_chance(r)} == {('new', 2): 9}
  assert suite_runs.never_left_chance(runs['new'][0])
  assert suite_runs.fell_to_chance(runs['new'][0]) is None


def test_on_common_rounds_reads_a_pair_at_the_rounds_both_evaluated():
  """A probe's method, evaluated every 5th round, beside a baseline it keeps unchanged,
  evaluated every round: both are read at the rounds both evaluated (the baseline's last 10
  rounds would be 91-100 while the method's are 55-100), as copies."""
  sparse = evaluated(100, 5)
  rng = np.random.default_rng(8)
  curves = {run: np.linspace(0.3, 0.8, 100) + rng.normal(0, 0.02, 100) for run in ('a', 'b')}
  base = dict(curve_run(range(1, 101), curves['a']), rounds=100)
  method = dict(curve_run(sparse, curves['b'][np.array(sparse) - 1]), rounds=100)
  a, b = suite_runs.on_common_rounds(base, method)
  assert a['curve_rounds'] == b['curve_rounds'] == sparse
  assert a['best_accuracy'] == pytest.approx(curves['a'][np.array(sparse) - 1].max())
  assert a['last10_mean_accuracy'] == pytest.approx(curves['a'][np.array(sparse[-10:]) - 1].mean())
  assert b['final_accuracy'] == pytest.approx(curves['b'][99])
  assert base['curve_rounds'] == list(range(1, 101))   # copies: the runs kept


def test_common_evaluations_blank_what_the_other_run_did_not_evaluate():
  """A recorded NaN counts as evaluated (as load_run reads it); runs of different rounds are
  refused rather than paired by position."""
  one = [{'round': '1', 'test_accuracy': '0.5'}, {'round': '2', 'test_accuracy': ''},
         {'round': '3', 'test_accuracy': 'nan'}]
  two = [{'round': '1', 'test_accuracy': ''}, {'round': '2', 'test_accuracy': '0.7'},
         {'round': '3', 'test_accuracy': '0.6'}]
  a, b = suite_runs.common_evaluations(one, two)
  assert [r['test_accuracy'] for r in a] == ['', '', 'nan']
  assert [r['test_accuracy'] for r in b] == ['', '', '0.6']
  assert one[0]['test_accuracy'] == '0.5'   # copies
  with pytest.raises(ValueError, match='same rounds'):
    suite_runs.common_evaluations(one, two[:2])


def test_collect_reads_every_seed_ever_run_and_its_figures(tmp_path, monkeypatch):
  """Three seeds of a synthetic suite: each run's last-10 mean is numpy's; a stopped seed
  beyond them is read too (not finished, its rounds done), not dropped."""
  suite = paired_toy_suite(30, tmp_path, monkeypatch)
  rng = np.random.default_rng(1)
  tails = {}
  for run, level in (('base', 0.6), ('new', 0.7)):
    for seed in (0, 1, 2):
      acc = np.clip(level + rng.normal(0, 0.02, 30), 0, 1)
      write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 30, acc)
      tails[run, seed] = acc[-10:].mean()
  write_run(tmp_path / 'toy' / 'runs' / 'new_s7', 30, np.full(12, 0.5), summary_rounds=12)
  runs = suite_runs.collect(suite)
  assert sorted(runs['base']) == [0, 1, 2] and sorted(runs['new']) == [0, 1, 2, 7]
  for (run, seed), tail in tails.items():
    assert records.usable(runs[run][seed])
    assert runs[run][seed]['last10_mean_accuracy'] == pytest.approx(tail)
  assert not runs['new'][7]['finished'] and runs['new'][7]['rounds_done'] == 12


def test_a_run_shorter_than_its_suite_is_not_finished(tmp_path, monkeypatch):
  """A suite lengthened after its runs were made (--rounds raised): the runs read as stopped
  at their old length, and the tuning runs stay finished at their own length."""
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=40), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
      grid=dict(base=dict(client_lr=[0.1, 0.3])), tuning_rounds=20)
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  write_run(tmp_path / 'toy' / 'runs' / 'base_s0', 20, np.full(20, 0.5))
  for lr in (0.1, 0.3):
    write_run(tmp_path / 'toy' / 'tuning' / declaration.tuning_name('base', dict(client_lr=lr)), 20,
              np.full(20, lr))
  run = suite_runs.collect(suite)['base'][0]
  assert not run['finished'] and (run['rounds_done'], run['rounds']) == (20, 40)
  assert records.load_run(str(tmp_path / 'toy' / 'runs' / 'base_s0'))['finished']
  for values in records.grid_points(suite.grid['base']):
    path = tmp_path / 'toy' / 'tuning' / declaration.tuning_name('base', values)
    tuning = records.at_length(records.load_run(str(path)),
                               suite.tuning_overrides('base', values)['rounds'])
    assert tuning['finished'] and tuning['last10_mean_accuracy'] == pytest.approx(
        values['client_lr'])


@pytest.mark.parametrize('rounds, want', [
    (200, list(range(20, 201, 20))), (300, list(range(50, 301, 50))),
    (150, list(range(25, 151, 25))), (100, list(range(10, 101, 10))), (7, [7])])
def test_checkpoint_rounds(rounds, want):
  assert suite_runs.checkpoint_rounds(rounds) == want


def test_a_run_made_at_other_settings_is_left_out_and_named(tmp_path, monkeypatch):
  """A run whose config.json records another value of a declared field (e.g. made before its
  tuned rate changed) is not read as a run of the new settings: it says which field differs."""
  suite = paired_toy_suite(20, tmp_path, monkeypatch)
  for run, level in (('base', 0.5), ('new', 0.6)):
    for seed in (0, 1):
      write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 20, np.full(20, level))
  path = tmp_path / 'toy' / 'runs' / 'new_s1' / 'config.json'
  path.write_text(json.dumps(dict(rounds=20, algorithm='fedprox')))
  runs = suite_runs.collect(suite)
  assert runs['new'][1]['stale'] == ['algorithm=fedprox (declared: fedcda)']
  assert runs['new'][1]['finished'] and not records.usable(runs['new'][1])
  assert [records.usable(runs[run][s]) for run in ('base', 'new') for s in (0, 1)] == [
      True, True, True, False]


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
  for run, algorithm in (('base', 'fedavg'), ('new', 'fedcda')):
    for seed in (0, 1):
      write_run(tmp_path / 'toy' / 'runs' / f'{run}_s{seed}', 20, np.full(20, 0.5),
                config=dict(algorithm=algorithm, eval_every=1,
                            **(dict(eval_last=3) if seed else {})))
  runs = suite_runs.collect(suite)
  assert all(r['stale'] == [] and records.usable(r) for seeds in runs.values()
             for r in seeds.values())
  shutil.rmtree(tmp_path / 'toy' / 'runs' / 'new_s1')
  write_run(tmp_path / 'toy' / 'runs' / 'new_s1', 20, np.full(20, 0.5),
            config=dict(algorithm='fedprox', eval_every=1))
  assert suite_runs.collect(suite)['new'][1]['stale'] == ['algorithm=fedprox (declared: fedcda)']


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
    assert suite_runs.swing(acc) == pytest.approx(np.sqrt(np.mean(residual ** 2)))
  # a straight rise has no swing; under three evaluated rounds there is no line to speak of
  assert suite_runs.swing(0.3 + 0.01 * np.arange(20)) == pytest.approx(0, abs=1e-12)
  assert np.isnan(suite_runs.swing(np.array([0.5, np.nan, 0.6, np.nan])))
  rounds = list(range(5, 101, 5))   # a 100-round run evaluated every 5 rounds
  acc = list(rng.uniform(0.4, 0.9, len(rounds)))
  run = dict(rounds=100, curve_rounds=rounds, curve_accuracy=acc)
  x = np.array([r for r in rounds if r > 60], np.float64)
  y = np.array([a for r, a in zip(rounds, acc) if r > 60])
  coef = np.polyfit(x, y, 1)
  assert suite_runs.run_swing(run, 40) == pytest.approx(np.std(y - np.polyval(coef, x)))


def test_at_length_reads_a_longer_run_over_its_first_rounds(tmp_path):
  """records.at_length: a 30-round run read at 20 rounds is its first 20 (last-10 = rounds
  11-20, numpy's), finished; read at 40 it is not finished; at its own length it is itself."""
  rng = np.random.default_rng(2)
  acc = rng.uniform(0.2, 0.9, 30)
  write_run(tmp_path / 'r', 30, acc, config=dict(algorithm='fedavg'))
  run = records.load_run(str(tmp_path / 'r'))
  short = records.at_length(run, 20)
  assert short['finished'] and short['rounds'] == 20 and short['curve_rounds'] == list(
      range(1, 21))
  assert short['last10_mean_accuracy'] == pytest.approx(acc[10:20].mean())
  assert short['best_accuracy'] == pytest.approx(acc[:20].max())
  assert short['final_accuracy'] == pytest.approx(acc[19])
  assert not records.at_length(run, 40)['finished']
  assert records.at_length(run, 30) is run
  # its training seconds a round too: the median over rounds 2-20, not the whole run's
  write_run(tmp_path / 'timed', 50, rng.uniform(0.2, 0.9, 50), config=dict(algorithm='fedavg'),
            seconds=np.r_[9.0, [2.0] * 19, [5.0] * 30])
  timed = records.load_run(str(tmp_path / 'timed'))
  assert (records.at_length(timed, 20)['seconds_per_round'], timed['seconds_per_round']) == (
      2.0, 5.0)


def test_at_length_a_divergence_past_the_length_does_not_count(tmp_path):
  """A 30-round run that diverged in round 26 (25 rounds recorded) read at 20 rounds is
  finished and not diverged there; at 30 it is the diverged run."""
  acc = np.random.default_rng(3).uniform(0.2, 0.9, 25)
  write_run(tmp_path / 'r', 30, acc, config=dict(algorithm='fedavg'), summary_rounds=25)
  (tmp_path / 'r' / 'diverged.txt').write_text('training diverged at round 26 (NaN)\n')
  run = records.load_run(str(tmp_path / 'r'))
  assert run['diverged'] and not run['finished']
  short = records.at_length(run, 20)
  assert short['finished'] and short['diverged'] is None and short['rounds_done'] == 20
  assert records.usable(short)


def test_a_length_is_read_from_the_shortest_kept_making_at_least_that_long(tmp_path,
                                                                          monkeypatch):
  """A suite made again at 40 rounds, evaluated every 5th round, whose 30-round makings
  (evaluated every round) are kept in earlier_runs/rounds30/: at 20 rounds its runs are read
  over the 30-round makings' first 20 rounds (last-10 = rounds 11-20, numpy's), not over the
  new making's every-5th evaluations; a seed without a kept making from runs/."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(5)
  base = tmp_path / 'toy'
  acc = {s: rng.uniform(0.3, 0.9, 40) for s in (0, 1, 2)}
  for s in (0, 1, 2):
    config = dict(suite.config_overrides('base'), seed=s)
    write_run(base / 'runs' / f'base_s{s}', 40, every_fifth(acc[s]), config=config)
    if s < 2:
      write_run(base / 'earlier_runs' / 'rounds30' / f'base_s{s}', 30, acc[s][:30],
                config=dict(config, rounds=30))
  assert suite_runs.kept_lengths(str(base)) == [30]
  assert suite_runs.kept_lengths(str(base), at_least=31) == []
  at20 = suite_runs.collect_at(suite, 20)['base']
  for s in (0, 1):
    assert at20[s]['dir'].endswith(os.path.join('rounds30', f'base_s{s}'))
    assert at20[s]['finished'] and at20[s]['rounds'] == 20
    assert at20[s]['last10_mean_accuracy'] == pytest.approx(acc[s][10:20].mean())
  assert at20[2]['dir'].endswith(os.path.join('runs', 'base_s2'))
  assert at20[2]['last10_mean_accuracy'] == pytest.approx(acc[2][[4, 9, 14, 19]].mean())
  assert suite_runs.collect_at(suite, 30)['base'][0]['dir'].endswith(
      os.path.join('rounds30', 'base_s0'))
  at40 = suite_runs.collect_at(suite)['base']
  assert all(r['dir'].endswith(os.path.join('runs', f'base_s{s}')) for s, r in at40.items())


def test_with_kept_evaluations_fills_unevaluated_rounds_from_an_identical_making(tmp_path,
                                                                                monkeypatch):
  """suite_runs.with_kept_evaluations: a run evaluated every 5th round takes the test figures of
  the rounds it did not evaluate from its kept shorter making, evaluated every round, when
  every other value of the rounds both ran agrees (timing aside); a making whose training
  loss differs in one round lends nothing."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(8)
  base = tmp_path / 'toy'
  acc = {s: rng.uniform(0.3, 0.9, 40).round(6) for s in (0, 1)}
  loss = {s: rng.uniform(0.1, 2.0, 40).round(6) for s in (0, 1)}
  for s in (0, 1):
    write_run(base / 'runs' / f'new_s{s}', 40, every_fifth(acc[s]),
              columns={'client_work/train/loss': loss[s]})
    kept_loss = loss[s][:30].copy()
    if s == 1:
      kept_loss[17] += 1e-6   # another making's last bits: not the same run
    write_run(base / 'earlier_runs' / 'rounds30' / f'new_s{s}', 30, acc[s][:30],
              seconds=7.0, columns={'client_work/train/loss': kept_loss})
  metrics = {'new': {s: records.metrics_rows(base / 'runs' / f'new_s{s}') for s in (0, 1)}}
  got, filled = suite_runs.with_kept_evaluations(suite, metrics)
  assert filled == {('new', 0): (30, 24)}   # 30 rounds, every 5th evaluated: 24 filled
  col = records.metrics_column(got['new'][0], 'test_accuracy')
  np.testing.assert_allclose(col[:30], acc[0][:30])
  want = np.array([np.nan if a == '' else a for a in every_fifth(acc[0])], np.float64)
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
    write_run(tmp_path / 'toy' / path, rounds + 5, np.full(rounds, 0.5), seconds=seconds)
    want[kind] = want.get(kind, 0.0) + rounds * seconds / 3600
  got = suite_runs.compute_hours('toy')
  assert set(got) == set(want)
  for kind in want:
    np.testing.assert_allclose(got[kind], want[kind], rtol=1e-12)


def test_remade_runs_compare_each_shorter_run_with_its_new_making(tmp_path, monkeypatch):
  """A shorter run kept in earlier_runs/rounds<N>/ beside its new, longer making: the first
  round that differs, the largest one-round gap and both last-10 means over N, as numpy's;
  an identical making has no first difference; a making not yet N rounds long, or made at
  other settings, is left out."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(11)
  earlier = rng.uniform(0.3, 0.9, 20)
  again = np.concatenate([earlier[:12], rng.uniform(0.3, 0.9, 28)])   # differs from round 13
  base = tmp_path / 'toy'
  write_run(base / 'earlier_runs' / 'rounds20' / 'new_s0', 20, earlier, seconds=2.0)
  write_run(base / 'runs' / 'new_s0', 40, again, seconds=np.r_[9.0, [5.0] * 19, [7.0] * 20])
  write_run(base / 'earlier_runs' / 'rounds20' / 'base_s0', 20, earlier)
  write_run(base / 'runs' / 'base_s0', 40, np.concatenate([earlier, again[20:]]))
  write_run(base / 'earlier_runs' / 'rounds20' / 'base_s1', 20, earlier)
  write_run(base / 'runs' / 'base_s1', 40, earlier[:15], summary_rounds=15)   # still running
  write_run(base / 'earlier_runs' / 'rounds20' / 'new_s2', 20, earlier)   # other settings:
  write_run(base / 'runs' / 'new_s2', 40, again, config=dict(algorithm='fedcda', batch_size=7))
  got = {(r['run'], r['seed']): r for r in suite_runs.remade_runs(suite)}
  assert sorted(got) == [('base', 0), ('new', 0)]
  new = got['new', 0]
  assert new['length'] == 20 and new['again_rounds'] == 40 and new['first_difference'] == 13
  np.testing.assert_allclose(new['largest_gap'], np.abs(earlier - again[:20]).max(), rtol=1e-6)
  np.testing.assert_allclose(new['earlier'], earlier[10:].mean(), rtol=1e-6)
  np.testing.assert_allclose(new['again'], again[10:20].mean(), rtol=1e-6)
  assert new['tail_rounds'] == 10
  assert got['base', 0]['first_difference'] is None and got['base', 0]['largest_gap'] == 0
  # each making's training seconds over rounds 2-20: 2.00 and 5.00 (round 1's 9 and the
  # rounds after 20 left out)
  assert (new['earlier_seconds'], new['again_seconds']) == (2.0, 5.0)
  # Made again twice (at 30, then 40): each shorter making is compared with the next longer
  # one, the 20-round making with the 30-round one (where it first differs) and that with
  # the reported 40-round run (the same bit for bit).
  write_run(base / 'earlier_runs' / 'rounds30' / 'new_s0', 30, again[:30], seconds=3.0)
  got = {(r['run'], r['seed'], r['length']): r for r in suite_runs.remade_runs(suite)}
  assert sorted(got) == [('base', 0, 20), ('new', 0, 20), ('new', 0, 30)]
  assert (got['new', 0, 20]['again_rounds'], got['new', 0, 20]['first_difference']) == (30, 13)
  assert got['new', 0, 20]['again_seconds'] == 3.0
  assert (got['new', 0, 30]['again_rounds'], got['new', 0, 30]['first_difference']) == (40, None)
  assert got['base', 0, 20]['again_rounds'] == 40


def test_a_run_made_again_evaluating_less_often_is_compared_where_both_evaluated(
    tmp_path, monkeypatch):
  """A run made again longer evaluating every 5th round (and its last 10): its missing test
  figures are no difference; the last-10 means are over the shorter run's last 10 rounds that
  the new making evaluated (rounds 15 and 20 of 11-20), and say so; a real difference is
  still found."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(12)
  earlier = rng.uniform(0.3, 0.9, 20)
  rounds = evaluated(40, 5)
  base = tmp_path / 'toy'
  for seed, again in ((0, np.concatenate([earlier, rng.uniform(0.3, 0.9, 20)])),
                      (1, np.concatenate([earlier[:6], rng.uniform(0.3, 0.9, 34)]))):
    write_run(base / 'earlier_runs' / 'rounds20' / f'new_s{seed}', 20, earlier)
    write_run(base / 'runs' / f'new_s{seed}', 40,   # test figures every 5th round
              [a if r in rounds else '' for r, a in enumerate(again, 1)],
              config=dict(algorithm='fedcda', eval_every=5))
  got = {r['seed']: r for r in suite_runs.remade_runs(suite)}
  assert got[0]['first_difference'] is None and got[0]['largest_gap'] == 0
  np.testing.assert_allclose([got[0]['earlier'], got[0]['again']],
                             [earlier[[14, 19]].mean()] * 2, rtol=1e-6)
  assert got[1]['first_difference'] == 10   # rounds 7-9 were not evaluated again
  np.testing.assert_allclose(got[1]['earlier'], earlier[[14, 19]].mean(), rtol=1e-6)
  assert got[0]['tail_rounds'] == 2   # the means are over 2 rounds, not 10


def test_a_suite_being_lengthened_reports_its_last_complete_length(tmp_path, monkeypatch):
  """A suite lengthened from 20 to 40 rounds and made again seed by seed: until every run has
  every seed at 40, it is read at 20 (the seeds made again from their 20-round makings in
  earlier_runs/rounds20/, the rest from runs/); once all are (a diverged one is done: made
  again, it would diverge again), at 40."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  rng = np.random.default_rng(12)
  base = tmp_path / 'toy'
  short = {(run, s): rng.uniform(0.3, 0.9, 20) for run in ('base', 'new') for s in (0, 1, 2)}
  long = {(run, s): np.concatenate([short[run, s], rng.uniform(0.3, 0.9, 20)])
          for run in ('base', 'new') for s in (0, 1, 2)}
  for (run, s), acc in short.items():
    if s == 2:      # not made again yet: still the 20-round run in runs/
      write_run(base / 'runs' / f'{run}_s{s}', 20, acc)
    else:
      write_run(base / 'earlier_runs' / 'rounds20' / f'{run}_s{s}', 20, acc)
  for run in ('base', 'new'):
    write_run(base / 'runs' / f'{run}_s0', 40, long[run, 0])
  write_run(base / 'runs' / 'base_s1', 40, long['base', 1][:15], summary_rounds=15)   # going
  assert suite_runs.reported_rounds(suite) == 20
  runs = suite_runs.collect(suite)
  for (run, s), acc in short.items():
    assert runs[run][s]['finished']
    np.testing.assert_allclose(runs[run][s]['last10_mean_accuracy'], acc[10:].mean(), rtol=1e-6)
  assert runs['base'][0]['dir'].endswith(os.path.join('earlier_runs', 'rounds20', 'base_s0'))
  assert [len(rows) for rows in suite_runs.suite_metrics(suite)['base'].values()] == [20] * 3
  # read at 40 meanwhile: seed 0 finished there, base seed 1 under way, seed 2 of 20 rounds
  # (not made again yet), new seed 1 kept only at 20 (not begun at 40)
  at40 = suite_runs.collect_at(suite, 40)
  assert {(run, s): records.usable(r) for run, seeds in at40.items() for s, r in seeds.items()} == {
      ('base', 0): True, ('base', 1): False, ('base', 2): False, ('new', 0): True,
      ('new', 2): False}
  assert at40['base'][1]['rounds_done'] == 15 and at40['base'][2]['rounds_done'] == 20
  # every seed made at 40 (one diverged: deterministic, so done): the suite reports 40
  shutil.rmtree(base / 'runs' / 'base_s1')
  write_run(base / 'runs' / 'base_s1', 40, long['base', 1])
  write_run(base / 'runs' / 'new_s1', 40, long['new', 1])
  for run in ('base', 'new'):
    shutil.rmtree(base / 'runs' / f'{run}_s2')
  write_run(base / 'runs' / 'base_s2', 40, long['base', 2])
  write_run(base / 'runs' / 'new_s2', 40, long['new', 2][:33], summary_rounds=33)
  (base / 'runs' / 'new_s2' / 'diverged.txt').write_text('training diverged at round 34\n')
  assert suite_runs.reported_rounds(suite) == 40
  runs = suite_runs.collect(suite)
  assert runs['new'][2]['diverged'] == 'training diverged at round 34'
  assert suite_runs.settled(runs['new'][2]) and not records.usable(runs['new'][2])
  np.testing.assert_allclose(runs['base'][1]['last10_mean_accuracy'], long['base', 1][30:].mean(),
                             rtol=1e-6)


def test_a_lengthened_suite_keeps_probe_baselines_and_summaries_at_their_lengths(
    tmp_path, monkeypatch):
  """While a suite declared at 40 rounds reports at 20: a probe of 30 rounds that leaves the
  baseline unchanged reads the baseline's runs at 30 (usable where they got there), not
  cut to the pages' 20; a run extended in place (checkpoints kept, nothing in earlier_runs/)
  read at 20 drops its summary, which is the longer making's."""
  probe = suites.Probe('p', 'q?', dict(rounds=30), ('new',), seeds=(0, 1, 2),
                       unchanged=('base',))
  suite = dataclasses.replace(paired_toy_suite(40, tmp_path, monkeypatch), probes=(probe,))
  base = tmp_path / 'toy'
  rng = np.random.default_rng(13)
  long = {s: rng.uniform(0.3, 0.9, 40) for s in (0, 1, 2)}
  for s in (0, 1, 2):
    write_run(base / 'runs' / f'new_s{s}', 20, np.full(20, 0.6))
    write_run(base / 'probes' / 'p' / f'new_s{s}', 30, np.full(30, 0.6))
  write_run(base / 'runs' / 'base_s0', 40, long[0])   # extended in place, finished
  write_run(base / 'runs' / 'base_s1', 40, long[1][:33], summary_rounds=20)   # extending
  write_run(base / 'runs' / 'base_s2', 20, long[2][:20])
  assert suite_runs.reported_rounds(suite) == 20
  runs = suite_runs.collect(suite)['base']
  assert runs[0]['summary'] == {} and runs[0]['client_epochs_training'] is None
  assert runs[1]['summary']['rounds'] == 20   # its summary is still the 20-round making's
  got = suite_runs.collect_probe(suite, probe)['base']
  assert [records.usable(got[s]) for s in (0, 1, 2)] == [True, True, False]
  for s in (0, 1):
    np.testing.assert_allclose(got[s]['last10_mean_accuracy'], long[s][20:30].mean(), rtol=1e-6)
  # probe_metrics: the probe's own runs, and the unchanged ones from their own directories
  rows = suite_runs.probe_metrics(suite, probe)
  assert sorted(rows['base']) == [0, 1] and sorted(rows['new']) == [0, 1, 2]
  for s in (0, 1):
    np.testing.assert_allclose(records.metrics_column(rows['base'][s], 'test_accuracy'),
                               long[s][:30], rtol=1e-6)


def test_a_run_read_short_of_its_making_sums_its_costs_from_its_rows(tmp_path, monkeypatch):
  """A run extended in place past the length the pages read (its summary is the longer
  making's) gets its client-epochs and exploration cost over the rounds read, summed from
  metrics.csv as the program sums them into summary.json; without the column it is None."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  base = tmp_path / 'toy'
  rng = np.random.default_rng(29)
  epochs = rng.integers(0, 9, 40).astype(float)
  explored = np.cumsum(rng.integers(0, 4, 40)).astype(float)
  for s in (0, 1, 2):
    write_run(base / 'runs' / f'base_s{s}', 40, rng.uniform(0.3, 0.9, 40),
              columns={'client_work/train/client_epochs': epochs,
                       'exploration_client_epochs': explored})
    write_run(base / 'runs' / f'new_s{s}', 20, rng.uniform(0.3, 0.9, 20))
  runs = suite_runs.collect(suite)
  assert suite_runs.reported_rounds(suite) == 20
  for s in (0, 1, 2):
    assert runs['base'][s]['summary'] == {}
    assert runs['base'][s]['client_epochs_training'] == int(epochs[:20].sum())
    assert runs['base'][s]['exploration_client_epochs'] == explored[19]
    assert runs['new'][s]['client_epochs_training'] == 20   # its own summary's
  # rows short of a round's cost (an older making) give no figure
  rows = [dict(round=str(r), **{'client_work/train/client_epochs': '2'}) for r in (1, 2, 3)]
  rows[1]['client_work/train/client_epochs'] = ''
  costs = records._costs_from_rows  # pylint: disable=protected-access
  assert costs(rows, 3)['client_epochs_training'] is None
  assert costs(rows[:1], 1)['client_epochs_training'] == 2


def test_whole_round_ratio_sums_the_rounds_that_record_both(tmp_path, monkeypatch):
  """suite_runs.whole_round_ratio: round_seconds over seconds, summed over every round but the
  first of the runs that record both; NaN when none does; whole_round_record also says
  which kinds of runs the ratio comes from and how long their rounds trained."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  write_run(tmp_path / 'toy' / 'runs' / 'old_s0', 5, np.full(5, 0.5), seconds=1.0)
  assert np.isnan(suite_runs.whole_round_ratio('toy'))
  assert suite_runs.whole_round_record('toy')[1] == ()
  write_run(tmp_path / 'toy' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
            round_seconds=3.0)
  write_run(tmp_path / 'toy' / 'tuning' / 'b_lr1', 3, np.full(3, 0.5), seconds=1.0,
            round_seconds=4.0)
  assert suite_runs.whole_round_ratio('toy') == pytest.approx((4 * 3.0 + 2 * 4.0) / (4 * 2.0 + 2))
  # which runs the ratio comes from, and how long their rounds trained (median of 2,2,2,2,1,1)
  ratio, kinds, median = suite_runs.whole_round_record('toy')
  assert ratio == pytest.approx(suite_runs.whole_round_ratio('toy'))
  assert kinds == ('reported runs', 'tuning') and median == pytest.approx(2.0)


def test_whole_round_example_cites_a_suite_that_records_whole_rounds(tmp_path, monkeypatch):
  """For a suite or plan without whole rounds recorded, --plan cites the ratio measured on
  another suite (computed from its runs, not a constant), with how often its runs evaluate,
  preferring one evaluated every round; none recorded says so."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))

  def suite(name, **common):
    return suites.Suite(name=name, title=name, common=dict(rounds=5, **common), scaled='-',
                        runs=dict(a=dict(algorithm='fedavg')), comparisons=())

  monkeypatch.setattr(suites, 'SUITES', {'old': suite('old'), 'dense': suite('dense'),
                                         'sparse': suite('sparse', eval_every=5)})
  write_run(tmp_path / 'old' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=1.0)
  assert suite_runs.whole_round_example() == 'no suite records it yet'
  write_run(tmp_path / 'sparse' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
            round_seconds=3.0)
  assert suite_runs.whole_round_example() == (
      'e.g. the sparse suite\'s recorded rounds, evaluated every 5 rounds, took 1.5 times their '
      'training')
  write_run(tmp_path / 'dense' / 'runs' / 'a_s0', 5, np.full(5, 0.5), seconds=2.0,
            round_seconds=5.0)
  assert suite_runs.whole_round_example() == (
      'e.g. the dense suite\'s recorded rounds, evaluated every round, took 2.5 times their '
      'training')
  assert suite_runs.whole_round_example(besides='dense').startswith('e.g. the sparse suite')
  shutil.rmtree(tmp_path / 'dense')
  assert suite_runs.whole_round_example(besides='sparse') == 'no suite records it yet'


def test_a_borrowed_run_is_read_from_the_suite_that_makes_it(tmp_path, monkeypatch):
  """Suite.borrowed: a run read from another suite at this suite's length (over the first
  rounds of the longer making there), its seeds those of the maker's run, its settings the
  maker's; a maker's run made at other settings is stale here too."""
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  maker = suites.Suite(
      name='maker', title='maker', common=dict(rounds=40), scaled='-',
      runs=dict(fedavg_x=dict(algorithm='fedavg', client_lr=0.1)), comparisons=())
  borrower = suites.Suite(
      name='borrower', title='borrower', common=dict(rounds=20), scaled='-',
      runs=dict(new=dict(algorithm='fedcda', client_lr=0.1)),
      borrowed=dict(base=('maker', 'fedavg_x')),
      comparisons=(suites.Comparison('new', 'base', 'p', 'l'),))
  monkeypatch.setitem(suites.SUITES, 'maker', maker)
  assert borrower.run_names == ('new', 'base')
  assert suite_runs.source(borrower, 'base') == (maker, 'fedavg_x')
  assert suite_runs.source(borrower, 'new') == (borrower, 'new')
  assert borrower.config_overrides('base') == dict(algorithm='fedavg', client_lr=0.1, rounds=20)
  rng = np.random.default_rng(17)
  acc = {s: rng.uniform(0.3, 0.9, 40) for s in (0, 1)}
  for s in (0, 1):
    write_run(tmp_path / 'maker' / 'runs' / f'fedavg_x_s{s}', 40, acc[s],
              config=dict(algorithm='fedavg', client_lr=0.1))
    write_run(tmp_path / 'borrower' / 'runs' / f'new_s{s}', 20, np.full(20, 0.5),
              config=dict(algorithm='fedcda', client_lr=0.1))
  assert sorted(suite_runs.seed_dirs(borrower, 'base')) == [0, 1]
  assert suite_runs.seed_dirs(borrower, 'base')[0] == str(
      tmp_path / 'maker' / 'runs' / 'fedavg_x_s0')
  runs = suite_runs.collect(borrower)
  assert sorted(runs) == ['base', 'new']
  for s in (0, 1):
    assert records.usable(runs['base'][s]) and runs['base'][s]['rounds'] == 20
    assert runs['base'][s]['last10_mean_accuracy'] == pytest.approx(acc[s][10:20].mean())
  # the maker's own page reads the same runs at its own length
  assert suite_runs.collect(maker)['fedavg_x'][0]['last10_mean_accuracy'] == pytest.approx(
      acc[0][30:].mean())
  path = tmp_path / 'maker' / 'runs' / 'fedavg_x_s1' / 'config.json'
  path.write_text(json.dumps(dict(algorithm='fedavg', client_lr=0.3, rounds=40)))
  assert suite_runs.collect(borrower)['base'][1]['stale'] == ['client_lr=0.3 (declared: 0.1)']
