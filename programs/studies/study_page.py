"""A study's page: results.md, results.json and curves.png in its output_dir.

Written from the run directories alone (and tuned.json's frozen choice), so the same runs
give the same bytes: settings from each run's declaration, figures from its metrics.csv and
summary.json. A run's accuracy is the central test-set accuracy of the global model, read by
the study's criterion (the mean of its last 10 evaluations, or its best evaluated round).
A comparison pairs the two runs of each seed (same partition, client sampling and initial
model): its margin is the mean of the per-seed differences, in points, with the 95% paired
t half-width; the half-width is the smallest margin these seeds resolve at this spread.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np

from programs import experiment_config
from programs import generated_files
from programs.studies import curves
from programs.studies import declaration
from programs.studies import paired
from programs.studies import records
from programs.studies import study_configs
from programs.studies import tuning

WRITTEN = '<!-- written by `python -m programs.study`; do not edit by hand -->'
CRITERION_WORDS = dict(last10='last-10 mean (the mean of its last 10 evaluations)',
                       best='best evaluated round')
MB = 1e6


def load_runs(study: declaration.Study, tuned: Optional[dict]) -> dict:
  """{run: {seed: loaded run}} of every run directory made so far, read at the declared
  length; a run recorded at other settings than declared now is marked `stale`."""
  out = {run: {} for run in study.runs}
  for config in study_configs.run_configs(study, tuned):
    if os.path.exists(os.path.join(config.experiment_dir, 'config.json')):
      run = config.experiment_name.rsplit('_s', 1)[0]
      out[run][config.seed] = records.declared_run(config.experiment_dir,
                                                   dataclasses.asdict(config))
  return out


def _mb_per_round(run: dict, direction: str) -> Optional[float]:
  """Mean MB a round sent `direction` ('up' or 'down': payload + overhead, every client of
  the round), where metrics.csv counts bytes."""
  rows = records.run_rows(run)
  values = sum(records.metrics_column(rows, f'bytes_{direction}_{part}')
               for part in ('payload', 'overhead'))
  values = values[np.isfinite(values)]
  return float(np.mean(values)) / MB if values.size else None


def run_figures(run: dict, criterion: str) -> dict:
  """A loaded run's figures on the page (accuracies as fractions)."""
  reached = {f'{t["target"]:g}': dict(round=t['round'],
                                      mb=None if t['bytes'] is None else t['bytes'] / MB)
             for t in run['summary'].get('time_to_accuracy', [])}
  return dict(accuracy=run[records.CRITERION_KEYS[criterion]],
              last10=run['last10_mean_accuracy'], best=run['best_accuracy'],
              rounds_done=run['rounds_done'], rounds=run['rounds'], finished=run['finished'],
              usable=records.usable(run), diverged=run['diverged'], stale=run.get('stale', []),
              time_to_accuracy=reached, mb_per_round_up=_mb_per_round(run, 'up'),
              mb_per_round_down=_mb_per_round(run, 'down'))


def compare(study: declaration.Study, loaded: dict, comp: declaration.Comparison) -> dict:
  """One comparison over the seeds where both runs are finished: levels, per-seed margins
  (points), their mean and 95% paired t half-width, and the verdict."""
  key = records.CRITERION_KEYS[study.criterion]
  method = {s: r for s, r in loaded[comp.method].items() if records.usable(r)}
  base = {s: r for s, r in loaded[comp.baseline].items() if records.usable(r)}
  seeds = paired.paired_seeds(method, base)
  figure = paired.paired_margin([method[s][key] for s in seeds], [base[s][key] for s in seeds],
                                scale=100)
  return dict(label=comp.label, method=comp.method, baseline=comp.baseline, seeds=seeds,
              per_seed=dict(zip(seeds, figure['margins'])), margin=figure['margin'],
              half_width=figure['half_width'],
              baseline_level=paired.mean_std([100 * base[s][key] for s in seeds]),
              method_level=paired.mean_std([100 * method[s][key] for s in seeds]),
              verdict=verdict(comp, figure['margin'], figure['half_width'], len(seeds)))


