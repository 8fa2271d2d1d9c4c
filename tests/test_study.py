"""programs/study.py: a user's own study from its file to its page (run after a kill, tune,
plan, report) and the one-line refusal of every mistake in the file, before anything trains."""

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest

from programs.studies import declaration
from programs.studies import study_configs
from programs.studies import study_file
from programs.studies import study_page
from tests.toy_studies import FEDPROX_AGAINST_FEDAVG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# FedProx against FedAvg, two seeds: the acceptance study.
TWO_METHODS = 'seeds = [0, 1]\n' + FEDPROX_AGAINST_FEDAVG + 'label = "digits 4 clients"\n'


def _rounds(metrics_csv: str) -> list:
  with open(metrics_csv, newline='') as f:
    return [int(r['round']) for r in csv.DictReader(f)]


def _last10(metrics_csv: str) -> float:
  """The run's last-10 mean, the test's own reading of its metrics.csv."""
  with open(metrics_csv, newline='') as f:
    acc = [float(r['test_accuracy']) for r in csv.DictReader(f) if r['test_accuracy']]
  return float(np.mean(acc[-10:]))


def _wait_for_a_round(proc, metrics_csv, seconds=300) -> None:
  """Returns once the run writing `metrics_csv` has recorded a round."""
  deadline = time.time() + seconds
  while not (metrics_csv.exists() and _rounds(str(metrics_csv))):
    assert proc.poll() is None, 'the command ended before its first round'
    assert time.time() < deadline, f'no round in {seconds} s'
    time.sleep(0.05)


@pytest.fixture(scope='module')
def finished_study(tmp_path_factory, write_study, study_command):
  """The acceptance study run as a user would: `run`, killed (SIGKILL) once the first run has
  a round in its metrics.csv, `plan` then, `run` again to the end, then `report`."""
  folder = tmp_path_factory.mktemp('study')
  path = write_study(folder, TWO_METHODS)
  out = folder / 'study'
  first = out / 'runs' / 'fedavg_s0' / 'metrics.csv'
  command = [sys.executable, '-m', 'programs.study', 'run', path]
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    _wait_for_a_round(proc, first)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  plan = study_command('plan', path)
  again = study_command('run', path)
  assert again.returncode == 0, again.stderr
  report = study_command('report', path)
  assert report.returncode == 0, report.stderr
  return dict(path=path, out=out, plan=plan, again=again, report=report)


def test_a_killed_study_resumes_and_finishes(finished_study):
  out = finished_study['out']
  for run in ('fedavg_s0', 'fedavg_s1', 'fedprox_s0', 'fedprox_s1'):
    assert _rounds(str(out / 'runs' / run / 'metrics.csv')) == [1, 2, 3], run
    assert json.loads((out / 'runs' / run / 'summary.json').read_text())['rounds'] == 3
  plan = finished_study['plan']
  assert plan.returncode == 0, plan.stderr
  lines = plan.stdout.splitlines()
  runs = [os.path.basename(line.split(':')[0]) for line in lines[:-2]]
  # seed by seed; the killed run unless it got to its end first
  assert runs in (['fedavg_s0', 'fedprox_s0', 'fedavg_s1', 'fedprox_s1'],
                  ['fedprox_s0', 'fedavg_s1', 'fedprox_s1']), lines
  assert all('rounds left' in line for line in lines[:-2]), lines
  assert lines[-2].startswith(f'{len(runs)} of 4 runs to make'), lines
  assert lines[-1] == 'no TF'   # planning starts no TensorFlow


