"""Entry point of every Bazel `py_test`: runs pytest on the test files given as arguments.

The test files have no `__main__` (pytest collects them), so a `py_test` whose `main` were the
test file itself would import it, run nothing and pass. scripts/gen_build.py makes this file
the `main` of every `py_test` and passes the test file in `args`; pytest's exit code is the
test's (1 for a failure, 5 when nothing was collected).
"""

import sys

import pytest

# No cache directory: Bazel's runfiles tree is not the place to write one.
PYTEST_FLAGS = ('-q', '-p', 'no:cacheprovider')


def main(argv):
  if not argv:
    print('error: pass the test files to run, e.g. tests/test_build.py', file=sys.stderr)
    return 2
  return int(pytest.main([*PYTEST_FLAGS, *argv]))


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