def verdict(comp: declaration.Comparison, mean: float, half_width: float, seeds: int) -> str:
  """In words: who is ahead by how much when the interval excludes 0 (resolved), else
  within noise; fewer than two paired seeds have no interval."""
  if seeds < 2:
    return 'not enough seeds'
  if abs(mean) > half_width:
    ahead = comp.method if mean > 0 else comp.baseline
    return f'{ahead} ahead by {abs(mean):.2f} ± {half_width:.2f} points: resolved'
  return 'within noise'


def tuning_results(study: declaration.Study, record: Optional[dict]) -> dict:
  """{run: {points: [{values, accuracy, diverged, rounds_done, finished}], chosen, edge,
  budget}} of the study's grids, read from the tuning runs; `chosen` from tuned.json."""
  key = records.CRITERION_KEYS[study.criterion]
  chosen = (record or {}).get('chosen', {})
  out = {}
  points = study_configs.tuning_points(study)
  for run, grid in study.grid.items():
    rows, rounds = [], 0
    for name, values, config in points:
      if name != run:
        continue
      rounds = config.rounds
      r = tuning.point_result(config)
      rows.append(dict(values=values, made=r is not None,
                       accuracy=None if r is None or r['diverged'] else r[key],
                       diverged=None if r is None else r['diverged'],
                       finished=bool(r and r['finished']),
                       rounds_done=0 if r is None else r['rounds_done']))
    best = chosen.get(study.algorithm(run))
    edge = sorted(k for k, v in (best or {}).items()
                  if len(grid[k]) > 1 and v in (grid[k][0], grid[k][-1]))
    out[run] = dict(points=rows, chosen=best, edge=edge, rounds=rounds,
                    budget=len(rows) * rounds)
  return out


def _pct(x) -> str:
  return paired.pct(x) if x is not None else 'n/a'


def _level(mean_std: tuple) -> str:
  return paired.mean_and_spread(*mean_std)


def _point(values: dict) -> str:
  return ', '.join(f'`{k}={v}`' for k, v in values.items())


def _prose(text: str) -> list:
  """A paragraph: one line (markdown wraps it)."""
  return [text]


def _settings_lines(study: declaration.Study, tuned: Optional[dict]) -> list:
  fields = {run: study.run_fields(run, tuned) for run in study.runs}
  keys = sorted({k for f in fields.values() for k in f})
  defaults = experiment_config.ExperimentConfig.__dataclass_fields__
  value = lambda run, k: fields[run].get(k, defaults[k].default)
  lines = _prose('Each run\'s trainer flags (`python -m programs.train --help`): those every '
                 'run shares, then each run\'s own; tuned values included. Every run is made '
                 f'on seeds {", ".join(map(str, study.seeds))}.') + [
      '', '| flag | every run | ' + ' | '.join(study.runs) + ' |',
      '|---' * (2 + len(study.runs)) + '|']
  for k in keys:
    values = [value(run, k) for run in study.runs]
    if all(v == values[0] for v in values):
      lines.append(f'| {k} | {values[0]} |' + ' |' * len(study.runs))
    else:
      lines.append(f'| {k} | | ' + ' | '.join(str(v) for v in values) + ' |')
  return lines + ['']


