"""What FedLEx's guidance G is here, what sets it, and how far it scales the guided steps.

  python -m benchmarks.fedlex_diagnosis     # writes benchmarks/fedlex/diagnosis.md

FedLEx explores once, before training: a fifth of the clients train unguided from w_0, and
G is their squared deviations, min-max normalised per tensor and averaged (ALGORITHMS.md,
section 4). Every guided step is then multiplied by G elementwise, so a guided variant can
only beat its base if G keeps the useful coordinates near 1 and the step rate makes up for
the rest. This script reads every FedLEx run that recorded G (the reported runs, the tuning
grid and the superseded first tuning points under `earlier_runs/tuning`): G's statistics by
the explorers' rate, the guided variants' best tuning points under each exploration rule, the
reported runs' steps and margins over rounds, and every superseded point.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np

from benchmarks import report
from benchmarks import suites

SUITE = suites.SUITES['fedlex']
OUT = os.path.join(suites.suite_dir('fedlex'), 'diagnosis.md')
GUIDANCE_KEYS = ('guidance_mean', 'guidance_median', 'guidance_below_0_01',
                 'guidance_zero_fraction', 'guidance_max')


def explorer_rate(config: dict) -> float:
  """The rate the explorers trained at: --fedlex_exploration_lr, or (0) --client_lr."""
  return config.get('fedlex_exploration_lr') or config.get('client_lr', 0.01)


def step_rate(config: dict) -> float:
  """The rate that scales a method's (guided) step: FedSGD's server rate, else the client's."""
  return config['server_lr'] if config['algorithm'] in ('fedsgd', 'fedlex_sgd') else (
      config['client_lr'])


def guidance(run: dict) -> dict:
  return run['summary'].get('guidance') or {}


def _dirs(pattern: str) -> list:
  return sorted(p for p in glob.glob(pattern) if os.path.exists(os.path.join(p, 'config.json')))


def recorded_runs() -> list:
  """(source, name, loaded run) for every FedLEx-suite run directory, reported runs first."""
  base = suites.suite_dir('fedlex')
  out = []
  for source, pattern in (('run', os.path.join(base, 'runs', '*')),
                          ('tuning', os.path.join(base, 'tuning', '*')),
                          ('superseded tuning',
                           os.path.join(base, 'earlier_runs', 'tuning', '*'))):
    out += [(source, os.path.basename(p), report.load_run(p)) for p in _dirs(pattern)]
  return out


def _g_cells(g: dict) -> list:
  return [f'{g["guidance_mean"]:.2g}', f'{g["guidance_median"]:.2g}',
          f'{g["guidance_below_0_01"]:.3f}', f'{g["guidance_zero_fraction"]:.3f}',
          f'{g["guidance_max"]:.2g}']


def _g_by_rate_lines(runs) -> list:
  groups = {}
  for source, name, r in runs:
    g = guidance(r)
    if g:
      groups.setdefault((explorer_rate(r['config']), r['config']['seed']), []).append(
          (source, name, g))
  lines = ['## What sets G: the explorers\' rate', '',
           'G as each run recorded it, grouped by the rate its explorers trained at and the seed '
           '(which picks the explorers). The explorers\' other settings are the suite\'s '
           f'({SUITE.common["batch_size"]} per batch, 5 epochs, no momentum) in every row. '
           '"Same in all" checks that every run of a row recorded the same G (it is computed '
           'before training, whatever the variant).', '',
           '| explorers\' rate | seed | runs | same in all | G mean | G median | share < 0.01 | '
           'share = 0 | G max |', '|---|---|---|---|---|---|---|---|---|']
  for (rate, seed), members in sorted(groups.items()):
    same = all(all(np.isclose(m[2][k], members[0][2][k], rtol=1e-6, atol=0)
                   for k in GUIDANCE_KEYS) for m in members)
    sources = sorted({m[0] for m in members})
    lines.append(f'| {rate:g} | {seed} | {len(members)} ({", ".join(sources)}) | '
                 f'{"yes" if same else "no"} | ' + ' | '.join(_g_cells(members[0][2])) + ' |')
  return lines + ['']


