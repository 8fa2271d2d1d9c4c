"""benchmarks/report.py: the verdict rule, the paired statistics on toy runs against numpy,
what the pages print, and the committed pages regenerating byte for byte."""

import csv
import glob
import json
import os
import re
import shutil

import numpy as np
import pytest
from scipy import stats

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
    (float('nan'), 0, 3.0, 1.0, 'higher'),    # no claim of the paper: our sign alone
    (float('nan'), 0, -3.0, 1.0, 'lower'),
    (float('nan'), 0, 0.5, 1.0, 'within noise'),
    (6.8, 0, float('nan'), float('nan'), 'not run'),
    (6.8, 0, 3.0, float('nan'), 'one seed'),
])
def test_verdict(paper, sign, mean, half, want):
  assert report.verdict(paper, sign, mean, half) == want


# --------------------------------------------------------------------------- #
# Toy suites on disk
# --------------------------------------------------------------------------- #


def _write_run(path, config: dict, accuracy: dict, finished: bool = True,
               seconds: float = 1.0):
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
      writer.writerow([r, seconds, accuracy.get(r, '')])
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
  # a paper that reports each run's best round (CADIS's) has every suite of its method read
  # at the best round, whatever the suite's own tuning criterion
  monkeypatch.setattr(suites, 'BEST_ROUND_PAPERS', ('toy',))
  c, = report.comparisons(suite, suite_runs.collect(suite))
  assert suite.criterion == 'last10' and c['verdict_key'] == 'best'
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
  assert ('**' + report.VERDICT_WORDS[c['verdict']] + '** (new seed 1 never left chance'
          in report.verdict_cell(c))


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
      ('Dir 0.1', ['fedavg_beta0.1', 'fedcross_beta0.1', 'fedprox_beta0.1']),
      ('Dir 0.5', ['fedavg_beta0.5', 'fedcross_beta0.5', 'fedprox_beta0.5'])]
  # a comparison between two methods (the code's slips against 1/|C_i|) adds no panel
  assert report.panels(suites.SUITES['cadis_reference']) == [
      ('eq. 1 weights', ['fedavg', 'cadis', 'cadis_reference_weights',
                         'cadis_reference_quirks'])]


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


def _words(text: str) -> int:
  """The words a reader reads: tokens holding a letter or a digit (table bars, ± and arrows
  are not words; `wc -w` counts them)."""
  return len(re.findall(r'[A-Za-z0-9]\S*', text))


def _tables(text: str) -> list:
  """Every markdown table of `text`: [header cells, row cells...] (the rule row left out)."""
  tables, rows = [], []
  for line in text.split('\n') + ['']:
    if line.startswith('|'):
      if not line.startswith('|---'):
        rows.append([c.strip() for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]])
    elif rows:
      tables.append(rows)
      rows = []
  return tables


def test_the_reproduction_page_reads_in_five_minutes():
  """Under 1,000 words; an opening table with one row per paper; every table with a seeds
  column, filled in every row ('n' or 'n of N'); the reading rule said once; one name per
  setting and none of the terms it replaced; every page it links to exists."""
  page = _committed(report.REPRODUCTION)
  assert _words(page) <= 1000, _words(page)
  tables = _tables(page)
  assert len(tables[0]) - 1 == len(suites.HEADLINES) == len(report.METHODS)
  assert [h.method for h in suites.HEADLINES] == list(report.METHODS)
  for table in tables:
    column = table[0].index('seeds')
    for row in table[1:]:
      assert re.fullmatch(r'\d+( of \d+)?', row[column]), row
  assert len(tables) == 1 + len(report.METHODS)
  assert page.count('**Reading rule**') == 1
  for gone in ('β =', 'below resolution', 'margin the verdict reads', 'index slip',
               'placeholder', 'Bold settings'):
    assert gone not in page, gone
  for method in report.METHODS:
    assert f'\n## {suites.SUITES[method].method}\n' in page
  for link in re.findall(r'\]\(([^)#]+)', page):
    assert os.path.exists(os.path.join(os.path.dirname(report.REPRODUCTION), link)), link


def _evaluated(path: str) -> dict:
  """{round: test accuracy} of the rounds a committed run evaluated, from its metrics.csv."""
  with open(os.path.join(path, 'metrics.csv'), newline='') as f:
    return {int(r['round']): float(r['test_accuracy']) for r in csv.DictReader(f)
            if r['test_accuracy']}