def _tuning_lines(study: declaration.Study, results: dict, record: Optional[dict]) -> list:
  if not study.grid:
    return []
  length = study.tuning_rounds or "the runs' own"
  lines = ['## Tuning', ''] + _prose(
      f'Each grid is tried on seed {study.tuning_seed}, which is not a reported seed, for '
      f'{length} rounds a point; the best '
      f'{CRITERION_WORDS[study.criterion]} wins (a diverged point never does) and is frozen '
      'in tuned.json before any reported run starts. Every run of the tuned algorithm takes '
      'its values' + (', and ' + ', '.join(f'{a} takes {s}\'s' for a, s in
                                            study.tuned_as.items()) if study.tuned_as else '')
      + '.' + ('' if record else ' Not tuned yet.')) + [
      '', '| run | grid point | accuracy (%) | chosen |', '|---|---|---|---|']
  for run, result in results.items():
    for p in result['points']:
      figure = ('not run yet' if not p['made'] else 'diverged' if p['diverged'] else
                _pct(p['accuracy']) if p['finished'] else f'running ({p["rounds_done"]} rounds)')
      mark = 'yes' if p['values'] == result['chosen'] else ''
      lines.append(f'| {run} | {_point(p["values"])} | {figure} | {mark} |')
  lines.append('')
  for run, result in results.items():
    lines += _prose(f'{run}: {len(result["points"])} points × {result["rounds"]} rounds = '
                    f'{result["budget"]} rounds of tuning.') + ['']
    if result['edge']:
      on_edge = _point({k: result['chosen'][k] for k in result['edge']})
      lines += _prose(f'**FLAG**: {run}\'s chosen {on_edge} '
                      'lies on its grid\'s edge: the best may lie beyond it; widen the grid '
                      'and tune again.') + ['']
  return lines


def _targets(figures: dict) -> list:
  return sorted({t for seeds in figures.values() for f in seeds.values()
                 for t in f['time_to_accuracy']}, key=float)


def _every_run_lines(study: declaration.Study, figures: dict) -> list:
  targets = _targets(figures)
  lines = _prose(
      f'accuracy: the {CRITERION_WORDS[study.criterion]}; to a target: the first evaluated '
      'round at or above it and the MB sent down and up until then (summary.json\'s '
      'time_to_accuracy); MB per round: what a round sent up and down, all its clients '
      '(metrics.csv).') + ['',
      '| run | seed | rounds | accuracy (%) | last 10 (%) | best (%) |'
      + ''.join(f' to {100 * float(t):g}% |' for t in targets)
      + ' MB/round up | MB/round down | notes |',
      '|---' * (9 + len(targets)) + '|']
  for run in study.runs:
    for seed in study.seeds:
      f = figures[run].get(seed)
      if f is None:
        lines.append(f'| {run} | {seed} | not run yet |' + ' |' * (6 + len(targets)))
        continue
      cells = []
      for t in targets:
        reached = f['time_to_accuracy'].get(t)
        cells.append('n/a' if reached is None else 'not reached' if reached['round'] is None
                     else f'{reached["round"]}' + (f', {reached["mb"]:.2f} MB'
                                                  if reached['mb'] is not None else ''))
      notes = []
      if f['stale']:
        notes.append('made at other settings, left out: ' + ', '.join(f['stale']))
      elif f['diverged']:
        notes.append(f'{f["diverged"]}; left out')
      elif not f['finished']:
        notes.append('running or stopped (the same command continues it)')
      mb = lambda v: 'n/a' if v is None else f'{v:.3f}'
      lines.append(f'| {run} | {seed} | {f["rounds_done"]}/{f["rounds"]} | '
                   + ' | '.join(_pct(f[k]) for k in ('accuracy', 'last10', 'best')) + ' | '
                   + ''.join(f'{c} | ' for c in cells)
                   + f'{mb(f["mb_per_round_up"])} | {mb(f["mb_per_round_down"])} | '
                   + '; '.join(notes) + ' |')
  return lines + ['']


