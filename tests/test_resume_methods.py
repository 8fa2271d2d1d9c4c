"""Every method through the training program: a run stopped after round 2 and resumed with
--resume ends exactly where the unbroken run ends (weights, state-driven metrics), so each
method's whole state (FedCross's middleware models and α schedule, FedCDA's cache, CADIS's
Q/F/τ, FedLEx's guidance, SCAFFOLD's control variates) is checkpointed and restored. The three runs share one compiled
process (the program's build cache), so each method compiles once.
(FedAvg's resume through a killed subprocess: tests/test_train_program.py.)"""

import collections
import dataclasses
import math
import os

import numpy as np
import pytest

from programs import experiment
from programs import experiment_config
from programs import run_directory

BASE = experiment_config.ExperimentConfig(
    dataset='digits', num_clients=8, clients_per_round=3, batch_size=16, client_lr=0.1,
    local_epochs=1, rounds=3, progress=False)

METHODS = {
    # Acceleration rounds, α schedule and propellers run inside the TFF process here.
    # The decayed client rate lives in the state (tff_algos.client_lr_decay): resumed too.
    'fedcross': dict(fedcross_alpha_schedule=True, fedcross_num_propellers=1,
                     fedcross_accel_rounds=2, client_lr_decay=0.5),
    # Selection starts in round 2: the resumed round selects from the restored cache.
    # Schedules with the round number in the state (tff_algos.schedules) resume mid-way.
    'fedcda': dict(fedcda_warmup_rounds=1, fedcda_cache_size=2, fedcda_batches=1,
                   client_lr_schedule='step', client_lr_decay=0.5, client_lr_warmup_rounds=1),
    'cadis': dict(cadis_kd_weight=0.5, cadis_kd_reduction='mean', server_lr_decay=0.5,
                  client_lr_warmup_rounds=1),
    'fedlex_avgm': dict(fedlex_exploration_epochs=1, fedlex_refresh=True,
                        server_lr_schedule='step', server_lr_decay=0.5,
                        server_lr_decay_every=2),
    # The resumed round corrects its clients' steps by the restored control variates.
    'scaffold': dict(client_momentum=0.0, scaffold_server_lr=0.8, client_lr_decay=0.5,
                     server_lr_warmup_rounds=1),
}
STATE_METRICS = {
    'fedcross': 'aggregator/alpha', 'fedcda': 'aggregator/switched',
    'cadis': 'aggregator/tau',
    # refreshed guidance each round: the program state's running exploration cost
    'fedlex_avgm': 'exploration_client_epochs',
    'scaffold': 'aggregator/server_control_norm'}


