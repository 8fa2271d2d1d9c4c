"""The code map's rules (docs/architecture.md, "The layers"), checked on every .py file.

A file's imports are read from its syntax tree, function-level ones included, with the
modules it names by string: a constant name given to `importlib.import_module`,
`runpy.run_module` or `__import__`, a constant `module:attribute` string naming one of the
project's packages (a builder reference, a study's page writer), and the keys of a lazy
export table (`_EXPORTS`). Study files' `report` keys are checked too. Also here: each
package's docstring names each of its modules, and `tff_algos/runtime/__init__.py` says
truly which of its modules import TensorFlow.
"""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The layer of each top-level folder (`data/` is the package `tff_algos.data`).
FOLDERS = ('tff_algos', 'data', 'programs', 'benchmarks', 'tests', 'scripts')
# What each layer never imports.
NEVER = {
    'library': {'data', 'programs', 'benchmarks', 'tests'},
    'data': {'programs', 'benchmarks', 'tests'},
    'programs': {'benchmarks', 'tests'},
    'benchmarks': {'tests'},
}
# All the data layer takes of the library: the exit hook that stops TFF's workers, the
# lazy exports, and the shared names without TensorFlow (the client input's fields).
DATA_TAKES = {'tff_algos.execution', 'tff_algos._lazy_exports', 'tff_algos.constants'}
# The runtime modules data, programs and benchmarks may import by their own name: the
# server state's, which import TensorFlow (programs' round loop and checkpoints use them).
# Everything else of the runtime is reached through `tff_algos.execution`.
RUNTIME_BY_NAME = {'resident_state', 'state_transfer', 'saved_model_template', 'bundle_parts'}
# Files that reach another runtime module, each with its reason: keep it tiny.
RUNTIME_EXCEPTIONS = {
    ('benchmarks/value_transfer.py', 'tff_algos.runtime.serialization'):
        "times TFF's own serializer (a private name) against ours",
}
MODULE_ATTRIBUTE = re.compile(r'([A-Za-z_]\w*(?:\.\w+)*):([A-Za-z_]\w*)')
LOADERS = {'import_module', 'run_module', '__import__'}


def _files() -> list:
  """Every .py file of the project's folders, relative to ROOT (the checkout's symlink
  `tff_algos/data` skipped: it is `data/`)."""
  out = []
  for folder in FOLDERS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
      dirnames[:] = sorted(d for d in dirnames if d != '__pycache__'
                           and not os.path.islink(os.path.join(dirpath, d)))
      out += [os.path.relpath(os.path.join(dirpath, f), ROOT)
              for f in sorted(filenames) if f.endswith('.py')]
  return out


def _module_of(path: str) -> str:
  """The module a file is imported as (data/x.py: tff_algos.data.x)."""
  parts = path[:-len('.py')].split(os.sep)
  if parts[0] == 'data':
    parts = ['tff_algos'] + parts
  if parts[-1] == '__init__':
    parts = parts[:-1]
  return '.'.join(parts)


def _is_module(name: str) -> bool:
  parts = name.split('.')
  if parts[:2] == ['tff_algos', 'data']:
    parts = parts[1:]
  base = os.path.join(ROOT, *parts)
  return os.path.exists(base + '.py') or os.path.exists(os.path.join(base, '__init__.py'))


def layer(module: str):
  """The layer of a module name; None for one not the project's."""
  top = module.split('.')[0]
  if module == 'tff_algos.data' or module.startswith('tff_algos.data.'):
    return 'data'
  if top == 'tff_algos':
    return 'library'
  if top == 'data':
    return 'bare data'   # (which fails: data/ is only tff_algos.data)
  return top if top in FOLDERS else None


