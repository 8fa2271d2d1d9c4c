"""Shared pytest setup: quiet TensorFlow before it is imported, and import from the checkout."""

import os
import sys

os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  """Slow reproduction runs are skipped unless RUN_SLOW=1 (see docs/reproduction.md)."""
  del config
  if os.environ.get('RUN_SLOW') == '1':
    return
  skip = pytest.mark.skip(reason='slow reproduction run: set RUN_SLOW=1 to run it')
  for item in items:
    if 'slow' in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope='session', autouse=True)
def _stop_tff_workers():
  """Tests start TFF worker processes; none may outlive the session."""
  yield
  if 'tff_algos.execution' in sys.modules:
    sys.modules['tff_algos.execution'].shutdown_workers()