def _best(runs, algorithm: str) -> dict | None:
  """The finished, not diverged tuning point of `algorithm` with the best last-10 mean."""
  done = [r for r in runs if r['config']['algorithm'] == algorithm and r['finished']
          and r['diverged'] is None]
  return max(done, key=lambda r: r['last10_mean_accuracy']) if done else None


def _point(r: dict | None) -> list:
  """Best point, explorers' rate, last-10, G median (the grid's keys are the run's)."""
  if r is None:
    return ['none finished', '', '', '']
  g = guidance(r)
  values = ', '.join(f'{k}={r["config"][k]:g}' for k in SUITE.grid[r['config']['algorithm']])
  return [values, f'{explorer_rate(r["config"]):g}' if g else 'n/a',
          report.pct(r['last10_mean_accuracy']), f'{g["guidance_median"]:.2g}' if g else 'n/a']


def _tuning_lines(runs) -> list:
  tuning = [r for source, _, r in runs if source == 'tuning']
  earlier = [r for source, _, r in runs if source == 'superseded tuning']
  lines = ['## The guided variants\' best tuning points under each exploration rule', '',
           f'Tuning at seed {suites.TUNING_SEED}, {SUITE.tuning_rounds} rounds. First rule '
           '(superseded): the explorers trained at the guided variant\'s own client rate, so '
           'every point of the guided grid also changed G. Now: the explorers train at '
           f'{suites.EXPLORATION_LR:g} for every point, and the grid changes the step only.', '',
           '| variant | rule | best point | explorers\' rate | last-10 (%) | G median |',
           '|---|---|---|---|---|---|']
  for base, guided in ((c.baseline, c.method) for c in SUITE.comparisons):
    for label, pool, algorithm in ((f'{base} (base)', tuning, base),
                                   (guided, earlier, guided), (guided, tuning, guided)):
      rule = ('no G' if pool is tuning and algorithm == base else
              'explorers at the point\'s own rate (superseded)' if pool is earlier else
              f'explorers at {suites.EXPLORATION_LR:g}')
      lines.append(f'| {label} | {rule} | ' + ' | '.join(_point(_best(pool, algorithm))) + ' |')
  return lines + ['']


def window_means(curve_rounds, curve_accuracy, width: int, total: int) -> list:
  """Mean test accuracy over each `width`-round window of rounds 1..total (NaN if none)."""
  rounds, acc = np.asarray(curve_rounds), np.asarray(curve_accuracy, np.float64)
  out = []
  for start in range(0, total, width):
    inside = (rounds > start) & (rounds <= start + width)
    out.append(float(acc[inside].mean()) if inside.any() else float('nan'))
  return out


