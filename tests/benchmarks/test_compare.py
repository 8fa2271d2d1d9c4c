"""benchmarks/compare.py (flags, plan, tuning, probes, keeping shorter runs, sharing runs with
another process, signals) and benchmarks/suites.py's declaration checks."""

import csv
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from benchmarks import compare
from benchmarks import report
from benchmarks import suite_runs
from benchmarks import suites
from programs import experiment
from programs import experiment_config
from programs import run_directory
from programs import stopping
from programs.studies import queue
from programs.studies import records
from tests.benchmarks.toy_runs import paired_toy_suite, write_run


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


def test_earlier_lengths_must_be_distinct_lengths_below_the_suites():
  suite = suites.Suite(name='toy', title='toy', common=dict(rounds=40), scaled='',
                       runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
                       earlier_lengths=(10, 20))
  for lengths in ((20, 10), (20, 20), (40,)):
    with pytest.raises(ValueError, match='earlier_lengths'):
      dataclasses.replace(suite, earlier_lengths=lengths)


def test_tuned_as_gives_an_algorithm_another_ones_tuned_values():
  suite = suites.SUITES['cadis']
  tuned = {'fedavg': {'client_lr': 0.7}, 'cadis': {'client_lr': 0.2}}
  assert suite.config_overrides('fedprox', tuned)['client_lr'] == 0.7   # FedAvg's
  assert suite.config_overrides('cadis_no_kd', tuned)['client_lr'] == 0.2
  assert suite.config_overrides('fedprox')['client_lr'] == suite.common['client_lr']
  with pytest.raises(ValueError, match='fedprox takes the tuned values of fedcda'):
    dataclasses.replace(suite, tuned_as=dict(fedprox='fedcda'))


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_tuning_runs_are_the_first_rounds_of_the_reported_runs(name):
  """A tuning run differs from its reported run only in the grid's values and its length."""
  suite = suites.SUITES[name]
  for run, grid in suite.grid.items():
    full = suite.config_overrides(run)
    for values in records.grid_points(grid):
      short = suite.tuning_overrides(run, values)
      differing = {k for k in set(full) | set(short) if full.get(k) != short.get(k)}
      assert differing <= set(values) | {'rounds'}
      assert short['rounds'] <= full['rounds']


@pytest.mark.parametrize('name', sorted(suites.SUITES))
def test_every_kept_length_is_an_earlier_length_of_its_suite(name):
  """A length whose makings are kept in earlier_runs/rounds<N>/ was reported: the suite
  declares it among its earlier_lengths."""
  suite = suites.SUITES[name]
  kept = suite_runs.kept_lengths(suites.suite_dir(name))
  assert set(kept) <= set(suite.earlier_lengths), (kept, suite.earlier_lengths)


def test_a_diverging_grid_point_is_recorded_and_skipped(tmp_path, monkeypatch):
  """compare.tune: a grid point whose training diverges is recorded, not chosen, and does not
  stop the grid; its run reads as diverged."""
  suite = suites.Suite(
      name='toy', title='toy', common=dict(rounds=20), scaled='nothing',
      runs=dict(base=dict(algorithm='fedavg')), comparisons=(),
      grid=dict(base=dict(client_lr=[0.1, 0.3, 1.0])))
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  level = {0.1: 0.5, 0.3: 0.6}

  def fake_run(config):
    if queue.finished(config):
      return
    recorded = dataclasses.asdict(config)
    if config.client_lr == 1.0:   # as the program does: the marker, then the error
      write_run(config.experiment_dir, 20, np.full(4, 0.3), config=recorded)
      with open(os.path.join(config.experiment_dir, run_directory.DIVERGED), 'w') as f:
        f.write('training diverged at round 5 (train loss nan)\n')
      raise experiment_config.ExperimentError(
          'training diverged at round 5 (train loss nan); start a new run with a lower '
          '--client_lr (now 1.0) or server learning rate')
    write_run(config.experiment_dir, 20, np.full(20, level[config.client_lr]),
              config=recorded)

  monkeypatch.setattr(compare, '_run', fake_run)
  assert compare.tune(suite) == {'fedavg': dict(client_lr=0.3)}
  assert compare.tune(suite) == {'fedavg': dict(client_lr=0.3)}   # rerun: nothing new to do
  diverged = records.load_run(str(tmp_path / 'toy' / 'tuning' / 'base_client_lr1'))
  assert diverged['diverged'] == 'training diverged at round 5 (train loss nan)'
  # The declaration changes after the grid ran: its finished points are other settings' now,
  # an error naming the directory and the setting, not taken for the new grid's points.
  suite.common['client_momentum'] = 0.9
  with pytest.raises(experiment_config.ExperimentError,
                     match=r'base_client_lr0\.1 holds a finished run of other settings \(it '
                           r'was run with --client_momentum=0\.5 \(now --client_momentum=0\.9\)'
                           r'\); move it away'):
    compare.tune(suite)