@pytest.mark.parametrize('method, baseline, rounds, read, row', [
    # FedCross at the Table II protocol against the fedcross suite's FedAvg, last 50 rounds
    ('fedcross_paper/runs/fedcross', 'fedcross/runs/fedavg_beta0.1', 600, 'last50',
     '| Dir 0.1 | Table II, E = 1 |'),
    # CADIS (the paper's weights) at the authors' code's defaults, best round
    ('cadis_reference/runs/cadis', 'cadis_reference/runs/fedavg', 50, 'best',
     "| eq. 1 weights | authors' code defaults |"),
    # CADIS's tuned suite, best round too (the paper's reading, whatever the suite tunes by)
    ('cadis/runs/cadis_reference_weights_no_kd', 'cadis/runs/fedavg', 800, 'best',
     '| weights 1/\\|C_i\\|, no KD | tuned |'),
    # FedLEx-AvgM at the authors' code's defaults, last 50 rounds
    ('fedlex_reference/runs/fedlex_avgm', 'fedlex_reference/runs/fedavgm', 200, 'last50',
     "| fedlex_avgm vs fedavgm | authors' code defaults |"),
])
def test_margins_on_the_page_recomputed_from_metrics_csv(method, baseline, rounds, read, row):
  """A margin of REPRODUCTION.md recomputed from the committed metrics.csv files alone: each
  finished seed of both runs read at the rounds both evaluated (the best one, or the mean
  over the last 50), the per-seed differences' mean and 95% t half-width."""
  base = os.path.join(suites.RESULTS, baseline)
  seeds = sorted(int(p.rsplit('_s', 1)[1]) for p in glob.glob(os.path.join(suites.RESULTS,
                                                                            method + '_s*'))
                 if os.path.exists(os.path.join(p, 'summary.json'))
                 and os.path.exists(os.path.join(f'{base}_s{p.rsplit("_s", 1)[1]}',
                                                 'summary.json')))
  margins = []
  for seed in seeds:
    m = _evaluated(os.path.join(suites.RESULTS, f'{method}_s{seed}'))
    b = _evaluated(f'{base}_s{seed}')
    both = [r for r in sorted(set(m) & set(b)) if r <= rounds]
    if read == 'best':
      margins.append(100 * (max(m[r] for r in both) - max(b[r] for r in both)))
    else:
      last = [r for r in both if r > rounds - 50]
      margins.append(100 * (np.mean([m[r] for r in last]) - np.mean([b[r] for r in last])))
  n = len(margins)
  half = stats.t.ppf(0.975, n - 1) * np.std(margins, ddof=1) / np.sqrt(n)
  line, = [l for l in _committed(report.REPRODUCTION).split('\n') if l.startswith(row)]
  cells = [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]
  assert cells[2].split(' of ')[0] == str(n) and n >= 2
  assert cells[4] == f'{np.mean(margins):+.2f} ± {half:.2f}', (cells, margins)


def test_seeds_beyond_the_declared_ones_are_read_and_counted(tmp_path, monkeypatch):
  """Seeds made after the declared ones (to narrow an interval) enter the comparison and the
  page's count; a comparison with planned seeds still to come says 'n of N'."""
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  rng = np.random.default_rng(7)
  for s in range(5):
    for run in ('base', 'new'):
      _make(tmp_path, suite, run, s, rng.uniform(0.5, 0.9, 100))
  c, = report.comparisons(suite, suite_runs.collect(suite))
  assert c['seeds'] == [0, 1, 2, 3, 4]
  assert '10 of 10 runs finished' in report.suite_page(suite)[0]
  assert report.seeds_cell(dict(c, planned=7)) == '5 of 7'
  assert report.seeds_cell(dict(c, planned=3)) == '5'


def test_a_headline_is_judged_against_the_paper_figure_it_names(tmp_path, monkeypatch):
  """The verdict of a paper's headline reads the figure it names (`judged`), not the
  comparison's own: one margin, two verdicts."""
  suite = _suite()
  _toy(monkeypatch, tmp_path, suite)
  for s in suites.SEEDS:
    _make(tmp_path, suite, 'base', s, np.full(100, 0.70 + 0.001 * s))
    _make(tmp_path, suite, 'new', s, np.full(100, 0.72 + 0.002 * s))
  c, = report.comparisons(suite, suite_runs.collect(suite))
  assert c['verdict'] == 'smaller'   # +2.2 against the toy paper's +5
  small = report.judged(c, dict(baseline=70.0, method=72.0, dataset='Other'))
  assert small['verdict'] == 'reproduced' and small['paper_margin'] == pytest.approx(2.0)
  assert small['window'] == c['window']