def test_the_page_margins_are_the_runs_own(finished_study):
  """results.json and results.md hold per-seed margins and their mean as the test reads
  them off each run's metrics.csv (last-10 mean, points)."""
  out = finished_study['out']
  own = {s: 100 * (_last10(str(out / 'runs' / f'fedprox_s{s}' / 'metrics.csv'))
                   - _last10(str(out / 'runs' / f'fedavg_s{s}' / 'metrics.csv')))
         for s in (0, 1)}
  data = json.loads((out / 'results.json').read_text())
  (comp,) = data['comparisons']
  assert comp['seeds'] == [0, 1]
  assert comp['per_seed'] == {str(s): pytest.approx(m, abs=1e-9) for s, m in own.items()}
  assert comp['margin'] == pytest.approx(np.mean(list(own.values())), abs=1e-9)
  page = (out / 'results.md').read_text()
  assert f's0: {own[0]:+.2f}, s1: {own[1]:+.2f}' in page
  assert comp['verdict'] in page and (comp['verdict'] == 'within noise' or
                                      comp['verdict'].endswith(': resolved'))
  assert f'python -m programs.study run {finished_study["path"]}' in page
  assert (out / 'curves.png').stat().st_size > 0


def test_the_page_is_written_again_byte_for_byte(finished_study, study_command):
  out = finished_study['out']
  before = {name: (out / name).read_bytes() for name in ('results.md', 'results.json',
                                                         'curves.png')}
  result = study_command('report', finished_study['path'])
  assert result.returncode == 0, result.stderr
  assert {name: (out / name).read_bytes() for name in before} == before


def test_plan_lists_only_the_runs_asked_and_their_rounds(tmp_path, write_study, study_command):
  path = write_study(tmp_path, TWO_METHODS)
  result = study_command('plan', path)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert len(lines) == 6 and all(': 3 rounds left (starts at round 1)' in l for l in lines[:4])
  assert lines[4].startswith('4 of 4 runs to make, 12 rounds')
  result = study_command('plan', path, '--only=fedprox')
  lines = result.stdout.splitlines()
  assert [os.path.basename(l.split(':')[0]) for l in lines[:2]] == ['fedprox_s0', 'fedprox_s1']
  assert lines[2].startswith('2 of 2 runs to make, 6 rounds')
  assert not os.path.exists(tmp_path / 'study')   # nothing made


def test_plan_sized_by_training_only_adds_no_empty_parentheses(tmp_path, write_study,
                                                                study_command):
  """A cost recorded before whole rounds were (training seconds only): the plan says so, with
  no parenthesis left empty."""
  from tests.benchmarks.toy_runs import write_run  # pylint: disable=g-import-not-at-top
  path = write_study(tmp_path, TWO_METHODS)
  (config,) = study_configs.run_configs(study_file.load(path), only=('fedavg',))[:1]
  write_run(tmp_path / 'study' / 'runs' / 'recorded_s0', 3, [0.5] * 3, seconds=2.0,
            config=dataclasses.asdict(config))
  result = study_command('plan', path, '--only=fedavg')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].endswith(': 3 rounds left (starts at round 1); ~26 s at 2.00 s/round '
                           '(training only) and 20 s start-up'), lines
  assert lines[2].startswith('2 of 2 runs to make, 6 rounds')
  assert lines[2].endswith('evaluation adds to it)'), lines


def test_plan_adds_the_recorded_start_up_of_each_run(tmp_path, write_study, study_command):
  """Each run to make costs its rounds plus a start-up: the median startup_seconds of the
  recorded runs' summaries (queue.DEFAULT_STARTUP_SECONDS before any records it)."""
  from tests.benchmarks.toy_runs import write_run  # pylint: disable=g-import-not-at-top
  path = write_study(tmp_path, TWO_METHODS)
  (config,) = study_configs.run_configs(study_file.load(path), only=('fedavg',))[:1]
  for name, startup in (('a_s0', 50.0), ('b_s0', 70.0), ('c_s0', 110.0)):
    directory = tmp_path / 'study' / 'runs' / name
    write_run(directory, 3, [0.5] * 3, seconds=2.0, round_seconds=4.0,
              config=dataclasses.asdict(config))
    summary = json.loads((directory / 'summary.json').read_text())
    (directory / 'summary.json').write_text(json.dumps(dict(summary, startup_seconds=startup)))
  result = study_command('plan', path, '--only=fedavg')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].endswith('; ~1 min at 4.00 s/round and 70 s start-up'), lines  # 70 + 3 x 4
  assert lines[2] == ('2 of 2 runs to make, 6 rounds: ~3 min as recorded (start-up 70 s a '
                      'run, the median of 3 runs recorded)'), lines   # 2 x (70 + 12) s


