"""absl's flag parsing with the programs' own error form: one `error:` line, exit 2.

absl's `app.run` reports a bad value (`--client_dropout=abc`) or an unknown flag with
`FATAL Flags parsing error`, a usage hint and exit 1; every other bad input of the programs
is one line and exit 2. Every binary (`programs.train`, `programs.study`, the benchmarks)
starts with `flag_parsing.run(main)` instead of `app.run(main)`. Standard library and absl
only: a flag error stops the program before TensorFlow is imported.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from absl import app
from absl import flags

EXIT_CODE = 2


def parse(argv: list[str], flag_values: Optional[flags.FlagValues] = None) -> list[str]:
  """`flag_values(argv)` (default: absl's FLAGS): the arguments left; on a flag error, its
  message (absl's, with its "Did you mean" suggestion) as one `error:` line, exit 2."""
  flag_values = flags.FLAGS if flag_values is None else flag_values
  try:
    return flag_values(argv)
  except flags.Error as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    sys.exit(EXIT_CODE)


def run(main: Callable[[list[str]], Optional[int]],
        check: Optional[Callable[[list[str]], None]] = None) -> None:
  """`app.run(main)` with flag errors as one line, exit 2; `check(argv)`, if given, runs
  before parsing (a binary's own early refusal, e.g. a removed flag value)."""

  def parser(argv):
    if check is not None:
      check(argv)
    return parse(argv)

  app.run(main, flags_parser=parser)
