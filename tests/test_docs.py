"""README.md and docs/: short pages, every relative link resolves, the examples run.

README.md is the quick start (at most 200 lines); each docs/ page starts with a title and
what it is for, and holds at most 400 lines. The minimal-call and per-client evaluation
blocks of docs/tff_integration.md run in a fresh interpreter (README's own example runs from an
installed wheel in tests/test_packaging.py). Every text file of the repository (code, docs,
.json data, run records) names only pages and `../` paths that exist in it.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs')
PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
    os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith('.md'))
# A markdown link or image target: ](target) with no spaces.
LINK = re.compile(r'\]\(([^)\s]+)\)')


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def relative_links(text: str) -> list:
  """The link targets of a page that name a file in the repository (no URL, no bare anchor),
  without their #anchor. Code blocks are skipped."""
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  targets = [t.split('#')[0] for t in LINK.findall(text)]
  return [t for t in targets if t and not re.match(r'[a-z]+:', t)]


def test_relative_links_finds_what_a_page_links():
  text = ('[a](docs/methods.md#x) ![b](fig.png) [c](https://x.org/y) [d](#anchor)\n'
          '```bash\n[e](not/a/link.md)\n```\n')
  assert relative_links(text) == ['docs/methods.md', 'fig.png']


@pytest.mark.parametrize('page', PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_every_relative_link_resolves(page):
  missing = [t for t in relative_links(_read(page))
             if not os.path.exists(os.path.join(os.path.dirname(page), t))]
  assert not missing, missing


def test_pages_are_short_and_say_what_they_are_for():
  assert len(_read(PAGES[0]).split('\n')) <= 200
  assert len(PAGES) >= 7
  for page in PAGES[1:]:
    lines = _read(page).split('\n')
    assert len(lines) <= 400, page
    assert lines[0].startswith('# ') and lines[1] == '' and lines[2] and not lines[2].startswith(
        ('#', '|', '-', '```')), f'{page}: a title, then a paragraph saying what it is for'


def test_readme_links_every_docs_page():
  readme = _read(PAGES[0])
  for page in PAGES[1:]:
    assert f'](docs/{os.path.basename(page)})' in readme, page


def _python_block(page: str, heading: str) -> str:
  section = _read(os.path.join(DOCS, page)).split(f'## {heading}\n', 1)[1]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_each_builders_minimal_call_runs(tmp_path):
  """Every builder of the methods table is called there with its required arguments only."""
  import inspect  # pylint: disable=g-import-not-at-top
  import tff_algos  # pylint: disable=g-import-not-at-top
  from programs import methods  # pylint: disable=g-import-not-at-top
  code = _python_block('tff_integration.md', "Each builder's minimal call")
  builders = {m.builder.__name__ for m in methods.METHODS.values()}
  assert len(builders) >= 10
  for name in sorted(builders | {'build_fedlex_exploration'}):
    call = re.search(rf'tff_algos\.{name}\((.*?)\)[,\n]', code, re.S)
    assert call, f'{name} has no minimal call in docs/tff_integration.md'
    required = [p for p, v in inspect.signature(getattr(tff_algos, name)).parameters.items()
                if v.default is inspect.Parameter.empty and v.kind in (
                    v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
    named = re.findall(r'(\w+)=', call.group(1))
    positional = len([a for a in call.group(1).split(',') if '=' not in a and a.strip()])
    assert set(required[positional:]) <= set(named), (name, required, call.group(1))
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  accuracy, loss = map(float, out.stdout.split())
  assert 0 <= accuracy <= 1 and loss > 0


def test_per_client_evaluation_example_runs(tmp_path):
  code = _python_block('tff_integration.md', 'Per-client evaluation')
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  counts, figures = out.stdout.strip().split('\n')[-2:]
  # Every example of every client counted (its batches read back whole), each at its index.
  assert counts.split() == [str(12 + 4 * i) for i in range(6)]
  mean, p10, evaluated = figures.split()
  assert 0 <= float(p10) <= float(mean) <= 1 and evaluated == '6'


# --------------------------------------------------------------------------- #
# The code map and the names of pages
# --------------------------------------------------------------------------- #

MAPPED_FOLDERS = ('tff_algos', 'data', 'programs', 'benchmarks', 'scripts')
SKIPPED_DIRS = {'.venv', '.git', '__pycache__', 'node_modules'}


def _walk(top: str):
  """(dirpath, filenames) under `top`, skipping SKIPPED_DIRS and symlinked folders (the
  checkout's `tff_algos/data` is `data/` again)."""
  for dirpath, dirnames, filenames in os.walk(top):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith('.')
                         and not os.path.islink(os.path.join(dirpath, d)))
    yield dirpath, sorted(filenames)


def test_every_module_is_on_the_code_map():
  """A module of the mapped folders without a line in docs/architecture.md fails."""
  page = _read(os.path.join(DOCS, 'architecture.md'))
  missing = []
  for folder in MAPPED_FOLDERS:
    for dirpath, filenames in _walk(os.path.join(ROOT, folder)):
      for name in filenames:
        if not name.endswith('.py'):
          continue
        path = os.path.relpath(os.path.join(dirpath, name), ROOT)
        module = path[:-len('.py')].replace(os.sep, '.')
        if f'`{path}`' not in page and f'`{module}`' not in page:
          missing.append(path)
  assert not missing, f'add a line for each to docs/architecture.md: {missing}'


# A name ending in .md, as prose or code names a page (matched from the start of a run of
# name characters only: linear in the text, which includes megabytes of run records).
MD_NAME = re.compile(r'(?<![\w./-])[\w./-]*\w\.md\b')
# Names of pages that are not in the repository, each with its reason: keep it tiny.
EXTERNAL_PAGES = {
    'page.md': 'tests/test_generated_files.py writes it in a temporary folder',
    'toy/results.md': "tests/benchmarks/test_report.py's toy suite, in a temporary folder",
    'not/a/link.md': 'tests/test_docs.py: a link inside a code block, which must not count',
    'benchmarks/RESULTS.md': 'an archived page under benchmarks/results/cadis/earlier_runs/, '
                             'kept as it was written',
}


def _text(path: str):
  """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
  with open(path, 'rb') as f:
    data = f.read()
  if b'\0' in data:
    return None
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError:
    return None


def _scanned_files() -> dict:
  """{path: text} of every text file of the repository (code, docs, data and run records)."""
  out = {}
  for dirpath, filenames in _walk(ROOT):
    for name in filenames:
      path = os.path.join(dirpath, name)
      text = _text(path)
      if text is not None:
        out[path] = text
  return out


def _resolves(name: str, source: str, basenames: set) -> bool:
  """Beside `source`, at the root, or, for a bare file name (a generated page such as a
  suite's results.md, named by its kind), anywhere in the repository."""
  if any(os.path.exists(os.path.normpath(os.path.join(base, name)))
         for base in (os.path.dirname(source), ROOT)):
    return True
  bare = re.sub(r'^(\.\./|\./|/)+', '', name)
  return ('/' not in bare and bare in basenames) or bare in EXTERNAL_PAGES


def test_md_name_finds_page_names():
  text = 'see docs/algorithms.md#fedcda, (methods.md) and `../README.md`; not a.mdx nor b.md5'
  assert MD_NAME.findall(text) == ['docs/algorithms.md', 'methods.md', '../README.md']


def test_every_named_page_exists():
  """Every `*.md` name in a text file of the repository (code, docs, .json, .csv, logs...)
  resolves (`_resolves`) or is in EXTERNAL_PAGES."""
  files = _scanned_files()
  basenames = {os.path.basename(f) for f in files}
  unresolved = []
  for path, text in files.items():
    for name in set(MD_NAME.findall(text)) if '.md' in text else ():
      if not _resolves(name, path, basenames):
        unresolved.append(f'{os.path.relpath(path, ROOT)}: {name}')
  assert not unresolved, sorted(unresolved)


# A relative path that climbs out of its folder, as a file names another file or folder.
CLIMBING_PATH = re.compile(r'(?<![\w./-])(?:\.\./)+[\w.-]*\w(?:/[\w.-]*\w)*')
# Climbing paths that name what exists only elsewhere, each with its reason: keep it tiny.
ELSEWHERE = {
    '../REPRODUCTION.md': "a link in a suite's page, written under benchmarks/results/<suite>/",
    '../fedprox_pull.md': "a link in a suite's page, written under benchmarks/results/<suite>/",
    '../base.toml': "tests/test_study.py's study files, in a temporary folder",
    '../toy/results.md': "tests/benchmarks/test_report.py's toy suite, in a temporary folder",
    '../escaped_by_name': "tests/test_train_program.py's --experiment_name that is refused",
}


def test_no_file_names_a_path_outside_the_repository():
  """Every `../` path in a text file of the repository names something in it (beside the
  file or from the root) or is in ELSEWHERE: nothing points at a folder of the machine the
  project was written on."""
  outside = []
  for path, text in _scanned_files().items():
    for name in set(CLIMBING_PATH.findall(text)) if '../' in text else ():
      targets = [os.path.normpath(os.path.join(base, name))
                 for base in (os.path.dirname(path), ROOT)]
      if name not in ELSEWHERE and not any(
          t.startswith(ROOT + os.sep) and os.path.exists(t) for t in targets):
        outside.append(f'{os.path.relpath(path, ROOT)}: {name}')
  assert not outside, sorted(outside)


def test_climbing_path_finds_climbing_paths():
  up = '..' + '/'   # (not written out: this file is scanned too)
  text = f'the papers in {up}shared/seeds), `{up}{up}README.md` and ./x, not a{up}b.'
  assert CLIMBING_PATH.findall(text) == [f'{up}shared/seeds', f'{up}{up}README.md']