def test_probes_run_the_tuned_runs_with_their_changes_and_are_read_back(tmp_path, monkeypatch):
  """compare.run_probes: each probe run is the suite's tuned run with the probe's changes,
  under probes/<name>/, read back by suite_runs.collect_probe; a probe that changes one side is
  compared with the reported runs of the other side it keeps unchanged, on its seeds (at a
  shorter length from the making kept at that length, when there is one)."""
  probe = suites.Probe('more_epochs', 'does it hold at E = 5?', dict(local_epochs=5, rounds=30),
                       ('base', 'new'), seeds=(0, 1))
  suite = dataclasses.replace(paired_toy_suite(20, tmp_path, monkeypatch), probes=(probe,))
  rng = np.random.default_rng(5)
  made, tails = [], {}

  def fake_run(config):
    made.append(config)
    acc = np.clip((0.5 if config.algorithm == 'fedavg' else 0.6) +
                  rng.normal(0, 0.03, config.rounds), 0, 1)
    write_run(config.experiment_dir, config.rounds, acc, config=dataclasses.asdict(config))
    tails[config.algorithm, config.seed] = acc[-10:].mean()

  monkeypatch.setattr(compare, '_run', fake_run)
  assert suite_runs.collect_probe(suite, probe) == {}   # before any probe run
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedavg', 0), ('fedcda', 0),
                                                  ('fedavg', 1), ('fedcda', 1)]
  assert all(c.local_epochs == 5 and c.rounds == 30 for c in made)
  assert [c.client_lr for c in made if c.algorithm == 'fedcda'] == [0.3, 0.3]   # tuned
  assert made[0].experiment_dir.endswith(os.path.join('toy', 'probes', 'more_epochs', 'base_s0'))
  (tmp_path / 'toy' / 'tuned.json').write_text('{"fedcda": {"client_lr": 0.3}}')
  runs = suite_runs.collect_probe(suite, probe)
  for run, algorithm in (('base', 'fedavg'), ('new', 'fedcda')):
    assert sorted(runs[run]) == [0, 1] and all(records.usable(r) for r in runs[run].values())
    for s in (0, 1):
      assert runs[run][s]['last10_mean_accuracy'] == pytest.approx(tails[algorithm, s])

  # A probe that changes only the method (a setting its baseline does not read) runs only it
  # and is compared with the suite's reported runs of the baseline it names unchanged, on the
  # probe's seeds; without that name, it has no baseline.
  only_new = suites.Probe('new_only', 'the method alone?', dict(rounds=20), ('new',),
                          seeds=(0, 1), unchanged=('base',))
  suite = dataclasses.replace(suite, probes=(only_new,))
  for seed in (0, 1, 2):   # the reported base runs (seed 2 is not the probe's)
    acc = np.clip(0.4 + rng.normal(0, 0.03, 20), 0, 1)
    write_run(tmp_path / 'toy' / 'runs' / f'base_s{seed}', 20, acc,
              config=dict(suite.config_overrides('base'), seed=seed))
    tails['reported', seed] = acc[-10:].mean()
  made.clear()
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedcda', 0), ('fedcda', 1)]
  runs = suite_runs.collect_probe(suite, only_new)
  assert sorted(runs['base']) == [0, 1] and sorted(runs['new']) == [0, 1]
  for s in (0, 1):
    assert runs['base'][s]['last10_mean_accuracy'] == pytest.approx(tails['reported', s])
    assert runs['new'][s]['last10_mean_accuracy'] == pytest.approx(tails['fedcda', s])
  # At a length shorter than the suite's: the reported runs' first rounds, or that length's
  # making kept in earlier_runs/ when there is one.
  short = dataclasses.replace(only_new, overrides=dict(rounds=10))
  assert suite_runs.collect_probe(suite, short)['base'][1]['rounds'] == 10
  write_run(tmp_path / 'toy' / 'earlier_runs' / 'rounds10' / 'base_s1', 10,
            np.full(10, 0.3), config=dict(suite.config_overrides('base'), seed=1, rounds=10))
  assert suite_runs.collect_probe(suite, short)['base'][1]['last10_mean_accuracy'] == (
      pytest.approx(0.3))
  shutil.rmtree(tmp_path / 'toy' / 'earlier_runs')
  alone = dataclasses.replace(only_new, unchanged=())
  assert sorted(suite_runs.collect_probe(suite, alone)) == ['new']

  # And one that changes only the baseline (e.g. another rate) against the reported method.
  only_base = suites.Probe('base_only', 'the baseline alone?', dict(rounds=20), ('base',),
                           seeds=(1, 2), unchanged=('new',))
  suite = dataclasses.replace(suite, probes=(only_base,))
  for seed in (0, 1, 2):
    acc = np.clip(0.5 + rng.normal(0, 0.03, 20), 0, 1)
    write_run(tmp_path / 'toy' / 'runs' / f'new_s{seed}', 20, acc,
              config=dict(suite.config_overrides('new', {'fedcda': dict(client_lr=0.3)}),
                          seed=seed))
    tails['reported new', seed] = acc[-10:].mean()
  made.clear()
  compare.run_probes(suite, {'fedcda': dict(client_lr=0.3)})
  assert [(c.algorithm, c.seed) for c in made] == [('fedavg', 1), ('fedavg', 2)]
  runs = suite_runs.collect_probe(suite, only_base)
  assert sorted(runs) == ['base', 'new'] and sorted(runs['new']) == [1, 2]
  for s in (1, 2):
    assert records.usable(runs['new'][s])
    assert runs['new'][s]['last10_mean_accuracy'] == pytest.approx(tails['reported new', s])


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
  """benchmarks.compare's flags, through its main: which runs (algorithm, seed) are made,
  and that the pages are written after them (report.write_all: tested with the report)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  probes = (suites.Probe('p', 'q?', dict(local_epochs=5), ('base', 'new')),
            suites.Probe('p2', 'q2?', dict(local_epochs=2), ('base',), seeds=(5,)))
  toy = dataclasses.replace(paired_toy_suite(20, tmp_path, monkeypatch), name='fedcda',
                            probes=probes, grid=dict(base=dict(client_lr=[0.1, 0.3])))
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  (tmp_path / 'fedcda').mkdir()
  if '--tune' not in argv:   # the reported runs need the suite's tuned rates
    (tmp_path / 'fedcda' / 'tuned.json').write_text('{"fedavg": {"client_lr": 0.3}}')
  made, written = [], []

  def fake_run(config):
    made.append((config.algorithm, config.seed))
    write_run(config.experiment_dir, config.rounds, np.full(config.rounds, 0.5),
              config=dataclasses.asdict(config))

  monkeypatch.setattr(compare, '_run', fake_run)
  monkeypatch.setattr(report, 'write_all', lambda: written.append(list(made)))
  try:
    flags.FLAGS(['compare', '--suite=fedcda'] + argv)
    assert compare.main([]) == 0
  finally:
    flags.FLAGS.unparse_flags()
  assert made == want
  assert written == [want]   # once, after the runs
  if '--tune' in argv:
    assert json.loads((tmp_path / 'fedcda' / 'tuned.json').read_text()) == {
        'fedavg': {'client_lr': 0.1}}   # equal scores: the first grid point stays


def test_compare_plan_lists_the_runs_left_and_their_recorded_cost(tmp_path, monkeypatch, capsys):
  """--plan trains nothing: it lists each run the same command would make, with its rounds
  left (a stopped run from its last checkpoint) at the recorded seconds per round of runs of
  the same cost, and the total."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  toy = dataclasses.replace(paired_toy_suite(20, tmp_path, monkeypatch), name='fedcda')
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  dirs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(toy, None)}
  # base's cost is recorded with whole rounds (round_seconds), new's with training only
  write_run(dirs['base_s0'].experiment_dir, 20, np.full(20, 0.5), seconds=40.0,
            round_seconds=60.0, config=dataclasses.asdict(dirs['base_s0']))
  # new_s0 stopped after round 8, checkpointed after round 5: it resumes there
  write_run(dirs['new_s0'].experiment_dir, 20, np.full(8, 0.6), seconds=36.0, summary_rounds=8,
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
      '(training only) and 20 s start-up; its own 7 rounds so far: a median 36.00 s of training (~9 min at that '
      'pace)',
      f'  {rel("base_s1")}: 20 rounds left (starts at round 1); ~20 min at 60.00 s/round '
      'and 20 s start-up',
      f'  {rel("new_s1")}: 20 rounds left (starts at round 1); ~12 min at 36.00 s/round '
      '(training only) and 20 s start-up']
  # 55 rounds' 2460 s and 3 runs' start-up at queue.DEFAULT_STARTUP_SECONDS (none recorded)
  assert lines[3].startswith('3 of 4 runs to make, 55 rounds: ~42 min as recorded')
  assert '; 2 runs sized by training time only' in lines[3]
  assert len(lines) == 4
  lines = plan_lines(['--only=new', '--seeds=2'])
  assert lines[0].endswith('20 rounds left (starts at round 1); ~12 min at 36.00 s/round '
                           '(training only) and 20 s start-up')
  # A run declared at another --eval_every than any recorded: its training is the same, so
  # it is sized by the recorded training seconds of its cost, and says so.
  every5 = dataclasses.replace(toy, common=dict(toy.common, eval_every=5))
  monkeypatch.setitem(suites.SUITES, 'fedcda', every5)
  lines = plan_lines(['--only=base', '--seeds=1'])
  assert lines[0] == (f'  {rel("base_s1")}: 20 rounds left (starts at round 1); ~14 min at '
                      '40.00 s/round (training only, recorded at another --eval_every) and 20 s '
                      'start-up')
  assert lines[1].startswith('1 of 1 runs to make, 20 rounds: ~14 min as recorded (') and (
      '1 run sized by training time only (recorded before whole rounds were, or at '
      'another --eval_every)' in lines[1]), lines
  monkeypatch.setitem(suites.SUITES, 'fedcda', toy)
  monkeypatch.setattr(queue, 'recorded_seconds_per_round', lambda directories: {})
  monkeypatch.setattr(queue, 'recorded_training_seconds', lambda directories: {})
  lines = plan_lines(['--only=base'])
  assert lines[0].endswith('no round of this cost recorded yet')
  assert '2 of 3 runs to make, 40 rounds: ~0 s as recorded, plus 2 runs ' \
         'of a cost not recorded yet' in lines[-1] and 'training time only' not in lines[-1]
  # What the command itself would stop at is listed as blocked, with the reason: a stopped run
  # recorded with other settings (its checkpoint cannot resume), a finished one likewise.
  other = dict(dataclasses.asdict(dirs['base_s2']), batch_size=dirs['base_s2'].batch_size + 1)
  write_run(dirs['base_s2'].experiment_dir, 20, np.full(4, 0.5), summary_rounds=4,
            config=other)
  os.makedirs(os.path.join(dirs['base_s2'].experiment_dir, 'checkpoints', 'program_state_4'))
  write_run(dirs['new_s2'].experiment_dir, 20, np.full(20, 0.5),
            config=dict(dataclasses.asdict(dirs['new_s2']), batch_size=7))
  lines = plan_lines(['--seeds=2'])
  assert lines[0].startswith(f'  {rel("base_s2")}: blocked: cannot resume '
                             f'{dirs["base_s2"].experiment_dir}: it was run with --batch_size='
                             ), lines
  assert lines[1].startswith(f'  {rel("new_s2")}: blocked: ') and (
      'holds a finished run of other settings' in lines[1]), lines
  assert lines[2].startswith('0 of 2 runs to make, 0 rounds: ') and '; 2 blocked' in lines[2]
  # ... and a stopped run whose record lost rounds its checkpoint holds (the run's own check)
  write_run(dirs['base_s1'].experiment_dir, 20, np.full(3, 0.5), summary_rounds=3,
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
  toy = dataclasses.replace(paired_toy_suite(20, tmp_path, monkeypatch), name='toypace')
  dirs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(toy, None)}
  write_run(dirs['base_s0'].experiment_dir, 20, np.full(20, 0.5), round_seconds=60.0,
            config=dataclasses.asdict(dirs['base_s0']))
  # base_s1 ran on a slower machine: 120 s a round after its first, round 10 paused 9000 s
  own = [500.0] + [120.0] * 8 + [9000.0]
  write_run(dirs['base_s1'].experiment_dir, 20, np.full(10, 0.5), summary_rounds=10,
            config=dataclasses.asdict(dirs['base_s1']), columns=dict(round_seconds=own))
  os.makedirs(os.path.join(dirs['base_s1'].experiment_dir, 'checkpoints', 'program_state_5'))
  # new_s1 stopped after round 3: two rounds after its first are too few for a pace
  write_run(dirs['new_s1'].experiment_dir, 20, np.full(3, 0.5), summary_rounds=3,
            config=dataclasses.asdict(dirs['new_s1']), round_seconds=30.0)
  os.makedirs(os.path.join(dirs['new_s1'].experiment_dir, 'checkpoints', 'program_state_3'))
  lines = compare.plan(toy, [dirs['base_s1'], dirs['new_s1']])
  recorded = (19 * 60.0 + 8 * 120.0) / 27   # the paused round left out
  assert lines[0] == (
      f'  {os.path.relpath(dirs["base_s1"].experiment_dir)}: 15 rounds left (resumes after '
      f'round 5); ~20 min at {recorded:.2f} s/round and 20 s start-up; its own 9 rounds so '
      'far: a median '
      '120.00 s (~30 min at that pace)')
  assert lines[1] == (
      f'  {os.path.relpath(dirs["new_s1"].experiment_dir)}: 17 rounds left (resumes after '
      'round 3); ~9 min at 30.00 s/round and 20 s start-up')
  assert queue.own_seconds_per_round(dirs['base_s1'].experiment_dir) == (120.0, 9, True)
  assert queue.own_seconds_per_round(dirs['new_s1'].experiment_dir) is None
  assert queue.own_seconds_per_round(dirs['new_s0'].experiment_dir) is None   # not begun


