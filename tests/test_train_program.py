"""End-to-end checks of programs/train.py: flags, resume, divergence, pipes."""

import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from programs import computations
from programs import experiment
from programs import experiment_config
from programs import run_directory
from programs import run_results
from programs import stopping
from tff_algos import constants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ['--dataset=digits', '--num_clients=10', '--clients_per_round=4', '--local_epochs=1',
        '--batch_size=16', '--client_lr=0.1', '--progress=false']


def _run(args, timeout=240, **kwargs):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, '-m', 'programs.train', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, **kwargs)


def _weights(directory):
  return run_results.load_final_weights(directory)


def _snapshot(directory):
  """{path: (bytes, mode)} of every file under directory."""
  out = {}
  for base, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(base, name)
      with open(path, 'rb') as f:
        out[path] = (f.read(), os.stat(path).st_mode)
  return out


@pytest.fixture(scope='module')
def piped_run(tmp_path_factory):
  """A finished 2-round run through `| cat`, started with --resume in an empty directory."""
  tmp = tmp_path_factory.mktemp('piped')
  cmd = (f'{sys.executable} -m programs.train ' + ' '.join(BASE) +
         f' --rounds=2 --resume --root_output_dir={tmp} --experiment_name=p 2>&1 | cat')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  result = subprocess.run(['bash', '-c', cmd], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
  return result, tmp / 'p'


@pytest.fixture(scope='module')
def bad_inputs(tmp_path_factory):
  """Data directories and files that the bad-input cases point at."""
  from tests.helpers import write_leaf_json  # pylint: disable=g-import-not-at-top
  tmp = tmp_path_factory.mktemp('bad')
  for split in ('train', 'test'):
    for case, content in (('corrupt', '{"users": ["a"], "user_data": {"a": {"x": [[0.5'),
                          ('no_user_data', '{"users": ["a"], "num_samples": [1]}')):
      os.makedirs(tmp / case / split)
      (tmp / case / split / 'a.json').write_text(content)
    write_leaf_json(str(tmp / 'pixels700' / split / 'a.json'),
                    {'u': {'x': [[0.5] * 700] * 2, 'y': [1, 2]}})
  # LEAF user split whose test users are none of the training users: a central test set,
  # but no client has test data of its own (per-client evaluation has nothing to evaluate).
  write_leaf_json(str(tmp / 'test_users_only' / 'train' / 'a.json'),
                  {'u': {'x': [[0.5] * 784] * 2, 'y': [1, 2]}})
  write_leaf_json(str(tmp / 'test_users_only' / 'test' / 'a.json'),
                  {'v': {'x': [[0.5] * 784] * 2, 'y': [1, 2]}})
  # LEAF all_data whose users have one sample each: all go to training, none to the test set.
  write_leaf_json(str(tmp / 'no_test' / 'all_data' / 'a.json'),
                  {f'u{i}': {'x': [[0.5] * 784], 'y': [i]} for i in range(12)})
  import gzip  # pylint: disable=g-import-not-at-top
  os.makedirs(tmp / 'fmnist')
  for stem, shape in (('train-images-idx3-ubyte', (3, 28, 28)), ('train-labels-idx1-ubyte', (3,)),
                      ('t10k-images-idx3-ubyte', (2, 28, 28)), ('t10k-labels-idx1-ubyte', (2,))):
    header = bytes([0, 0, 8, len(shape)]) + b''.join(d.to_bytes(4, 'big') for d in shape)
    raw = gzip.compress(header + bytes(int(np.prod(shape))))
    if stem.startswith('train-images'):
      raw = raw[:len(raw) // 2]  # a download cut short
    (tmp / 'fmnist' / (stem + '.gz')).write_bytes(raw)
  (tmp / 'a_file').write_text('not a directory')
  return tmp


# (flags, fragment of the one error line); {bad} = the bad_inputs directory, {run} = the
# root of piped_run's finished run 'p' (resume cases).
BAD_INPUTS = [
    ('--algorithm=nope', '--algorithm'),
    ('--clients_per_round=50', '--clients_per_round=50 exceeds'),
    ('--partition=dirichlet --dirichlet_alpha=0', '--dirichlet_alpha must be > 0'),
    ('--checkpoint_every=0', '--checkpoint_every must be at least 1'),
    ('--eval_last=-1', '--eval_last must be at least 0'),
    ('--blown_up_rounds=-1', '--blown_up_rounds must be at least 0'),
    ('--client_test_fraction=1', '--client_test_fraction must be in [0, 1)'),
    # client faults (tff_algos.data.ClientFaults's checks, named as the flags)
    ('--client_dropout=1', '--client_dropout must be in [0, 1)'),
    ('--client_dropout=-0.5', '--client_dropout must be in [0, 1)'),
    ('--straggler_fraction=1.5', '--straggler_fraction must be in [0, 1]'),
    ('--straggler_fraction=0.5 --straggler_min_work=0', '--straggler_min_work must be in (0, 1]'),
    ('--straggler_fraction=0.5 --straggler_min_work=nan', '--straggler_min_work must be a finite'),
    ('--straggler_min_work=0.3', '--straggler_min_work is used only with --straggler_fraction'),
    # given explicitly, at its default value: absl knows it was given
    ('--straggler_min_work=0.5', '--straggler_min_work is used only with --straggler_fraction'),
    ('--straggler_fraction=0 --straggler_min_work=0.5',
     '--straggler_min_work is used only with --straggler_fraction'),
    ('--dataset=mnist --data_dir=/nonexistent', 'tfds build'),
    ('--target_accuracy=1.5', '--target_accuracy: 1.5 is outside (0, 1]'),
    ('--target_accuracy=0', '--target_accuracy: 0 is outside (0, 1]'),
    ('--target_accuracy=0.6,seventy', "--target_accuracy: 'seventy' is not a number"),
    ('--target_accuracy=nan', '--target_accuracy: nan is outside (0, 1]'),
    ('--target_accuracy=', '--target_accuracy is empty'),
    ('--partition=classes --classes_per_client=11', 'impossible partition'),
    ('--num_clients=200', 'use fewer clients'),  # names no min_size: that is not a flag
    ('--algorithm=fedcda --fedcda_selection=best', '--fedcda_selection'),
    ('--algorithm=fedcda --fedcda_warmup_weighting=loss', '--fedcda_warmup_weighting'),
    ('--algorithm=cadis --cadis_threshold=0.99 --cadis_threshold_max=0.9', '--cadis_threshold'),
    ('--algorithm=cadis --cadis_closure=three_hop', '--cadis_closure'),
    # found only once the model is built: still one line, naming the flags to change
    ('--algorithm=fedcda --fedcda_max_cache_gib=0.0001', '--fedcda_max_cache_gib'),
    # a state above the largest value TFF's runtime moves (one gRPC message): refused
    # before anything runs, naming how to shrink it (with --resident_state, the default, it
    # crosses as a file: no limit)
    ('--algorithm=fedcda --model=fedavg_cnn --fedcda_cache_size=400 --noresident_state',
     'crosses to and from the worker as one gRPC message); hold the cache in bfloat16'),
    ('--algorithm=scaffold --client_momentum=0 --scaffold_max_control_gib=0.000001',
     '--scaffold_max_control_gib'),
    # SCAFFOLD's option II needs plain client SGD; the program's default momentum is 0.5
    ('--algorithm=scaffold', 'add --client_momentum=0'),
    # flags a method would ignore
    ('--algorithm=fedcross --server_optimizer=adam --server_lr=0.5', '--server_optimizer is not used'),
    ('--algorithm=fedavgm --server_optimizer=adam', '--server_optimizer is not used'),
    ('--algorithm=fedavg --server_momentum=0.5', 'only with --server_optimizer=sgdm'),
    ('--algorithm=fedavg --fedcda_cache_size=5', '--fedcda_cache_size is not used'),
    # learning-rate schedules: unknown, or of a rate the method does not have
    ('--client_lr_schedule=linear', "--client_lr_schedule='linear' is unknown"),
    ('--algorithm=fedcross --server_lr_schedule=cosine', 'fedcross takes no server optimizer'),
    # models that cannot take the data
    ('--model=char_lstm', 'does not take digits'),
    ('--model=vgg16', 'vgg16 needs height and width >= 32'),
    ('--data_dir=/tmp', 'drop --data_dir'),
    # unreadable data
    ('--dataset=femnist_leaf --data_dir={bad}/corrupt', 'not valid JSON'),
    ('--dataset=femnist_leaf --data_dir={bad}/no_user_data', 'no "user_data"'),
    ('--dataset=femnist_leaf --data_dir={bad}/pixels700', '784 pixels'),
    ('--dataset=femnist_leaf --data_dir={bad}/no_test', 'no central test examples'),
    ('--dataset=femnist_leaf --data_dir={bad}/test_users_only --num_clients=1 '
     '--clients_per_round=1 --client_test_fraction=0.5', 'has test data of its own'),
    ('--dataset=fashion_mnist --data_dir={bad}/fmnist', 'truncated or corrupt gzip'),
    # output directories
    ('--experiment_name=../escaped_by_name', "--experiment_name='../escaped_by_name' would "
     'leave --root_output_dir'),
    ('--experiment_name=a/b', 'would leave --root_output_dir'),
    ('--experiment_name=..', 'would leave --root_output_dir'),
    ('--root_output_dir={bad}/a_file', 'cannot create the experiment directory'),
    ('--root_output_dir=/proc/no_such_dir', 'cannot create the experiment directory'),
    # --resume of a different run
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=2 --seed=1',
     'run with --seed=0 (now --seed=1)'),
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=2 --algorithm=fedcross',
     '--algorithm=fedavg (now --algorithm=fedcross)'),
    # per-client evaluation changes what the clients train on: a build input
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=2 --client_test_fraction=0.2',
     'run with --client_test_fraction=0.0 (now --client_test_fraction=0.2)'),
    # faults change what the clients run: another run (but the same computations)
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=2 --client_dropout=0.2',
     'run with --client_dropout=0.0 (now --client_dropout=0.2)'),
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=3 --server_lr_warmup_rounds=1',
     'run with --server_lr_warmup_rounds=0 (now --server_lr_warmup_rounds=1)'),
    ('--root_output_dir={run} --experiment_name=p --resume --rounds=1',
     'already finished round 2; pass --rounds=2 or more'),
    ('--root_output_dir={run} --experiment_name=p --rounds=2', 'pass --resume to continue'),
]


