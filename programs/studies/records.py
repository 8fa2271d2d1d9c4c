"""Reading run directories: one run's record and its headline figures.

A run directory is an ordinary experiment directory of `programs.train` (config.json,
metrics.csv, summary.json, diverged.txt). `load_run` reads one at its own length (or the
length it is meant to reach); `at_length` reads a loaded run over its first rounds. A run's
accuracy is the mean test accuracy of its last LAST evaluations, or its best evaluated round
(`CRITERION_KEYS`). The studies (their queue and page) and the reproduction pages
(benchmarks/suite_runs.py) read runs through here. Imports neither TensorFlow nor TFF.
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
import os
import re
from typing import Optional

import numpy as np

from programs import experiment_config
from programs import run_directory
from programs import run_results


LAST = 10                 # rounds in the headline mean


# A loaded run's figure for each criterion (study.CRITERIA).
CRITERION_KEYS = dict(last10='last10_mean_accuracy', best='best_accuracy')


def grid_points(grid: dict) -> list:
  keys = sorted(grid)
  return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def load_run(exp_dir: str, rounds: Optional[int] = None) -> dict:
  """One run's curve and headline numbers; `finished` says whether all rounds are in.

  `rounds` is the length the run is meant to reach (default: its config's); a run made
  shorter and since lengthened is not finished until it is extended.
  """
  with open(os.path.join(exp_dir, 'config.json')) as f:
    config = json.load(f)
  rows = []
  metrics = os.path.join(exp_dir, 'metrics.csv')
  if os.path.exists(metrics):
    with open(metrics, newline='') as f:
      rows = list(csv.DictReader(f))
  curve = [(int(r['round']), float(r['test_accuracy'])) for r in rows if r.get('test_accuracy')]
  summary_path = os.path.join(exp_dir, 'summary.json')
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  diverged = None
  if os.path.exists(os.path.join(exp_dir, run_directory.DIVERGED)):
    with open(os.path.join(exp_dir, run_directory.DIVERGED)) as f:
      diverged = f.read().strip()
  rounds = rounds or config['rounds']
  done = int(rows[-1]['round']) if rows else 0
  # Clients whose update was not finite are left out of their round's aggregate (the program
  # goes on without them): (round, how many) of every such round up to `rounds`.
  dropped = [(int(r['round']), int(float(r['dropped_clients']))) for r in rows
             if r.get('dropped_clients') and float(r['dropped_clients']) > 0
             and int(r['round']) <= rounds]
  return dict(
      dir=exp_dir, config=config, rounds=rounds, rounds_done=done, diverged=diverged, rows=rows,
      dropped_clients=dropped,
      finished=summary.get('rounds') == rounds and done == rounds,
      **curve_figures(curve, rounds),
      seconds_per_round=median_seconds(rows),
      client_epochs_training=summary.get('client_epochs_training'),
      exploration_client_epochs=summary.get('exploration_client_epochs', 0.0),
      aggregator_state_bytes=summary.get('aggregator_state_bytes', 0),
      summary=summary)


def curve_figures(curve: list, rounds: int) -> dict:
  """A run's curve ([(round, accuracy)]) up to `rounds` and its headline figures there."""
  kept = [(r, a) for r, a in curve if r <= rounds]
  acc = np.array([a for _, a in kept])
  tail = [a for _, a in kept[-LAST:]]   # the last LAST evaluations (last_evaluations)
  return dict(curve_rounds=[r for r, _ in kept], curve_accuracy=[a for _, a in kept],
              last10_mean_accuracy=float(np.mean(tail)) if tail else float('nan'),
              final_accuracy=float(acc[-1]) if acc.size else float('nan'),
              best_accuracy=float(acc.max()) if acc.size else float('nan'))


def metrics_rows(exp_dir: str) -> list:
  """A run's metrics.csv, one dict per round (the diagnosis scripts read its columns)."""
  with open(os.path.join(exp_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def metrics_column(rows, key) -> np.ndarray:
  """One column of `metrics_rows` as floats (NaN where a round has no value)."""
  return np.array([float(r[key]) if r.get(key) not in (None, '') else np.nan for r in rows])


def last10_of(acc: np.ndarray) -> float:
  """The mean of a per-round accuracy column's last LAST evaluated values (NaN: not
  evaluated), as summary.json's last-10 mean; NaN when none was evaluated."""
  evaluated = np.asarray(acc, np.float64)
  evaluated = evaluated[np.isfinite(evaluated)]
  return float(np.mean(evaluated[-LAST:])) if evaluated.size else float('nan')


def run_rows(run: dict) -> list:
  """A loaded run's metrics rows over the length it is read at (a run lengthened past the
  length a page reports is read over its first rounds)."""
  return [r for r in run['rows'] if int(r['round']) <= run['rounds']]


def seed_paths(folder: str, run: str) -> dict:
  """{seed: directory} of `run`'s seeds in `folder` (directories <run>_s<seed> that hold a
  config.json)."""
  out = {}
  for path in glob.glob(os.path.join(folder, f'{glob.escape(run)}_s*')):
    m = re.fullmatch(re.escape(run) + r'_s(\d+)', os.path.basename(path))
    if m and os.path.exists(os.path.join(path, 'config.json')):
      out[int(m.group(1))] = path
  return dict(sorted(out.items()))


def mean_curve(runs: list) -> tuple:
  """(rounds, mean, std) of the runs' test accuracy over seeds, at the rounds every one of
  them evaluated (std 0 for one run)."""
  common = sorted(set.intersection(*(set(r['curve_rounds']) for r in runs))) if runs else []
  acc = np.array([[dict(zip(r['curve_rounds'], r['curve_accuracy']))[x] for x in common]
                  for r in runs], np.float64).reshape(len(runs), len(common))
  std = acc.std(0, ddof=1) if len(runs) > 1 else np.zeros(len(common))
  return np.array(common, np.int64), acc.mean(0), std


def median_seconds(rows: list, rounds: Optional[int] = None) -> float:
  """The median training seconds of a run's rounds after the first (which traces and
  compiles), up to round `rounds` if given; NaN with none."""
  seconds = [float(r['seconds']) for r in rows
             if 1 < int(r['round']) <= (rounds or int(r['round']))]
  return float(np.median(seconds)) if seconds else float('nan')


def settings_differences(run: dict, fields: dict) -> list:
  """'key=recorded (declared: value)' for every declared field that the run's config.json
  records otherwise: a run made before its declaration or tuned rate changed is not shown as
  a run of the new settings. Fields that do not change what a run computes (the program's
  RESUMABLE_CHANGES: its length, which `finished` judges, its evaluation schedule, ...) are
  not compared."""
  return [f'{k}={run["config"].get(k)} (declared: {v})' for k, v in sorted(fields.items())
          if k not in experiment_config.RESUMABLE_CHANGES and run['config'].get(k) != v]


def declared_run(path: str, fields: dict) -> dict:
  run = load_run(path, fields['rounds'])
  run['stale'] = settings_differences(run, fields)
  return run


def at_length(run: dict, rounds: int) -> dict:
  """A loaded run read as a run of `rounds` rounds: a reported run lengthened past a probe's
  pinned length is compared over its first `rounds` (the run of that length, since client
  sampling, batches and rates are functions of seed and round, not of the total). It is
  finished once it got there (a divergence later on, which records no round, is past it); its
  training seconds a round are those of its first `rounds`."""
  if run['rounds'] == rounds:
    return run
  reached = run['rounds_done'] >= rounds
  out = dict(run, rounds=rounds, rounds_done=min(run['rounds_done'], rounds), finished=reached,
             diverged=None if reached else run['diverged'],
             seconds_per_round=median_seconds(run.get('rows', []), rounds),
             **curve_figures(list(zip(run['curve_rounds'], run['curve_accuracy'])), rounds))
  if run['summary'].get('rounds') != rounds:   # a summary of another length is not this one's
    out.update(summary={}, **_costs_from_rows(run.get('rows', []), rounds))
  return out


def _costs_from_rows(rows: list, rounds: int) -> dict:
  """A run's costs over its first `rounds` rounds, read from its metrics rows as the program
  sums them into summary.json (client-epochs: None where the rows do not record every round's,
  e.g. a making that predates the column)."""
  kept = [r for r in rows if int(r['round']) <= rounds]
  recorded = (len(kept) == rounds and
              all(any(run_results.is_cost_column(k, 'client_epochs') and v
                      for k, v in r.items()) for r in kept))
  return dict(
      client_epochs_training=run_results.round_costs(kept, 'client_epochs') if recorded else None,
      exploration_client_epochs=float(kept[-1].get('exploration_client_epochs') or 0.0)
      if kept else 0.0)


def usable(run: dict) -> bool:
  """Finished, and made at the settings declared now."""
  return run['finished'] and not run.get('stale')


