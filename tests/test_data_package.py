"""The data layer has one import name, `tff_algos.data`: the checkout's top-level `data/`
folder cannot be imported as `data`, so a process never holds two copies of its classes."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code):
  code = f'import sys; sys.path.insert(0, {ROOT!r}); {code}'
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def test_importing_top_level_data_fails_naming_tff_algos_data():
  for code in ('import data', 'import data.partitioners', 'from data import IidPartitioner'):
    out = _run(code)
    assert out.returncode != 0, code
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('ImportError: import the data layer as tff_algos.data'), (code, last)


def test_tff_algos_data_imports():
  out = _run('from tff_algos import data; import tff_algos.data.partitioners as p; '
             'assert data.IidPartitioner is p.IidPartitioner; '
             'print(data.IidPartitioner.__module__, "data" in sys.modules)')
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ['tff_algos.data.partitioners', 'False']
