r"""Realistic federations: every method with clients that drop out or lag, in rounds and bytes.

  python -m benchmarks.federations            # make the runs (two copies share them)
  python -m benchmarks.federations --plan     # what it would make, and for how long
  python -m benchmarks.federations --report   # the page only, from the runs

FedAvg, FedCross, FedCDA and CADIS (the reference code's 1/|C_i| weights), and SCAFFOLD beside a
FedAvg on the same plain client SGD, on the fedcross suite's layout (Fashion-MNIST Dir 0.1, 100
clients, 10 per round), each with no faults, with 30% of the sampled clients never reporting,
and with half of them running a random share in [0.5, 1] of their local steps.

The page (`benchmarks/results/federations/results.md`) gives each run's last-10 accuracy, the
rounds and megabytes it took to reach 60% and 70% test accuracy, and its megabytes per round each
way, and draws accuracy against cumulative megabytes, a panel per condition.

The runs are those of benchmarks/studies/federations.toml (`python -m benchmarks.study
run|plan|report` on it makes and reports the same); this module is the paper layer: labels,
table, figure and verdict.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


from absl import logging
import numpy as np

from benchmarks import compare
from benchmarks import report
from benchmarks import suites
from programs import flag_parsing
from programs import generated_files
from programs.studies import curves
from programs.studies import declaration
from programs.studies import queue
from programs.studies import records
from programs.studies import study_configs
from programs.studies import study_file

# --report and --plan are compare's flags (this module runs its runs through compare's queue).
_REPORT = compare.REPORT
_PLAN = compare.PLAN

NAME = 'federations'
# The runs, their layout and seed: run <method>_<condition> of the study file.
STUDY = study_file.load(suites.study_path(NAME))
METHODS = {
    'fedavg': 'FedAvg',
    'fedcross': 'FedCross',
    'fedcda': 'FedCDA',
    'cadis': 'CADIS (1/\\|C_i\\|)',
    'fedavg_sgd': 'FedAvg (plain SGD)',
    'scaffold': 'SCAFFOLD (plain SGD)',
}
CONDITIONS = {
    'none': 'no faults',
    'dropout': '30% of clients never report',
    'stragglers': 'half the clients run 50-100% of their steps',
}
# What the runs showed, in words; its figures are filled in from the runs (`verdict_figures`).
VERDICT = (
    'one seed per run, so gaps of a point or two between methods are not resolved; within a '
    'method the conditions share the seed, the sampled clients and their batch orders, but each'
    ' is still one trajectory: read under a point as noise. Dropping 30% of the sampled clients'
    ' costs every method 2-4 points of last-10 accuracy (FedAvg {d[fedavg_dropout]}, FedCross '
    '{d[fedcross_dropout]}, FedCDA {d[fedcda_dropout]}, CADIS {d[cadis_dropout]}, FedAvg on '
    'plain SGD {d[fedavg_sgd_dropout]}, SCAFFOLD {d[scaffold_dropout]}) and delays 70% by '
    '{delay_70[0]} to {delay_70[1]} rounds; stragglers running 50-100% of their steps cost under'
    ' a point ({straggle[0]} to {straggle[1]}), except SCAFFOLD ({d[scaffold_stragglers]}), and '
    "move no method's round of reaching 70% (FedCross's 60% does move, from round "
    '{r[fedcross_none_60]} to {r[fedcross_stragglers_60]}). Under either fault the picture '
    'without faults holds: FedCross and CADIS stay within about a point of FedAvg; FedCDA stays '
    '{fedcda_gap[0]}-{fedcda_gap[1]} points below it and never reaches 70% in {rounds} rounds '
    '(with dropout it reaches 60% at round {r[fedcda_dropout_60]}, against {r[fedcda_none_60]} '
    'without); and of these four, CADIS reaches 60% first every time (rounds '
    '{r[cadis_none_60]}, {r[cadis_dropout_60]} and {r[cadis_stragglers_60]}, against '
    "FedAvg's {r[fedavg_none_60]}, {r[fedavg_dropout_60]} and {r[fedavg_stragglers_60]}). "
    'SCAFFOLD reaches 70% in the fewest rounds without faults and with stragglers '
    '({r[scaffold_none_70]} against {r[fedavg_none_70]}) but not with dropout '
    "({r[scaffold_dropout_70]} against its FedAvg's {r[fedavg_sgd_dropout_70]}), and it is the "
    'dearest in megabytes every time (to 70%: {m[scaffold_none_70]} MB against '
    '{m[fedavg_none_70]} without faults, {m[scaffold_dropout_70]} against '
    '{m[fedavg_sgd_dropout_70]} with dropout), as it moves {down:.0f} times FedAvg\'s bytes down '
    'and {up:.0f} times up.')


def run_name(method: str, condition: str) -> str:
  """The study file's run of `method` under `condition`."""
  return f'{method}_{condition}'


