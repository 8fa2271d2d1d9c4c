"""The papers' suites declared as study files (benchmarks/studies/): `python -m programs.study`
addresses exactly the suite's committed run directories at their recorded settings, and its
`report` writes the paper layer's pages, not the generic one."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import compare
from benchmarks import report
from benchmarks import suites
from programs.studies import study_configs
from programs.studies import study_file
from programs.studies import tuning
from tests.benchmarks.toy_runs import write_run
from tests.toy_studies import FEDPROX_AGAINST_FEDAVG

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY_SUITES = [name for name, s in suites.SUITES.items() if s.study]


def test_every_suite_but_those_borrowing_runs_is_a_study_file():
  assert sorted(name for name, s in suites.SUITES.items() if not s.study) == [
      'cadis_paper', 'fedcross_paper']
  assert all(suites.SUITES[name].borrowed for name in ('cadis_paper', 'fedcross_paper'))


def test_the_fedlex_adam_suites_and_the_reference_protocol_share_the_reference_rate():
  """The reference code's Adam rate, in three study files: the reference protocol's client
  rate is fedlex_paper's for both runs, and the explorers' and the grid's middle in
  fedlex_adam_tuned."""
  rate = suites.SUITES['fedlex_reference'].common['client_lr']
  paper, tuned = suites.SUITES['fedlex_paper'], suites.SUITES['fedlex_adam_tuned']
  assert {paper.config_overrides(run)['client_lr'] for run in paper.runs} == {rate}
  assert paper.runs['fedlex_avgm']['fedlex_exploration_lr'] == rate
  assert tuned.runs['fedlex_avgm']['fedlex_exploration_lr'] == rate
  assert [sorted(g['client_lr'])[1] for g in tuned.grid.values()] == [rate, rate]
  assert paper.common == tuned.common


@pytest.mark.parametrize('name', STUDY_SUITES)
def test_a_study_file_gives_the_suites_runs_and_tuning_points(name, monkeypatch):
  """Every ExperimentConfig `programs.study` makes is the one `benchmarks.compare` makes."""
  monkeypatch.chdir(ROOT)   # both record run directories relative to the checkout
  suite = suites.SUITES[name]
  study = study_file.load(os.path.relpath(suite.study))
  tuned = suites.load_tuned(name)
  ours = [dataclasses.asdict(c) for c in study_configs.run_configs(
      study, tuning.tuned_values(study) if tuned or not study.grid else None)]
  theirs = [dataclasses.asdict(c) for c in compare.run_configs(suite, tuned)]
  assert ours == theirs
  assert [dataclasses.asdict(c) for _, _, c in study_configs.tuning_points(study)] == [
      dataclasses.asdict(c) for _, _, c in compare.tuning_points(suite)]


def test_a_study_files_suite_takes_its_runs_from_the_file_alone():
  suite = suites.SUITES['fedcda']
  dataclasses.replace(suite, probes=())
  for change in (dict(runs=dict(suite.runs, extra=dict(algorithm='fedavg'))),
                 dict(common=dict(suite.common, batch_size=1)), dict(tuning_rounds=1)):
    with pytest.raises(ValueError, match='differ from its study file'):
      dataclasses.replace(suite, **change)


@pytest.mark.parametrize('name, runs', [
    ('fedcda', 22), ('fedcross', 18), ('cadis', 27), ('fedlex', 107), ('fedlex_paper', 6),
    ('fedlex_adam_tuned', 12), ('fedlex_reference', 6), ('scaffold', 6), ('federations', 18)])
def test_plan_of_a_finished_suites_study_has_nothing_left(study_command, name, runs):
  """Every committed run (reported and tuning) is finished at the file's settings: the
  queue's refusal of a run of other settings does not fire."""
  result = study_command('plan', f'benchmarks/studies/{name}.toml')
  assert result.returncode == 0, result.stderr
  last = result.stdout.splitlines()[-2]
  assert last.startswith(f'0 of {runs} runs to make, 0 rounds'), result.stdout
  assert 'blocked' not in result.stdout


