"""BUILD lists every Python file, and Bazel can parse it when Bazel is installed."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_files():
  for package in ('tff_algos', 'data', 'programs', 'tests', 'benchmarks'):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
      dirnames[:] = [d for d in dirnames if not d.startswith(('.', '__'))]
      for f in filenames:
        if f.endswith('.py'):
          yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def test_every_python_file_belongs_to_a_target():
  build = open(os.path.join(ROOT, 'BUILD')).read()
  listed = set(re.findall(r'"([\w/]+\.py)"', build))
  missing = sorted(set(_python_files()) - listed)
  assert not missing, f'not in BUILD (run python scripts/gen_build.py): {missing}'


def test_build_is_current():
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'gen_build.py'),
                           '--check'], capture_output=True, text=True)
  assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which('bazel') is None, reason='bazel not installed')
def test_bazel_query_succeeds(tmp_path):
  result = subprocess.run(['bazel', f'--output_user_root={tmp_path}', 'query', '//...'],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert '//:tff_algos' in result.stdout and '//:train' in result.stdout