def test_startup_seconds_add_the_first_rounds_excess():
  from programs import run_results  # pylint: disable=g-import-not-at-top
  rows = [dict(round_seconds=s) for s in ('9.5', '1.0', '2.0', '1.5', '')]
  assert run_results.startup_seconds(3.25, rows) == 3.25 + 9.5 - 1.5   # median of 1, 2, 1.5
  assert run_results.startup_seconds(3.25, rows[:1]) == 3.25           # no later round
  assert run_results.startup_seconds(3.25, [dict(round_seconds='1.0')] * 3) == 3.25


def test_a_study_run_ends_each_run_with_its_round_accuracy_and_eta(finished_study):
  """Through a pipe (no terminal: no progress bar), `run` prints one line per run it made:
  its rounds, final accuracy, time, and the list's remaining runs at its pace; each run's
  summary records its start-up, which the plan before used its default for."""
  from programs.studies import queue  # pylint: disable=g-import-not-at-top
  lines = [l for l in finished_study['again'].stderr.splitlines() if l.startswith('   round')]
  runs = ['fedavg_s0', 'fedprox_s0', 'fedavg_s1', 'fedprox_s1']
  made = runs[len(runs) - len(lines):]   # fedavg_s0 may have finished before the kill
  assert len(made) >= 3, finished_study['again'].stderr
  for line, run in zip(lines, made):
    summary = json.loads((finished_study['out'] / 'runs' / run / 'summary.json').read_text())
    left = len(runs) - 1 - runs.index(run)
    eta = (rf'{left} more runs? in the list, ~\d+ (s|min) at this pace' if left
           else 'the last in the list')
    assert re.fullmatch(rf'   round 3/3, accuracy {summary["final_accuracy"]:.4f}, '
                        rf'\d+ (s|min); {eta}', line), line
    assert summary['startup_seconds'] > 0
  assert '\r' not in finished_study['again'].stderr   # no progress bar through a pipe
  assert (f'start-up {queue.DEFAULT_STARTUP_SECONDS:.0f} s a run, a default until runs '
          'record it') in finished_study['plan'].stdout


BAD = [
    ('[runs.fedavg]\nclinet_lr = 0.1', '[runs.fedavg] clinet_lr: not a trainer flag '
     '(did you mean client_lr?)'),
    ('[runs.fedavg]\nrounds = "3"', '[runs.fedavg] rounds: "3" is a string, but --rounds '
     'takes an integer (e.g. rounds = 30)'),
    ('[runs.fedprox]\nproximal_strength = -1.0', '[runs.fedprox] proximal_strength: '
     '--proximal_strength must be >= 0, got -1.0'),
    ('[runs.fedavg]\nseed = 3', '[runs.fedavg] seed: set by the study'),
    ('[[compare]]\nmethod = "fedprx"\nbaseline = "fedavg"', '[[compare]] #2 method: "fedprx" is '
     'not a run (did you mean fedprox?)'),
    ('[tune.fedavg]\nclient_rate = [0.01, 0.1]', '[tune.fedavg] client_rate: not a trainer flag '
     '(did you mean client_lr?)'),
    ('[tune.fedavg]\nfedcross_alpha = [0.9, 0.99]', '[tune.fedavg] fedcross_alpha: '
     '--fedcross_alpha is not used by --algorithm=fedavg; drop it'),
    ('[tune.fedavgg]\nclient_lr = [0.01, 0.1]', '[tune.fedavgg] a grid over no run (did you '
     'mean fedavg?)'),
    ('tuning_seed = 1', 'tuning_seed: 1 is one of the seeds [0, 1]'),
]