def test_recorded_cost_is_the_mean_whole_round_per_evaluation_schedule(tmp_path, monkeypatch):
  """A run evaluated every 5th round costs its mean whole round (evaluated rounds counted as
  often as they come), and is not the cost of one evaluated every round."""
  toy = dataclasses.replace(paired_toy_suite(20, tmp_path, monkeypatch), name='toycost')
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
  got = queue.recorded_seconds_per_round(compare.recorded_dirs('toycost'))
  key = tuple(getattr(config, f) for f in queue.COST_FIELDS[:-1])
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
  try:
    flags.FLAGS(['compare', '--suite=fedcda'] + argv)
    assert compare.main([]) == 2
  finally:
    flags.FLAGS.unparse_flags()
  assert message in capsys.readouterr().err


def test_compare_leaves_a_run_another_process_holds_for_last_and_then_makes_it(tmp_path,
                                                                              monkeypatch):
  """Two `compare` commands share a suite's runs: a run another process holds is skipped,
  the free ones are made, then the held one is waited for and made (resumed) after."""
  import threading  # pylint: disable=g-import-not-at-top
  made = []

  def fake_run(config):   # what run_experiment does first: hold the directory, or refuse
    with run_directory.exclusive_run_directory(config.experiment_dir):
      made.append(config.experiment_name)

  monkeypatch.setattr(compare, '_run', fake_run)
  configs = []
  for name in ('held', 'free'):
    (tmp_path / name).mkdir()
    configs.append(experiment_config.ExperimentConfig(root_output_dir=str(tmp_path),
                                               experiment_name=name))
  holding, release = threading.Event(), threading.Event()

  def other_process():
    with run_directory.exclusive_run_directory(str(tmp_path / 'held')):
      holding.set()
      release.wait(30)

  other = threading.Thread(target=other_process)
  other.start()
  holding.wait(30)
  threading.Timer(0.5, release.set).start()
  compare.run_all(configs)
  other.join()
  assert made == ['free', 'held']


