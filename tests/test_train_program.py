"""End-to-end checks of programs/train.py: flags, resume, divergence, pipes."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ['--dataset=digits', '--num_clients=10', '--clients_per_round=4', '--local_epochs=1',
        '--batch_size=16', '--client_lr=0.1', '--progress=false']


def _run(args, timeout=240, **kwargs):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, '-m', 'programs.train', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, **kwargs)


def _weights(directory):
  with np.load(os.path.join(directory, 'final_weights.npz')) as f:
    return [f[k] for k in sorted(f.files, key=lambda k: int(k.split('_')[1]))]


@pytest.mark.parametrize('flag, fragment', [
    ('--algorithm=nope', '--algorithm'),
    ('--clients_per_round=50', '--clients_per_round=50 exceeds'),
    ('--partition=dirichlet --dirichlet_alpha=0', '--dirichlet_alpha must be > 0'),
    ('--dataset=mnist --data_dir=/nonexistent', 'tfds build'),
    ('--partition=classes --classes_per_client=11', 'impossible partition'),
    ('--algorithm=fedcda --fedcda_selection=best', '--fedcda_selection'),
    ('--algorithm=fedcda --fedcda_warmup_weighting=loss', '--fedcda_warmup_weighting'),
    ('--algorithm=cadis --cadis_threshold=0.99 --cadis_threshold_max=0.9', '--cadis_threshold'),
    ('--algorithm=cadis --cadis_closure=three_hop', '--cadis_closure'),
    # found only once the model is built: still one line, naming the flags to change
    ('--algorithm=fedcda --fedcda_max_cache_gib=0.0001', '--fedcda_max_cache_gib'),
])
def test_bad_input_gives_one_line(tmp_path, flag, fragment):
  result = _run(BASE + flag.split() + [f'--root_output_dir={tmp_path}'])
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('error: ') and fragment in lines[0], lines[0]


def test_diverging_training_stops_with_message(tmp_path):
  result = _run(BASE + ['--client_lr=1e9', '--rounds=3', f'--root_output_dir={tmp_path}'])
  assert result.returncode == 2
  assert 'diverged' in result.stderr and '--client_lr' in result.stderr
  assert 'Traceback' not in result.stderr


def test_resume_after_kill_is_identical_to_unbroken_run(tmp_path):
  straight = _run(BASE + ['--rounds=4', f'--root_output_dir={tmp_path}', '--experiment_name=a'])
  assert straight.returncode == 0, straight.stderr
  # Kill a run once it has checkpointed round 2 (SIGKILL: no cleanup at all).
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  proc = subprocess.Popen([sys.executable, '-m', 'programs.train', *BASE, '--rounds=40',
                           f'--root_output_dir={tmp_path}', '--experiment_name=b'],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpt = tmp_path / 'b' / 'checkpoints' / 'program_state_2'
  deadline = time.time() + 180
  while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert ckpt.exists()
  resumed = _run(BASE + ['--rounds=4', '--resume', f'--root_output_dir={tmp_path}',
                         '--experiment_name=b'])
  assert resumed.returncode == 0, resumed.stderr
  for w_a, w_b in zip(_weights(tmp_path / 'a'), _weights(tmp_path / 'b')):
    np.testing.assert_array_equal(w_a, w_b)
  rows_a = (tmp_path / 'a' / 'metrics.csv').read_text().splitlines()
  rows_b = (tmp_path / 'b' / 'metrics.csv').read_text().splitlines()
  assert len(rows_b) == 5
  # Same losses and accuracies round by round (column 'seconds' differs).
  strip = lambda row: row.split(',')[2:]  # noqa: E731
  assert [strip(r) for r in rows_a[1:]] == [strip(r) for r in rows_b[1:]]


def test_outputs_and_pipe_termination(tmp_path):
  """Through a pipe the program returns (TFF's worker would otherwise hold it open)."""
  cmd = (f'{sys.executable} -m programs.train ' + ' '.join(BASE) +
         f' --rounds=2 --root_output_dir={tmp_path} --experiment_name=p 2>&1 | cat')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  result = subprocess.run(['bash', '-c', cmd], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
  assert 'final accuracy' in result.stdout, result.stdout
  assert 'Traceback' not in result.stdout and 'Exception ignored' not in result.stdout
  out = tmp_path / 'p'
  for name in ('summary.json', 'metrics.csv', 'accuracy.png', 'final_weights.npz',
               'partition.npz', 'config.json'):
    assert (out / name).stat().st_size > 0, name
  assert list((out / 'tensorboard').iterdir())
  import json  # pylint: disable=g-import-not-at-top
  summary = json.loads((out / 'summary.json').read_text())
  for key in ('final_accuracy', 'best_accuracy', 'rounds', 'seconds_per_round'):
    assert summary[key] is not None
  assert summary['rounds'] == 2
