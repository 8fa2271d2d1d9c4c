"""benchmarks/report.py: the verdict rule, the paired statistics on toy runs against numpy,
what the pages print, and the committed pages regenerating byte for byte."""

import csv
import json
import os
import re

import numpy as np
import pytest

from benchmarks import report, suites
from benchmarks import suite_runs
from programs import experiment
from programs import experiment_config
from programs.studies import declaration
from programs.studies import paired

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize('paper, sign, mean, half, want', [
    (6.8, 0, 4.0, 1.0, 'reproduced'),       # the paper's side, at least half its margin
    (6.8, 0, 3.4, 1.0, 'reproduced'),       # exactly half
    (6.8, 0, 3.0, 1.0, 'smaller'),
    (6.8, 0, -2.0, 1.0, 'opposite'),
    (6.8, 0, 0.9, 1.0, 'within noise'),     # the interval holds 0, and is narrower than 6.8
    (0.4, 0, 0.9, 1.0, 'below resolution'),  # ... and is wider than the paper's margin
    (0.4, 0, -3.0, 1.0, 'opposite'),        # a sign is a sign, whatever the paper's size
    (-1.0, 0, -2.0, 0.5, 'reproduced'),     # a paper that reports a loss
    (float('nan'), 1, 3.0, 1.0, 'reproduced (sign)'),   # its figures lost, its sign known
    (float('nan'), 1, 0.5, 1.0, 'within noise'),
    (float('nan'), 0, 3.0, 1.0, 'no paper figure'),
    (6.8, 0, float('nan'), float('nan'), 'not run'),
    (6.8, 0, 3.0, float('nan'), 'one seed'),
])
def test_verdict(paper, sign, mean, half, want):
  assert report.verdict(paper, sign, mean, half) == want


# --------------------------------------------------------------------------- #
# Toy suites on disk
# --------------------------------------------------------------------------- #


