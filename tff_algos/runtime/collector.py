"""Python's garbage collector kept out of TFF's calls.

Once TFF has built and compiled its computations the interpreter tracks about a million
objects, and every round leaves some in reference cycles, so the collector would run full
passes over that heap in the middle of a round. Freeze what lives as long as the program
once the first calls are compiled, and pause the collector during each TFF call
(benchmarks/results/RESULTS.md, "Round overhead").
"""

import contextlib
import gc


def freeze_long_lived_objects() -> int:
  """Collects, then moves every object alive now out of the collector's sight.

  Call once the processes are built and their first calls compiled (everything alive then
  lives as long as the program). Returns the number of objects frozen.
  """
  gc.collect()
  gc.freeze()
  return gc.get_freeze_count()


@contextlib.contextmanager
def collector_paused():
  """No garbage collection during the block; a collection right after it.

  Cheap after `freeze_long_lived_objects` (only the young objects are traversed); without
  the freeze it still keeps the pause out of the TFF call itself. Nested blocks pause
  once: only the outermost collects.
  """
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was_enabled:
      gc.enable()
      gc.collect()