def test_compare_stops_at_a_signal_like_the_program(tmp_path, monkeypatch):
  """benchmarks.compare hands its StopRequests to each run (SIGTERM/SIGINT stop the run at
  its next round boundary, checkpointed) and a stopped run ends the command: no later run
  starts."""
  import signal  # pylint: disable=g-import-not-at-top
  stop = stopping.StopRequests()
  monkeypatch.setattr(queue, '_STOP', stop)
  started = []

  def fake_run_experiment(config, stop=None):
    started.append(config.experiment_name)
    assert stop is queue._STOP  # pylint: disable=protected-access
    raise stopping.Interrupted(signal.SIGTERM, 3, config.experiment_dir)

  monkeypatch.setattr(experiment, 'run_experiment', fake_run_experiment)
  configs = [experiment_config.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name=n)
             for n in ('a', 'b')]
  with pytest.raises(stopping.Interrupted):
    compare.run_all(configs)
  assert started == ['a']


def test_compare_stopped_while_waiting_for_a_run_does_not_start_it(tmp_path, monkeypatch):
  """A signal that arrives while compare waits for another process's run ends the command
  before that run is started, naming its last checkpointed round."""
  import signal  # pylint: disable=g-import-not-at-top
  stop = stopping.StopRequests()
  stop.signum = signal.SIGTERM   # recorded while waiting
  monkeypatch.setattr(queue, '_STOP', stop)
  monkeypatch.setattr(experiment, 'run_experiment',
                      lambda *a, **k: pytest.fail('a run was started after the signal'))
  config = experiment_config.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name='r')
  os.makedirs(os.path.join(config.experiment_dir, 'checkpoints', 'program_state_7'))
  with open(os.path.join(config.experiment_dir, 'config.json'), 'w') as f:
    json.dump(dict(rounds=30), f)
  with pytest.raises(stopping.Interrupted) as info:
    compare._run(config)  # pylint: disable=protected-access
  assert info.value.last_round == 7 and info.value.signum == signal.SIGTERM


