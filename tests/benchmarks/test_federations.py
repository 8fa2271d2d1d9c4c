"""benchmarks/federations.py: its runs, its table against numpy on toy runs, and the committed
page regenerating byte for byte."""

import json
import os

import numpy as np
import pytest
from toy_runs import write_run

from benchmarks import federations, suites


def test_every_method_runs_under_every_condition_on_one_layout():
  configs = {os.path.basename(c.experiment_dir): c for c in federations.configs()}
  assert len(configs) == len(federations.METHODS) * len(federations.CONDITIONS) == 18
  for method, (_, fields) in federations.METHODS.items():
    for condition, (_, faults) in federations.CONDITIONS.items():
      c = configs[federations.run_name(method, condition)]
      assert (c.dataset, c.partition, c.dirichlet_alpha, c.num_clients, c.clients_per_round,
              c.rounds, c.eval_every, c.seed) == ('fashion_mnist', 'dirichlet', 0.1, 100, 10,
                                                  150, 1, 0)
      assert c.client_dropout == faults.get('client_dropout', 0.0)
      assert c.straggler_fraction == faults.get('straggler_fraction', 0.0)
      assert all(getattr(c, k) == v for k, v in fields.items())
      assert c.target_accuracy == '0.6,0.7'
  # SCAFFOLD is compared with a FedAvg on the same plain client SGD
  for name in ('fedavg_sgd', 'scaffold'):
    c = configs[federations.run_name(name, 'none')]
    assert (c.client_lr, c.client_momentum) == (0.02, 0.0)


def test_the_table_reads_levels_targets_and_megabytes(tmp_path, monkeypatch):
  monkeypatch.setattr(suites, 'RESULTS', str(tmp_path))
  rng = np.random.default_rng(0)
  rounds = federations.LAYOUT['rounds']
  acc = rng.uniform(0.5, 0.8, rounds)
  down = rng.integers(1, 10**6, rounds).astype(float)
  up = rng.integers(1, 10**6, rounds).astype(float)
  path = os.path.join(federations.run_dir(), federations.run_name('fedcross', 'dropout'))
  write_run(path, rounds, acc, config=dict(algorithm='fedcross'), columns=dict(
      bytes_down_payload=down, bytes_down_overhead=np.full(rounds, 7.0),
      bytes_up_payload=up, bytes_up_overhead=np.full(rounds, 3.0),
      cumulative_bytes_down=np.cumsum(down + 7.0), cumulative_bytes_up=np.cumsum(up + 3.0)))
  first = int(np.argmax(acc >= 0.6)) + 1
  with open(os.path.join(path, 'summary.json')) as f:
    summary = json.load(f)
  summary['time_to_accuracy'] = [dict(target=0.6, round=first, bytes=12.5e6, seconds=1.0),
                                 dict(target=0.7, round=None, bytes=None, seconds=None)]
  with open(os.path.join(path, 'summary.json'), 'w') as f:
    json.dump(summary, f)
  lines = federations.table(federations.load())
  row, = [l for l in lines if '| FedCross |' in l and 'never report' in l]
  cells = [c.strip() for c in row.strip('|').split('|')]
  assert cells[2] == f'{100 * acc[-10:].mean():.2f}'
  assert cells[3:7] == [str(first), '12.5', 'never', '—']
  assert cells[7] == f'{np.mean(down + 7.0) / 1e6:.1f}'
  assert cells[8] == f'{np.mean(up + 3.0) / 1e6:.1f}'
  # every other run is listed as not run
  assert sum('not run' in l for l in lines) == 17
  federations.write_pages()
  assert os.path.getsize(os.path.join(federations.results_dir(), 'federations.png')) > 0


def test_the_committed_page_regenerates_byte_for_byte():
  with open(os.path.join(federations.results_dir(), 'results.md')) as f:
    assert federations.page(federations.load()) == f.read(), (
        'regenerate: python -m benchmarks.federations --report')