def _comparison_lines(study: declaration.Study, results: list) -> list:
  if not results:
    return []
  lines = ['## Comparisons', ''] + _prose(
      f'Levels: the {CRITERION_WORDS[study.criterion]}, mean ± std over seeds (%). Margin: '
      'method − baseline per paired seed, in points, mean ± the 95% t half-width (the smallest '
      'margin these seeds tell from 0 at this spread), then each seed\'s. A verdict is resolved '
      'when the interval excludes 0.') + ['',
      '| comparison | seeds | baseline (%) | method (%) | margin (points) | per seed | '
      'verdict |', '|---|---|---|---|---|---|---|']
  for c in results:
    per_seed = ', '.join(f's{s}: {m:+.2f}' for s, m in c['per_seed'].items()) or 'none'
    margin = (paired.mean_and_spread(c['margin'], c['half_width'], '.2f', '+.2f')
              if c['seeds'] else 'n/a')
    pair = f'{c["method"]} vs {c["baseline"]}'
    name = pair if c['label'] == pair else f'{c["label"]}: {pair}'
    lines.append(f'| {name} | {len(c["seeds"])} | '
                 f'{_level(c["baseline_level"])} | {_level(c["method_level"])} | {margin} | '
                 f'{per_seed} | {c["verdict"]} |')
  return lines + ['']


def _commands(study: declaration.Study, options: str) -> list:
  commands = (['tune'] if study.grid else []) + ['run', 'report']
  return [f'    python -m programs.study {c} {study.path}{options}' for c in commands]


def page(study: declaration.Study, options: str = '') -> tuple:
  """(results.md text, results.json text, loaded runs) of a study; `options`: the command
  line's flags that make its runs (e.g. ' --output_dir=...')."""
  record = tuning.load(study)
  tuned = (record or {}).get('chosen')
  loaded = load_runs(study, tuned)
  figures = {run: {s: run_figures(r, study.criterion) for s, r in seeds.items()}
             for run, seeds in loaded.items()}
  results = [compare(study, loaded, comp) for comp in study.comparisons]
  tuned_grids = tuning_results(study, record)
  done = sum(f['usable'] for seeds in figures.values() for f in seeds.values())
  lines = [f'# Study {study.name}', '', WRITTEN, ''] + _prose(
      f'{done} of {len(study.runs) * len(study.seeds)} runs finished. Commands (each '
      'continues where it stopped; `report` writes this page only):') + [''] + _commands(
      study, options) + ['', '## What the figures are', ''] + _prose(
      'Accuracy: the global model\'s accuracy on the data set\'s central test set, after a '
      'round. A run\'s last-10 mean is the mean of its last 10 evaluations; its best is its '
      f'best evaluated round. This study reads a run by its {CRITERION_WORDS[study.criterion]}'
      ': tuning chooses by it and the margins are of it.') + ['', '## Settings', '']
  lines += _settings_lines(study, tuned) + _tuning_lines(study, tuned_grids, record)
  lines += _comparison_lines(study, results)
  lines += ['![test accuracy over rounds, one panel per baseline](curves.png)', '']
  lines += ['## Every run', ''] + _every_run_lines(study, figures)
  data = dict(name=study.name, criterion=study.criterion, seeds=list(study.seeds),
              comparisons=results, runs=figures, tuning=tuned_grids)
  return ('\n'.join(lines),
          json.dumps(generated_files.json_ready(data), indent=1, sort_keys=True) + '\n', loaded)


def _colours(study: declaration.Study):
  """A run's colour: one per algorithm, in the order the study first names them."""
  order = list(dict.fromkeys(study.algorithm(run) for run in study.runs))
  return lambda run: curves.PALETTE[order.index(study.algorithm(run)) % len(curves.PALETTE)]


def write(study: declaration.Study, options: str = '') -> None:
  """Writes results.md, results.json and curves.png in the study's output_dir."""
  text, data, loaded = page(study, options)
  os.makedirs(study.output_dir, exist_ok=True)
  generated_files.write_text(os.path.join(study.output_dir, 'results.md'), text)
  generated_files.write_text(os.path.join(study.output_dir, 'results.json'), data)
  groups = curves.panels(study.comparisons) or [('every run', list(study.runs))]
  curves.plot(os.path.join(study.output_dir, 'curves.png'),
              [(title, {r: list(loaded[r].values()) for r in names}) for title, names in groups],
              _colours(study))