def targets(study) -> tuple:
  """The accuracies the table gives the time to (the runs' --target_accuracy)."""
  return tuple(float(t) for t in study.common['target_accuracy'].split(','))


def configs() -> list:
  """Every run's ExperimentConfig, in the study file's order (the fault-free ones first)."""
  return study_configs.run_configs(STUDY)


def _mb(value) -> str:
  return '—' if value is None or not np.isfinite(value) else f'{value / 1e6:.1f}'


def _reached(run: dict, target: float):
  """(round, bytes) of the run's summary.json time-to-accuracy entry for `target`."""
  for entry in run['summary'].get('time_to_accuracy') or ():
    if abs(float(entry['target']) - target) < 1e-9:
      return entry.get('round'), entry.get('bytes')
  return None, None


def _per_round_mb(rows: list, direction: str) -> float:
  """Mean megabytes a round moves in `direction` ('down' or 'up'), payload and overhead."""
  total = sum(records.metrics_column(rows, f'bytes_{direction}_{part}')
              for part in ('payload', 'overhead'))
  total = total[np.isfinite(total)]
  return float(np.mean(total)) if total.size else float('nan')


def load(study) -> dict:
  """{(method, condition): loaded run or None} of the study's runs (StudyFileError unless
  they are every method under every condition)."""
  cells = {run_name(method, condition): (method, condition)
           for condition in CONDITIONS for method in METHODS}
  if sorted(study.runs) != sorted(cells):
    raise study_file.StudyFileError(
        f'{study.path} [runs]: {sorted(study.runs)}; the federations page shows the runs '
        f'{sorted(cells)} (<method>_<condition>)')
  loaded = {}
  for name, cell in cells.items():
    path = os.path.join(study.runs_dir, declaration.run_name(name, study.seeds[0]))
    loaded[cell] = (records.load_run(path, study.common['rounds'])
                    if os.path.exists(os.path.join(path, 'config.json')) else None)
  return loaded


def table(study, loaded: dict) -> list:
  head = ('| condition | method | last-10 accuracy | '
          + ' | '.join(f'rounds to {t:.0%} | MB to {t:.0%}' for t in targets(study))
          + ' | MB per round down | MB per round up |')
  lines = [head, '|' + '---|' * (head.count('|') - 1)]
  for condition, words in CONDITIONS.items():
    for method, label in METHODS.items():
      run = loaded[method, condition]
      if run is None or not run['rows']:
        lines.append(f'| {words} | {label} | not run |' + ' |' * (2 * len(targets(study)) + 2))
        continue
      status = '' if run['finished'] else f' (at round {run["rounds_done"]})'
      cells = [f'{100 * run["last10_mean_accuracy"]:.2f}{status}']
      for target in targets(study):
        rnd, mb = _reached(run, target)
        cells += ['never' if rnd is None else str(rnd), _mb(mb)]
      cells += [_mb(_per_round_mb(run['rows'], d)) for d in ('down', 'up')]
      lines.append(f'| {words} | {label} | ' + ' | '.join(cells) + ' |')
  return lines


