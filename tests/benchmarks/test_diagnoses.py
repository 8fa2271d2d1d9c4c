"""The diagnosis modules (benchmarks/*_diagnosis.py) and fedprox_pull: their statistics against
numpy on random and toy runs, and their committed pages regenerate byte for byte."""

import csv
import dataclasses
import json
import os
import re

import numpy as np
import pytest

from benchmarks import cadis_diagnosis
from benchmarks import fedcda_diagnosis
from benchmarks import fedcross_diagnosis
from benchmarks import fedlex_diagnosis as fd
from benchmarks import fedprox_pull
from benchmarks import suite_runs
from benchmarks import suites
from programs.studies import records
from tests.benchmarks.toy_runs import curve_run, evaluated, write_run


def test_cadis_diagnosis_regenerates_byte_for_byte():
  with open(cadis_diagnosis.OUT) as f:
    assert f.read() == cadis_diagnosis.page()


def test_fedcross_diagnosis_regenerates_byte_for_byte():
  with open(fedcross_diagnosis.OUT) as f:
    assert f.read() == fedcross_diagnosis.page(), 'run python -m benchmarks.fedcross_diagnosis'


@pytest.mark.parametrize('module', [cadis_diagnosis, fedcda_diagnosis, fedcross_diagnosis, fd],
                         ids=lambda m: m.__name__.split('.')[-1])
def test_each_diagnosis_main_writes_its_page(module, tmp_path, monkeypatch, capsys):
  """`python -m benchmarks.<method>_diagnosis` (what reproduce.sh runs after each suite)
  writes the page that `page()` makes, and says where."""
  out = tmp_path / 'diagnosis.md'
  monkeypatch.setattr(module, 'OUT', str(out))
  monkeypatch.setattr('sys.argv', ['diagnosis'])
  assert module.main() == 0
  assert out.read_text() == module.page()
  assert 'wrote ' in capsys.readouterr().out


def test_fedcda_diagnosis_regenerates_byte_for_byte():
  with open(fedcda_diagnosis.OUT) as f:
    assert f.read() == fedcda_diagnosis.page(), 'run python -m benchmarks.fedcda_diagnosis'


def test_fedlex_diagnosis_regenerates_byte_for_byte():
  with open(fd.OUT) as f:
    assert f.read() == fd.page(), 'run python -m benchmarks.fedlex_diagnosis'


@pytest.mark.parametrize('seed', range(3))
def test_fedcda_diagnosis_statistics_on_random_rows(seed):
  """fedcda_diagnosis's window figures and selection statistics against direct numpy on
  random recorded rounds (some not evaluated, some in warmup)."""
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
  assert suite_runs.window_marks(n, warmup) == [25, 50, 100, 120]
  assert suite_runs.window_marks(600, 50) == list(range(50, 601, 50))
  assert suite_runs.window_marks(120) == [50, 100, 120]
  for start, stop in ((0, 25), (25, 50), (50, 100), (100, 120)):
    window = acc[start:stop]
    rounds = np.flatnonzero(np.isfinite(window)).astype(float)
    values = window[np.isfinite(window)]
    design = np.stack([rounds, np.ones_like(rounds)], axis=1)
    fit, *_ = np.linalg.lstsq(design, values, rcond=None)
    mean, swing = suite_runs.window_accuracy(rows, start, stop)
    assert mean == pytest.approx(values.mean())
    assert swing == pytest.approx(np.std(values - design @ fit))


def test_fedcda_diagnosis_reads_a_pair_at_the_rounds_bothevaluated():
  """A probe's FedCDA evaluated every 5th round beside the unchanged FedAvg evaluated every
  round: the window levels, margins and best rounds are over the rounds both evaluated (the
  warmup, FedAvg in both, then differs by ~0, not by FedAvg's first four rounds)."""
  rng = np.random.default_rng(4)
  sparse = set(evaluated(60, 5))
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
    assert suite_runs.window_accuracy(a, start, stop)[0] == pytest.approx(
        avg[start:stop][mask].mean())
    rounds = np.flatnonzero(mask).astype(float)
    values = avg[start:stop][mask]
    fit = np.polyval(np.polyfit(rounds, values, 1), rounds)
    assert suite_runs.window_accuracy(a, start, stop)[1] == pytest.approx(np.std(values - fit))
    assert (suite_runs.window_accuracy(c, start, stop)[0]
            - suite_runs.window_accuracy(a, start, stop)[0]) == pytest.approx(0.05)
  assert fedcda_diagnosis.best_round(a[:45]) == pytest.approx(avg[:45][keep[:45]].max())
  assert fedcda_diagnosis.last10(a) == pytest.approx(avg[-10:].mean())   # the headline's


