"""The flags both study binaries take, defined once so one process may import both
(`python -m programs.study` and the papers' `python -m benchmarks.compare`)."""

from absl import flags

ONLY = flags.DEFINE_list(
    'only', [], 'Only these runs, by name (every seed): `programs.study run|plan` (and in '
    '`plan` the tuning points of their grids); `benchmarks.compare` (with --probes, the runs '
    'of its probes).')