def test_a_bare_tuned_choice_is_read_as_a_records_choice(tmp_path, write_study):
  """A suite's tuned.json ({algorithm: values}, as compare --tune writes it) is the study's
  choice; a study's own record reads the same."""
  path = write_study(tmp_path, '''
      seeds = [0]
      [runs.fedavg]
      algorithm = "fedavg"
      [tune.fedavg]
      client_lr = [0.01, 0.1]
      ''')
  study = study_file.load(path)
  os.makedirs(study.output_dir)
  with open(study.tuned_path, 'w') as f:
    json.dump(dict(fedavg=dict(client_lr=0.1)), f)
  assert tuning.load(study) == dict(chosen=dict(fedavg=dict(client_lr=0.1)))
  assert tuning.tuned_values(study) == dict(fedavg=dict(client_lr=0.1))
  with open(study.tuned_path, 'w') as f:   # a choice for another algorithm does not hold
    json.dump(dict(fedprox=dict(client_lr=0.1)), f)
  with pytest.raises(Exception, match=r'\[tune\]: changed since'):
    tuning.tuned_values(study)


def _pages() -> list:
  """Every file benchmarks.report.write_all writes."""
  named = [os.path.join(suites.suite_dir(name), f) for name in suites.SUITES
           for f in ('results.md', 'results.json', 'curves.png')]
  figures = [os.path.join(report.FIGURES, f) for f in sorted(os.listdir(report.FIGURES))]
  return named + figures + [report.REPRODUCTION, report.PROVENANCE, report.README]


def test_report_of_a_suites_study_file_regenerates_its_pages_byte_for_byte(study_command,
                                                                         put_back):
  """`report` on a suite's study file (benchmarks.study) writes the paper layer's pages (its
  `report` key), not the generic page: every committed page comes back byte for byte (put
  back if not)."""
  before = put_back(_pages())
  result = study_command('report', 'benchmarks/studies/fedcda.toml', program='benchmarks.study')
  assert result.returncode == 0, result.stderr
  assert 'wrote benchmarks/results/fedcda/results.md (and every other page)' in result.stdout
  changed = []
  for path, data in before.items():
    with open(path, 'rb') as f:
      if f.read() != data and not path.endswith('.png'):   # figures: matplotlib's version
        changed.append(os.path.relpath(path, ROOT))
  assert not changed, f'regenerate: python -m benchmarks.report ({changed})'


@pytest.mark.parametrize('value, message', [
    ('"benchmarks.report"', 'report: "benchmarks.report" is not module:function'),
    ('3', 'report: 3 is an integer; give a non-empty string'),
])
def test_a_bad_report_key_is_one_line(tmp_path, write_study, value, message):
  path = write_study(tmp_path, f'''
      seeds = [0]
      report = {value}
      [runs.fedavg]
      algorithm = "fedavg"
      ''')
  with pytest.raises(study_file.StudyFileError, match=message.replace('.', r'\.')):
    study_file.load(path)


def test_a_study_file_leaving_the_suites_protocol_is_refused(tmp_path):
  text = open(suites.study_path('fedcda_paper')).read().replace('checkpoint_every = 10',
                                                                 'checkpoint_every = 5')
  path = tmp_path / 'fedcda_paper.toml'
  path.write_text(text)
  with pytest.raises(ValueError, match=r'\[common\] checkpoint_every: 5, but every suite takes '
                     '10'):
    suites.Suite.from_study(str(path), {'FedCDA Dir 0.1': 'Dir 0.1'}, title='t', scaled='s')
  with pytest.raises(ValueError, match=r'\[\[compare\]\] label'):
    suites.Suite.from_study(suites.study_path('fedcda_paper'), {'Dir 0.1': 'Dir 0.1'},
                            title='t', scaled='s')


@pytest.mark.parametrize('seeds, refused', [
    ('[0, 1, 2, 3, 4, 5, 6]', False),   # later seeds, made to narrow an interval
    ('[0, 1]', True), ('[1, 2, 3]', True)])
def test_a_suites_study_file_may_add_seeds_after_the_shared_ones(tmp_path, seeds, refused):
  text = open(suites.study_path('fedcda_paper')).read().replace('seeds = [0, 1, 2]',
                                                                 f'seeds = {seeds}')
  path = tmp_path / 'fedcda_paper.toml'
  path.write_text(text)
  papers = {'FedCDA Dir 0.1': 'Dir 0.1'}
  if refused:
    with pytest.raises(ValueError, match=r'seeds: .*more seeds may follow'):
      suites.Suite.from_study(str(path), papers, title='t', scaled='s')
  else:
    suite = suites.Suite.from_study(str(path), papers, title='t', scaled='s')
    assert suite.seeds == (0, 1, 2, 3, 4, 5, 6)