def _write_run(path, config: dict, accuracy: dict, finished: bool = True):
  """A run directory as the program writes it: config.json, metrics.csv with test accuracy at
  the rounds of `accuracy` ({round: value}) and summary.json when finished."""
  os.makedirs(path)
  rounds = config['rounds']
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(config, f)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'seconds', 'test_accuracy'])
    for r in range(1, (rounds if finished else rounds // 2) + 1):
      writer.writerow([r, 1.0, accuracy.get(r, '')])
  if finished:
    with open(os.path.join(path, 'summary.json'), 'w') as f:
      json.dump(dict(rounds=rounds), f)


def _toy(monkeypatch, tmp_path, *declared):
  """Registers toy suites (their directories under tmp_path) in place of the real ones."""
  monkeypatch.setattr(suites, 'SUITES', {s.name: s for s in declared})
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  monkeypatch.setattr(suites, 'load_tuned', lambda name: None)
  numbers = dict(toy={'x': dict(baseline=70.0, method=75.0, dataset='Toy')},
                 borrower={'x': dict(baseline=70.0, method=75.0, dataset='Toy')})
  monkeypatch.setattr(suites, 'load_paper_numbers', lambda: numbers)


def _suite(name='toy', rounds=100, criterion='last10', **kwargs):
  return suites.Suite(
      name=name, title=f'{name} suite', scaled='nothing',
      common=dict(dataset='digits', rounds=rounds, eval_every=1),
      runs=kwargs.pop('runs', dict(base=dict(algorithm='fedavg'), new=dict(algorithm='fedprox'))),
      comparisons=(suites.Comparison('new', 'base', 'x', 'New vs base'),), criterion=criterion,
      **kwargs)


def _make(tmp_path, suite, run, seed, accuracy, every=1, finished=True):
  fields = dict(experiment_config.ExperimentConfig(**suite.config_overrides(run)).__dict__,
                seed=seed)
  rounds = fields['rounds']
  config = experiment_config.ExperimentConfig(**{k: v for k, v in fields.items()})
  shown = {r: float(accuracy[r - 1]) for r in range(1, rounds + 1)
           if experiment.evaluated_round(r, experiment_config.ExperimentConfig(
               rounds=rounds, eval_every=every))}
  _write_run(tmp_path / suite.name / 'runs' / declaration.run_name(run, seed),
             dict(config.__dict__, eval_every=every), shown, finished)


def test_comparison_figures_match_numpy(tmp_path, monkeypatch):
  """Levels, per-seed margins and 95% half-widths over the last 10 rounds, the last 50 and
  the best round, and the verdict, against numpy on random curves."""
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  rng = np.random.default_rng(0)
  curves = {(run, s): rng.uniform(0.6, 0.9, 100) + (0.05 if run == 'new' else 0.0)
            for run in ('base', 'new') for s in suites.SEEDS}
  for (run, s), acc in curves.items():
    _make(tmp_path, suite, run, s, acc)
  c, = report.comparisons(suite, suite_runs.collect(suite))
  reads = dict(last10=lambda a: a[-10:].mean(), window=lambda a: a[-50:].mean(),
               best=lambda a: a.max())
  for key, read in reads.items():
    margins = [100 * (read(curves['new', s]) - read(curves['base', s])) for s in suites.SEEDS]
    np.testing.assert_allclose(c[key]['margins'], margins)
    assert c[key]['margin'] == pytest.approx(np.mean(margins))
    assert c[key]['half_width'] == pytest.approx(paired.t_half_width(margins))
    base = [100 * read(curves['base', s]) for s in suites.SEEDS]
    assert c[key]['baseline'] == pytest.approx((np.mean(base), np.std(base, ddof=1)))
  w = c['window']
  assert c['verdict'] == report.verdict(5.0, 0, w['margin'], w['half_width'])
  assert c['seeds'] == list(suites.SEEDS) and c['verdict_key'] == 'window'
  # a suite read at the best round (the CADIS paper's criterion) reads the best margins
  best = _suite(criterion='best')
  c, = report.comparisons(best, suite_runs.collect(best))
  assert c['verdict_key'] == 'best'
  assert c['verdict'] == report.verdict(5.0, 0, c['best']['margin'], c['best']['half_width'])


def test_a_pair_on_two_schedules_is_read_at_the_rounds_both_evaluated(tmp_path, monkeypatch):
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  rng = np.random.default_rng(1)
  base, new = rng.uniform(0.5, 0.9, 100), rng.uniform(0.5, 0.9, 100)
  _make(tmp_path, suite, 'base', 0, base, every=5)
  _make(tmp_path, suite, 'new', 0, new, every=1)
  c, = report.comparisons(suite, suite_runs.collect(suite))
  both = np.array([r for r in range(1, 101) if r % 5 == 0 or r > 90]) - 1
  tail = both[both >= 50]
  assert c['window']['margins'] == pytest.approx([100 * (new[tail].mean() - base[tail].mean())])
  assert c['best']['margins'] == pytest.approx([100 * (new[both].max() - base[both].max())])
  assert c['verdict'] == 'one seed'


def test_a_borrowed_run_is_read_from_its_suite_at_the_borrowers_length(tmp_path, monkeypatch):
  maker = _suite(rounds=100)
  borrower = _suite(name='borrower', rounds=60, runs=dict(new=dict(algorithm='fedprox')),
                    borrowed=dict(base=('toy', 'base')))
  _toy(monkeypatch, tmp_path, maker, borrower)
  rng = np.random.default_rng(2)
  base = {s: rng.uniform(0.5, 0.9, 100) for s in suites.SEEDS}
  new = {s: rng.uniform(0.5, 0.9, 60) for s in suites.SEEDS}
  for s in suites.SEEDS:
    _make(tmp_path, maker, 'base', s, base[s])
    _make(tmp_path, borrower, 'new', s, new[s])
  loaded = suite_runs.collect(borrower)
  assert all(r['rounds'] == 60 and r['finished'] for r in loaded['base'].values())
  c, = report.comparisons(borrower, loaded)
  np.testing.assert_allclose(c['last10']['margins'],
                             [100 * (new[s][50:].mean() - base[s][50:60].mean())
                              for s in suites.SEEDS])
  page = report.suite_page(borrower)[0]
  assert "the [toy](../toy/results.md) suite's `base`, read at this length" in page


def test_runs_that_never_left_or_fell_back_to_chance_are_named(tmp_path, monkeypatch):
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  for s in suites.SEEDS:
    _make(tmp_path, suite, 'base', s, np.full(100, 0.8))
    acc = np.full(100, 0.8)
    if s == 1:
      acc = np.full(100, 0.1)
    if s == 2:
      acc[70:] = 0.1
    _make(tmp_path, suite, 'new', s, acc)
  c, = report.comparisons(suite, suite_runs.collect(suite))
  assert report.stuck_text(c) == ('new seed 1 never left chance; new seed 2 fell to chance at '
                                  'round 71')
  assert '**' + c['verdict'] + '** (new seed 1 never left chance' in report.verdict_cell(c)


def test_the_every_run_table_shows_unmade_and_unfinished_seeds(tmp_path, monkeypatch):
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  _make(tmp_path, suite, 'base', 0, np.full(100, 0.7))
  _make(tmp_path, suite, 'new', 0, np.full(100, 0.7), finished=False)
  page = report.suite_page(suite)[0]
  assert '| base | 1 | not run yet |' in page
  assert '| new | 0 | 50/100 |' in page and 'running or stopped' in page
  assert '1 of 6 runs finished' in page


def test_the_settings_table_marks_what_differs_from_the_paper(monkeypatch):
  paper = dict(settings=dict(toy={h: 'n/a' for h, _ in report.SETTINGS}))
  paper['settings']['toy'].update({'clients': '20, 4 per round',
                                   'batch': dict(show='64 (paper)', same=['50']),
                                   'results read': 'best round'})
  monkeypatch.setattr(suites, 'load_paper_numbers', lambda: paper)
  suite = suites.Suite(name='t', title='t', scaled='', common=dict(
      dataset='digits', num_clients=20, clients_per_round=4, batch_size=50, rounds=10),
                       runs=dict(a=dict(algorithm='fedavg', client_lr=0.1),
                                 b=dict(algorithm='fedprox', client_lr=0.3)),
                       comparisons=(suites.Comparison('b', 'a', 'x', 'b vs a'),))
  monkeypatch.setattr(suites, 'load_tuned', lambda name: None)
  table = report.settings_table('toy', [('ours', suite)])
  rows = {line.split(' | ')[0][2:]: line for line in table[2:]}
  assert rows['clients'] == '| clients | 20, 4 per round | 20, 4 per round |'
  assert rows['batch'] == '| batch | 64 (paper) | 50 |'
  assert rows['local epochs'] == '| local epochs | n/a | **1** |'
  # runs that train differently are named with their value
  assert ('**SGD lr 0.1, momentum 0.5 (a)** / **SGD lr 0.3, momentum 0.5 (b)**'
          in rows['client optimizer'])


def test_each_method_has_one_colour_and_each_baseline_a_panel():
  fedcross = suites.SUITES['fedcross']
  assert report.colour_of('fedavg_beta0.1') == report.colour_of('fedavg_dir0.1') == \
      report.colour_of('fedavg')
  assert report.colour_of('fedcross_beta0.1') != report.colour_of('fedavg_beta0.1')
  assert [(title, names) for title, names in report.panels(fedcross)] == [
      ('β = 0.1', ['fedavg_beta0.1', 'fedcross_beta0.1', 'fedprox_beta0.1']),
      ('β = 0.5', ['fedavg_beta0.5', 'fedcross_beta0.5', 'fedprox_beta0.5'])]


# --------------------------------------------------------------------------- #
# The committed pages
# --------------------------------------------------------------------------- #


def _committed(path):
  with open(path) as f:
    return f.read()


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_committed_suite_pages_regenerate_byte_for_byte(name):
  page, data, _ = report.suite_page(suites.SUITES[name])
  assert page == _committed(os.path.join(suites.suite_dir(name), 'results.md')), (
      f'regenerate: python -m benchmarks.report ({name}/results.md)')
  assert data == _committed(os.path.join(suites.suite_dir(name), 'results.json'))


def test_committed_reproduction_and_provenance_pages_regenerate_byte_for_byte():
  assert report.reproduction_page() == _committed(report.REPRODUCTION)
  assert report.provenance_page() == _committed(report.PROVENANCE)
  with open(report.README) as f:
    readme = f.read()
  assert report.readme_with_status(readme) == readme


def test_the_reproduction_page_reads_in_five_minutes():
  """At most 150 lines, no prose line over 400 characters, one verdict line per protocol
  and a bottom line for every method, and every page it links to exists."""
  lines = _committed(report.REPRODUCTION).split('\n')
  assert len(lines) <= 150
  assert not [line for line in lines if len(line) > 400 and not line.startswith('|')]
  for method in report.METHODS:
    section = _committed(report.REPRODUCTION).split(f'## {suites.SUITES[method].method}\n')[1]
    section = section.split('\n## ')[0]
    for protocol in dict.fromkeys(report.protocol_of(s) for _, s in report.method_suites(method)):
      assert section.count(f'\n- {report.verdict_words(protocol)}') == 1, (method, protocol)
    assert section.count('\n- Against the tuned, converged baseline') == 1
    assert section.count('\n- Bottom line: ') == 1
  for link in re.findall(r'\]\(([^)#]+)', _committed(report.REPRODUCTION)):
    assert os.path.exists(os.path.join(os.path.dirname(report.REPRODUCTION), link)), link


def test_rounds_to_targets_match_numpy(tmp_path, monkeypatch):
  """Per paired seed, the first round both runs evaluated at which each reached a target
  (one seed's method evaluated every 5 rounds), and the speed-up as the ratio of the mean
  rounds (NaN when a seed never got there), against numpy on random rising curves."""
  suite = _suite(targets=(0.45, 0.6, 0.99))
  _toy(monkeypatch, tmp_path, suite)
  rng = np.random.default_rng(4)
  curves = {(run, s): np.clip(0.3 + np.cumsum(rng.uniform(-0.02, 0.025, 100)), 0, 1)
            for run in ('base', 'new') for s in suites.SEEDS}
  every = {('new', suites.SEEDS[0]): 5}
  for (run, s), acc in curves.items():
    _make(tmp_path, suite, run, s, acc, every=every.get((run, s), 1))
  got = report.rounds_to_targets(suite_runs.collect(suite), suite.comparisons[0], suite.targets)
  assert got['seeds'] == list(suites.SEEDS)
  for t in suite.targets:
    means = {}
    for run, side in (('base', 'baseline'), ('new', 'method')):
      firsts = []
      for s in suites.SEEDS:
        rounds = np.arange(1, 101)
        if every.get(('new', s)) == 5:   # the pair is read where both evaluated
          rounds = rounds[(rounds % 5 == 0) | (rounds > 90)]
        hits = rounds[curves[run, s][rounds - 1] >= t]
        firsts.append(int(hits[0]) if hits.size else None)
      assert got[side][t] == firsts, (t, side)
      means[side] = np.nan if None in firsts else np.mean(firsts)
    np.testing.assert_equal(got['speedup'][t], means['baseline'] / means['method'])
  assert got['steps'] == [5, 1, 1]
  assert any(np.isfinite(v) for v in got['speedup'].values())
  assert not np.isfinite(got['speedup'][0.99])
  # the tuned suite's page: a row per comparison, the paper's figures beside them
  numbers = dict(rounds_to_target=dict(toy=dict(
      where='Toy Table II', dataset='Toy', rounds={'80': dict(fedavg=100, toy=50)})))
  monkeypatch.setattr(suites, 'load_paper_numbers', lambda: numbers)
  lines = report._rounds_to_target_lines(suite)
  assert lines[0] == f'## {report.ROUNDS_TO_TARGET}'
  row, = [l for l in lines if l.startswith('| tuned | New vs base |')]
  assert report._speedup_text(got['speedup'][0.45]) in row
  assert 'speed-up 2.00×' in ' '.join(lines)
  assert '2.00×' in report.rounds_to_target_line(suite)


def test_the_reproduction_line_names_only_suites_that_reach_a_target(tmp_path, monkeypatch):
  """A suite whose runs reach no target (e.g. one too short) is left to the page's table;
  one that reaches a target gets its speed-up in REPRODUCTION.md's line."""
  numbers = dict(rounds_to_target=dict(toy=dict(
      where='Toy Table II', dataset='Toy', rounds={'80': dict(fedavg=100, toy=50)})))
  rising = np.linspace(0.3, 0.9, 100)
  for reach, want in ((rising, True), (np.full(100, 0.3), False)):
    suite = suites.Suite(
        name='toy', title='toy suite', scaled='nothing', targets=(0.6,),
        common=dict(dataset='digits', rounds=100, eval_every=1),
        runs=dict(base=dict(algorithm='fedavg'), new=dict(algorithm='fedprox')),
        comparisons=(suites.Comparison('new', 'base', 'x', 'toy, new'),))
    _toy(monkeypatch, tmp_path / str(want), suite)
    monkeypatch.setattr(suites, 'load_paper_numbers', lambda: numbers)
    for run in ('base', 'new'):
      for s in suites.SEEDS:
        _make(tmp_path / str(want), suite, run, s, reach)
    assert ('toy: new ' in report.rounds_to_target_line(suite)) == want
