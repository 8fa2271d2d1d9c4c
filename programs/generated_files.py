"""Writing the project's generated text: atomic replacement, and blocks between markers.

Generated pages (docs/methods.md's flag table, README.md's reproduction status, the results
pages under benchmarks/results/) are rewritten by programs that may run side by side; a
reader, or a second writer, must never see half a file. Importing this module imports
neither TensorFlow nor TFF.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np


@contextlib.contextmanager
def replacing(path: str):
  """A temporary path (this process's own) that replaces `path` when the block ends."""
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically."""
  with replacing(path) as tmp:
    with open(tmp, 'w') as f:
      f.write(text)


def write_json(path: str, value) -> None:
  """Writes `value` to `path` atomically as JSON (indented, keys sorted, a final newline): the
  form of every committed record (tuned.json, the diagnoses' measurements, --json figures)."""
  write_text(path, json.dumps(value, indent=1, sort_keys=True) + '\n')


def with_block(text: str, begin: str, end: str, body: str) -> str:
  """`text` with what lies between the marker lines `begin` and `end` replaced by `body`.

  `body` is whole lines (each ending in a newline). A page that lost a marker is an error
  naming it, not a page silently left stale.
  """
  for marker in (begin, end):
    if marker not in text:
      raise ValueError(f'the page has lost its marker {marker!r}: restore it from git')
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f'{head}{begin}\n{body}{end}{tail}'


def json_ready(value):
  """`value` as a page's JSON holds it: keys as strings, tuples as lists, numpy numbers as
  Python's, and a number that is not finite (a figure not measured) as null."""
  if isinstance(value, dict):
    return {str(k): json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_ready(v) for v in value]
  if isinstance(value, (np.floating, np.integer)):
    value = value.item()
  if isinstance(value, float) and not np.isfinite(value):
    return None
  return value
