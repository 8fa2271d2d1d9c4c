"""Each benchmark script runs end to end at tiny settings and prints what RESULTS.md records.

The scripts in `benchmarks/` measure (ratios side by side, memory, precision); nothing else
imports them, so without these they rot unseen when the code they drive changes. Every run
here is a real run of the script as documented (`python -m benchmarks.<name>`), shrunk by its
own flags; the checks are on the printed tables and JSON, not on timings. Minutes each, so
marked slow (RUN_SLOW=1 runs them):

  RUN_SLOW=1 .venv/bin/python -m pytest -q tests/benchmarks/test_benchmark_scripts.py
"""

import json
import os
import re
import subprocess
import sys

import pytest

from programs import checkpoint_writer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(module, *flags, expect_code=0, timeout=1200):
  """Runs `python -m benchmarks.<module> flags...` from the project root; the finished process."""
  out = subprocess.run([sys.executable, '-m', f'benchmarks.{module}', *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout, check=False)
  assert out.returncode == expect_code, (
      f'{module} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}')
  return out


def _table_rows(text, first_cell):
  """Markdown table rows of `text` whose first cell is `first_cell`, split into cells."""
  rows = []
  for line in text.splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if line.startswith('|') and cells[0] == first_cell:
      rows.append(cells)
  return rows


def test_parallel_runs_rejects_an_unknown_arrangement_in_one_line():
  # No TFF run is started for a bad flag: this one is fast and runs in the default suite.
  out = _run('parallel_runs', '--arrangements=alone,trio', expect_code=2, timeout=300)
  assert out.stderr.strip().splitlines() == [
      'error: --arrangements takes alone, pair, pair_1thread; --skip must be below --rounds']


@pytest.mark.slow
def test_parallel_runs_alone_makes_the_suite_run_and_reports_its_round():
  stdout = _run('parallel_runs', '--suite=cadis', '--run=fedavg', '--rounds=3', '--skip=1',
                '--arrangements=alone').stdout
  result = json.loads(stdout.strip().splitlines()[-1])
  assert (result['suite'], result['run'], result['rounds'], result['skip']) == (
      'cadis', 'fedavg', 3, 1)
  alone = result['results']['alone']
  assert alone['runs'] == 1 and len(alone['round_seconds']) == 1
  assert alone['round_seconds'][0] > 0
  assert alone['rounds_per_second'] == pytest.approx(1 / alone['round_seconds'][0])
  assert 'alone         throughput 1.00x alone' in stdout


def test_round_overhead_server_share_adds_0_epoch_rounds(tmp_path):
  """--server_share: each TFF variant also runs 0-epoch rounds, timed beside the full ones
  and tabulated as the server step's share; no client step was taken in them (the model
  ends where it started); were the flag ignored, none of it would be printed. Small enough for
  the default suite (one variant, 2 clients of 10 examples, 1 + 1 rounds; TFF's own FedAvg is
  not built)."""
  flags = ['--dataset=digits', '--model=tiny_cnn', '--clients=2', '--examples_per_client=10',
           '--batch_size=10', '--rounds=1', '--warmup_rounds=1', '--variants=plain_tf,ours']
  figures = tmp_path / 'figures.json'
  stdout = _run('round_overhead', *flags, '--server_share', f'--json={figures}',
                timeout=600).stdout
  rounds = [l for l in stdout.splitlines() if l.startswith('round ')]
  assert len(rounds) == 2 and all(re.search(r'\bours@0 [0-9.]+s', l) for l in rounds), stdout
  (row,) = _table_rows(stdout, 'ours')
  full, empty, share = float(row[1].split()[0]), float(row[3].split()[0]), row[4]
  assert float(share.split('%')[0]) == pytest.approx(100 * empty / full, rel=0.1)
  moved = re.search(r'^0-epoch rounds: max \|final - initial weights\| ours (\S+)$', stdout,
                    re.M)
  assert moved and float(moved.group(1)) == 0.0, stdout
  # --json: the same medians, and each variant's ratio to plain_tf, for a script to read.
  written = json.loads(figures.read_text())
  assert written['setup']['clients'] == 2 and written['setup']['rounds'] == 1
  assert sorted(written['variants']) == ['ours', 'ours@0', 'plain_tf']
  medians = dict(re.findall(r'(\S+) ([0-9.]+)', stdout.split('median s/round: ')[1].split('\n')[0]))
  for v in ('plain_tf', 'ours'):
    assert written['variants'][v]['median_s'] == pytest.approx(float(medians[v]), abs=6e-4)
  ours = written['variants']['ours']
  assert ours['ratio_to_plain_tf'] == pytest.approx(
      ours['median_s'] / written['variants']['plain_tf']['median_s'])


def test_round_overhead_resident_gives_the_round_as_the_program_runs_it(tmp_path):
  """--resident --checkpoint_every=N: each TFF variant also runs with its state resident (the
  same weights as through process.next) and, interleaved, as the program runs it by default
  (<name>@program: a checkpoint every round, by the program's own
  CheckpointWriter.checkpoint, completed while the next round runs); the round "as the
  program runs it" is given
  at the default cadence (default_ratio_to_plain_tf beside ratio_to_plain_tf in --json) and
  at every N rounds (the resident round plus what checkpoints add, over N). N = 4 here, not
  the default 10: were --checkpoint_every ignored, the figure would differ. A checkpoint made
  in the round loop's thread is timed too, for reference. With --server_share too, the
  0-epoch rounds also run resident (the server step's share as the program runs it) and
  leave the model where it started."""
  figures = tmp_path / 'figures.json'
  stdout = _run('round_overhead', '--dataset=digits', '--model=tiny_cnn', '--clients=2',
                '--examples_per_client=10', '--batch_size=10', '--rounds=1',
                '--warmup_rounds=1', '--variants=plain_tf,ours', '--resident',
                '--server_share', '--checkpoint_every=4', f'--json={figures}',
                timeout=600).stdout
  assert re.search(r'\bours@resident@0 [0-9.]+s', stdout), stdout
  assert re.search(r'\bours@program [0-9.]+s', stdout), stdout
  assert len(_table_rows(stdout, 'ours@resident')) == 1, stdout
  moved = re.search(r'^0-epoch rounds: max \|final - initial weights\| .*ours@resident (\S+)$',
                    stdout, re.M)
  assert moved and float(moved.group(1)) == 0.0, stdout
  diff = re.search(r'^final weights max \|ours@resident - ours\| (\S+);', stdout, re.M)
  assert diff and float(diff.group(1)) == 0.0, stdout
  written = json.loads(figures.read_text())['variants']
  resident, plain = written['ours@resident'], written['plain_tf']['median_s']
  assert resident['checkpoint_every'] == 4 and resident['checkpoint_s'] > 0
  assert resident['snapshot_s'] > 0 and resident['wait_s'] > 0
  # The machine's CPU seconds per round, and what a checkpoint every round adds to them.
  assert written['plain_tf']['cpu_user_s'] >= 0 and written['ours@program']['cpu_user_s'] > 0
  assert resident['checkpoint_cpu_s'] == pytest.approx(
      sum(written['ours@program'][k] for k in ('cpu_user_s', 'cpu_system_s')) -
      sum(written['ours@resident'][k] for k in ('cpu_user_s', 'cpu_system_s')))
  assert re.search(r'^CPU per round \(ours, the machine\'s, user \+ system\): resident '
                   r'[0-9.]+ \+ [0-9.]+ s, default .* the checkpoints add [-+][0-9.]+ s', stdout,
                   re.M), stdout
  # Timed past a run's start: the writer's first versions were written before the rounds.
  assert len(resident['first_writes_s']) == checkpoint_writer.KEEP_VERSIONS
  assert all(t > 0 for t in resident['first_writes_s'])
  # The last version's size: written whole (no tensor of FedAvg's tiny CNN is cut in parts).
  assert resident['version_mb'] > 0 and resident['written_mb'] == resident['version_mb']
  assert re.search(r'the last version [0-9.]+ MB, [0-9.]+ MB of it written anew$', stdout,
                   re.M), stdout
  # A checkpoint every round, as the program makes them, timed in its own interleaved rounds.
  assert resident['default_s'] == pytest.approx(written['ours@program']['median_s'])
  assert resident['default_ratio_to_plain_tf'] == pytest.approx(resident['default_s'] / plain)
  assert 'ratio_to_plain_tf' in resident
  # A checkpoint every 4 rounds (the resident round detaches its state: no refresh).
  assert 'refresh_s' not in resident
  assert resident['program_s'] == pytest.approx(
      resident['median_s'] + (resident['default_s'] - resident['median_s']) / 4)
  assert resident['program_ratio_to_plain_tf'] == pytest.approx(resident['program_s'] / plain)
  # The checkpoint in the round loop's thread, with the state through TFF's values too.
  assert resident['in_loop_program_s'] == pytest.approx(
      resident['median_s'] + resident['checkpoint_s'] / 4)
  values = resident['transfer_values']
  assert values['materialize_s'] > 0
  assert values['program_s'] == pytest.approx(resident['median_s'] + values['checkpoint_s'] / 4)
  line = re.search(r'^as the program runs it \(ours, resident\): default \(a checkpoint every '
                   r'round\) ([0-9.]+) s/round, ([0-9.]+)x plain_tf .*; --checkpoint_every=4: '
                   r'([0-9.]+) s/round, ([0-9.]+)x plain_tf$', stdout, re.M)
  assert line, stdout
  assert float(line.group(1)) == pytest.approx(resident['default_s'], abs=6e-4)
  assert float(line.group(3)) == pytest.approx(resident['program_s'], abs=6e-4)


def test_version_writes_times_both_removal_orders(tmp_path):
  """version_writes writes --versions versions of a --megabytes state in --tensors tensors,
  --pause s apart, in both orders (the oldest removed after a write, or just before the
  next), each keeping the newest KEEP_VERSIONS (under --dir, removed after), and gives the
  ratio of the two orders' median write."""
  keep = checkpoint_writer.KEEP_VERSIONS
  stdout = _run('version_writes', '--megabytes=2', '--tensors=2', f'--versions={keep + 3}',
                '--pause=0.5', f'--dir={tmp_path}', timeout=300).stdout
  assert (f'state: 2 float32 tensors of 262,144 (2.0 MB); {keep + 3} versions in each order, '
          '0.5 s apart' in stdout), stdout
  kept = ', '.join(f'program_state_{v}' for v in range(4, keep + 4))
  for order in ('removed after', 'removed before'):
    assert f'{order}: kept {kept}' in stdout, stdout
  rows = re.findall(r'^version \d+: removed after wall [0-9.]+ s, user [0-9.]+ s, system '
                    r'[0-9.]+ s; removed before wall [0-9.]+ s', stdout, re.M)
  assert len(rows) == keep + 3, stdout
  assert re.search(rf'^median wall from version {keep + 2} on: removed after [0-9.]+ s, '
                   r'removed before [0-9.]+ s; ratio removed after / removed before '
                   r'[0-9.]+x$', stdout, re.M), stdout
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_round_overhead_times_each_variant_against_plain_tf():
  variants = ['plain_tf', 'ours', 'ours@exposed', 'tff', 'fedcross']
  stdout = _run('round_overhead', '--dataset=digits', '--model=tiny_cnn', '--clients=2',
                '--examples_per_client=20', '--batch_size=10', '--rounds=2',
                '--warmup_rounds=1', '--variants=' + ','.join(variants)).stdout
  median_line = next(l for l in stdout.splitlines() if l.startswith('median s/round: '))
  medians = dict(re.findall(r'([\w@]+) ([0-9.]+)', median_line[len('median s/round: '):]))
  assert sorted(medians) == sorted(variants)
  for v in variants[1:]:   # each against plain_tf (medians printed to 3 decimals)
    ratio = re.search(rf'^ratio {v} / plain_tf: ([0-9.]+)x$', stdout, re.M)
    assert ratio, f'no ratio line for {v}'
    assert float(ratio.group(1)) == pytest.approx(
        float(medians[v]) / float(medians['plain_tf']), rel=0.2)
  isolation = re.search(r'^isolation: ours \(worker isolated\) / ours@exposed \(worker on '
                        r'every interface\): ([0-9.]+)x$', stdout, re.M)
  assert isolation and float(isolation.group(1)) == pytest.approx(
      float(medians['ours']) / float(medians['ours@exposed']), rel=0.2)
  assert re.search(r'^round 2 \(', stdout, re.M)   # every timed round is printed
  # Our FedAvg and TFF's do the same arithmetic on the same batches: the same weights.
  diff = re.search(r'^final weights max \|ours - plain_tf\| \S+, max \|ours - tff\| (\S+)$',
                   stdout, re.M)
  assert diff and float(diff.group(1)) == 0.0, stdout


@pytest.mark.slow
def test_protobuf_cost_agrees_on_the_weights_under_both_implementations():
  stdout = _run('protobuf_cost', '--methods=fedavg', '--clients=2',
                '--examples_per_client=20', '--rounds=1', '--repeats=1').stdout
  assert 'final weights identical' in stdout
  rows = _table_rows(stdout, 'fedavg')
  assert len(rows) == 1
  for cell in rows[0][1:]:   # upb s / python s (ratio)
    upb, python, ratio = map(float, re.fullmatch(
        r'([0-9.]+) / ([0-9.]+) \(([0-9.]+)x\)', cell).groups())
    assert ratio == pytest.approx(python / upb, rel=0.05, abs=0.01)


@pytest.mark.slow
def test_fedcda_cache_precision_writes_its_summary(tmp_path):
  output = tmp_path / 'precision.json'
  stdout = _run('fedcda_cache_precision', '--rounds=4', '--warmup_rounds=1',
                '--dataset=digits', '--model=tiny_cnn', '--num_clients=8',
                '--clients_per_round=4', '--dtypes=float16', f'--output={output}').stdout
  with open(output) as f:
    summary = json.load(f)
  assert sorted(summary['last10_accuracy']) == ['float16', 'float32']
  for acc in summary['last10_accuracy'].values():
    assert 0.0 <= acc <= 1.0
  assert 0.0 <= summary['replay_same_selection']['float16'] <= 1.0
  # float16 halves the cache: the aggregator state is about half float32's.
  rows = {r[0]: float(r[1].split()[0]) for r in _table_rows(stdout, 'float16')
          + _table_rows(stdout, 'float32')}
  assert rows['float16'] < 0.6 * rows['float32']


@pytest.mark.slow
@pytest.mark.parametrize('resident', [False, True])
def test_server_scale_reports_a_row_per_n(resident):
  stdout = _run('server_scale', '--method=fedcda', '--num_clients=20,40',
                '--clients_per_round=3', '--rounds=1', '--examples_per_client=10',
                f'--{"" if resident else "no"}resident').stdout
  assert ('rounds through ResidentProcess' in stdout) == resident, stdout[:500]
  state_mb = {}
  for n in ('20', '40'):
    rows = _table_rows(stdout, n)
    assert len(rows) == 1 and not rows[0][1].startswith('refused'), rows
    state_mb[n] = float(rows[0][1])
    full_min, full_median = map(float, rows[0][2].split(' / '))
    assert 0 < full_min <= full_median
    assert float(rows[0][5]) > 0   # worker peak RSS MB
  # FedCDA's cache holds K models per client: its state doubles with N (2.2 -> 4.4 MB).
  assert state_mb['40'] == pytest.approx(2 * state_mb['20'], rel=0.1)


def test_server_scale_times_the_cadis_clustering_step_per_n_and_closure():
  """--method=cadis --server_step at tiny N (no TFF process is built: fast, default suite):
  one row per (N, closure) with positive times, the uploads' cluster sizes and a cluster
  count (two_hop's is computed at these N)."""
  stdout = _run('server_scale', '--method=cadis', '--server_step', '--num_clients=12,30',
                '--clients_per_round=4', '--rounds=2', '--closures=two_hop,components',
                '--with_true_clusters', timeout=600).stdout
  for n in ('12', '30'):
    rows = _table_rows(stdout, n)
    assert [r[1] for r in rows] == ['two_hop', 'components'], stdout
    for row in rows:
      step_min, step_median = map(float, row[3].split(' / '))
      assert 0 < step_min <= step_median and float(row[4]) >= 0
      sizes = [int(v) for v in row[5].split()]
      assert len(sizes) == 4 and all(1 <= v <= int(n) for v in sizes)
      assert 1 <= int(row[6]) <= int(n)
  assert 'load average at end' in stdout


def test_server_scale_refuses_the_removed_cadis_step_spelling_in_one_line():
  out = _run('server_scale', '--method=cadis_step', '--num_clients=12', expect_code=1,
             timeout=300)
  assert out.stderr.strip() == 'error: --method=cadis_step is now --method=cadis --server_step'


@pytest.mark.slow
def test_server_scale_server_step_times_fedcda_step_per_n_with_ratios():
  """--server_step: one row per N (interleaved tf.function calls of FedCDA's cache_round),
  each with its ratio to the first N's step; the state holds the cache and selected_sum.
  Tiny (N = 20 and 40, 3 uploaders, 1 timed call each), but it starts TFF's runtime."""
  stdout = _run('server_scale', '--method=fedcda', '--server_step', '--num_clients=20,40',
                '--clients_per_round=3', '--rounds=1', timeout=600).stdout
  assert re.search(r'^setup: FedCDA server step alone .*\(D=9658\), P=3, K=3', stdout, re.M)
  steps, state_mb = {}, {}
  for n in ('20', '40'):
    (row,) = _table_rows(stdout, n)
    state_mb[n] = float(row[1])
    step_min, step_median = map(float, row[2].split(' / '))
    assert 0 < step_min <= step_median and float(row[4]) > 0 and float(row[5]) > 0
    steps[n] = (step_min, float(row[3]))
  assert steps['20'][1] == 1.0
  # The ratio is printed to 2 decimals from unrounded times; the times to 4 decimals (about
  # a millisecond here): it must lie within what that rounding allows.
  (a, ratio), (b, _) = steps['40'], steps['20']
  half = 5e-5
  assert (a - half) / (b + half) - 0.005 <= ratio <= (a + half) / (b - half) + 0.005
  # K = 3 float32 models per client plus the 8·D-byte selected_sum and bookkeeping
  d = 9658
  for n in ('20', '40'):
    assert state_mb[n] == pytest.approx((4 * int(n) * 3 * d + 8 * d) / 2**20, rel=0.02)


@pytest.mark.slow
def test_value_transfer_moves_each_size_and_times_both_serialisers():
  stdout = _run('value_transfer', '--megabytes=1,4', '--repeats=1').stdout
  for mb in ('1', '4'):
    assert len(_table_rows(stdout, mb)) == 1
  assert re.search(r'serialising a \d+ MB nested server state .*TFF [0-9.]+ s, '
                   r'execution.serialize_value [0-9.]+ s, [0-9.]+x', stdout)


@pytest.mark.slow
def test_worker_memory_reports_each_variant_round_by_round():
  stdout = _run('worker_memory', '--rounds=2', '--refresh_every=0,direct').stdout
  never, direct = _table_rows(stdout, 'never'), _table_rows(stdout, 'direct')
  assert len(never) == 1 and len(direct) == 1
  for row in never + direct:
    gb = [float(c.split()[0]) for c in row[1:-1]]
    assert gb and all(g > 0.1 for g in gb), row   # the worker holds at least the model


def test_linear_fit_of_round_time_over_clients():
  # In a fresh interpreter: importing the script defines its absl flags (--rounds, ...), which
  # would clash with the training program's in this test process.
  code = ('import json; from benchmarks import clients_per_round as c; print(json.dumps(['
          'c.linear_fit([10, 50, 100], [0.5 + 0.002 * p for p in (10, 50, 100)]), '
          'c.linear_fit([1, 2, 3], [1.0, 1.0, 2.0])]))')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=True)
  fit, bent = json.loads(out.stdout.strip().splitlines()[-1])
  assert fit['slope_ms'] == pytest.approx(2.0)
  assert fit['intercept_s'] == pytest.approx(0.5)
  assert fit['max_relative_gap'] == pytest.approx(0.0, abs=1e-9)
  assert bent['max_relative_gap'] > 0.1


