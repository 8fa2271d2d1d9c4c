"""benchmarks/federations.py: its runs (benchmarks/studies/federations.toml), its table
against numpy on toy runs, and the committed page regenerating byte for byte."""

import dataclasses
import json
import os

import numpy as np
import pytest
from toy_runs import write_run

from benchmarks import federations
from programs.studies import study_file


ALGORITHMS = dict(fedavg='fedavg', fedcross='fedcross', fedcda='fedcda', cadis='cadis',
                  fedavg_sgd='fedavg', scaffold='scaffold')
# (client_dropout, straggler_fraction) of each condition
FAULTS = dict(none=(0.0, 0.0), dropout=(0.3, 0.0), stragglers=(0.0, 0.5))


def test_every_method_runs_under_every_condition_on_one_layout():
  configs = {os.path.basename(c.experiment_dir): c for c in federations.configs()}
  assert sorted(configs) == sorted(f'{method}_{condition}_s0' for method in federations.METHODS
                                   for condition in federations.CONDITIONS)
  for method, algorithm in ALGORITHMS.items():
    for condition, faults in FAULTS.items():
      c = configs[f'{method}_{condition}_s0']
      assert (c.dataset, c.partition, c.dirichlet_alpha, c.num_clients, c.clients_per_round,
              c.rounds, c.eval_every, c.seed) == ('fashion_mnist', 'dirichlet', 0.1, 100, 10,
                                                  150, 1, 0)
      assert c.algorithm == algorithm
      assert (c.client_dropout, c.straggler_fraction) == faults
      assert c.target_accuracy == '0.6,0.7'
      # SCAFFOLD is compared with a FedAvg on the same plain client SGD
      plain = method in ('fedavg_sgd', 'scaffold')
      assert (c.client_lr, c.client_momentum) == ((0.02, 0.0) if plain else (0.01, 0.5))
      assert c.fedcda_warmup_rounds == 25 or method != 'fedcda'
      assert c.cadis_sample_weighted == (method != 'cadis')


def test_a_study_without_every_method_under_every_condition_is_refused():
  runs = dict(federations.STUDY.runs)
  del runs['cadis_stragglers']
  study = dataclasses.replace(federations.STUDY, runs=runs)
  with pytest.raises(study_file.StudyFileError, match=r'federations\.toml \[runs\]: '):
    federations.load(study)


def test_the_table_reads_levels_targets_and_megabytes(tmp_path):
  study = dataclasses.replace(federations.STUDY, output_dir=str(tmp_path))
  rng = np.random.default_rng(0)
  rounds = study.common['rounds']
  acc = rng.uniform(0.5, 0.8, rounds)
  down = rng.integers(1, 10**6, rounds).astype(float)
  up = rng.integers(1, 10**6, rounds).astype(float)
  path = os.path.join(study.runs_dir, 'fedcross_dropout_s0')
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
  lines = federations.table(study, federations.load(study))
  row, = [l for l in lines if '| FedCross |' in l and 'never report' in l]
  cells = [c.strip() for c in row.strip('|').split('|')]
  assert cells[2] == f'{100 * acc[-10:].mean():.2f}'
  assert cells[3:7] == [str(first), '12.5', 'never', '—']
  assert cells[7] == f'{np.mean(down + 7.0) / 1e6:.1f}'
  assert cells[8] == f'{np.mean(up + 3.0) / 1e6:.1f}'
  # every other run is listed as not run
  assert sum('not run' in l for l in lines) == 17
  federations.write_pages(study)
  assert os.path.getsize(os.path.join(tmp_path, 'federations.png')) > 0


def test_the_committed_page_regenerates_byte_for_byte():
  study = federations.STUDY
  with open(os.path.join(study.output_dir, 'results.md')) as f:
    assert federations.page(study, federations.load(study)) == f.read(), (
        'regenerate: python -m benchmarks.federations --report')


def test_the_study_files_report_writes_the_federations_page(study_command, put_back):
  """`python -m benchmarks.study report` on the file writes this page (its `report` key), the
  same bytes (put back if not)."""
  page = os.path.join(federations.STUDY.output_dir, 'results.md')
  before = put_back([page, os.path.join(federations.STUDY.output_dir, 'federations.png')])
  result = study_command('report', 'benchmarks/studies/federations.toml',
                         program='benchmarks.study')
  assert result.returncode == 0, result.stderr
  assert 'wrote benchmarks/results/federations/results.md' in result.stdout
  with open(page, 'rb') as f:
    assert f.read() == before[page]