def imports(path: str, source: str = None) -> set:
  """The modules the file imports, by statement or by a string naming them (module doc)."""
  if source is None:
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
      source = f.read()
  tree = ast.parse(source)
  own = _module_of(path)
  package = own if path.endswith('__init__.py') else own.rpartition('.')[0]
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join(anchor + ([base] if base else []))
      for alias in node.names:
        found.add(f'{base}.{alias.name}' if _is_module(f'{base}.{alias.name}') else base)
    elif isinstance(node, ast.Call):
      name = getattr(node.func, 'attr', getattr(node.func, 'id', None))
      if (name in LOADERS and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)):
        found.add(node.args[0].value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      match = MODULE_ATTRIBUTE.fullmatch(node.value)
      if match and layer(match.group(1)):
        found.add(match.group(1))
    elif isinstance(node, ast.Assign) and any(
        getattr(t, 'id', None) == '_EXPORTS' for t in node.targets) and isinstance(
            node.value, ast.Dict):
      found.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
  return found


FILES = _files()


def test_imports_reads_statements_and_strings():
  source = ('from tff_algos import data\nfrom . import generated_files\nimport importlib\n'
            'def f():\n  from benchmarks import report\n'
            '  importlib.import_module("benchmarks.federations")\n'
            'BUILDER = "tff_algos.fedcross:build_fedcross"\nNOT = "a:b"\n'
            '_EXPORTS = {"tff_algos.runtime.resident_state": ("ResidentProcess",)}\n')
  assert imports('programs/x.py', source) == {
      'tff_algos.data', 'programs.generated_files', 'importlib', 'benchmarks.report',
      'benchmarks.federations', 'tff_algos.fedcross', 'tff_algos.runtime.resident_state'}
  assert imports('data/x.py', 'from .. import execution\nfrom .leaf import load_leaf\n') == {
      'tff_algos.execution', 'tff_algos.data.leaf'}


def test_no_layer_imports_one_above_it():
  upward = []
  for path in FILES:
    own = layer(_module_of(path))
    for module in imports(path):
      theirs = layer(module)
      if theirs == 'bare data' or theirs in NEVER.get(own, ()):
        upward.append(f'{path}: {module}')
      elif own == 'data' and theirs == 'library' and module not in DATA_TAKES:
        upward.append(f'{path}: {module} (data takes only {sorted(DATA_TAKES)})')
  assert not upward, upward


def test_the_runtime_is_reached_as_the_map_says():
  """Outside the library (tests aside) the runtime is `tff_algos.execution`, and the server
  state's modules by name."""
  stray = []
  for path in FILES:
    if layer(_module_of(path)) in ('library', 'tests'):
      continue
    for module in imports(path):
      parts = module.split('.')
      if (parts[:2] == ['tff_algos', 'runtime'] and (len(parts) < 3 or parts[2] not in
                                                      RUNTIME_BY_NAME)
          and (path, module) not in RUNTIME_EXCEPTIONS):
        stray.append(f'{path}: {module}')
  assert not stray, f'import these through tff_algos.execution: {stray}'


def test_a_study_files_report_is_run_by_its_own_layer():
  """A `report` naming benchmarks' writer is in a file of benchmarks/ (run by
  benchmarks.study); no study file names one of tests/; every named module exists."""
  wrong = []
  for dirpath, _, filenames in os.walk(ROOT):
    if any(part.startswith('.') for part in os.path.relpath(dirpath, ROOT).split(os.sep)):
      continue
    for name in filenames:
      if not name.endswith('.toml') or name == 'pyproject.toml':
        continue
      path = os.path.relpath(os.path.join(dirpath, name), ROOT)
      with open(os.path.join(ROOT, path), 'rb') as f:
        report = tomllib.load(f).get('report')
      if not report:
        continue
      module = report.split(':')[0]
      theirs = layer(module)
      if (theirs == 'tests' or (theirs == 'benchmarks' and not path.startswith('benchmarks'))
          or (theirs and not _is_module(module))):
        wrong.append(f'{path}: {report}')
  assert not wrong, wrong


def test_programs_study_refuses_a_benchmarks_writer_in_one_line(study_command):
  result = study_command('report', 'benchmarks/studies/fedcda.toml')
  assert result.returncode == 2
  assert result.stderr.startswith(
      'error: benchmarks/studies/fedcda.toml report: "benchmarks.report:write_study_pages" '
      'is a module of benchmarks/, which programs never import; run a paper suite\'s file '
      'with `python -m benchmarks.study`'), result.stderr
  assert len(result.stderr.splitlines()) == 1


def _packages() -> list:
  return sorted({os.path.dirname(p) for p in FILES if p.endswith('__init__.py')})


@pytest.mark.parametrize('package', _packages())
def test_each_packages_docstring_names_its_modules(package):
  with open(os.path.join(ROOT, package, '__init__.py'), encoding='utf-8') as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ''
  names = [n[:-len('.py')] for n in os.listdir(os.path.join(ROOT, package))
           if n.endswith('.py') and n != '__init__.py']
  names += [n for n in os.listdir(os.path.join(ROOT, package))
            if os.path.isfile(os.path.join(ROOT, package, n, '__init__.py'))
            and not os.path.islink(os.path.join(ROOT, package, n))]
  missing = sorted(n for n in names if f'`{n}`' not in doc)
  assert not missing, f'{package}/__init__.py: name these in its docstring: {missing}'


TF = ('tensorflow', 'tensorflow_federated')


def _imports_tensorflow(module: str, seen=None) -> bool:
  """Whether importing the project's `module` imports TensorFlow (its module-level imports,
  followed through the project's modules)."""
  seen = set() if seen is None else seen
  if module in seen:
    return False
  seen.add(module)
  path = os.path.join(*module.split('.'))
  path = path + '.py' if os.path.exists(os.path.join(ROOT, path + '.py')) else os.path.join(
      path, '__init__.py')
  with open(os.path.join(ROOT, path), encoding='utf-8') as f:
    tree = ast.parse(f.read())
  top_level = set()
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      top_level |= imports(path, ast.unparse(node))
  parents = {'.'.join(module.split('.')[:i]) for i in range(1, len(module.split('.')))}
  return any(m.split('.')[0] in TF or (layer(m) == 'library' and _imports_tensorflow(m, seen))
             for m in top_level | parents)


def test_the_runtime_says_truly_which_modules_import_tensorflow():
  """runtime/__init__.py: "Importing this package, `a`, ... does not import TensorFlow (...);
  `b`, ... do." Checked from the modules' imports, and the TF-free ones by importing them."""
  with open(os.path.join(ROOT, 'tff_algos', 'runtime', '__init__.py'), encoding='utf-8') as f:
    doc = ast.get_docstring(ast.parse(f.read()))
  free, heavy = re.search(r'Importing this package, (.*?)\s+does not import\s+TensorFlow'
                          r'.*?; (.*?)\s+do\.', doc, re.S).groups()
  free, heavy = (set(re.findall(r'`(\w+)`', part)) for part in (free, heavy))
  modules = {n[:-len('.py')] for n in os.listdir(os.path.join(ROOT, 'tff_algos', 'runtime'))
             if n.endswith('.py') and n != '__init__.py'}
  assert free | heavy == modules and not free & heavy
  assert {m for m in modules if _imports_tensorflow(f'tff_algos.runtime.{m}')} == heavy
  code = ('import sys\n' + ''.join(f'import tff_algos.runtime.{m}\n' for m in sorted(free)) +
          'import tff_algos.execution\nprint(sorted(m for m in sys.modules if m in '
          f'{TF!r}))')
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == '[]', result.stdout
