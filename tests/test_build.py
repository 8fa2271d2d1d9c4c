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


def _py_libraries():
  """{name: (srcs, deps)} of every py_library in BUILD."""
  build = open(os.path.join(ROOT, 'BUILD')).read()
  libraries = {}
  for body in re.findall(r'^py_library\(\n(.*?)^\)', build, flags=re.M | re.S):
    name = re.search(r'name = "(\w+)"', body).group(1)
    srcs = re.findall(r'"([\w/]+\.py)"', body)
    deps = re.search(r'deps = \[(.*?)\]', body, flags=re.S)
    libraries[name] = (srcs, set(re.findall(r'":(\w+)"', deps.group(1))) if deps else set())
  return libraries


def test_every_library_depends_on_the_first_party_packages_it_imports():
  """A library importing another of our packages must list it in deps (Bazel's sandbox
  would otherwise lack it); e.g. data/__init__ imports tff_algos.execution."""
  libraries = _py_libraries()
  package_target = {'tff_algos': 'tff_algos', 'data': 'data', 'programs': 'programs_lib'}
  for name, (srcs, deps) in libraries.items():
    for src in srcs:
      source = open(os.path.join(ROOT, src)).read()
      imported = set(re.findall(r'^\s*(?:from|import) (tff_algos|data|programs)\b', source,
                                flags=re.M))
      for package in imported:
        target = package_target[package]
        assert target == name or target in deps, (
            f'{src} imports {package} but py_library {name} lacks deps ":{target}" '
            '(run python scripts/gen_build.py)')


def _py_tests():
  """{name: {attribute: value source}} of every py_test in BUILD."""
  build = open(os.path.join(ROOT, 'BUILD')).read()
  tests = {}
  for body in re.findall(r'^py_test\(\n(.*?)^\)', build, flags=re.M | re.S):
    attributes = dict(re.findall(r'^    (\w+) = (.*),$', body, flags=re.M))
    tests[attributes['name'].strip('"')] = attributes
  return tests


def test_every_py_test_runs_pytest_on_its_file():
  tests = _py_tests()
  test_files = sorted(p for p in _python_files()
                      if os.path.basename(p).startswith('test_') and p.startswith('tests/'))
  # Named by the path under tests/ (tests/benchmarks/test_suite_runs.py:
  # benchmarks_test_suite_runs), so that files of one name in two folders are two targets.
  names = {p: os.path.splitext(os.path.relpath(p, 'tests'))[0].replace('/', '_')
           for p in test_files}
  assert sorted(tests) == sorted(names.values())
  assert any('/' in os.path.relpath(p, 'tests') for p in test_files)   # subfolders walked
  for path in test_files:
    attributes = tests[names[path]]
    # A test file has no __main__: as `main` it would be imported, run nothing and pass.
    assert attributes['main'] == '"tests/pytest_main.py"', path
    assert attributes['args'] == f'["{path}"]', path
    assert attributes['srcs'] == f'["{path}", "tests/pytest_main.py"]', path


@pytest.mark.parametrize('body, exit_code, summary', [
    ('def test_ok():\n  assert True\n', 0, '1 passed'),
    ('def test_bad():\n  assert False\n', 1, '1 failed'),
    ('def helper():\n  pass\n', 5, 'no tests ran'),
])
def test_pytest_main_runs_the_given_file(tmp_path, body, exit_code, summary):
  """The py_test entry point runs pytest on its argument and fails when pytest does
  (exit 5 when nothing was collected, so an empty test target cannot pass)."""
  test_file = tmp_path / 'test_probe.py'
  test_file.write_text(body)
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'pytest_main.py'),
                           str(test_file)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == exit_code, result.stdout + result.stderr
  assert summary in result.stdout


def test_pytest_main_without_a_file_is_an_error():
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'pytest_main.py')],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1


# Bazel sets TEST_SRCDIR for the tests it runs: its sandbox cannot start another Bazel.
@pytest.mark.skipif(shutil.which('bazel') is None or 'TEST_SRCDIR' in os.environ,
                    reason='bazel not installed, or running under bazel test')
def test_bazel_query_succeeds(tmp_path):
  bazel = ['bazel', f'--output_user_root={tmp_path}']
  try:
    result = subprocess.run(bazel + ['query', '//...'], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
  finally:  # Bazel leaves its server running for hours otherwise
    subprocess.run(bazel + ['shutdown'], cwd=ROOT, capture_output=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert '//:tff_algos' in result.stdout and '//:train' in result.stdout