@pytest.mark.parametrize('flags, fragment', BAD_INPUTS, ids=[f for f, _ in BAD_INPUTS])
def test_bad_input_gives_one_line_and_changes_no_run_file(piped_run, bad_inputs, tmp_path,
                                                          flags, fragment):
  run_root = piped_run[1].parent
  flags = flags.format(bad=bad_inputs, run=run_root)
  # An earlier run's record in the default output place: nothing of it may change.
  record = tmp_path / 'runs' / 'r'
  os.makedirs(record)
  for name in ('config.json', 'metrics.csv', 'partition.npz'):
    (record / name).write_text(name)
  before = _snapshot(tmp_path), _snapshot(run_root)
  args = BASE + [f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=r'] + flags.split()
  result = _run(args)
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('error: ') and fragment in lines[0], lines[0]
  assert 'min_size' not in lines[0]
  assert (_snapshot(tmp_path), _snapshot(run_root)) == before


@pytest.mark.parametrize('flags', ['--partition=classes --classes_per_client=11',
                                   '--dataset=femnist_leaf --data_dir={bad}/corrupt'])
def test_a_data_stage_error_leaves_no_experiment_directory(bad_inputs, tmp_path, flags):
  """The data are checked after the directory is made and held: a run stopped there removes
  what it made (here the directory and the two missing parents above it)."""
  root = tmp_path / 'new' / 'runs'
  result = _run(BASE + [f'--root_output_dir={root}', '--experiment_name=r'] +
                flags.format(bad=bad_inputs).split())
  assert result.returncode == 2 and result.stderr.startswith('error: '), result.stderr
  assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def _assert_refused_in_one_line(args, fragment, unchanged):
  """The program exits 2 with one `error:` line holding `fragment`, and nothing under the
  directory `unchanged` changes."""
  before = _snapshot(unchanged)
  result = _run(args)
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: ') and fragment in lines[0], lines
  assert _snapshot(unchanged) == before


def test_a_run_another_process_is_running_is_refused_in_one_line(piped_run):
  """Two processes on one run directory would interleave its checkpoints and metrics.csv:
  while one holds it, a second is refused in one line and nothing of the run changes."""
  run_dir = piped_run[1]
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; from programs import run_directory\n'
       f'with run_directory.exclusive_run_directory({str(run_dir)!r}):\n'
       '  print("held", flush=True); time.sleep(120)'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, text=True)
  try:
    assert select.select([holder.stdout], [], [], 120)[0], 'the holder did not start'
    assert holder.stdout.readline().strip() == 'held'
    _assert_refused_in_one_line(
        BASE + ['--rounds=3', '--resume', f'--root_output_dir={run_dir.parent}',
                '--experiment_name=p'], 'is being run by another process', run_dir)
  finally:
    holder.kill()
    holder.wait()
  # The holder's death releases the directory.
  with run_directory.exclusive_run_directory(str(run_dir)):
    pass