@pytest.mark.parametrize('extra, message', BAD)
def test_a_mistake_is_one_line_naming_file_table_and_key(tmp_path, write_study, study_command,
                                                         extra, message):
  """Each mistake: exit 2, one `error:` line naming the file, the table and the key, before
  TensorFlow starts or any run directory is made."""
  header, _, keys = extra.partition('\n')
  if not header.startswith('['):   # a top-level key
    body = extra + '\n' + TWO_METHODS
  elif header + '\n' in TWO_METHODS and not header.startswith('[['):   # into its table
    body = TWO_METHODS.replace(header + '\n', f'{header}\n{keys}\n')
  else:
    body = TWO_METHODS + '\n' + extra
  path = write_study(tmp_path, body)
  result = study_command('run', path)
  assert result.returncode == 2
  assert result.stderr.startswith(f'error: {path} {message}'), result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr
  assert result.stdout.strip() == 'no TF'
  assert not os.path.exists(tmp_path / 'study')


def test_an_unknown_key_is_named_with_its_fix(tmp_path, write_study):
  path = write_study(tmp_path, 'rounds = 3\n' + TWO_METHODS)
  with pytest.raises(study_file.StudyFileError, match=r'study.toml rounds: a trainer flag: put '
                     r'it under \[common\]'):
    study_file.load(path)
  path = write_study(tmp_path, 'seed = [0]\n' + TWO_METHODS)
  with pytest.raises(study_file.StudyFileError, match=r'seed: not a study key \(did you mean '
                     'seeds\\?\\)'):
    study_file.load(path)
  path = write_study(tmp_path, TWO_METHODS + '[tuned_as]\nfedprox = "fedavg"\n')
  with pytest.raises(study_file.StudyFileError,
                     match=r'\[tuned_as\] fedprox: "fedavg" names no algorithm with a grid'):
    study_file.load(path)


def test_common_from_starts_from_another_files_common(tmp_path, write_study):
  """A file's [common] over the [common] of the file `common_from` names (relative to it)."""
  base = write_study(tmp_path, TWO_METHODS, name='base.toml')
  (tmp_path / 'sub').mkdir()
  child = tmp_path / 'sub' / 'child.toml'
  child.write_text('common_from = "../base.toml"\nseeds = [0]\n[common]\nrounds = 5\n'
                   'batch_size = 8\n[runs.fedavg]\nalgorithm = "fedavg"\n')
  with open(base, 'rb') as f:
    want = dict(tomllib.load(f)['common'], rounds=5, batch_size=8)
  study = study_file.load(str(child))
  assert study.common == want
  assert study.run_fields('fedavg') == dict(want, algorithm='fedavg')


@pytest.mark.parametrize('common_from, message', [
    ('"nothing.toml"', 'common_from: "nothing.toml": no such file'),
    ('"study.toml"', 'common_from: "study.toml" leads back to this file'),
    ('3', 'common_from: 3 is an integer; give a non-empty string'),
])
def test_a_bad_common_from_is_one_line(tmp_path, write_study, study_command, common_from,
                                       message):
  path = write_study(tmp_path, f'common_from = {common_from}\n' + TWO_METHODS)
  result = study_command('plan', path)
  assert result.returncode == 2
  assert result.stderr.startswith(f'error: {path} {message}'), result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_mistake_in_the_common_from_file_names_that_file(tmp_path, write_study):
  base = write_study(tmp_path, 'seeds = [0]\n[runs.fedavg]\nclinet_lr = 0.1\n',
                     name='base.toml')
  path = write_study(tmp_path, 'common_from = "base.toml"\n' + TWO_METHODS)
  with pytest.raises(study_file.StudyFileError, match='^' + re.escape(
      f'{base} [runs.fedavg] clinet_lr: not a trainer flag')):
    study_file.load(path)


