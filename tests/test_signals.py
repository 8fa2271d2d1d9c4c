"""SIGTERM / SIGINT stop a run at the next round boundary, whenever they land.

The handler (programs.stopping.StopRequests) only records the signal; the training loop
checks it between rounds, after the checkpoint. The loop test signals one Python process at
24 timings around round boundaries (and during set-up), resuming in between; the computations
are built once and reused by the resumes, so each timing costs about one round. The CLI test
checks the exit codes, the message and that no TFF worker outlives the program.
"""

import csv
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from programs import experiment
from programs import experiment_config
from programs import run_directory
from programs import stopping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (signal, when): a float = seconds after the first new round's checkpoint appears (0 lands
# in the CSV/TensorBoard/garbage-collector work after it, larger ones inside the next round's
# training, evaluation or checkpoint write); ('setup', s) = s seconds after the run starts,
# while data, state and checkpoints are being loaded.
_DELAYS = (0.0, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06,
           0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4)
TIMINGS = ([(signal.SIGTERM if i % 2 else signal.SIGINT, d) for i, d in enumerate(_DELAYS)]
           + [(signal.SIGTERM, ('setup', 0.0)), (signal.SIGINT, ('setup', 0.05)),
              (signal.SIGTERM, ('setup', 0.3)), (signal.SIGINT, ('setup', 0.6))])


def _fire(sig, when, ckpt_dir, first_new_round, started, run_ended):
  if isinstance(when, tuple):
    time.sleep(max(0.0, started + when[1] - time.time()))
  else:
    while (max(run_directory.checkpointed_rounds(ckpt_dir), default=0) < first_new_round
           and not run_ended.is_set()):
      time.sleep(0.0005)
    time.sleep(when)
  if not run_ended.is_set():
    os.kill(os.getpid(), sig)


def _interrupted(config, fire, *args):
  """Runs `config` while `fire(*args, run_ended)` signals this process from a thread;
  returns the Interrupted the run ended with."""
  run_ended = threading.Event()
  with stopping.StopRequests() as stop:
    thread = threading.Thread(target=fire, args=args + (run_ended,))
    thread.start()
    try:
      with pytest.raises(stopping.Interrupted) as info:
        experiment.run_experiment(config, log=lambda msg: None, stop=stop)
    finally:
      run_ended.set()
      thread.join()
  return info.value


def _csv_rounds(path):
  with open(path) as f:
    return [int(r['round']) for r in csv.DictReader(f)]


def test_every_signal_stops_the_run_at_a_round_boundary(tmp_path):
  assert len(TIMINGS) >= 20
  config = experiment_config.ExperimentConfig(
      dataset='digits', num_clients=6, clients_per_round=2, batch_size=64, client_lr=0.1,
      eval_every=2, progress=False, root_output_dir=str(tmp_path), experiment_name='sig')
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')
  csv_path = os.path.join(config.experiment_dir, 'metrics.csv')
  last = 0
  outcomes = []
  for i, (sig, when) in enumerate(TIMINGS):
    config.resume = last > 0
    # A lost signal would let the run finish these rounds: no Interrupted below.
    config.rounds = last + 30
    stopped = _interrupted(config, _fire, sig, when, ckpt_dir, last + 1, time.time())
    outcomes.append((signal.Signals(sig).name, when, last, stopped.last_round))
    assert stopped.signum == sig and stopped.exit_code == 128 + sig, outcomes
    # Stopped at a boundary: the checkpoint and metrics.csv both end at the last round.
    assert stopped.last_round == max(run_directory.checkpointed_rounds(ckpt_dir), default=0)
    assert last <= stopped.last_round < config.rounds, outcomes
    if not isinstance(when, tuple):
      assert stopped.last_round >= last + 1, outcomes
    if stopped.last_round:
      assert _csv_rounds(csv_path) == list(range(1, stopped.last_round + 1)), outcomes
      assert f'round {stopped.last_round} is the last finished' in str(stopped)
    else:
      assert 'before any round finished' in str(stopped)
    last = stopped.last_round

  # A kill mid-round leaves TensorBoard ahead of the checkpoint and a half-written checkpoint
  # directory; the resume drops both.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.summary.create_file_writer(os.path.join(config.experiment_dir, 'tensorboard')).as_default(
      step=last + 1):
    tf.summary.scalar('client_work/train/loss', 1.0)
  stale = os.path.join(ckpt_dir, f'program_state_{last + 1}_temp1234')
  os.makedirs(stale)
  # and the resident state's scratch directory (tff_algos.ResidentProcess), a file in it
  scratch = os.path.join(config.experiment_dir, 'tff_algos_resident_x1y2')
  os.makedirs(scratch)
  open(os.path.join(scratch, 'state_7.index'), 'w').close()
  config.resume, config.rounds = True, last + 2
  summary = experiment.run_experiment(config, log=lambda msg: None)
  assert summary['rounds'] == last + 2 and not os.path.exists(stale)
  assert not [e for e in os.listdir(config.experiment_dir) if e.startswith('tff_algos_res')]
  assert _csv_rounds(csv_path) == list(range(1, last + 3))
  steps = {}
  tb_dir = os.path.join(config.experiment_dir, 'tensorboard')
  for name in os.listdir(tb_dir):
    for record in tf.data.TFRecordDataset(os.path.join(tb_dir, name)):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        steps.setdefault(value.tag, []).append(event.step)
  assert sorted(steps['client_work/train/loss']) == list(range(1, last + 3))
  umask = os.umask(0)
  os.umask(umask)
  mode = os.stat(os.path.join(config.experiment_dir, 'partition.npz')).st_mode & 0o777
  assert mode == 0o666 & ~umask