def test_resume_refuses_a_record_older_than_its_checkpoint(piped_run, tmp_path):
  """metrics.csv replaced by an older copy (here: round 1 only) under a round-2 checkpoint:
  resuming would drop round 2 from every page, so the program refuses in one line."""
  import shutil  # pylint: disable=g-import-not-at-top
  run = tmp_path / 'p'
  shutil.copytree(piped_run[1], run)
  lines = (run / 'metrics.csv').read_text().splitlines(keepends=True)
  (run / 'metrics.csv').write_text(''.join(lines[:2]))
  _assert_refused_in_one_line(
      BASE + ['--rounds=3', '--resume', f'--root_output_dir={tmp_path}', '--experiment_name=p'],
      'lacks 1 of those rounds (from round 2)', tmp_path)


def test_flag_errors_come_before_tensorflow_starts():
  code = ('import atexit, runpy, sys; '
          'atexit.register(lambda: print("TF" if "tensorflow" in sys.modules else "no TF")); '
          'sys.argv = ["train", "--dataset=digits", "--algorithm=fedcross", '
          '"--server_optimizer=adam"]; runpy.run_module("programs.train", run_name="__main__")')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2 and result.stderr.startswith('error: --server_optimizer')
  assert result.stdout.strip() == 'no TF'


def test_server_lr_alone_sets_the_server_sgd_rate():
  """--server_lr without --server_optimizer is used (plain server SGD), not ignored."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  from programs import computations  # pylint: disable=g-import-not-at-top
  model_fn = models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
  config = experiment_config.ExperimentConfig(dataset='digits', server_lr=0.25)
  process = computations.build_process(config, model_fn, num_clients=4)
  state = process.initialize()
  assert float(state.finalizer['learning_rate']) == 0.25


def test_dropped_clients_are_counted_and_announced(tmp_path):
  """With this seed and --client_lr=1e6, one of round 1's 4 clients goes non-finite: the run
  goes on without it, says so on stderr and counts it in metrics.csv and summary.json."""
  result = _run(BASE + ['--client_lr=1e6', '--rounds=1', f'--root_output_dir={tmp_path}',
                        '--experiment_name=d'])
  assert result.returncode == 0, result.stderr
  assert ('warning: round 1: 1 of 4 clients had non-finite updates and were left out'
          in result.stderr), result.stderr
  import csv  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  with open(tmp_path / 'd' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r['dropped_clients'] for r in rows] == ['1']
  assert json.loads((tmp_path / 'd' / 'summary.json').read_text())['dropped_clients'] == 1


def test_blown_up_rounds_are_announced_and_stop_the_run_checkpointed(tmp_path):
  """--client_lr=1e6 blows local training up without overflowing (losses ~1e25 then ~1e5,
  finite): each such round is announced, --blown_up_rounds=2 of them in a row stop the run in
  one error line naming the rate, checkpointed, and --resume --blown_up_rounds=0 goes on."""
  import csv  # pylint: disable=g-import-not-at-top
  args = BASE + ['--client_lr=1e6', '--rounds=3', f'--root_output_dir={tmp_path}',
                 '--experiment_name=b']
  result = _run(args + ['--blown_up_rounds=2'])
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  # (round 1 may also drop a client whose update overflowed: another warning line)
  assert all(l.startswith('warning: ') for l in lines[:-1]) and lines[-1].startswith('error: ')
  blown = [l for l in lines[:-1] if "the clients' training loss is" in l]
  assert len(blown) == 2 and blown[0].startswith('warning: round 1: '), lines
  assert '(2 rounds in a row)' in blown[1] and 'stops after 2 such rounds' in blown[1], lines
  assert ('for 2 rounds in a row (rounds 1-2)' in lines[-1] and '--client_lr (now 1e+06)' in
          lines[-1] and 'rounds up to 2 are checkpointed' in lines[-1]), lines
  with open(tmp_path / 'b' / 'metrics.csv') as f:
    losses = [float(r['client_work/train/loss']) for r in csv.DictReader(f)]
  assert len(losses) == 2 and min(losses) > 1e4, losses
  assert not (tmp_path / 'b' / 'summary.json').exists()
  result = _run(args + ['--resume', '--blown_up_rounds=0'])
  assert result.returncode == 0, result.stderr
  assert "warning: round 3: the clients' training loss is" in result.stderr, result.stderr
  assert '(3 rounds in a row)' in result.stderr and 'stops after' not in result.stderr
  with open(tmp_path / 'b' / 'metrics.csv') as f:
    assert [r['round'] for r in csv.DictReader(f)] == ['1', '2', '3']


@pytest.mark.parametrize('loss, warned', [(2.3, False), (1e4, False), (float('nan'), False),
                                          (float('inf'), False), (1.5e4, True)])
def test_blown_up_warning_takes_finite_losses_above_the_threshold(loss, warned):
  from programs import stopping  # pylint: disable=g-import-not-at-top
  message = stopping.blown_up_warning(3, loss, 0.5)
  assert (message is not None) == warned
  if warned:
    assert message.startswith("warning: round 3: the clients' training loss is 1.5e+04: ")


def test_blown_up_rounds_in_a_row_counts_the_last_rows_only():
  """What a resumed run counts from metrics.csv: the trailing blown-up rounds, not all."""
  from programs import stopping  # pylint: disable=g-import-not-at-top
  rows = [{'client_work/train/loss': v} for v in ('2e5', '1.2', '3e4', '7e8', '')]
  assert stopping.blown_up_rounds_in_a_row(rows[:4]) == 2
  assert stopping.blown_up_rounds_in_a_row(rows[:2]) == 0
  assert stopping.blown_up_rounds_in_a_row(rows[:1]) == 1
  assert stopping.blown_up_rounds_in_a_row(rows) == 0   # no loss recorded: not blown up


def test_a_round_nobody_reported_in_is_neither_divergence_nor_a_blow_up():
  """Nobody reporting (loss 0 by divide_no_nan) is a round that trained nothing: not
  diverged; all reporting clients non-finite is; a blown-up streak passes over the round."""
  from programs import stopping  # pylint: disable=g-import-not-at-top
  assert stopping.divergence(4, 0.0, 0, 0) == ''
  assert stopping.divergence(4, 2.0, 2, 3) == ''
  assert 'all 2 reporting clients' in stopping.divergence(4, 2.0, 2, 2)
  assert 'train loss nan' in stopping.divergence(4, float('nan'), 0, 3)
  rows = [{'client_work/train/loss': '2e5', 'reported_clients': '3'},
          {'client_work/train/loss': '0.0', 'reported_clients': '0'},
          {'client_work/train/loss': '3e4', 'reported_clients': '2'}]
  assert stopping.blown_up_rounds_in_a_row(rows) == 2
  assert run_results.reported_clients({'client_work/train/reported_clients': 2.0,
                                       'client_work/train/unreported_clients': 1.0}, 3) == 2
  assert run_results.reported_clients({'client_work/train/loss': 1.0}, 3) == 3


@pytest.mark.parametrize('rounds,every,last', [(30, 1, 10), (30, 5, 10), (23, 7, 0),
                                               (23, 7, 3), (5, 4, 10), (600, 5, 10)])
def test_evaluated_rounds_are_every_eval_every_and_the_last_eval_last(rounds, every, last):
  config = experiment_config.ExperimentConfig(rounds=rounds, eval_every=every, eval_last=last)
  got = [r for r in range(1, rounds + 1) if experiment.evaluated_round(r, config)]
  expected = sorted({r for r in range(every, rounds + 1, every)} |
                    set(range(max(1, rounds - last + 1), rounds + 1)) | {rounds})
  assert got == expected


def test_diverging_training_stops_with_message(tmp_path):
  result = _run(BASE + ['--client_lr=1e9', '--rounds=3', f'--root_output_dir={tmp_path}'])
  assert result.returncode == 2
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: training diverged at round 1 ('), lines
  assert 'non-finite' in lines[0] and '--client_lr (now 1000000000.0)' in lines[0]
  assert 'train loss 0.0' not in lines[0] and 'checkpoint' not in lines[0]
  assert 'Traceback' not in result.stderr
  # The run's directory says so (written while the run was still held: a process waiting
  # for it, e.g. a second benchmarks.compare, reads it instead of running it again).
  run = next(p for p in tmp_path.iterdir() if p.is_dir())
  assert (run / 'diverged.txt').read_text() == lines[0][len('error: '):].split(';')[0] + '\n'


def test_a_diverged_run_is_not_resumed_and_a_fresh_start_clears_its_mark(tmp_path):
  """Divergence after a checkpoint: --resume is refused in one line (it would diverge
  again); a run that diverged in round 1 (nothing checkpointed) starts afresh and loses the
  mark."""
  args = BASE + [f'--root_output_dir={tmp_path}', '--experiment_name=d']
  assert _run(args + ['--rounds=2']).returncode == 0
  (tmp_path / 'd' / 'diverged.txt').write_text('training diverged at round 3 (train loss nan)\n')
  _assert_refused_in_one_line(args + ['--rounds=4', '--resume'],
                              'its training diverged at round 3 (train loss nan) and would '
                              'again', tmp_path)
  (tmp_path / 'e').mkdir()
  (tmp_path / 'e' / 'diverged.txt').write_text('training diverged at round 1 (x)\n')
  done = _run(BASE + [f'--root_output_dir={tmp_path}', '--experiment_name=e', '--rounds=1'])
  assert done.returncode == 0, done.stderr
  assert not (tmp_path / 'e' / 'diverged.txt').exists()


def test_every_flag_has_a_role_and_a_flag_defining_the_run_rebuilds():
  """experiment_config.FLAG_ROLES says of every ExperimentConfig field whether --resume may
  change it and whether it rebuilds the computations; both old lists derive from it."""
  fields = list(experiment_config.ExperimentConfig.__dataclass_fields__)
  roles = experiment_config.FLAG_ROLES
  assert [f for f in fields if f not in roles] == [] and set(roles) == set(fields)
  # A flag that changes what the run computes must not reuse another run's computations,
  # unless it changes only the clients' inputs (the faults: the same computations run them).
  inputs_only = {'client_dropout', 'straggler_fraction', 'straggler_min_work'}
  assert {n for n, role in roles.items() if not role.resumable and not role.rebuilds} == \
      inputs_only
  assert set(experiment_config.RESUMABLE_CHANGES) == {n for n in fields if roles[n].resumable}
  assert set(experiment_config.NOT_BUILD_INPUTS) == {n for n in fields if not roles[n].rebuilds}
  assert set(experiment_config.NOT_BUILD_INPUTS) - inputs_only <= set(
      experiment_config.RESUMABLE_CHANGES)


def test_resume_after_kill_is_identical_to_unbroken_run(tmp_path):
  straight = _run(BASE + ['--rounds=4', f'--root_output_dir={tmp_path}', '--experiment_name=a'])
  assert straight.returncode == 0, straight.stderr
  # Kill a run once it has checkpointed round 2 (SIGKILL: no cleanup at all). A digits round
  # takes tens of milliseconds and older checkpoints are pruned, so poll often and accept
  # the kill landing after round 2, 3 or 4 (any of them resumes into the 4-round run).
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  proc = subprocess.Popen([sys.executable, '-m', 'programs.train', *BASE, '--rounds=40',
                           f'--root_output_dir={tmp_path}', '--experiment_name=b'],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoints = tmp_path / 'b' / 'checkpoints'

  def last_checkpoint():
    rounds = [int(p.name.rsplit('_', 1)[-1]) for p in checkpoints.glob('program_state_*')
              if p.name.rsplit('_', 1)[-1].isdigit()]
    return max(rounds, default=0)

  deadline = time.time() + 180
  while last_checkpoint() < 2 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.005)
  killed_running = proc.poll() is None
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert killed_running, 'the run ended before it was killed'
  assert 2 <= last_checkpoint() <= 4, last_checkpoint()
  resumed = _run(BASE + ['--rounds=4', '--resume', f'--root_output_dir={tmp_path}',
                         '--experiment_name=b'])
  assert resumed.returncode == 0, resumed.stderr
  for w_a, w_b in zip(_weights(tmp_path / 'a'), _weights(tmp_path / 'b')):
    np.testing.assert_array_equal(w_a, w_b)
  rows_a = (tmp_path / 'a' / 'metrics.csv').read_text().splitlines()
  rows_b = (tmp_path / 'b' / 'metrics.csv').read_text().splitlines()
  assert len(rows_b) == 5
  # Same losses and accuracies round by round (the timings, seconds and round_seconds, differ).
  import csv  # pylint: disable=g-import-not-at-top
  strip = lambda rows: [  # noqa: E731
      {k: v for k, v in r.items() if k not in run_directory.TIMING_COLUMNS}
      for r in csv.DictReader(rows)]
  assert strip(rows_a) == strip(rows_b)


def test_outputs_and_pipe_termination(piped_run):
  """Through a pipe the program returns (TFF's worker would otherwise hold it open); --resume
  with nothing to resume says so and trains from scratch."""
  result, out = piped_run
  assert 'final accuracy' in result.stdout, result.stdout
  assert 'Traceback' not in result.stdout and 'Exception ignored' not in result.stdout
  assert 'note: nothing to resume in' in result.stdout
  for name in ('summary.json', 'metrics.csv', 'accuracy.png', 'final_weights.npz',
               'partition.npz', 'config.json'):
    assert (out / name).stat().st_size > 0, name
  assert list((out / 'tensorboard').iterdir())
  import json  # pylint: disable=g-import-not-at-top
  summary = json.loads((out / 'summary.json').read_text())
  for key in ('final_accuracy', 'best_accuracy', 'rounds', 'seconds_per_round'):
    assert summary[key] is not None
  assert summary['rounds'] == 2 and summary['dropped_clients'] == 0
  assert summary['host'] == run_results.host_description(), summary['host']
  assert summary['host']['cores'] == len(os.sched_getaffinity(0)), summary['host']
  assert summary['host']['cpu'], summary['host']   # a name, whatever the machine
  # The whole round (training, then the evaluation) is timed beside its training alone.
  import csv  # pylint: disable=g-import-not-at-top
  with open(out / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0])[:3] == ['round', 'seconds', 'round_seconds']
  assert all(float(r['round_seconds']) > float(r['seconds']) > 0 for r in rows), rows
  # Without --client_test_fraction there is no per-client evaluation.
  assert not set(constants.CLIENT_ACCURACY_FIGURES) & (set(rows[0]) | set(summary))
  # time_to_accuracy at digits' default targets, read again from metrics.csv by hand.
  evaluated = [(int(r['round']), float(r['test_accuracy'])) for r in rows if r['test_accuracy']]
  expected = []
  for target in experiment_config.DEFAULT_TARGET_ACCURACIES['digits']:
    reached = [n for n, a in evaluated if a >= target][:1]
    seconds = [sum(float(r['seconds']) for r in rows[:reached[0]])] if reached else [None]
    expected.append((target, (reached or [None])[0], seconds[0]))
  got = [(t['target'], t['round'], t['seconds']) for t in summary['time_to_accuracy']]
  assert [(t, n) for t, n, _ in got] == [(t, n) for t, n, _ in expected], got
  assert all(a is None and b is None or abs(a - b) < 1e-3
             for (_, _, a), (_, _, b) in zip(got, expected)), got


def test_final_weights_load_by_name_and_score_the_final_accuracy(piped_run):
  """final_weights.npz is keyed by variable name; loaded into a fresh model of the run's
  architecture with docs/training_program.md's line, it scores summary.json's final accuracy
  on the central test set."""
  import json  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos.models import zoo  # pylint: disable=g-import-not-at-top
  _, out = piped_run
  summary = json.loads((out / 'summary.json').read_text())
  model = zoo.build_keras_model(summary['model'], (8, 8, 1), 10, seed=1)
  w = np.load(out / 'final_weights.npz')
  assert w.files == [v.name.split(':')[0] for v in
                     model.trainable_weights + model.non_trainable_weights]
  [v.assign(w[v.name.split(':')[0]]) for v in model.weights]  # the documented line
  test = data.load_digits()
  predicted = np.argmax(model.predict(test.x_test, verbose=0), axis=1)
  accuracy = float(np.mean(predicted == test.y_test))
  assert abs(accuracy - summary['final_accuracy']) < 1e-6, (accuracy, summary)


def test_weight_names_strip_the_index_and_number_repeats():
  import types  # pylint: disable=g-import-not-at-top
  var = lambda name: types.SimpleNamespace(name=name)
  model = types.SimpleNamespace(
      trainable_variables=[var('fc/kernel:0'), var('Variable:0'), var('Variable:0')],
      non_trainable_variables=[var('Variable:0'), var('bn/moving_mean:0')])
  assert run_results.weight_names(model) == [
      'fc/kernel', 'Variable', 'Variable_1', 'Variable_2', 'bn/moving_mean']


def _client_figures_are_consistent(record):
  mean, std, p10, lowest = (float(record[k]) for k in constants.CLIENT_ACCURACY_FIGURES)
  assert 0 <= lowest <= p10 <= mean <= 1 and 0 <= std <= 0.5, record


def test_client_test_fraction_holds_out_examples_and_evaluates_every_client(tmp_path):
  """--client_test_fraction=0.2: the clients train on what is not held out (the round's
  num_examples, from the partition and the rule written out here), the four figures are
  written whenever the test set is evaluated, and a resume with the flag unchanged goes on."""
  import csv  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  args = [*BASE, '--client_test_fraction=0.2', '--eval_every=2', '--eval_last=0',
          f'--root_output_dir={tmp_path}', '--experiment_name=c']
  first = _run([*args, '--rounds=2'], timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  resumed = _run([*args, '--rounds=3', '--resume'], timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  with open(tmp_path / 'c' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  summary = json.loads((tmp_path / 'c' / 'summary.json').read_text())
  # Evaluated after rounds 2 and 3 (the last), not after round 1: the figures with the test set.
  for row in rows:
    evaluated = row['test_accuracy'] != ''
    assert evaluated == (row['round'] != '1')
    assert all((row[k] != '') == evaluated for k in constants.CLIENT_ACCURACY_FIGURES), row
  for row in rows[1:]:
    _client_figures_are_consistent(row)
  for k in constants.CLIENT_ACCURACY_FIGURES:
    assert summary[k] == float(rows[-1][k]), k
  assert summary['clients_evaluated'] == 10

  fed = experiment.load_federated_data(experiment_config.ExperimentConfig(
      dataset='digits', num_clients=10, clients_per_round=4))
  sizes = fed.client_sizes()
  held_out = [0 if n < 2 else min(n - 1, max(1, int(np.floor(0.2 * n + 0.5)))) for n in sizes]
  for row in rows:
    sampled = data.sample_clients(10, 4, int(row['round']), 0)
    trained = float(row['client_work/train/num_examples'])
    assert trained == sum(sizes[i] - held_out[i] for i in sampled), row['round']
    assert trained < sum(sizes[i] for i in sampled)


def test_leaf_client_test_fraction_uses_the_users_own_test_data(tmp_path):
  """On LEAF data any --client_test_fraction > 0 evaluates each client on its user's own test
  split: nothing is held out of training, and a user without test data is not counted."""
  import json  # pylint: disable=g-import-not-at-top
  from tests.helpers import leaf_femnist_users, write_leaf_json  # pylint: disable=g-import-not-at-top
  write_leaf_json(str(tmp_path / 'leaf' / 'train' / 'a.json'),
                  leaf_femnist_users(['a', 'b', 'c'], 8))
  test = {**leaf_femnist_users(['a'], 3, seed=1), **leaf_femnist_users(['c'], 2, seed=2)}
  write_leaf_json(str(tmp_path / 'leaf' / 'test' / 'a.json'), test)
  result = _run(['--dataset=femnist_leaf', f'--data_dir={tmp_path / "leaf"}', '--num_clients=3',
                 '--clients_per_round=3', '--rounds=1', '--batch_size=8', '--progress=false',
                 '--client_test_fraction=0.5', f'--root_output_dir={tmp_path}',
                 '--experiment_name=l'], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  import csv  # pylint: disable=g-import-not-at-top
  with open(tmp_path / 'l' / 'metrics.csv') as f:
    (row,) = list(csv.DictReader(f))
  assert float(row['client_work/train/num_examples']) == 24.0   # all 3 x 8 trained on
  _client_figures_are_consistent(row)
  summary = json.loads((tmp_path / 'l' / 'summary.json').read_text())
  assert summary['clients_evaluated'] == 2
  # Two clients, of 3 and 2 test examples (accuracies k/3 and j/2): mean - population std is
  # the lower one, p10 a tenth of the way up to the higher, and 6 x min is a whole number.
  mean, std, p10, lowest = (float(row[k]) for k in constants.CLIENT_ACCURACY_FIGURES)
  assert mean - std == pytest.approx(lowest, abs=1e-6)
  assert p10 == pytest.approx(lowest + 0.2 * std, abs=1e-6)
  assert lowest * 6 == pytest.approx(round(lowest * 6), abs=1e-5)


def test_host_description_names_the_microarchitecture_from_cpuinfo(tmp_path):
  # Two processors' blocks in /proc/cpuinfo's format: the first describes the machine.
  block = ('processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n'
           'model name\t: AMD EPYC\nstepping\t: 1\n'
           'flags\t\t: fpu sse2 fma avx512f avx2 amx_tile avx sha_ni{extra}\n\n')
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text(block.format(n=0, extra='') + block.format(n=1, extra=' avx_vnni'))
  host = run_results.host_description(str(cpuinfo))
  assert host == {'cpu': 'AMD EPYC', 'cores': len(os.sched_getaffinity(0)),
                  'cpu_id': 'family 26 model 2 stepping 1',
                  'vector_extensions': 'amx_tile avx avx2 avx512f fma'}, host
  # Without the numbers (e.g. an ARM cpuinfo), the record says only what it knows.
  (tmp_path / 'arm').write_text('processor\t: 0\nmodel name\t: Neoverse\n')
  assert run_results.host_description(str(tmp_path / 'arm')) == {
      'cpu': 'Neoverse', 'cores': len(os.sched_getaffinity(0))}


def test_a_run_directory_replaced_while_waiting_is_locked_anew(tmp_path):
  """A process waiting for a run directory that is removed and made again meanwhile ends up
  holding the new directory, not the removed one (which would leave the new one free for a
  third process)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  run = tmp_path / 'run'
  run.mkdir()
  holding, waiter_has_it, done = threading.Event(), threading.Event(), threading.Event()

  def waiter():
    with run_directory.exclusive_run_directory(str(run), wait=True):
      waiter_has_it.set()
      done.wait(30)

  with run_directory.exclusive_run_directory(str(run)):
    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)   # the waiter is blocked on the old directory's lock
    run.rename(tmp_path / 'removed')
    run.mkdir()
  assert waiter_has_it.wait(30)
  fd = os.open(run, os.O_RDONLY)
  try:
    with pytest.raises(BlockingIOError):   # the new directory is the one held
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  finally:
    os.close(fd)
    done.set()
    thread.join()