TUNED = '''
seeds = [0]
tuning_rounds = 2
[runs.fedavg]
algorithm = "fedavg"
[runs.fedprox]
algorithm = "fedprox"
[tune.fedavg]
client_lr = [0.02, 0.2]
[tuned_as]
fedprox = "fedavg"
'''


def test_tune_freezes_the_best_point_and_run_waits_for_it(tmp_path, write_study, study_command):
  """`run` is refused until `tune` wrote tuned.json (in --output_dir when given), and again
  when the grid changes; SIGTERM stops `tune` at a round boundary and the same command
  continues; a best point on the grid's edge is flagged on the page; --only makes
  those runs alone, at the tuned values (FedProx at FedAvg's, tuned_as)."""
  path = write_study(tmp_path, TUNED, rounds=3)   # tuning_rounds = 2
  refused = study_command('run', path)
  assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
  assert f'run `python -m programs.study tune {path}` first' in refused.stderr
  assert not os.path.exists(tmp_path / 'study' / 'runs')
  other = tmp_path / 'elsewhere'
  # SIGTERM stops at a round boundary, checkpointed; the same command continues.
  first = other / 'tuning' / 'fedavg_client_lr0.02' / 'metrics.csv'
  proc = subprocess.Popen([sys.executable, '-m', 'programs.study', 'tune', path,
                           f'--output_dir={other}'], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3'))
  _wait_for_a_round(proc, first)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signal.SIGTERM, stderr
  assert 'stopped by SIGTERM' in stderr and 'the same command continues' in stderr
  assert not (other / 'tuned.json').exists()
  tuned = study_command('tune', path, f'--output_dir={other}')
  assert tuned.returncode == 0, tuned.stderr
  assert _rounds(str(first)) == [1, 2]
  config = json.loads((first.parent / 'config.json').read_text())
  assert config['rounds'] == 2 and config['seed'] == declaration.TUNING_SEED
  assert not os.path.exists(tmp_path / 'study')   # --output_dir, not the file's
  record = json.loads((other / 'tuned.json').read_text())
  chosen = record['chosen']['fedavg']['client_lr']
  assert chosen in (0.02, 0.2)
  assert [p['values'] for p in record['points']['fedavg']] == [{'client_lr': 0.02},
                                                               {'client_lr': 0.2}]
  page = (other / 'results.md').read_text()
  assert '**FLAG**: fedavg\'s chosen `client_lr=' in page   # a two-point grid: an edge
  assert '2 points × 2 rounds = 4 rounds of tuning' in page
  made = study_command('run', path, f'--output_dir={other}', '--only=fedprox')
  assert made.returncode == 0, made.stderr
  assert sorted(os.listdir(other / 'runs')) == ['fedprox_s0']
  config = json.loads((other / 'runs' / 'fedprox_s0' / 'config.json').read_text())
  assert config['client_lr'] == chosen and config['seed'] == 0 and config['rounds'] == 3
  with open(path) as f:   # the grid changes: the choice no longer holds
    text = f.read().replace('client_lr = [0.02, 0.2]', 'client_lr = [0.02, 0.2, 0.5]')
  with open(path, 'w') as f:
    f.write(text)
  refused = study_command('run', path, f'--output_dir={other}')
  assert refused.returncode == 2
  assert refused.stderr.startswith(f'error: {path} [tune.fedavg]: changed since ')


def test_name_output_dir_criterion_and_tuning_seed_reach_the_plan_and_page(
    tmp_path, write_study, study_command):
  """The file's `name` titles the page, its `output_dir` (relative to the file) holds the runs
  and the page, `criterion = "best"` is what the page reads and `tuning_seed` what the grids
  are tried on."""
  path = write_study(tmp_path, 'name = "lr check"\noutput_dir = "out"\ncriterion = "best"\n'
                     'tuning_seed = 7\n' + TUNED.replace('tuning_rounds = 2\n', ''))
  study = study_file.load(path)
  assert {c.seed for _, _, c in study_configs.tuning_points(study)} == {7}
  plan = study_command('plan', path)
  assert plan.returncode == 0, plan.stderr
  made = [line.split(':')[0].strip() for line in plan.stdout.splitlines()[1:5]]
  assert made[:2] == [os.path.relpath(tmp_path / 'out' / 'tuning' / f'fedavg_client_lr{lr}',
                                      ROOT) for lr in ('0.02', '0.2')], plan.stdout
  report = study_command('report', path)
  assert report.returncode == 0, report.stderr
  text = (tmp_path / 'out' / 'results.md').read_text()
  assert text.startswith('# Study lr check\n')
  assert 'Each grid is tried on seed 7, which is not a reported seed' in text
  assert f'the best {study_page.CRITERION_WORDS["best"]} wins' in text
  assert study_page.CRITERION_WORDS['last10'] not in text
  assert json.loads((tmp_path / 'out' / 'results.json').read_text())['criterion'] == 'best'
  assert not os.path.exists(tmp_path / 'study')


def test_a_verdict_says_who_is_ahead_only_when_the_seeds_resolve_it():
  comp = declaration.Comparison('fedprox', 'fedavg', 'digits')
  assert study_page.verdict(comp, 1.5, 0.5, 3) == 'fedprox ahead by 1.50 ± 0.50 points: resolved'
  assert study_page.verdict(comp, -1.5, 0.5, 3) == 'fedavg ahead by 1.50 ± 0.50 points: resolved'
  assert study_page.verdict(comp, 0.4, 0.5, 3) == 'within noise'
  assert study_page.verdict(comp, 3.0, float('nan'), 1) == 'not enough seeds'


def test_tuning_length_without_a_rounds_key_is_the_trainers_default(tmp_path):
  """A grid with neither tuning_rounds nor rounds: its points run the trainer's default length,
  and the page's tuning budget says so."""
  study = declaration.Study(name='s', output_dir=str(tmp_path), seeds=(0,),
                          common=dict(dataset='digits'), runs=dict(fedavg={}),
                          grid=dict(fedavg=dict(client_lr=[0.02, 0.2])))
  default = study_file.FIELDS['rounds'].default
  (result,) = study_page.tuning_results(study, None).values()
  assert result['rounds'] == default and result['budget'] == 2 * default


def test_schedule_keys_reach_the_runs_and_a_bad_one_is_named(tmp_path, write_study):
  """The learning-rate schedule flags are study keys like any trainer flag
  (programs/lr_schedules.py): a run's reach its ExperimentConfig; a bad one names its table."""
  from programs import lr_schedules  # pylint: disable=g-import-not-at-top
  path = write_study(tmp_path, 'seeds = [0]\n[runs.fedavg]\nalgorithm = "fedavg"\n'
                     'client_lr_schedule = "cosine"\nclient_lr_floor = 0.1\n'
                     'server_lr_schedule = "step"\nserver_lr_decay = 0.5\n'
                     'server_lr_decay_every = 2\nserver_lr_warmup_rounds = 1\n')
  study = study_file.load(path)
  (config,) = study_configs.run_configs(study)
  client, server = lr_schedules.schedules(config)
  assert (client.kind, client.floor, client.rounds) == ('cosine', 0.1, 3)
  assert (server.kind, server.decay, server.every, server.warmup_rounds) == ('step', 0.5, 2, 1)
  path = write_study(tmp_path, 'seeds = [0]\n[runs.fedcross]\nalgorithm = "fedcross"\n'
                     'server_lr_schedule = "cosine"\n')
  with pytest.raises(study_file.StudyFileError, match=r'\[runs.fedcross\] server_lr_schedule: '
                     '--server_lr_schedule: fedcross takes no server optimizer step'):
    study_file.load(path)