def test_cadis_diagnosis_statistics_on_random_rows():
  """cadis_diagnosis's per-run statistics against direct numpy on random recorded rounds."""
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
  from tff_algos.aggregators import clustering  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(8)
  for rounds in (3, 40):
    q, f = _random_similarity_record(rng, 12, rounds)
    assert (f == 0).any() == (rounds == 3)   # unseen pairs in the short record
    want = clustering.rescale_similarity(
        clustering.average_similarity(q.astype(np.float32), f.astype(np.float32)),
        f.astype(np.float32)).numpy()
    np.testing.assert_allclose(cadis_diagnosis.rescaled_similarity(q, f), want, atol=1e-5)


def test_cadis_similarity_statistics_against_pair_loops():
  """Same-cluster similarities before, within and after a window of rounds, and the shares
  above τ, against plain loops over the pairs of two random snapshots."""
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
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
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
  from tff_algos import data  # pylint: disable=g-import-not-at-top
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


def test_cadis_diagnosis_tables_on_toy_runs():
  """The per-run and over-rounds tables: the clusters match only once every client has been
  seen (`clusters_match` alone covers the clients seen so far), seeds that never match are
  counted, and accuracies are window means."""

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
  never = dict(runs, cadis={**runs['cadis'], 2: rows((0.1,) * 4, (0,) * 4, (n,) * 4, 0.1)})
  text_never = '\n'.join(cadis_diagnosis._suite_lines(never, {}))  # pylint: disable=protected-access
  assert '| 2 ± 1 (never on seed 2) |' in text_never, text_never
  assert '| 0.300 ± 0.283 |' in row, row            # λ·KD / cross-entropy: 0.5 and 0.1
  assert '| 2.67 ± 0.00 |' in row, row    # effective participants: 1/Σp² of (1, 1, 2)/4
  last = text.splitlines()[-1]
  assert last.startswith('| 4 |') and '| 1 of 2 |' in last, last
  assert '| 50.00 | 50.00 |' in last, last        # window means: cadis (0.1..0.9) and FedAvg


def test_fedcross_diagnosis_spread_on_random_rounds():
  """One round's spread and choices against direct numpy on random similarity matrices."""
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
  """last-10 and the peak margin over the last 10 evaluated rounds (suite_runs.last10_at)."""
  rng = np.random.default_rng(8)
  rounds = evaluated(120, 5)
  cross_full, avg_full = rng.uniform(0.4, 0.9, (2, 3, 120))
  def column(full):
    out = np.full(120, np.nan)
    out[np.array(rounds) - 1] = full[np.array(rounds) - 1]
    return out
  for c, a in zip(cross_full, avg_full):
    assert records.last10_of(column(c)) == pytest.approx(c[110:].mean())
    assert records.last10_of(column(c)[:100]) == pytest.approx(c[np.arange(54, 100, 5)].mean())
  margins = [column(c) - column(a) for c, a in zip(cross_full, avg_full)]
  mean = np.mean(margins, axis=0)
  runs = curve_run(rounds, mean[np.array(rounds) - 1])
  best = max(((suite_runs.last10_at(runs, r), r) for r in rounds[9:]), key=lambda w: w[0])
  assert fedcross_diagnosis.peak_margin(margins) == f'{100 * best[0]:+.2f} (round {best[1]})'


def test_fedcross_diagnosis_tables_on_toy_runs():
  """Margins pair each seed with FedAvg's same seed; the peak is the largest last-10 margin of
  the seeds' mean curves and names the round its window ends at; spreads skip the first 50
  rounds (acceleration)."""
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
  bump_swing = suite_runs.swing(bump[:50])
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
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  rng = np.random.default_rng(11)
  g_a, g_b = _fedlex_guidance(rng), _fedlex_guidance(rng)

  def write(path, config, accuracy, guidance=None):
    write_run(path, len(accuracy), accuracy, config=config)
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
  width = suite_runs.plateau_window(rounds)
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
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  suite = fd.SUITE
  (probe,) = [p for p in suite.probes if p.name == 'guidance_floor']
  rounds = probe.overrides['rounds']
  rng = np.random.default_rng(5)
  last10 = {}

  def write(path, config, level, first_loss=0.5, length=rounds):
    acc = np.full(length, level)
    acc[rounds:] += 0.2   # rounds past the probe's length: not in its comparison
    write_run(path, length, acc, config=config)
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
  assert fd.stuck_at_chance(suite_runs.collect(suite)) == []   # the reported runs all learned


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