def test_a_refused_run_leaves_the_other_process_its_directory(tmp_path, monkeypatch):
  """Two processes starting one run: both find no directory, both make it (makedirs with
  exist_ok), one takes the lock. The refused one must not remove the directory as one it
  made and left empty (the holder writes nothing while it checks its data): the holder
  would then write into a path a third process makes anew, two runs in one directory."""
  config = experiment_config.ExperimentConfig(dataset='digits', root_output_dir=str(tmp_path),
                                       experiment_name='shared')
  run_dir = config.experiment_dir
  os.makedirs(run_dir)
  # As the refused process sees it: the directory did not exist when it looked.
  monkeypatch.setattr(run_directory, 'make_output_dir', lambda path: [os.path.abspath(path)])
  with run_directory.exclusive_run_directory(run_dir):   # the other process's lock
    with pytest.raises(run_directory.RunDirectoryBusy):
      experiment.run_experiment(config)
    assert os.path.isdir(run_dir)


def _random_rows(rng, rounds, with_bytes):
  """metrics.csv rows as csv.DictReader gives them: strings, blank where not evaluated."""
  rows = []
  down = np.cumsum(rng.integers(1, 10**6, rounds))
  up = np.cumsum(rng.integers(1, 10**6, rounds))
  for n in range(1, rounds + 1):
    evaluated = rng.random() < 0.4 or n == rounds
    row = dict(round=str(n), seconds=f'{rng.uniform(0.1, 3):.4f}',
               test_accuracy=f'{rng.uniform(0, 1):.6f}' if evaluated else '')
    if with_bytes:
      row.update(cumulative_bytes_down=str(down[n - 1]), cumulative_bytes_up=str(up[n - 1]))
    rows.append(row)
  return rows