def _csv(path):
  import csv  # pylint: disable=g-import-not-at-top
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.parametrize('algorithm', sorted(METHODS))
def test_stopped_and_resumed_run_equals_the_unbroken_run(algorithm, tmp_path):
  config = dataclasses.replace(BASE, algorithm=algorithm, root_output_dir=str(tmp_path),
                               **METHODS[algorithm])
  log = lambda msg: None  # noqa: E731
  straight = experiment.run_experiment(dataclasses.replace(config, experiment_name='unbroken'),
                                       log)
  experiment.run_experiment(dataclasses.replace(config, experiment_name='broken', rounds=2),
                            log)
  summary = experiment.run_experiment(
      dataclasses.replace(config, experiment_name='broken', resume=True), log)
  unbroken, broken = (os.path.join(tmp_path, name) for name in ('unbroken', 'broken'))
  a = np.load(os.path.join(unbroken, 'final_weights.npz'))
  b = np.load(os.path.join(broken, 'final_weights.npz'))
  assert sorted(a.files) == sorted(b.files)
  for key in a.files:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  rows_a, rows_b = _csv(os.path.join(unbroken, 'metrics.csv')), _csv(os.path.join(broken,
                                                                                   'metrics.csv'))
  assert [r['round'] for r in rows_b] == ['1', '2', '3']
  # The bytes' running totals (and FedLEx's exploration bytes) go on from the kept rows.
  columns = [k for k in rows_a[0] if 'accuracy' in k or 'loss' in k or 'bytes' in k
             or k == STATE_METRICS[algorithm] or k.startswith('learning_rate/')]
  # A schedule's rates (tff_algos.schedules), fedcross's --client_lr_decay alone aside.
  assert (algorithm == 'fedcross') != any(k.startswith('learning_rate/') for k in columns)
  assert 'cumulative_bytes_up' in columns
  assert ({k: v for k, v in summary.items() if 'bytes_' in k}
          == {k: v for k, v in straight.items() if 'bytes_' in k})
  assert STATE_METRICS[algorithm] in columns, sorted(rows_a[0])
  for ra, rb in zip(rows_a, rows_b):
    assert {k: ra[k] for k in columns} == {k: rb[k] for k in columns}
  # The method changed something the state carries (the test could not pass on a no-op).
  assert len({r[STATE_METRICS[algorithm]] for r in rows_a}) > 1 or algorithm == 'fedcda'
  if algorithm == 'fedcda':
    assert any(float(r['aggregator/warmup']) == 0.0 for r in rows_a)
    # The cache's formula (summary.json) is the state the run actually held.
    assert summary['fedcda_state_formula_bytes'] == summary['aggregator_state_bytes']
    assert summary['fedcda_cache_formula'].startswith('4*N*K*D = 4*8*2*')
  if algorithm == 'scaffold':
    # The control variates' formula (summary.json) is the state the run actually held.
    assert summary['scaffold_state_formula_bytes'] == summary['aggregator_state_bytes']
  if algorithm == 'cadis':
    assert summary['cadis_final_num_clusters'] >= 1
  if algorithm.startswith('fedlex'):
    assert 0 < summary['guidance']['guidance_mean'] <= 1
  if algorithm == 'cadis':  # the KD term's size is reported beside the cross-entropy
    assert summary['cadis_kd_loss_mean'] > 0
    assert summary['cadis_kd_to_cross_entropy'] == pytest.approx(
        summary['cadis_kd_loss_mean'] / summary['cadis_cross_entropy_mean'])