def figure(loaded: dict, path: str) -> None:
  """Accuracy against cumulative megabytes (down + up), a panel per condition."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(CONDITIONS), figsize=(4.2 * len(CONDITIONS), 3.4),
                           sharey=True)
  for ax, (condition, words) in zip(axes, CONDITIONS.items()):
    for method, label in METHODS.items():
      run = loaded[method, condition]
      if run is None or not run['rows']:
        continue
      acc = records.metrics_column(run['rows'], 'test_accuracy')
      mb = (records.metrics_column(run['rows'], 'cumulative_bytes_down')
            + records.metrics_column(run['rows'], 'cumulative_bytes_up')) / 1e6
      keep = np.isfinite(acc) & np.isfinite(mb)
      ax.plot(mb[keep], 100 * acc[keep], lw=1.1, label=label.replace('\\|', '|'))
    curves.finish_panel(ax, words, 'cumulative MB (down + up)', 'no run yet')
  axes[0].set_ylabel('test accuracy (%)', fontsize=8)
  curves.save(fig, path)


def verdict_figures(study, loaded: dict) -> dict:
  """The figures VERDICT quotes, from the finished runs: `d` each faulty run's last-10 change
  from its method's fault-free run (points), `r` / `m` the rounds / MB to each target
  (`<run>_<percent>`), and the ranges and ratios its sentences give."""
  accuracy = {run_name(m, c): 100 * loaded[m, c]['last10_mean_accuracy']
              for m in METHODS for c in CONDITIONS}
  drop = {run_name(m, c): accuracy[run_name(m, c)] - accuracy[run_name(m, 'none')]
          for m in METHODS for c in CONDITIONS if c != 'none'}
  rounds, mb = {}, {}
  for (m, c), run in loaded.items():
    for target in targets(study):
      key = f'{run_name(m, c)}_{round(100 * target)}'
      rounds[key], mb[key] = _reached(run, target)
  delays = [rounds[f'{m}_dropout_70'] - rounds[f'{m}_none_70'] for m in METHODS
            if rounds[f'{m}_dropout_70'] is not None and rounds[f'{m}_none_70'] is not None]
  straggle = sorted(drop[f'{m}_stragglers'] for m in METHODS if m != 'scaffold')
  gaps = [accuracy[f'fedavg_{c}'] - accuracy[f'fedcda_{c}'] for c in CONDITIONS]
  per_round = {d: _per_round_mb(loaded['scaffold', 'none']['rows'], d)
               / _per_round_mb(loaded['fedavg_sgd', 'none']['rows'], d) for d in ('down', 'up')}
  return dict(
      d={k: f'{v:.1f}' for k, v in drop.items()},
      r=rounds, m={k: f'{v / 1e6:.0f}' if v is not None else 'never' for k, v in mb.items()},
      delay_70=(min(delays), max(delays)),
      straggle=(f'{straggle[-1]:.1f}', f'{straggle[0]:.1f}'),
      fedcda_gap=(f'{min(gaps):.0f}', f'{max(gaps):.0f}'), rounds=study.common['rounds'],
      down=per_round['down'], up=per_round['up'])


def page(study, loaded: dict) -> str:
  layout = study.common
  plain_sgd_lr = study.runs[run_name('scaffold', 'none')]['client_lr']
  lines = ['# Realistic federations: clients that drop out or lag, in rounds and bytes', '',
           '<!-- written by `python -m benchmarks.federations`; do not edit by hand -->', '',
           *report.prose(' '.join(__doc__.split('\n\n')[2].split())), '',
           *report.prose(
           f'Settings: {layout["dataset"]}, {layout["model"]}, Dirichlet '
           f'{layout["dirichlet_alpha"]}, {layout["num_clients"]} clients, '
           f'{layout["clients_per_round"]} per round, batch {layout["batch_size"]}, E = '
           f'{layout["local_epochs"]}, client lr {layout["client_lr"]} with momentum '
           f'{layout["client_momentum"]} (the plain-SGD pair: lr {plain_sgd_lr}, no momentum), '
           f'{layout["rounds"]} rounds, seed {study.seeds[0]}. Accuracy: the global model\'s '
           'on the 10,000 test images, evaluated every round; last-10 is the mean of the last 10 '
           'rounds. Every '
           'method loses the same clients in the same rounds (the draw depends on the seed, the '
           'round and the client only). Megabytes are 10^6 bytes of the values that cross, down '
           'and up, payload and overhead (docs/training_program.md); a dropped client\'s download '
           'counts, its upload does not. "Rounds to" is the first evaluated round at or above the '
           'target; "MB to" the cumulative megabytes then. Time to accuracy is compared in '
           'rounds and bytes, not seconds: a simulated straggler costs less compute, where a '
           'deployment would wait for it. SCAFFOLD moves 3·D down and 2·D up per client as we '
           'run it (D: the model\'s bytes; our clients keep nothing between rounds, so each '
           'one\'s control variate lives in the server state and goes down with the model); '
           'its paper counts 2·D each way, for clients that keep theirs.'), '',
           'Command: `python -m benchmarks.federations` (two copies share the runs; `--report` '
           'rewrites this page and the figure).', '']
  lines += table(study, loaded)
  lines += ['', '![accuracy against cumulative megabytes](federations.png)', '']
  finished = all(run is not None and run['finished'] for run in loaded.values())
  lines += report.prose('Verdict: ' + (VERDICT.format(**verdict_figures(study, loaded))
                                       if finished else 'not yet: the runs above are not all in.'))
  return '\n'.join(lines) + '\n'


def write_pages(study) -> None:
  """The page and figure in the study's output_dir, from its runs (the file's `report`)."""
  loaded = load(study)
  os.makedirs(study.output_dir, exist_ok=True)
  generated_files.write_text(os.path.join(study.output_dir, 'results.md'), page(study, loaded))
  figure(loaded, os.path.join(study.output_dir, 'federations.png'))
  print(f'wrote {os.path.relpath(os.path.join(study.output_dir, "results.md"))}')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _REPORT.value and _PLAN.value:
    print('error: choose one of --report and --plan', file=sys.stderr)
    return 2
  if _REPORT.value:
    write_pages(STUDY)
    return 0
  if _PLAN.value:
    print('\n'.join(compare.plan_runs(NAME, configs())))
    return 0

  def make() -> None:
    with queue.stop_requests():
      compare.run_all(configs())

  return queue.run_and_write(make, lambda: write_pages(STUDY))


if __name__ == '__main__':
  flag_parsing.run(main)