def test_compare_waiting_for_another_process_stops_at_a_signal(tmp_path, monkeypatch):
  """While another process holds a run for hours, a recorded signal ends the waiting compare
  within about a second (the wait polls; a blocking flock would ignore the signal)."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  stop = stopping.StopRequests()
  monkeypatch.setattr(queue, '_STOP', stop)

  def fake_run(config):
    with run_directory.exclusive_run_directory(config.experiment_dir):
      pass

  monkeypatch.setattr(compare, '_run', fake_run)
  (tmp_path / 'held').mkdir()
  config = experiment_config.ExperimentConfig(root_output_dir=str(tmp_path), experiment_name='held')
  holding, release = threading.Event(), threading.Event()

  def other_process():
    with run_directory.exclusive_run_directory(config.experiment_dir):
      holding.set()
      release.wait(60)

  other = threading.Thread(target=other_process)
  other.start()
  holding.wait(30)
  threading.Timer(0.5, lambda: setattr(stop, 'signum', signal.SIGTERM)).start()
  started = time.time()
  try:
    with pytest.raises(stopping.Interrupted):
      compare.run_all([config])
    assert time.time() - started < 5
  finally:
    release.set()
    other.join()


def test_compare_keeps_a_shorter_run_it_makes_again(tmp_path, monkeypatch, capsys):
  """A finished run shorter than the suite's rounds, with no checkpoint, is made again from
  round 1: compare first moves it to earlier_runs/rounds<N>/ (suite_runs.remade_runs then compares
  the two), --plan says so; a stopped run with a checkpoint resumes in place; a name already
  kept there is an error naming both, and nothing moves."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  configs = {os.path.basename(c.experiment_dir): c for c in compare.run_configs(suite, None)}
  shorter = np.linspace(0.3, 0.6, 20)
  for name in ('new_s0', 'new_s1', 'base_s0'):
    write_run(configs[name].experiment_dir, 20, shorter,
              config=dict(dataclasses.asdict(configs[name]), rounds=20))
  os.makedirs(os.path.join(configs['base_s0'].experiment_dir, 'checkpoints', 'program_state_20'))
  kept = tmp_path / 'toy' / 'earlier_runs' / 'rounds20'
  write_run(kept / 'new_s1', 20, shorter)   # new_s1's name is taken there already
  write_run(configs['base_s1'].experiment_dir, 20, shorter,   # a shorter run, other settings
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
      write_run(config.experiment_dir, config.rounds, np.full(config.rounds, 0.7),
                config=dataclasses.asdict(config))

  monkeypatch.setattr(experiment, 'run_experiment', fake_run_experiment)
  compare._run(configs['new_s0'])   # pylint: disable=protected-access
  compare._run(configs['base_s0'])   # pylint: disable=protected-access
  assert made == [('new_s0', False), ('base_s0', True)]
  assert 'its shorter run is kept in' in capsys.readouterr().err
  np.testing.assert_allclose(records.load_run(str(kept / 'new_s0'))['curve_accuracy'], shorter)
  assert records.load_run(configs['new_s0'].experiment_dir)['rounds_done'] == 40
  assert not (kept / 'base_s0').exists()
  assert [(r['run'], r['seed']) for r in suite_runs.remade_runs(suite)] == [('new', 0)]
  with pytest.raises(experiment_config.ExperimentError, match='already keeps a run of that name'):
    compare._run(configs['new_s1'])   # pylint: disable=protected-access
  assert records.load_run(configs['new_s1'].experiment_dir)['rounds_done'] == 20
  with pytest.raises(experiment_config.ExperimentError,
                     match=r'holds a shorter finished run \(20 rounds\) of other settings'):
    compare._run(configs['base_s1'])   # pylint: disable=protected-access
  assert records.load_run(configs['base_s1'].experiment_dir)['rounds_done'] == 20
  assert made == [('new_s0', False), ('base_s0', True)]   # neither of those two was made

  # Two compare processes on one run: the other moved it between this one's look and its
  # lock. The directory is gone, so this one makes the run anew instead of failing.
  new_s2 = configs['new_s2']
  write_run(new_s2.experiment_dir, 20, shorter,
            config=dict(dataclasses.asdict(new_s2), rounds=20))
  lock = run_directory.exclusive_run_directory

  def moved_first(exp_dir, wait=False):
    if os.path.isdir(exp_dir):
      os.rename(exp_dir, str(kept / 'new_s2'))   # what the other process did
    return lock(exp_dir, wait)

  monkeypatch.setattr(run_directory, 'exclusive_run_directory', moved_first)
  compare._run(new_s2)   # pylint: disable=protected-access
  assert made[-1] == ('new_s2', False)
  assert records.load_run(new_s2.experiment_dir)['rounds_done'] == 40


def test_compare_reading_a_run_the_other_process_moves_makes_it_anew(tmp_path, monkeypatch):
  """The other compare process moves a shorter run away (`_keep_shorter_run`) while this one
  reads it in `queue.finished`, before either holds the run: the run is free, so this one makes
  it anew instead of failing on the missing files. (Every later look is under the run's lock; a
  move just before this one takes it: test_compare_keeps_a_shorter_run_it_makes_again.)"""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  kept = tmp_path / 'toy' / 'earlier_runs' / 'rounds20'
  made = []
  monkeypatch.setattr(experiment, 'run_experiment',
                      lambda config, stop=None: made.append(os.path.basename(
                          config.experiment_dir)))
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  write_run(config.experiment_dir, 20, np.full(20, 0.5),
            config=dict(dataclasses.asdict(config), rounds=20))
  load_run = records.load_run
  calls = []

  def moved_while_read(exp_dir, rounds=None):
    calls.append(exp_dir)
    if len(calls) == 1:
      os.makedirs(kept)
      os.rename(exp_dir, str(kept / 'new_s0'))   # what the other process did
    return load_run(exp_dir, rounds)

  monkeypatch.setattr(records, 'load_run', moved_while_read)
  compare._run(config)   # pylint: disable=protected-access
  assert made == ['new_s0'] and len(calls) == 1


def test_compare_takes_a_longer_run_as_finished_and_keeps_other_shorter_records(
    tmp_path, monkeypatch):
  """A finished run longer than the suite now declares is finished, read over its first
  rounds as its page reads it (not made again shorter over its record); a probe's finished
  run shorter than its probe declares, with no checkpoint, is refused with one line instead
  of being made again from round 1 over its record (only reported runs have a place to keep
  a shorter making)."""
  suite = paired_toy_suite(20, tmp_path, monkeypatch)
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  write_run(config.experiment_dir, 30, np.full(30, 0.5),
            config=dict(dataclasses.asdict(config), rounds=30))
  monkeypatch.setattr(experiment, 'run_experiment', lambda *a, **k: pytest.fail('made'))
  compare._run(config)   # pylint: disable=protected-access
  (total,) = compare.plan(suite, [config])
  assert total.startswith('0 of 1 runs to make, 0 rounds: ')
  assert records.load_run(config.experiment_dir)['rounds_done'] == 30
  probe = dataclasses.replace(config, root_output_dir=str(tmp_path / 'toy' / 'probes' / 'runs'))
  write_run(probe.experiment_dir, 10, np.full(10, 0.5),
            config=dict(dataclasses.asdict(probe), rounds=10))
  with pytest.raises(experiment_config.ExperimentError,
                     match='holds a finished run of 10 rounds and no checkpoint to continue it '
                           'to 20: move it away'):
    compare._run(probe)   # pylint: disable=protected-access
  assert records.load_run(probe.experiment_dir)['rounds_done'] == 10


def test_compare_waiting_for_a_run_the_other_process_moved_makes_it(tmp_path, monkeypatch):
  """run_all leaves a run another compare process holds for last and waits for it; if that
  process moved the run's directory away (a shorter run kept, `_keep_shorter_run`) the
  missing directory is free, not an error."""
  suite = paired_toy_suite(40, tmp_path, monkeypatch)
  config = compare.run_configs(suite, None, only=('new',), seeds=(0,))[0]
  os.makedirs(config.experiment_dir)
  calls = []

  def fake_run(c):
    calls.append(c.experiment_dir)
    if len(calls) == 1:   # held by the other process, which then moves the directory away
      os.rename(c.experiment_dir, str(tmp_path / 'moved'))
      raise run_directory.RunDirectoryBusy('held')

  monkeypatch.setattr(compare, '_run', fake_run)
  compare.run_all([config])
  assert calls == [config.experiment_dir] * 2