def test_checkpoint_every_n_rounds_and_a_crash_between_repeats_the_same_rounds(tmp_path):
  """--checkpoint_every=3 saves rounds 3 and 6 and the last (7) (the program keeps the
  latest three versions); a crash after round 5 (its checkpoint never written) resumes from round 3 and logs rounds 4-5 again exactly as the
  unbroken run did."""
  config = dataclasses.replace(BASE, algorithm='fedavg', root_output_dir=str(tmp_path),
                               rounds=7, checkpoint_every=3)
  log = lambda msg: None  # noqa: E731
  unbroken = dataclasses.replace(config, experiment_name='unbroken')
  experiment.run_experiment(unbroken, log)
  ckpt = lambda c: os.path.join(c.experiment_dir, 'checkpoints')  # noqa: E731
  assert run_directory.checkpointed_rounds(ckpt(unbroken)) == [3, 6, 7]
  every_round = dataclasses.replace(config, experiment_name='every', checkpoint_every=1)
  experiment.run_experiment(every_round, log)
  assert run_directory.checkpointed_rounds(ckpt(every_round)) == [5, 6, 7]

  broken = dataclasses.replace(config, experiment_name='broken', rounds=5)
  experiment.run_experiment(broken, log)   # checkpoints after rounds 3 and 5 (its last)
  assert run_directory.checkpointed_rounds(ckpt(broken)) == [3, 5]
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(os.path.join(ckpt(broken), 'program_state_5'))   # the crash
  messages = []
  experiment.run_experiment(dataclasses.replace(broken, rounds=7, resume=True), messages.append)
  assert any('after round 3' in m for m in messages), messages
  rows_a = _csv(os.path.join(unbroken.experiment_dir, 'metrics.csv'))
  rows_b = _csv(os.path.join(broken.experiment_dir, 'metrics.csv'))
  assert [r['round'] for r in rows_b] == [str(r) for r in range(1, 8)]
  for ra, rb in zip(rows_a, rows_b):
    assert ra['test_accuracy'] == rb['test_accuracy'] and ra['test_loss'] == rb['test_loss']
  a = np.load(os.path.join(unbroken.experiment_dir, 'final_weights.npz'))
  b = np.load(os.path.join(broken.experiment_dir, 'final_weights.npz'))
  for key in a.files:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_resident_state_is_detached_every_round_and_resumes_exactly(tmp_path,
                                                                       monkeypatch):
  """With the state resident, every round's new state is detached in the worker
  (`ResidentProcess.next`) and none is placed anew (`refresh`, a write and read of the whole
  state, is not needed): a run stopped at round 4 and resumed to 7 equals the unbroken run
  exactly."""
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  calls = collections.Counter()
  detached, refresh = resident_state.ResidentProcess._detached, resident_state.ResidentProcess.refresh  # pylint: disable=protected-access

  async def counting_detached(self, value):
    calls['detached'] += 1
    return await detached(self, value)

  def counting_refresh(self, state):
    calls['refresh'] += 1
    return refresh(self, state)

  monkeypatch.setattr(resident_state.ResidentProcess, '_detached', counting_detached)
  monkeypatch.setattr(resident_state.ResidentProcess, 'refresh', counting_refresh)
  config = dataclasses.replace(BASE, algorithm='fedcda', root_output_dir=str(tmp_path),
                               rounds=7, **METHODS['fedcda'])
  log = lambda msg: None  # noqa: E731
  experiment.run_experiment(dataclasses.replace(config, experiment_name='unbroken'), log)
  assert calls == {'detached': 7}
  experiment.run_experiment(dataclasses.replace(config, experiment_name='broken', rounds=4),
                            log)
  calls.clear()
  experiment.run_experiment(dataclasses.replace(config, experiment_name='broken', resume=True),
                            log)
  assert calls == {'detached': 3}
  a = np.load(os.path.join(tmp_path, 'unbroken', 'final_weights.npz'))
  b = np.load(os.path.join(tmp_path, 'broken', 'final_weights.npz'))
  for key in a.files:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  rows_a = _csv(os.path.join(tmp_path, 'unbroken', 'metrics.csv'))
  rows_b = _csv(os.path.join(tmp_path, 'broken', 'metrics.csv'))
  for ra, rb in zip(rows_a, rows_b):
    assert (ra['test_accuracy'], ra['aggregator/switched']) == (
        rb['test_accuracy'], rb['aggregator/switched'])


def _rewrite_checkpoint(path, change_aggregator):
  """Rewrites the saved program state at `path` with its aggregator state changed."""
  import asyncio  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  loop = asyncio.new_event_loop()
  saved = loop.run_until_complete(file_utils.read_saved_model(path))
  saved['state'] = saved['state']._replace(aggregator=change_aggregator(saved['state'].aggregator))
  loop.run_until_complete(file_utils.write_saved_model(saved, path, overwrite=True))
  loop.close()


def test_a_checkpoint_that_does_not_match_the_state_is_refused(tmp_path):
  """FedCDA checkpoints whose aggregator state lacks a field are refused in one line (every
  kept version: with one that loads, --resume falls back to it)."""
  config = dataclasses.replace(BASE, algorithm='fedcda', root_output_dir=str(tmp_path),
                               experiment_name='bad', rounds=2, **METHODS['fedcda'])
  quiet = lambda msg: None  # noqa: E731
  experiment.run_experiment(config, quiet)
  ckpt_dir = os.path.join(tmp_path, 'bad', 'checkpoints')
  for version in os.listdir(ckpt_dir):
    _rewrite_checkpoint(os.path.join(ckpt_dir, version),
                        lambda agg: {k: v for k, v in agg.items() if k != 'losses'})
  with pytest.raises(experiment_config.ExperimentError, match='checkpoint does not match'):
    experiment.run_experiment(dataclasses.replace(config, rounds=BASE.rounds, resume=True),
                              quiet)


