"""absl's flag errors in every binary: one `error:` line (absl's message, with its "Did you
mean" suggestion), exit 2, before TensorFlow is imported (programs/flag_parsing.py)."""

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One binary of each kind: the training program, the study program, a benchmark.
BINARIES = {'programs.train': '--client_dropout', 'programs.study': '--output_dir',
            'benchmarks.compare': '--suite'}


def _run(module, *args):
  """Runs `module` as __main__ with `args`; stdout's last line says whether TF was loaded."""
  code = ('import atexit, runpy, sys; '
          'atexit.register(lambda: print("TF" if "tensorflow" in sys.modules else "no TF")); '
          f'sys.argv = [{module!r}, *{list(args)!r}]; '
          f'runpy.run_module({module!r}, run_name="__main__")')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


@pytest.mark.parametrize('module', list(BINARIES))
def test_an_unknown_flag_is_one_line_with_a_suggestion(module):
  flag = BINARIES[module]
  result = _run(module, flag + 'x=1')
  assert result.returncode == 2, result
  assert result.stderr == (f"error: Unknown command line flag '{flag[2:]}x'. "
                           f'Did you mean: {flag[2:]} ?\n'), result.stderr
  assert result.stdout.strip() == 'no TF'


def test_a_bad_value_is_one_line():
  result = _run('programs.train', '--client_dropout=abc')
  assert result.returncode == 2
  assert result.stderr == ("error: flag --client_dropout=abc: could not convert string to "
                           "float: 'abc'\n"), result.stderr
  assert result.stdout.strip() == 'no TF'


def test_every_binary_parses_its_flags_through_flag_parsing():
  """No file runs absl's app.run itself (whose errors are FATAL lines and exit 1)."""
  binaries = []
  for path in glob.glob(os.path.join(ROOT, '*', '*.py')):
    text = open(path).read()
    if "if __name__ == '__main__':" in text and re.search(r'^from absl import', text, re.M):
      binaries.append(os.path.relpath(path, ROOT))
      assert not re.search(r'\bapp\.run\(', text), path
      assert 'flag_parsing.run(' in text or 'flag_parsing.parse(' in text, path
  assert {'programs/train.py', 'programs/study.py', 'benchmarks/compare.py'} <= set(binaries)