@pytest.mark.parametrize('with_bytes', [True, False])
def test_time_to_accuracy_against_numpy(with_bytes):
  """Per target: the first evaluated round at or above it, the bytes to its end (+ the
  exploration's) and the training seconds to it, against arrays; None where never reached
  or (bytes) where metrics.csv does not count them."""
  rng = np.random.default_rng(3)
  for _ in range(20):
    rows = _random_rows(rng, int(rng.integers(1, 40)), with_bytes)
    targets = list(rng.uniform(0.05, 1.0, 4)) + [1.0]
    explored = float(rng.integers(0, 10**5))
    acc = np.array([float(r['test_accuracy']) if r['test_accuracy'] else np.nan for r in rows])
    seconds = np.cumsum([float(r['seconds']) for r in rows])
    got = run_results.time_to_accuracy(rows, targets, explored)
    for target, entry in zip(targets, got):
      hits = np.flatnonzero(acc >= target)   # NaN (not evaluated) compares False
      assert entry['target'] == target
      if not hits.size:
        assert entry == dict(target=target, round=None, bytes=None, seconds=None)
        continue
      i = hits[0]
      assert entry['round'] == i + 1
      assert entry['seconds'] == pytest.approx(seconds[i], abs=1e-3)
      if with_bytes:
        total = float(rows[i]['cumulative_bytes_down']) + float(rows[i]['cumulative_bytes_up'])
        assert entry['bytes'] == total + explored
      else:
        assert entry['bytes'] is None


