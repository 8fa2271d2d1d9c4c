"""benchmarks/client_training_vs_pytorch.py at tiny settings: its flags, the TF side without
PyTorch, the profile, and (given an interpreter with PyTorch) the PyTorch side.

No timing is checked: the runs check that each side runs, the figures are written, and that
the sides do the same work. PyTorch is never needed by these tests: the run without it points
--torch_python at this interpreter (the project's, which has no torch); the PyTorch side runs
only when TFF_ALGOS_TORCH_PYTHON names an interpreter with torch, e.g.

  TFF_ALGOS_TORCH_PYTHON=/work/torchvenv/bin/python .venv/bin/python -m pytest -q \\
      tests/benchmarks/test_client_training_vs_pytorch.py
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_PYTHON = os.environ.get('TFF_ALGOS_TORCH_PYTHON')
# Digits, 2 clients x 10 examples, batch 5: two steps per client epoch.
TINY = ('--dataset=digits', '--clients=2', '--examples_per_client=10', '--batch_sizes=5')


def _run(*flags, expect_code=0):
  out = subprocess.run([sys.executable, '-m', 'benchmarks.client_training_vs_pytorch', *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
  assert out.returncode == expect_code, f'exit {out.returncode}:\n{out.stdout}\n{out.stderr}'
  return out


@pytest.mark.parametrize('flag, says', [
    ('--models=vgg16', '--models takes fedavg_cnn, simple_cnn, mlp_2nn, resnet20'),
    ('--batch_sizes=7', '--batch_sizes positive integers dividing --examples_per_client'),
    ('--tf_intra_op_threads=-1', 'tf_intra_op_threads'),
])
def test_a_bad_flag_is_one_error_line(flag, says):
  out = _run('--examples_per_client=200', flag, expect_code=2)   # 200: every default batch
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and says in lines[0], out.stderr


def test_without_torch_the_tf_side_runs_and_says_how_to_get_torch(tmp_path):
  """--torch_python without torch: the how-to line, and ours and plain TF still timed (the
  same FedAvg: equal final weights); the thread flags reach TF here and the TFF worker."""
  if importlib.util.find_spec('torch') is not None:
    pytest.skip('this interpreter has torch: the run without it needs one that has not')
  figures = tmp_path / 'figures.json'
  out = _run(*TINY, '--models=mlp_2nn', '--rounds=1', '--warmup_rounds=1',
             f'--torch_python={sys.executable}', '--tf_intra_op_threads=1',
             '--tf_inter_op_threads=2', '--max_concurrent_computation_calls=3',
             f'--json={figures}')
  assert f'PyTorch is not importable by {sys.executable}: the torch column is skipped' \
      in out.stdout
  assert re.search(r'round 0 \(warm-up\): .*ours', out.stdout), out.stdout
  assert re.search(r'round 1 \(timed\): ', out.stdout) and 'round 2' not in out.stdout
  written = json.loads(figures.read_text())
  setup = written['setup']
  assert (setup['dataset'], setup['clients'], setup['examples_per_client']) == ('digits', 2, 10)
  assert (setup['tf_intra_op_threads'], setup['tf_inter_op_threads']) == (1, 2)
  assert setup['worker'] == dict(intra_op_threads='1', inter_op_threads='2',
                                 max_concurrent_computation_calls='3')
  assert setup['torch'] is None
  [setting] = written['settings']
  assert (setting['model'], setting['batch_size']) == ('mlp_2nn', 5)
  assert sorted(setting['median_s']) == ['ours', 'plain_tf']
  assert all(t > 0 for t in setting['median_s'].values())
  assert setting['ratio_ours_to_plain_tf'] == pytest.approx(
      setting['median_s']['ours'] / setting['median_s']['plain_tf'])
  # 64 inputs -> 200 -> 200 -> 10.
  assert setting['params'] == dict(trainable=64 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10,
                                   non_trainable=0)
  assert setting['plain_tf_moved_max_abs'] > 1e-4   # the rounds trained
  assert setting['ours_vs_plain_tf_max_abs_difference'] < 1e-5
  assert '| mlp_2nn | 5 |' in out.stdout and '| - | - | - |' in out.stdout


def test_seed_picks_the_clients_and_client_lr_the_step(tmp_path):
  """--seed=1 trains seed 1's clients (not seed 0's), and --client_lr=0 leaves both TF sides'
  weights where they started."""
  from benchmarks import fedavg_rounds  # pylint: disable=g-import-not-at-top
  from benchmarks.method_builds import load_data  # pylint: disable=g-import-not-at-top
  figures = tmp_path / 'figures.json'
  _run(*TINY, '--models=mlp_2nn', '--rounds=1', '--warmup_rounds=0', '--seed=1',
       '--client_lr=0', f'--torch_python={sys.executable}', f'--json={figures}')
  written = json.loads(figures.read_text())
  digits = load_data('digits')
  digest = {seed: fedavg_rounds.clients_sha256(*fedavg_rounds.client_split(digits, 2, 10, seed))
            for seed in (0, 1)}
  assert digest[0] != digest[1]
  assert written['setup']['clients_sha256'] == digest[1]
  [setting] = written['settings']
  assert setting['plain_tf_moved_max_abs'] == 0
  assert setting['ours_vs_plain_tf_max_abs_difference'] == 0


def test_profile_gives_the_ops_and_the_overhead_of_a_client_epoch(tmp_path):
  figures = tmp_path / 'figures.json'
  out = _run(*TINY, '--models=mlp_2nn', '--profile', f'--json={figures}')
  assert re.search(r'one client epoch, 2 steps, .* ms/step = ops .* ms \+ framework overhead',
                   out.stdout), out.stdout
  [setting] = json.loads(figures.read_text())['settings']
  profile = setting['profile']
  assert profile['steps'] == 2 and 'median_s' not in setting
  assert profile['step_ms'] == pytest.approx(
      profile['ops_ms_per_step'] + profile['overhead_ms_per_step'])
  ops = [o['op'] for o in profile['ops']]
  # The backward pass's MatMul, and the forward Dense + ReLU that Grappler fuses.
  assert 'MatMul' in ops and '_FusedMatMul' in ops, profile
  assert '| MatMul |' in out.stdout


@pytest.mark.skipif(not TORCH_PYTHON, reason='set TFF_ALGOS_TORCH_PYTHON to an interpreter '
                    'with PyTorch (e.g. /work/torchvenv/bin/python) to run the torch side')
def test_the_torch_twins_match_and_train_as_tf_does(tmp_path):
  """Each twin has the Keras model's weight counts; one client step, and its epoch (two
  steps), from the same weights in the same batch order land within float32 rounding of plain
  TF's (fedavg_cnn: 'same' padding and the flattened features' order; resnet20: stride-2
  'same' convolutions, BatchNorm, option-A shortcuts); the torch side is timed and
  --torch_threads reaches it. (simple_cnn's 'valid' convolutions need more than digits' 8x8
  inputs.)"""
  figures = tmp_path / 'figures.json'
  out = _run(*TINY, '--models=fedavg_cnn,mlp_2nn,resnet20', '--rounds=1',
             '--warmup_rounds=0', f'--torch_python={TORCH_PYTHON}', '--torch_threads=1',
             f'--json={figures}')
  del out
  written = json.loads(figures.read_text())
  assert written['setup']['torch']['threads'] == 1
  settings = {s['model']: s for s in written['settings']}
  # fedavg_cnn on 8x8x1 ('same', two 2x2 poolings: 2x2x64 features), counted by hand.
  assert settings['fedavg_cnn']['params']['trainable'] == (
      5 * 5 * 32 + 32 + 5 * 5 * 32 * 64 + 64 + 2 * 2 * 64 * 512 + 512 + 512 * 10 + 10)
  assert settings['resnet20']['params']['non_trainable'] > 0
  for name, s in settings.items():
    assert s['torch_params'] == s['params'], name
    assert s['step_max_abs_difference'] <= 1e-5, name
    assert s['epoch_max_abs_difference'] <= 1e-3, name
    assert s['median_s']['torch'] > 0, name
    assert s['ratio_ours_to_torch'] == pytest.approx(
        s['median_s']['ours'] / s['median_s']['torch'])


# Run by the PyTorch interpreter: the twin's forward pass against NumPy on the Keras layout
# (Flatten's (h, w, c) order, read by a twin that flattens (c, h, w)), and the simulator's
# round against the NumPy example-weighted mean of its clients' epochs.
_TWIN_CHECK = '''
import json, sys
import numpy as np
sys.path.insert(0, 'benchmarks')
import torch_twins
rng = np.random.default_rng(0)
sizes = (4, 8)
def dense(n_in, n_out):
  return [rng.normal(0, 0.3, (n_in, n_out)).astype(np.float32),
          rng.normal(0, 0.1, n_out).astype(np.float32)]
layers = [('fc1', dense(24, 200)), ('fc2', dense(200, 200)), ('classifier', dense(200, 10))]
xs = [rng.normal(size=(n, 4, 3, 2)).astype(np.float32) for n in sizes]
ys = [rng.integers(0, 10, n).astype(np.int32) for n in sizes]
sim = torch_twins.Simulator('mlp_2nn', (4, 3, 2), 10, layers, xs, ys, 0.1, 2)
h = xs[1].reshape(len(xs[1]), -1)
for _, (kernel, bias) in layers[:2]:
  h = np.maximum(h @ kernel + bias, 0)
logits = h @ layers[2][1][0] + layers[2][1][1]
forward = float(np.abs(sim.model(sim.xs[1]).detach().numpy() - logits).max())
orders = [rng.permutation(n)[None] for n in sizes]
trained = []
for client in range(2):
  sim.train_client(client, orders[client])
  trained.append({k: v.detach().numpy().copy() for k, v in sim.model.state_dict().items()})
sim.round(orders)
mean = max(float(np.abs(sim.global_state[k].numpy()
                        - (sizes[0] * trained[0][k] + sizes[1] * trained[1][k]) / sum(sizes)).max())
           for k in trained[0])
moved = max(float(np.abs(trained[1][k] - w.T).max()) for k, w in
            (('fc2.weight', layers[1][1][0]), ('classifier.weight', layers[2][1][0])))
print(json.dumps(dict(forward=forward, mean=mean, moved=moved)))
'''


@pytest.mark.skipif(not TORCH_PYTHON, reason='set TFF_ALGOS_TORCH_PYTHON to an interpreter '
                    'with PyTorch (e.g. /work/torchvenv/bin/python) to run the torch side')
def test_the_twin_reads_keras_weights_and_the_round_is_the_weighted_mean():
  out = subprocess.run([TORCH_PYTHON, '-c', _TWIN_CHECK], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=False)
  assert out.returncode == 0, out.stderr
  checks = json.loads(out.stdout.strip().splitlines()[-1])
  assert checks['forward'] < 1e-4, checks
  assert checks['moved'] > 1e-3 and checks['mean'] < 1e-6, checks


def test_results_md_shows_the_committed_runs_figures():
  """RESULTS.md's issue-87 figures are the committed logs' own: the two default runs and the
  two oneDNN runs as the benchmark's table() prints them, each lever run's medians, and the
  profiled epoch's seconds with oneDNN off and on."""
  logs = os.path.join(ROOT, 'benchmarks', 'results', 'logs')
  with open(os.path.join(ROOT, 'benchmarks', 'results', 'RESULTS.md')) as f:
    page = f.read()
  load = lambda name: json.load(open(os.path.join(
      logs, f'client_training_vs_pytorch_{name}.json')))['settings']
  code = ('import json, sys; from benchmarks import client_training_vs_pytorch as b; '
          'print("\\n".join(b.table(json.load(sys.stdin))))')
  for name in ('default_1', 'default_2', 'onednn', 'onednn_2'):
    out = subprocess.run([sys.executable, '-c', code], input=json.dumps(load(name)), cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    for row in out.stdout.splitlines()[2:]:
      assert row in page, (name, row)
  for name in ('intra1', 'intra1_inter1', 'calls1', 'calls2_intra1'):
    for f in load(name):
      m = f['median_s']
      assert (f'{m["ours"]:.3f} / {m["plain_tf"]:.3f} / {m["torch"]:.3f} | '
              f'{f["ratio_ours_to_torch"]:.2f}x') in page, (name, f['batch_size'])
  profiles = {name: {f['batch_size']: f['profile']['wall_s'] for f in load(name)}
              for name in ('profile', 'profile_onednn')}
  for batch, off in profiles['profile'].items():
    assert f'| {batch} | {off:.3f} s | {profiles["profile_onednn"][batch]:.3f} s |' in page, batch