def test_one_process_imports_both_binaries():
  """benchmarks.compare and programs.study define --only once between them."""
  result = subprocess.run([sys.executable, '-c', 'import benchmarks.compare, programs.study'],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True)
  assert result.returncode == 0, result.stderr


def test_the_suites_page_writer_refuses_a_file_no_suite_declares_in_one_line(
    tmp_path, write_study, study_command):
  path = write_study(tmp_path, '''
      report = "benchmarks.report:write_study_pages"
      seeds = [0]
      [runs.fedavg]
      algorithm = "fedavg"
      ''')
  result = study_command('report', path, program='benchmarks.study')
  assert result.returncode == 2
  assert result.stderr.startswith(
      f'error: {path} report: "benchmarks.report:write_study_pages" writes the pages of the '
      'suites of benchmarks/suites.py, and none is declared by this file'), result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr


TOY_SUITE_STUDY = '''
seeds = [0, 1, 2]
tuning_rounds = 4
[common]
dataset = "digits"
num_clients = 4
clients_per_round = 2
rounds = 6
checkpoint_every = 10
blown_up_rounds = 0
''' + FEDPROX_AGAINST_FEDAVG + '''label = "FedProx"
[tune.fedavg]
client_lr = [0.1, 0.3, 1.0]
[tuned_as]
fedprox = "fedavg"
'''


def test_compare_tune_of_a_study_files_suite_writes_the_studys_record(tmp_path, monkeypatch):
  """compare --tune freezes a suite declared by a study file as `programs.study tune` does:
  a record of every point's accuracy that the study's `run` accepts, and the suites read."""
  path = tmp_path / 'toy.toml'
  path.write_text(TOY_SUITE_STUDY)
  suite = suites.Suite.from_study(str(path), {'FedProx': 'x'}, title='t', scaled='s')
  monkeypatch.setattr(suites, 'suite_dir', lambda name: str(tmp_path / name))
  level = {0.1: 0.5, 0.3: 0.7, 1.0: 0.6}

  def fake_run(config):
    write_run(config.experiment_dir, config.rounds, np.full(config.rounds, level[config.client_lr]),
              config=dataclasses.asdict(config))

  monkeypatch.setattr(compare, '_run', fake_run)
  assert compare.tune(suite) == {'fedavg': {'client_lr': 0.3}}
  study = study_file.load(str(path))
  record = tuning.load(study)
  assert record['points'] == {'fedavg': [
      dict(values=dict(client_lr=lr), diverged=None, accuracy=pytest.approx(accuracy))
      for lr, accuracy in level.items()]}
  assert tuning.tuned_values(study) == {'fedavg': {'client_lr': 0.3}}
  assert suites.load_tuned('toy') == {'fedavg': {'client_lr': 0.3}}
  assert [c.client_lr for c in compare.run_configs(suite, suites.load_tuned('toy'))] == [0.3] * 6


@pytest.mark.parametrize('common', ['', 'algorithm = "fedavg"\n'])
def test_a_runs_algorithm_may_come_from_common_or_the_trainers_default(tmp_path, common):
  """A run without `algorithm` takes [common]'s, else the trainer's default."""
  path = tmp_path / 'toy.toml'
  text = TOY_SUITE_STUDY.replace('[runs.fedavg]\nalgorithm = "fedavg"\n', '[runs.fedavg]\n')
  path.write_text(text.replace('[common]\n', '[common]\n' + common))
  study = study_file.load(str(path))
  suite = suites.Suite.from_study(str(path), {'FedProx': 'x'}, title='t', scaled='s')
  for runs in (study, suite):
    assert [runs.algorithm(run) for run in ('fedavg', 'fedprox')] == ['fedavg', 'fedprox']
  tuned = {'fedavg': {'client_lr': 0.3}}
  assert suite.config_overrides('fedprox', tuned)['client_lr'] == 0.3   # tuned_as
  assert study.run_fields('fedprox', tuned)['client_lr'] == 0.3