def _runs_lines() -> list:
  runs = report.collect(SUITE)
  width = max(1, min(50, SUITE.common['rounds'] // 4))   # as the plateau criterion's window
  lines = ['## The reported runs: G, the steps it scales, the margin over rounds', '',
           'Mean ± std over the seeds where both runs finished. The step rate is the rate that '
           'multiplies a method\'s step (the client rate; FedSGD\'s server rate); G mean × '
           'rate is the guided variant\'s average step rate per coordinate, G median × rate '
           'its typical one. Margin: guided − base of the same seed, in points.', '']
  header = ['| comparison | seeds | G mean | G median | share < 0.01 | base rate | guided rate | '
            'G mean × rate | G median × rate | base (%) | guided (%) | margin |',
            '|---|---|---|---|---|---|---|---|---|---|---|---|']
  rows, windows = [], []
  for c in SUITE.comparisons:
    base = {s: r for s, r in runs[c.baseline].items() if report.usable(r)}
    guided = {s: r for s, r in runs[c.method].items() if report.usable(r)}
    seeds = sorted(set(base) & set(guided))
    if not seeds:
      rows.append(f'| {c.label} | no paired seed finished |' + ' |' * 10)
      continue
    g = [guidance(guided[s]) for s in seeds]
    b_rate, g_rate = step_rate(base[seeds[0]]['config']), step_rate(guided[seeds[0]]['config'])
    rows.append(
        f'| {c.label} | {", ".join(map(str, seeds))} | '
        f'{report.over_seeds([x["guidance_mean"] for x in g], ".2g")} | '
        f'{report.over_seeds([x["guidance_median"] for x in g], ".2g")} | '
        f'{report.over_seeds([x["guidance_below_0_01"] for x in g], ".3f")} | {b_rate:g} | '
        f'{g_rate:g} | {report.over_seeds([x["guidance_mean"] * g_rate for x in g], ".2g")} | '
        f'{report.over_seeds([x["guidance_median"] * g_rate for x in g], ".2g")} | '
        f'{report.over_seeds([base[s]["last10_mean_accuracy"] for s in seeds], scale=100)} | '
        f'{report.over_seeds([guided[s]["last10_mean_accuracy"] for s in seeds], scale=100)} '
        f'| {report.over_seeds([guided[s]["last10_mean_accuracy"] - base[s]["last10_mean_accuracy"] for s in seeds], scale=100, signed=True)} |')
    total = SUITE.common['rounds']
    per_seed = [np.subtract(window_means(guided[s]['curve_rounds'], guided[s]['curve_accuracy'],
                                         width, total),
                            window_means(base[s]['curve_rounds'], base[s]['curve_accuracy'],
                                         width, total)) for s in seeds]
    windows.append((c.label, per_seed))
  lines += header + rows + ['']
  if windows:
    total = SUITE.common['rounds']
    names = [f'{a + 1}-{min(a + width, total)}' for a in range(0, total, width)]
    lines += [f'Margin (points) over {width}-round windows, mean ± std over seeds:', '',
              '| comparison | ' + ' | '.join(names) + ' |',
              '|---|' + '---|' * len(names)]
    for label, per_seed in windows:
      cells = [report.over_seeds([m[i] for m in per_seed], scale=100, signed=True)
               for i in range(len(names))]
      lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
    lines.append('')
  return lines


def _superseded_lines(runs) -> list:
  earlier = [(name, r) for source, name, r in runs if source == 'superseded tuning']
  lines = ['## Every superseded tuning point (`earlier_runs/tuning`)', '',
           'Made before the explorers\' rate was fixed: the explorers trained at the point\'s own '
           'client rate (FedLEx-SGD\'s at the default 0.01). Kept, not reported; the runs '
           'stopped when the rule changed are listed as such.', '',
           '| point | explorers\' rate | status | last-10 (%) | G median |', '|---|---|---|---|---|']
  for name, r in earlier:
    status = (r['diverged'] if r['diverged'] else 'finished' if r['finished'] else
              f'stopped after round {r["rounds_done"]} of {r["rounds"]}')
    g = guidance(r)
    lines.append(f'| {name} | {explorer_rate(r["config"]):g} | {status} | '
                 f'{report.pct(r["last10_mean_accuracy"]) if r["finished"] else ""} | '
                 f'{format(g["guidance_median"], ".2g") if g else ""} |')
  return lines + ['']


def page() -> str:
  runs = recorded_runs()
  lines = report.diagnosis_header(f'{SUITE.title}: what the guidance G is',
                                  sys.modules[__name__])
  lines += (_g_by_rate_lines(runs) + _tuning_lines(runs) + _runs_lines() +
            _superseded_lines(runs))
  return '\n'.join(lines).rstrip('\n') + '\n'


def main() -> int:
  return report.write_diagnosis(OUT, page)


if __name__ == '__main__':
  sys.exit(main())
