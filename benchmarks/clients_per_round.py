"""Round time against clients per round P: what each extra client costs, ours and TFF's.

For each P of --clients, runs `benchmarks/round_overhead.py` once on P digits-sized clients
(its variants interleaved round by round in that one process, so load hits all alike) and
reads its --json. Prints, per variant, the median s/round at each P, the least-squares slope
of s/round over P (the cost one more client adds, in ms), the largest relative gap between
the measured times and that line (how far from linear in P), and each slope's ratio to the
slope of TFF's `build_weighted_fed_avg` (variant tff). The per-client overhead over the
plain-TF loop doing the same local work is (slope - plain_tf's slope).

  .venv/bin/python -m benchmarks.clients_per_round --clients=10,50,100

Timings are only figures on idle cores; the script prints the load average of each run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from programs import flag_parsing
from programs import generated_files  # pylint: disable=g-import-not-at-top

_CLIENTS = flags.DEFINE_list('clients', ['10', '50', '100'], 'Clients per round, each P a run.')
_VARIANTS = flags.DEFINE_list('variants', ['plain_tf', 'ours', 'tff', 'fedcross', 'cadis'],
                              'round_overhead.py variants; plain_tf is always included.')
_MODEL = flags.DEFINE_string('model', 'tiny_cnn', 'Model of every variant.')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 10, 'Examples per client (digits-sized '
                                 'clients: 1,797 digits over 100+ clients is ~10-18 each).')
_BATCH = flags.DEFINE_integer('batch_size', 10, 'Local batch size.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per P.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed rounds per P first.')
_JSON = flags.DEFINE_string('json', None, 'Also write every P\'s figures and the fits here.')


def linear_fit(ps, seconds) -> dict:
  """Least-squares line of s/round over P: its slope (ms per client), intercept (s) and the
  largest relative gap between a measured time and the line."""
  ps, seconds = np.asarray(ps, float), np.asarray(seconds, float)
  slope, intercept = np.polyfit(ps, seconds, 1)
  gap = np.max(np.abs(seconds - (slope * ps + intercept)) / seconds)
  return dict(slope_ms=1e3 * float(slope), intercept_s=float(intercept),
              max_relative_gap=float(gap))


def main(argv):
  del argv
  try:
    ps = sorted({int(p) for p in _CLIENTS.value})
  except ValueError:
    raise app.UsageError(f'--clients takes integers, got {",".join(_CLIENTS.value)}')
  if len(ps) < 2 or ps[0] < 1:
    raise app.UsageError('--clients needs at least two distinct counts >= 1')
  variants = ['plain_tf'] + [v for v in _VARIANTS.value if v != 'plain_tf']
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    for p in ps:
      out = os.path.join(tmp, f'{p}.json')
      cmd = [sys.executable, '-m', 'benchmarks.round_overhead', '--dataset=digits',
             f'--model={_MODEL.value}', f'--clients={p}',
             f'--examples_per_client={_EXAMPLES.value}', f'--batch_size={_BATCH.value}',
             f'--rounds={_ROUNDS.value}', f'--warmup_rounds={_WARMUP.value}',
             '--variants=' + ','.join(variants), f'--json={out}']
      print('$ ' + ' '.join(cmd[1:]), flush=True)
      done = subprocess.run(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            capture_output=True, text=True, check=False)
      if done.returncode:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-3000:])
        print(f'error: round_overhead.py failed at --clients={p} (exit {done.returncode}); '
              'its output is above', file=sys.stderr)
        return 1
      with open(out) as f:
        runs[p] = json.load(f)
      print(f'P = {p}: load average {runs[p]["setup"]["load_average"]:.1f}', flush=True)
  fits = {v: linear_fit(ps, [runs[p]['variants'][v]['median_s'] for p in ps]) for v in variants}
  print('\n| variant | ' + ' | '.join(f's/round P={p}' for p in ps) +
        ' | ms per extra client | largest gap to the line | overhead over plain_tf, ms/client |'
        ' slope / TFF\'s |')
  print('|---|' + '---|' * (len(ps) + 4))
  for v in variants:
    fit = fits[v]
    over = fit['slope_ms'] - fits['plain_tf']['slope_ms']
    to_tff = (f'{fit["slope_ms"] / fits["tff"]["slope_ms"]:.2f}' if 'tff' in fits else 'n/a')
    print(f'| {v} | ' + ' | '.join(f'{runs[p]["variants"][v]["median_s"]:.3f}' for p in ps) +
          f' | {fit["slope_ms"]:.1f} | {100 * fit["max_relative_gap"]:.0f}% | {over:.1f} | '
          f'{to_tff} |')
  if _JSON.value:
    generated_files.write_text(
        _JSON.value, json.dumps(dict(runs={str(p): runs[p] for p in ps}, fits=fits), indent=1,
                                sort_keys=True) + '\n')
  return 0


if __name__ == '__main__':
  flag_parsing.run(lambda argv: sys.exit(main(argv)))