def test_a_retired_protocol_gives_the_cost_its_timing_probe_measured(tmp_path, monkeypatch):
  """A paper protocol retired for its cost: its comparison reads 'retired', and the page
  gives the round time of its timing probe's runs and what its runs would take at it."""
  maker = _suite(probes=(suites.Probe('timing', 'how long is a round?', dict(rounds=20),
                                      ('base', 'new')),))
  paper = _suite(name='paper', rounds=200, paper_of='toy', retired=('toy', 'timing'))
  _toy(monkeypatch, tmp_path, maker, paper)
  for run, seconds in (('base', 90.0), ('new', 96.0)):
    path = tmp_path / 'toy' / 'probes' / 'timing' / declaration.run_name(run, 0)
    fields = dict(maker.probe_overrides(maker.probes[0], run), seed=0)
    _write_run(path, dict(experiment_config.ExperimentConfig(**fields).__dict__),
               {r: 0.5 for r in range(1, 21)}, seconds=seconds)
  c, = report.comparisons(paper, suite_runs.collect(paper))
  assert c['verdict'] == 'retired'
  hours = 93.0 * 200 / 3600
  assert report.retired_text(paper) == (
      f'retired, 90-96 s a round here at its local training (probe timing): {hours:.1f} h a '
      f'200-round run, {hours * 6:.0f} h for its 6 runs')

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
  row, = [l for l in lines if l.startswith(f'| {report.protocol_of(suite)} | New vs base |')]
  assert report._speedup_text(got['speedup'][0.45]) in row
  assert 'speed-up 2.00×' in ' '.join(lines)


def _results_with_seeds_landed(tmp_path) -> str:
  """A results folder that is the committed one (linked) but for the background runs the
  issue plans, faked by copying committed seeds under new seed numbers (their config's seed
  changed): cadis_reference seed 2, the fedcross probe paper_local_epochs' seeds 1 and 2,
  fedlex_reference's FedAvgM and FedLEx-AvgM seeds 3-6; a seed already landed is read as it is.
  Never committed."""
  def link_all(source, target, but=()):
    os.makedirs(target)
    for name in os.listdir(source):
      if name not in but:
        os.symlink(os.path.join(source, name), os.path.join(target, name))

  def copy_seed(runs, run, seed, new):
    path = os.path.join(runs, f'{run}_s{new}')
    if os.path.exists(path):   # landed for real: read as it is
      return
    shutil.copytree(os.path.join(runs, f'{run}_s{seed}'), path, symlinks=True)
    with open(os.path.join(path, 'config.json')) as f:
      config = json.load(f)
    with open(os.path.join(path, 'config.json'), 'w') as f:
      json.dump(dict(config, seed=new), f)

  root = str(tmp_path / 'results')
  link_all(suites.RESULTS, root, but=('cadis_reference', 'fedcross', 'fedlex_reference'))
  for name in ('cadis_reference', 'fedlex_reference'):
    link_all(os.path.join(suites.RESULTS, name), os.path.join(root, name), but=('runs',))
    shutil.copytree(os.path.join(suites.RESULTS, name, 'runs'), os.path.join(root, name, 'runs'))
  for run in ('fedavg', 'cadis', 'cadis_reference_weights', 'cadis_reference_quirks'):
    copy_seed(os.path.join(root, 'cadis_reference', 'runs'), run, 1, 2)
  for run in ('fedavgm', 'fedlex_avgm'):
    for new in (3, 4, 5, 6):
      copy_seed(os.path.join(root, 'fedlex_reference', 'runs'), run, new - 3, new)
  fedcross = os.path.join(suites.RESULTS, 'fedcross')
  link_all(fedcross, os.path.join(root, 'fedcross'), but=('probes',))
  link_all(os.path.join(fedcross, 'probes'), os.path.join(root, 'fedcross', 'probes'),
           but=('paper_local_epochs',))
  probe = os.path.join(root, 'fedcross', 'probes', 'paper_local_epochs')
  shutil.copytree(os.path.join(fedcross, 'probes', 'paper_local_epochs'), probe)
  for run in ('fedavg_beta0.1', 'fedcross_beta0.1'):
    for new in (1, 2):
      copy_seed(probe, run, 0, new)
  return root


def test_the_page_reads_the_planned_seeds_as_they_land(tmp_path, monkeypatch):
  """With the planned runs landed (faked from committed seeds), the opening table reads 3
  seeds for FedCross's probe at the paper's E = 5, judged against FEMNIST (copies of one seed:
  no spread, so its margin decides) and against CIFAR-10, 3 for CADIS, 7 for FedLEx."""
  root = _results_with_seeds_landed(tmp_path)
  monkeypatch.setattr(suites, 'suite_dir', lambda name: os.path.join(root, name))
  rows = {h.method: row for h, row in zip(suites.HEADLINES, _tables(report.reproduction_page())[0][1:])}
  assert rows['fedcross'][3] == '3' and rows['cadis'][3] == '3' and rows['fedlex'][3] == '7'
  assert rows['fedcross'][2].startswith(
      '**reproduced** against FEMNIST; a smaller gain against CIFAR-10 (+1.15 ± 0.00)')
  assert 'over 7 seeds' in ' '.join(report.status_lines())