def _faulty_seed(dropout, rounds, num_clients, per_round):
  """The first seed whose rounds 1..`rounds` include one where no sampled client reports and
  one where some do (the draw is NumPy's: found without running anything)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  faults = data.ClientFaults(dropout)
  for seed in range(1000):
    reporting = [sum(faults.work(seed, t, int(n)) > 0 for n in data.sample_clients(
        num_clients, per_round, t, seed)) for t in range(1, rounds + 1)]
    if 0 in reporting and reporting[0] and reporting[-1]:
      return seed
  raise AssertionError('no such seed')


def test_faults_change_what_runs_and_resume_exactly(tmp_path):
  """--client_dropout / --straggler_fraction: each round's reported clients are the draw's
  (data.ClientFaults over the round's sample), a round nobody reports in is a round (not a
  divergence), stragglers cut the client-epochs, the weights differ from the fault-free
  run's, and a run stopped after round 2 resumes into the unbroken run exactly."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  rounds, dropout = 4, 0.6
  seed = _faulty_seed(dropout, rounds, BASE.num_clients, BASE.clients_per_round)
  config = dataclasses.replace(BASE, algorithm='fedavg', root_output_dir=str(tmp_path),
                               rounds=rounds, seed=seed, client_dropout=dropout,
                               straggler_fraction=0.5, straggler_min_work=0.3)
  log = lambda msg: None  # noqa: E731
  messages = []
  experiment.run_experiment(dataclasses.replace(config, experiment_name='unbroken'),
                            messages.append)
  experiment.run_experiment(dataclasses.replace(config, experiment_name='broken', rounds=2),
                            log)
  summary = experiment.run_experiment(
      dataclasses.replace(config, experiment_name='broken', resume=True), log)
  experiment.run_experiment(dataclasses.replace(
      config, experiment_name='plain', client_dropout=0.0, straggler_fraction=0.0,
      straggler_min_work=0.5), log)
  runs = {name: os.path.join(tmp_path, name) for name in ('unbroken', 'broken', 'plain')}
  weights = {name: np.load(os.path.join(d, 'final_weights.npz')) for name, d in runs.items()}
  for key in weights['unbroken'].files:
    np.testing.assert_array_equal(weights['unbroken'][key], weights['broken'][key])
  assert any(not np.array_equal(weights['unbroken'][k], weights['plain'][k])
             for k in weights['plain'].files)
  rows = {name: _csv(os.path.join(d, 'metrics.csv')) for name, d in runs.items()}
  assert rows['unbroken'] == [dict(r, seconds=a['seconds'], round_seconds=a['round_seconds'])
                              for a, r in zip(rows['unbroken'], rows['broken'])]
  faults = data.ClientFaults(dropout, 0.5, 0.3)
  fed = experiment.load_federated_data(config)
  for t, row in enumerate(rows['unbroken'], start=1):
    works = [faults.work(seed, t, int(n)) for n in data.sample_clients(
        BASE.num_clients, BASE.clients_per_round, t, seed)]
    reported = sum(w > 0 for w in works)
    assert int(row['reported_clients']) == reported
    assert int(row['unreported_clients']) == BASE.clients_per_round - reported
    assert float(row['client_work/train/reported_clients']) == reported
    # One local epoch of K = ceil(n / B) steps: a client runs ceil(work x K) of them.
    steps = [math.ceil(len(fed.client_arrays(int(n))[1]) / BASE.batch_size) for n in
             data.sample_clients(BASE.num_clients, BASE.clients_per_round, t, seed)]
    np.testing.assert_allclose(float(row['client_work/train/client_epochs']),
                               sum(math.ceil(w * k) / k for w, k in zip(works, steps)),
                               rtol=1e-6)
    if not reported:
      assert float(row['client_work/train/client_epochs']) == 0
      assert any(f'round {t}: none of the' in m for m in messages), messages
  assert [r['round'] for r in rows['unbroken']] == [str(t) for t in range(1, rounds + 1)]
  assert summary['unreported_clients'] == sum(int(r['unreported_clients'])
                                              for r in rows['unbroken'])
  assert all(int(r['reported_clients']) == BASE.clients_per_round for r in rows['plain'])
  assert (sum(float(r['client_work/train/client_epochs']) for r in rows['unbroken'])
          < sum(float(r['client_work/train/client_epochs']) for r in rows['plain']))