def test_every_committed_table_row_has_its_headers_cells():
  """A bar inside a cell (e.g. 1/|C_i| in a label) splits it in two on GitHub unless escaped
  as \\|: every row of every table in the committed pages has as many cells as its header."""
  pages = [os.path.join(root, name) for root, _, names in os.walk(suites.HERE)
           for name in names if name.endswith('.md')]
  root = os.path.dirname(suites.HERE)
  pages.append(os.path.join(root, 'README.md'))
  pages += [os.path.join(root, 'docs', name) for name in os.listdir(os.path.join(root, 'docs'))
            if name.endswith('.md')]
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


def _numpy_linear_epoch(w, b, x, y, order, batch, lr, adam, guidance):
  """One epoch of a softmax-regression client in NumPy: SGD or Adam (PyTorch's betas and
  eps, bias-corrected), every gradient times `guidance` when given. (first step, update)."""
  params, m, v, first = [w.copy(), b.copy()], [0.0, 0.0], [0.0, 0.0], None
  for t, start in enumerate(range(0, len(order), batch), 1):
    idx = order[start:start + batch]
    logits = x[idx] @ params[0] + params[1]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(idx)), y[idx]] -= 1.0
    grads = [x[idx].T @ p / len(idx), p.mean(0)]
    if guidance is not None:
      grads = [g * s for g, s in zip(grads, guidance)]
    new = []
    for i, (q, g) in enumerate(zip(params, grads)):
      if adam:
        m[i] = 0.9 * m[i] + 0.1 * g
        v[i] = 0.999 * v[i] + 0.001 * g * g
        step = lr * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
      else:
        step = lr * g
      new.append(q - step)
    if first is None:
      first = [a - q for a, q in zip(new, params)]
    params = new
  return first, [params[0] - w, params[1] - b]


@pytest.mark.parametrize('adam', [True, False])
def test_fedlex_local_epoch_equals_numpy_and_adam_cancels_a_positive_guidance(adam):
  """`local_epoch` (the Adam-step measurement's client loop) against NumPy, guided and not;
  under Adam a guidance bounded away from 0 leaves the first step nearly unchanged, under SGD
  it scales the step by G (what the page's columns measure)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  x = rng.normal(size=(23, 6)).astype(np.float32)
  y = rng.integers(0, 4, 23).astype(np.int32)
  order = rng.permutation(23).astype(np.int32)
  model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(6,))])
  w0 = [rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
  guidance = [rng.uniform(0.1, 1.0, size=t.shape).astype(np.float32) for t in w0]
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  opt = (tff.learning.optimizers.build_adam(learning_rate=0.01, epsilon=1e-8) if adam else
         tff.learning.optimizers.build_sgdm(learning_rate=0.1))
  element = dict(x=x, y=y, order=order[None])
  for g in (None, guidance):
    first, epoch = fd.local_epoch(model, loss, opt, w0, element, 5, g)
    want_first, want_epoch = _numpy_linear_epoch(*w0, x, y, order, 5, 0.01 if adam else 0.1,
                                                 adam, g)
    for got, want in zip(first + epoch, want_first + want_epoch):
      np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=1e-6)
  first_u, _ = fd.local_epoch(model, loss, opt, w0, element, 5)
  first_g, _ = fd.local_epoch(model, loss, opt, w0, element, 5, guidance)
  ratio = fd._norm(first_g) / fd._norm(first_u)  # pylint: disable=protected-access
  if adam:   # Adam's first step is lr * sign(g) up to eps: G cancels
    assert abs(ratio - 1) < 1e-4 and fd._cosine(first_g, first_u) > 1 - 1e-6  # pylint: disable=protected-access
  else:
    assert ratio == pytest.approx(fd._norm([a * s for a, s in zip(first_u, guidance)])  # pylint: disable=protected-access
                                  / fd._norm(first_u), rel=1e-5)  # pylint: disable=protected-access