def test_every_dataset_has_a_default_target_pair_and_the_flag_overrides_it():
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  defaults = experiment_config.DEFAULT_TARGET_ACCURACIES
  assert set(defaults) == set(data.DATASETS)
  assert all(len(p) == 2 and 0 < p[0] < p[1] <= 1 for p in defaults.values()), defaults
  for dataset in data.DATASETS:
    c = experiment_config.ExperimentConfig(dataset=dataset)
    assert experiment_config.target_accuracies(c) == defaults[dataset]
  c = experiment_config.ExperimentConfig(target_accuracy=' 0.5, 1,0.25')
  assert experiment_config.target_accuracies(c) == (0.5, 1.0, 0.25)
  # What is reported, not what is computed: a resumed run may change it, and reuses the
  # computations built for the old value.
  saved = dict(experiment_config.ExperimentConfig(target_accuracy='0.6').__dict__)
  assert experiment_config.settings_changed(saved, c) == ''
  assert 'target_accuracy' in experiment_config.NOT_BUILD_INPUTS


def test_accuracy_plot_gains_a_bytes_panel_where_bytes_are_counted(tmp_path):
  """accuracy.png is one panel without the bytes columns, two side by side with them."""
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  widths = {}
  for with_bytes in (False, True):
    path = str(tmp_path / f'{with_bytes}.png')
    run_results.plot_accuracy(_random_rows(rng, 10, with_bytes), path, 't', 1e6)
    widths[with_bytes] = matplotlib.image.imread(path).shape[1]
  assert widths == {False: 600, True: 1100}, widths


# programs.train, printing after the run how many TFF worker processes it started.
_COUNTING_WORKERS = '''
from absl import app
from programs import experiment, train
from tff_algos.runtime import workers
run = experiment.run_experiment
def counting(*args, **kwargs):
  try:
    return run(*args, **kwargs)
  finally:
    print('workers', len(workers.worker_pids()), flush=True)
experiment.run_experiment = counting
app.run(train.main)
'''


@pytest.mark.parametrize('flag', ['--worker_timeout=30', '--require_isolated_worker'])
def test_one_worker_per_run_whatever_the_worker_flags(flag, tmp_path):
  """The resident state's process reuses the run's TFF context: flags that set the runtime
  apart from its defaults start no second local worker."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  if flag == '--require_isolated_worker' and execution.isolation_unavailable():
    pytest.skip(execution.isolation_unavailable())
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, '-c', _COUNTING_WORKERS, *BASE, '--rounds=1', flag,
       f'--root_output_dir={tmp_path}', '--experiment_name=w'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert result.returncode == 0, result.stderr
  assert 'workers 1' in result.stdout.splitlines(), result.stdout
