"""The wheel: it installs `tff_algos` with the data layer as `tff_algos.data`, and the
README's "Using a builder in your own TFF code" example runs from outside the checkout.

The wheel is built from a copy of the sources (so the checkout gets no build/ directory),
installed with `pip --target` into a temporary directory (the shared venv is untouched),
and the README's first example under that heading runs in a fresh interpreter whose working
directory is a temporary directory, with only that target on PYTHONPATH.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example() -> str:
  with open(os.path.join(ROOT, 'README.md')) as f:
    text = f.read()
  section = text.split('## Using a builder in your own TFF code', 1)[1]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  src = tmp_path_factory.mktemp('src')
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), src / name)
  for package in ('tff_algos', 'data'):
    shutil.copytree(os.path.join(ROOT, package), src / package, symlinks=True,
                    ignore=shutil.ignore_patterns('__pycache__'))
  wheels = tmp_path_factory.mktemp('wheels')
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                  '-q', '-w', str(wheels), str(src)], check=True)
  [wheel] = list(wheels.iterdir())
  target = tmp_path_factory.mktemp('site')
  subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-index', '-q',
                  '--target', str(target), str(wheel)], check=True)
  return target


def run_outside(code, target, cwd):
  env = dict(os.environ, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL='3')
  return subprocess.run([sys.executable, '-c', code], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=900)


def test_wheel_holds_the_data_layer_under_tff_algos(installed, tmp_path):
  assert set(os.listdir(installed / 'tff_algos' / 'data')) >= {
      '__init__.py', 'client_data_adapter.py', 'round_sampling.py', 'datasets.py',
      'loaders.py', 'partitioners.py'}
  assert not (installed / 'data').exists()  # no clash-prone top-level `data`
  out = run_outside(
      'import tff_algos, tff_algos.data as d, sys\n'
      'print(tff_algos.__file__); print(d.ClientDataInputs.__module__); '
      'print("data" in sys.modules)', installed, tmp_path)
  assert out.returncode == 0, out.stderr
  path, module, top_level = out.stdout.split()
  assert path.startswith(str(installed))
  assert module == 'tff_algos.data.client_data_adapter' and top_level == 'False'


def test_readme_example_runs_outside_the_checkout(installed, tmp_path):
  out = run_outside(readme_example(), installed, tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip(), 'the example prints the trained classifier bias'
