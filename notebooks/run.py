"""Executes the notebooks top to bottom: the one way their committed outputs are made.

    .venv/bin/python notebooks/run.py                     # full scale, outputs written back
    .venv/bin/python notebooks/run.py --scale=ci          # the test suite's small run, no writes
    .venv/bin/python notebooks/run.py 1_quickstart.ipynb  # one notebook

The scale is the notebooks' one parameter, the environment variable `SCALE_ENV`; the kernel
inherits it, so the code cells are the same at both scales. A full run stamps the digest of
the notebook's code cells into its metadata: tests/test_notebooks.py checks that the
committed code is exactly the code that produced the committed outputs, and executes that
same code at CI scale.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))
SCALE_ENV = 'TFF_ALGOS_NOTEBOOK_SCALE'
SCALES = ('full', 'ci')
NOTEBOOKS = ('1_quickstart.ipynb', '2_your_tff_pipeline.ipynb', '3_inside_the_methods.ipynb')
FIGURE_TAG = 'figure'  # cells tagged so must show a plot (image/png) when executed
METADATA_KEY = 'tff_algos'


def code_digest(notebook) -> str:
  """sha256 over the sources of the code cells, in order."""
  h = hashlib.sha256()
  for cell in notebook.cells:
    if cell.cell_type == 'code':
      h.update(cell.source.encode())
      h.update(b'\0')
  return h.hexdigest()


def figure_cells(notebook) -> list:
  return [c for c in notebook.cells
          if c.cell_type == 'code' and FIGURE_TAG in c.get('metadata', {}).get('tags', [])]


def has_image(cell) -> bool:
  return any('image/png' in out.get('data', {}) for out in cell.get('outputs', []))


def execute(path: str, scale: str, timeout: int = 1800):
  """Runs the notebook at `path` in a fresh kernel at `scale`; returns (notebook, seconds)."""
  if scale not in SCALES:
    raise ValueError(f'scale must be one of {SCALES}, got {scale!r}')
  notebook = nbformat.read(path, as_version=4)
  previous = {k: os.environ.get(k) for k in (SCALE_ENV, 'TF_CPP_MIN_LOG_LEVEL')}
  os.environ[SCALE_ENV] = scale  # the kernel inherits this process's environment
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  start = time.time()
  try:
    NotebookClient(notebook, timeout=timeout, kernel_name='python3',
                   resources={'metadata': {'path': os.path.dirname(os.path.abspath(path))}}
                   ).execute()
  finally:
    for key, value in previous.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  return notebook, time.time() - start


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('notebooks', nargs='*', default=list(NOTEBOOKS))
  parser.add_argument('--scale', choices=SCALES, default='full')
  args = parser.parse_args(argv)
  for name in args.notebooks:
    path = name if os.path.exists(name) else os.path.join(HERE, name)
    notebook, seconds = execute(path, args.scale)
    missing = [i for i, c in enumerate(notebook.cells) if c in figure_cells(notebook)
               and not has_image(c)]
    print(f'{os.path.basename(path)}: {args.scale} scale, {seconds:.0f} s'
          + (f', figure cells without a plot: {missing}' if missing else ''), flush=True)
    if args.scale == 'full':
      notebook.metadata[METADATA_KEY] = {'scale': 'full', 'code_sha256': code_digest(notebook),
                                         'seconds': round(seconds)}
      nbformat.write(notebook, path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