@pytest.mark.slow
def test_clients_per_round_fits_each_variant_over_p(tmp_path):
  out = tmp_path / 'sweep.json'
  stdout = _run('clients_per_round', '--clients=2,3', '--variants=plain_tf,ours,tff',
                '--rounds=1', '--warmup_rounds=1', f'--json={out}').stdout
  written = json.loads(out.read_text())
  assert sorted(written['runs']) == ['2', '3']
  assert sorted(written['fits']) == ['ours', 'plain_tf', 'tff']
  rows = {v: _table_rows(stdout, v) for v in ('plain_tf', 'ours', 'tff')}
  assert all(len(r) == 1 for r in rows.values()), stdout
  (tff_row,) = rows['tff']
  assert float(tff_row[-1]) == pytest.approx(1.0)   # TFF's slope against itself


def test_worker_peak_reports_the_workers_peak_memory_and_the_exit_code(tmp_path):
  """worker_peak.sh runs a command, keeps its output and appends its exit code and the TFF
  worker's peak memory (a small TFF computation: its worker has a nonzero VmHWM)."""
  log = tmp_path / 'run.log'
  code = ('import time, tensorflow_federated as tff; from tff_algos import execution; '
          'execution.initialize_runtime(); '
          'print(tff.tensorflow.computation(lambda: 1)()); time.sleep(2)')
  out = subprocess.run(['bash', 'benchmarks/worker_peak.sh', str(log), '--', sys.executable,
                        '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       check=False)
  assert out.returncode == 0, out.stderr
  text = log.read_text()
  assert '1\n' in text
  peak = re.search(r'^rc=0 worker_peak_kB=(\d+)$', text, re.M)
  assert peak and int(peak.group(1)) > 10_000, text[-500:]
  failing = subprocess.run(['bash', 'benchmarks/worker_peak.sh', str(log), '--', sys.executable,
                            '-c', 'raise SystemExit(3)'], cwd=ROOT, timeout=60, check=False)
  assert failing.returncode == 3 and 'rc=3 worker_peak_kB=0' in log.read_text()


@pytest.mark.slow
def test_clients_together_prints_each_models_equality_and_pfors_loops():
  result = json.loads(_run('clients_together').stdout.strip().splitlines()[-1])
  assert [(r['model'], r['momentum']) for r in result['equality']] == [
      ('fedavg_cnn', None), ('fedavg_cnn', 0.9), ('mlp_2nn', None), ('mlp_2nn', 0.9)]
  assert all(r['weight_difference'] < 1e-4 and r['sum_difference'] < 1e-4
             for r in result['equality'])
  assert result['pfor_loops'] == {
      'fedavg_cnn': ['Conv2D', 'Conv2DBackpropFilter', 'Conv2DBackpropInput'], 'mlp_2nn': []}


CHECKPOINT_RUNS = ('overlap_1', 'overlap_2', 'steady_1', 'steady_2', 'drop_before_1',
                   'drop_before_2', 'thread_removes_1', 'thread_removes_2', 'parts_1', 'parts_2',
                   'integrity_1', 'integrity_2')


@pytest.mark.parametrize('argv', [['--added', *CHECKPOINT_RUNS], ['parts_1', 'parts_2'],
                                  ['integrity_1', 'integrity_2']])
def test_results_checkpoint_tables_are_the_scripts_output(argv, capsys):
  # No TF: reads the committed round_overhead logs and RESULTS.md only.
  from benchmarks import checkpoint_cost  # pylint: disable=g-import-not-at-top
  assert checkpoint_cost.main(argv) == 0
  with open(os.path.join(ROOT, 'benchmarks', 'results', 'RESULTS.md')) as f:
    page = f.read()
  missing = [row for row in capsys.readouterr().out.splitlines() if row not in page]
  assert not missing, f'RESULTS.md lacks what `python -m benchmarks.checkpoint_cost ' \
                      f'{" ".join(argv)}` prints: {missing}'


def test_checkpoint_cost_names_a_missing_log_in_one_line(capsys):
  from benchmarks import checkpoint_cost  # pylint: disable=g-import-not-at-top
  assert checkpoint_cost.main(['no_such_run']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: no log for no_such_run')
  assert checkpoint_cost.main([]) == 2


def test_checkpoint_cost_adds_the_default_cadence_over_the_resident_round():
  from benchmarks import checkpoint_cost  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, 'benchmarks', 'results', 'logs',
                         'round_overhead_2026-12-07_parts_1.json')) as f:
    variants = json.load(f)['variants']
  fedcda = variants['fedcda@resident']
  want = 100 * (fedcda['default_s'] - fedcda['median_s']) / variants['plain_tf']['median_s']
  assert checkpoint_cost.added_percent(variants, 'fedcda') == pytest.approx(want)
  assert round(want, 1) == 4.1  # RESULTS.md's FedCDA figure of parts_1