def _workers_of(pid):
  found = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        with open(f'/proc/{entry}/cmdline', 'rb') as f:
          if ppid == pid and b'worker_binary' in f.read():
            found.append(int(entry))
      except (OSError, ValueError, IndexError):
        pass
  return found


def _alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def test_program_exit_codes_message_and_no_worker_left(tmp_path):
  """SIGTERM -> 143, SIGINT -> 130, sent once round 1 is checkpointed; both programs run
  concurrently. The message is its own line (after the progress bar), and it names the last
  checkpointed round."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  runs = {}
  for sig in (signal.SIGTERM, signal.SIGINT):
    name = signal.Signals(sig).name
    proc = subprocess.Popen(
        [sys.executable, '-m', 'programs.train', '--dataset=digits', '--num_clients=6',
         '--clients_per_round=2', '--batch_size=64', '--client_lr=0.1', '--rounds=500',
         f'--root_output_dir={tmp_path}', f'--experiment_name={name}'],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs[sig] = (proc, tmp_path / name / 'checkpoints' / 'program_state_1')
  workers = {}
  pending = set(runs)
  deadline = time.time() + 600
  while pending and time.time() < deadline:
    for sig in list(pending):
      proc, ckpt = runs[sig]
      assert proc.poll() is None, proc.stderr.read()
      if ckpt.exists():
        workers[sig] = _workers_of(proc.pid)
        proc.send_signal(sig)
        pending.discard(sig)
    time.sleep(0.01)
  assert not pending
  for sig, (proc, _) in runs.items():
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, err
    assert 'Traceback' not in err
    lines = err.splitlines()
    final = [l for l in lines if l.startswith(f'interrupted by {signal.Signals(sig).name}: round ')]
    assert len(final) == 1 and 'rerun with --resume' in final[0], err
    assert workers[sig] and not any(_alive(p) for p in workers[sig]), workers


def test_a_stop_between_checkpoints_checkpoints_the_last_finished_round(tmp_path):
  """With --checkpoint_every larger than the run, a SIGTERM still leaves the last finished
  round checkpointed (nothing to repeat on --resume)."""
  config = experiment_config.ExperimentConfig(
      dataset='digits', num_clients=6, clients_per_round=2, batch_size=64, client_lr=0.1,
      rounds=50, checkpoint_every=1000, progress=False, root_output_dir=str(tmp_path),
      experiment_name='sig')
  csv_path = os.path.join(config.experiment_dir, 'metrics.csv')
  ckpt_dir = os.path.join(config.experiment_dir, 'checkpoints')

  def fire_after_round_two(run_ended):
    while not run_ended.is_set():
      if os.path.exists(csv_path) and len(_csv_rounds(csv_path)) >= 2:
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.001)

  last = _interrupted(config, fire_after_round_two).last_round
  assert 2 <= last < config.rounds
  assert run_directory.checkpointed_rounds(ckpt_dir) == [last]
  assert _csv_rounds(csv_path) == list(range(1, last + 1))
