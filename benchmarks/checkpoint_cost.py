"""RESULTS.md's tables of what the program's checkpoints cost a round, from round_overhead's
`--json` logs (benchmarks/results/logs/round_overhead_<run>.json, `--resident` runs).

  .venv/bin/python -m benchmarks.checkpoint_cost --added overlap_1 overlap_2 ...
      one row per method: what a checkpoint every round adds to the resident round, in % of
      the plain-TF round (the default-cadence round less the resident round, medians);
  .venv/bin/python -m benchmarks.checkpoint_cost parts_1 parts_2 ...
      per run and method: the round through `process.next`, the resident round, the default
      cadence (a checkpoint every round) and what it adds, a checkpoint every 10 rounds, the
      checkpoint's own parts of the round loop, and the last version's size.

Run names are the logs' names less `round_overhead_` and `.json`; a name without a date is
read as 2026-12-07's. Reads JSON only: no TensorFlow.
"""

import json
import os
import sys

LOGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'logs')
METHODS = (('ours', 'FedAvg'), ('fedcross', 'FedCross'), ('fedcda', 'FedCDA'),
           ('cadis_nokd', 'CADIS (λ = 0)'), ('scaffold', 'SCAFFOLD'))
DEFAULT_DATE = '2026-12-07'


def log_name(run: str) -> str:
  return f'round_overhead_{run if run[:4].isdigit() else f"{DEFAULT_DATE}_{run}"}'


def read(run: str) -> dict:
  with open(os.path.join(LOGS, log_name(run) + '.json')) as f:
    return json.load(f)['variants']


def _signed(x: float, digits: int = 1) -> str:
  text = f'{x:+.{digits}f}'
  return text.replace('-', '\u2212')


def added_percent(variants: dict, method: str) -> float:
  """What a checkpoint every round adds to `method`'s resident round, in % of plain TF's."""
  resident = variants[f'{method}@resident']
  return (resident['default_s'] - resident['median_s']) / variants['plain_tf']['median_s'] * 100


def added_rows(runs) -> list:
  rows = ['| method | ' + ' | '.join(f'`{r}`' for r in runs) + ' |',
          '|---|' + '---|' * len(runs)]
  figures = [read(r) for r in runs]
  for method, name in METHODS:
    rows.append(f'| {name} | ' + ' | '.join(
        _signed(added_percent(v, method)) + '%' for v in figures) + ' |')
  return rows


def run_rows(run: str) -> list:
  variants = read(run)
  rows = []
  for i, (method, name) in enumerate(METHODS):
    resident = variants[f'{method}@resident']
    first = (f'[`{run}`](logs/{log_name(run)}.log) (plain TF '
             f'{variants["plain_tf"]["median_s"]:.3f} s)' if i == 0 else '')
    rows.append(
        f'| {first} | {name} | {variants[method]["ratio_to_plain_tf"]:.2f}x | '
        f'{resident["ratio_to_plain_tf"]:.2f}x | '
        f'**{resident["default_ratio_to_plain_tf"]:.2f}x** '
        f'({_signed(added_percent(variants, method))}%) | '
        f'{resident["program_ratio_to_plain_tf"]:.2f}x | '
        f'{resident["snapshot_s"]:.3f} + {resident["wait_s"]:.3f} | '
        f'{resident["written_mb"]:.1f} of {resident["version_mb"]:.1f} |')
  return rows


def main(argv) -> int:
  added = argv[:1] == ['--added']
  runs = argv[1:] if added else argv
  if not runs:
    print('error: name the runs, e.g. `python -m benchmarks.checkpoint_cost parts_1 parts_2`'
          ' (their logs: benchmarks/results/logs/round_overhead_<date>_<run>.json)',
          file=sys.stderr)
    return 2
  missing = [r for r in runs if not os.path.exists(os.path.join(LOGS, log_name(r) + '.json'))]
  if missing:
    print(f'error: no log for {", ".join(missing)} in {LOGS}; the runs there: '
          + ', '.join(sorted(n[len('round_overhead_'):-len('.json')] for n in os.listdir(LOGS)
                             if n.startswith('round_overhead_') and n.endswith('.json'))),
          file=sys.stderr)
    return 2
  rows = added_rows(runs) if added else [row for run in runs for row in run_rows(run)]
  print('\n'.join(rows))
  return 0

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
