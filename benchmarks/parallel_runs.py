"""Two training runs side by side: TensorFlow's default thread pools against one thread each.

`benchmarks/reproduce.sh` with JOBS=2 runs two `compare` commands at once, each with its own
TFF `worker_binary`, and TensorFlow sizes each worker's intra-op and inter-op thread pools to
every core: on 2 cores the two workers run twice as many compute threads as there are cores.
The worker binary reads TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS. This runs one
suite run (by default the CADIS suite's FedAvg run, at its tuned rate) for a few rounds in
three arrangements, one after another in one invocation, each in fresh processes:

  alone         one run, default thread pools
  pair          two runs at once, default thread pools
  pair_1thread  two runs at once, each worker with one intra-op and one inter-op thread

and prints, per arrangement, the whole round (metrics.csv's round_seconds: training,
evaluation and the rest of the round but the checkpoint; the median over the rounds after
`--skip`) and the throughput, rounds per wall-clock second summed over its runs, with each
one's ratio to `alone`. Run it on idle cores: each arrangement shares the machine with
nothing but itself. Results: benchmarks/results/RESULTS.md, "Two runs side by side".

  .venv/bin/python -m benchmarks.parallel_runs --rounds=25
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


from absl import flags

from programs import flag_parsing  # pylint: disable=g-import-not-at-top
import numpy as np

from benchmarks import suites

ARRANGEMENTS = {   # name: (runs at once, environment of each run)
    'alone': (1, {}),
    'pair': (2, {}),
    'pair_1thread': (2, {'TF_NUM_INTRAOP_THREADS': '1', 'TF_NUM_INTEROP_THREADS': '1'}),
}

_SUITE = flags.DEFINE_enum('suite', 'cadis', list(suites.SUITES), 'Suite of the run.')
_RUN = flags.DEFINE_string('run', 'fedavg', 'The suite\'s run (its tuned settings).')
_ROUNDS = flags.DEFINE_integer('rounds', 25, 'Rounds per run.', lower_bound=2)
_SKIP = flags.DEFINE_integer('skip', 3, 'First rounds left out of the median (the first '
                             'traces and compiles).', lower_bound=1)
_ARRANGEMENTS = flags.DEFINE_list('arrangements', list(ARRANGEMENTS),
                                  f'Arrangements, in order: {", ".join(ARRANGEMENTS)}.')
_CHILD = flags.DEFINE_string('child', '', 'Internal: make one run in this directory.')


def _child(exp_dir: str) -> None:
  from programs import experiment  # pylint: disable=g-import-not-at-top
  suite = suites.SUITES[_SUITE.value]
  fields = dict(suite.config_overrides(_RUN.value, suites.load_tuned(suite.name)),
                rounds=_ROUNDS.value)
  experiment.run_experiment(suites.experiment_config(
      fields, 0, os.path.dirname(exp_dir), os.path.basename(exp_dir)))


def _arrangement(name: str, root: str) -> dict:
  """Makes the arrangement's runs at once; their whole-round medians and throughput."""
  count, env = ARRANGEMENTS[name]
  dirs = [os.path.join(root, f'{name}_{i}') for i in range(count)]
  logs = [d + '.log' for d in dirs]
  children = []
  for d, log in zip(dirs, logs):
    with open(log, 'w') as f:   # a file, not a pipe: nothing waits on the other run's output
      children.append(subprocess.Popen(
          [sys.executable, '-m', 'benchmarks.parallel_runs', f'--child={d}',
           f'--suite={_SUITE.value}', f'--run={_RUN.value}', f'--rounds={_ROUNDS.value}'],
          env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=f))
  codes = [child.wait() for child in children]   # every run ends before any is judged
  for code, log in zip(codes, logs):
    if code:
      with open(log) as f:
        last = (f.read().strip().splitlines() or ['(no output)'])[-1]
      raise RuntimeError(f'{name}: a run failed: {last}')
  from programs.studies import records  # pylint: disable=g-import-not-at-top
  medians = [float(np.median(records.metrics_column(records.metrics_rows(d)[_SKIP.value:],
                                                   'round_seconds'))) for d in dirs]
  return dict(runs=count, round_seconds=medians,
              rounds_per_second=float(sum(1 / m for m in medians)))


def main(argv):
  del argv
  if _CHILD.value:
    _child(_CHILD.value)
    return 0
  unknown = sorted(set(_ARRANGEMENTS.value) - set(ARRANGEMENTS))
  if unknown or _SKIP.value >= _ROUNDS.value:
    print(f'error: --arrangements takes {", ".join(ARRANGEMENTS)}; --skip must be below '
          '--rounds', file=sys.stderr)
    return 2
  results = {}
  with tempfile.TemporaryDirectory() as root:
    for name in _ARRANGEMENTS.value:
      results[name] = _arrangement(name, root)
      r = results[name]
      print(f'{name:13s} {r["runs"]} run(s): whole round '
            + ', '.join(f'{s:.2f}' for s in r['round_seconds'])
            + f' s (median of rounds {_SKIP.value + 1}-{_ROUNDS.value}); '
            f'{r["rounds_per_second"]:.3f} rounds/s', flush=True)
  if 'alone' in results:
    base = results['alone']['rounds_per_second']
    for name, r in results.items():
      print(f'{name:13s} throughput {r["rounds_per_second"] / base:.2f}x alone')
  print(json.dumps(dict(suite=_SUITE.value, run=_RUN.value, rounds=_ROUNDS.value,
                        skip=_SKIP.value, results=results)))
  return 0


if __name__ == '__main__':
  flag_parsing.run(lambda argv: sys.exit(main(argv)))
