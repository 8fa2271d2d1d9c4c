"""Shared pytest setup: quiet TensorFlow before it is imported, and import from the checkout."""

import os
import sys

os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
