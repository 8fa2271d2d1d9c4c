"""LEAF FEMNIST, Shakespeare and Sent140 train end to end through programs.train with their default
(LEAF) models, on small files in LEAF's own JSON layout written here.

The LEAF user split (`-t user`) is used: test/ holds other users than train/, so a run only
reports an accuracy if the loader kept the held-out users' test data.
"""

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from tests.helpers import (
    leaf_femnist_users, leaf_sent140_users, leaf_shakespeare_users, write_leaf_json)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    'femnist_leaf': ('fedavg_cnn', leaf_femnist_users,
                     ['--batch_size=8', '--client_lr=0.05', '--client_momentum=0']),
    # dataset: (default model, users writer, flags); every client trains every round, so
    # round 2 sees the same data as round 1 and its loss must be lower.
    'shakespeare_leaf': ('leaf_char_lstm', leaf_shakespeare_users,
                         ['--batch_size=8', '--client_lr=0.8', '--client_momentum=0']),
    'sent140_leaf': ('sent140_lstm', leaf_sent140_users,
                     ['--batch_size=8', '--local_epochs=2', '--client_lr=0.5',
                      '--client_momentum=0']),
}


def _write_user_split(directory, users_fn):
  train = users_fn(['u_b', 'u_a', 'u_c'], 8)
  held_out = users_fn(['u_test'], 6)
  write_leaf_json(os.path.join(directory, 'train', 'all_data_niid_0_keep_0_train_9.json'), train)
  write_leaf_json(os.path.join(directory, 'test', 'all_data_niid_0_keep_0_test_9.json'), held_out)


@pytest.fixture(scope='module')
def leaf_runs(tmp_path_factory):
  """The datasets trained concurrently (one program process each), 2 rounds each."""
  tmp = tmp_path_factory.mktemp('leaf')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  procs = {}
  for dataset, (_, users_fn, flags) in CASES.items():
    data_dir = tmp / dataset
    _write_user_split(str(data_dir), users_fn)
    procs[dataset] = subprocess.Popen(
        [sys.executable, '-m', 'programs.train', f'--dataset={dataset}', f'--data_dir={data_dir}',
         '--num_clients=3', '--clients_per_round=3', '--rounds=2', '--progress=false',
         f'--root_output_dir={tmp}', f'--experiment_name={dataset}', *flags],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  results = {}
  for dataset, proc in procs.items():
    out, err = proc.communicate(timeout=900)
    results[dataset] = (proc.returncode, out, err, tmp / dataset)
  return results


@pytest.mark.parametrize('dataset', sorted(CASES))
def test_leaf_dataset_trains_with_its_leaf_model(leaf_runs, dataset):
  returncode, out, err, run_dir = leaf_runs[dataset]
  assert returncode == 0, err
  assert 'final accuracy' in out
  summary = json.loads((run_dir / 'summary.json').read_text())
  assert summary['model'] == CASES[dataset][0]
  assert summary['rounds'] == 2 and 0.0 <= summary['final_accuracy'] <= 1.0
  with open(run_dir / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  losses = [float(r['client_work/train/loss']) for r in rows]
  assert all(math.isfinite(l) for l in losses)
  assert losses[1] < losses[0], losses  # same clients, same data: training reduces the loss
  # 3 clients x 8 samples trained per round, evaluated on the 6 held-out examples.
  assert [float(r['client_work/train/num_examples']) for r in rows] == [24.0, 24.0]
  assert all(math.isfinite(float(r['test_loss'])) and float(r['test_loss']) > 0 for r in rows)
