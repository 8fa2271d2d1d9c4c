"""Writes every reproduction page from committed run directories and benchmarks/suites.py.

  python -m benchmarks.report

Pages: each suite's results.md, results.json and curves.png (one panel per setting);
REPRODUCTION.md (a row per paper: its claim at the closest protocol we ran, `suites.HEADLINES`;
then per method every comparison of its suites, with seeds, levels, margins and verdicts);
PROVENANCE.md (machines, evaluation schedules, runs made again); README.md's status block
(the row per paper, in short). Nothing on a page is typed by hand:
settings come from the suite declarations, numbers from each run's metrics.csv and
summary.json, paper figures and settings from paper_numbers.json. A test regenerates the
pages and compares them byte for byte with the committed ones.

Statistics (`programs.studies.paired`): seeds are paired (same partition, sampling and initial
model for both runs of a comparison), so a margin is the mean of the per-seed differences,
with a 95% paired t interval, over every seed both runs finished (those a study file adds
after 0, 1, 2 too). The reading rule (`verdict_key`): every suite of a paper that reports each
run's best round is read at the best round; any other over the last WINDOW rounds (each run's
mean test accuracy over the rounds it evaluated there), so that one seed's last 10 rounds
cannot flip it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import textwrap

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs import experiment_config
from programs import generated_files
from programs import methods
from programs import run_results
from programs.studies import curves
from programs.studies import declaration
from programs.studies import paired
from programs.studies import records
from programs.studies import study_file

REPRODUCTION = os.path.join(suites.RESULTS, 'REPRODUCTION.md')
PROVENANCE = os.path.join(suites.RESULTS, 'PROVENANCE.md')
FIGURES = os.path.join(suites.RESULTS, 'figures')
README = os.path.join(os.path.dirname(suites.HERE), 'README.md')
STATUS_BEGIN = '<!-- reproduction status: written by `python -m benchmarks.report` -->'
STATUS_END = '<!-- end of reproduction status -->'
WRITTEN = '<!-- written by `python -m benchmarks.report`; do not edit by hand -->'
METHODS = ('fedcda', 'fedcross', 'cadis', 'fedlex')   # REPRODUCTION.md's sections
MIN_SEEDS_FOR_VERDICT = 2


# --------------------------------------------------------------------------- #
# Comparisons and verdicts
# --------------------------------------------------------------------------- #


def window_mean(run: dict, width: int = suite_runs.WINDOW) -> float:
  """A run's mean test accuracy over the rounds it evaluated among its last `width`."""
  acc = [a for r, a in zip(run['curve_rounds'], run['curve_accuracy'])
         if r > run['rounds'] - width]
  return float(np.mean(acc)) if acc else float('nan')


# A run's figures on the pages: (key, heading).
FIGURES_READ = (('last10', 'last 10'), ('window', f'last {suite_runs.WINDOW}'), ('best', 'best'))


def run_figures(run: dict) -> dict:
  return dict(last10=run['last10_mean_accuracy'], window=window_mean(run),
              best=run['best_accuracy'], final=run['final_accuracy'])


def verdict_key(suite: suites.Suite) -> str:
  """The figure a suite's verdicts read (the reading rule): the best round where its paper
  reports each run's best (suites.BEST_ROUND_PAPERS), at every protocol of that paper, else
  the mean over the last WINDOW rounds."""
  return 'best' if suite.paper in suites.BEST_ROUND_PAPERS else 'window'


def verdict(paper_margin: float, paper_sign: float, mean: float, half_width: float) -> str:
  """Our margin (mean and 95% half-width over paired seeds, points) against the paper's.

  An interval that excludes 0 has a sign: `opposite` to the paper's, or the paper's sign with
  at least half its margin (`reproduced`) or less (`smaller`); a paper whose figures were lost
  but whose sign is known is `reproduced (sign)`; a comparison the paper makes no claim about
  is `higher` or `lower`. An interval that holds 0 is `below resolution` when the paper's
  margin is smaller than the interval's half-width (three seeds could not see it even if it
  were there), else `within noise`.
  """
  if not np.isfinite(mean):
    return 'not run'
  if not np.isfinite(half_width):
    return 'one seed'
  sign = np.sign(paper_margin) if np.isfinite(paper_margin) else np.sign(paper_sign)
  if not sign:
    return ('higher' if mean > 0 else 'lower') if abs(mean) > half_width else 'within noise'
  if abs(mean) > half_width:
    if np.sign(mean) != sign:
      return 'opposite'
    if not np.isfinite(paper_margin):
      return 'reproduced (sign)'
    return 'reproduced' if abs(mean) >= 0.5 * abs(paper_margin) else 'smaller'
  if np.isfinite(paper_margin) and abs(paper_margin) < half_width:
    return 'below resolution'
  return 'within noise'


def compare(suite: suites.Suite, loaded: dict, comp: suites.Comparison, paper: dict) -> dict:
  """One comparison of a suite over its paired finished seeds: levels, per-seed margins and
  their intervals for every figure of FIGURES_READ, and the verdict."""
  method = {s: r for s, r in loaded.get(comp.method, {}).items() if records.usable(r)}
  base = {s: r for s, r in loaded.get(comp.baseline, {}).items() if records.usable(r)}
  seeds = paired.paired_seeds(method, base)
  # Read both sides at the rounds both evaluated (a borrowed baseline may be evaluated on
  # another schedule).
  pairs = {s: [run_figures(r) for r in suite_runs.on_common_rounds(base[s], method[s])]
           for s in seeds}
  out = dict(label=comp.label, method=comp.method, baseline=comp.baseline, seeds=seeds,
             paper=paper.get(comp.paper, {}), stuck=[], collapsed=[])
  figures = out['paper']
  out['paper_margin'] = figures.get('method', np.nan) - figures.get('baseline', np.nan)
  for key, _ in FIGURES_READ:
    levels = [[pairs[s][side][key] for s in seeds] for side in (0, 1)]
    out[key] = dict(baseline=paired.mean_std([100 * v for v in levels[0]]),
                    method=paired.mean_std([100 * v for v in levels[1]]),
                    **paired.paired_margin(levels[1], levels[0], scale=100))
  key = verdict_key(suite)
  out['verdict_key'] = key
  out['verdict'] = (verdict(out['paper_margin'], figures.get('sign', 0), out[key]['margin'],
                            out[key]['half_width'])
                    if len(seeds) >= MIN_SEEDS_FOR_VERDICT or not seeds else 'one seed')
  if suite.retired and not seeds:
    out['verdict'] = 'retired'
  for name, side in ((comp.baseline, base), (comp.method, method)):
    for s in seeds:
      if suite_runs.never_left_chance(side[s]):
        out['stuck'].append((name, s))
      elif (at := suite_runs.fell_to_chance(side[s])):
        out['collapsed'].append((name, s, at))
  return out


def comparisons(suite: suites.Suite, loaded: dict) -> list:
  paper = suites.load_paper_numbers().get(suite.name, {})
  return [compare(suite, loaded, c, paper) for c in suite.comparisons]


def stuck_text(c: dict) -> str:
  return '; '.join([f'{run} seed {s} never left chance' for run, s in c['stuck']] +
                   [f'{run} seed {s} fell to chance at round {at}'
                    for run, s, at in c['collapsed']])


# --------------------------------------------------------------------------- #
# Rounds to a target accuracy (a paper's rounds-to-target table)
# --------------------------------------------------------------------------- #

ROUNDS_TO_TARGET = 'Rounds to target accuracy'


def rounds_to_targets(loaded: dict, comp: suites.Comparison, targets: tuple) -> dict:
  """A comparison's rounds to each target over its paired finished seeds, each pair read at
  the rounds both runs evaluated: {'seeds', 'baseline'/'method': {target: [first round per
  seed, None = never]}, 'speedup': {target: the baseline's mean rounds / the method's, NaN
  unless every seed of both reached it}, 'steps': per seed, the largest gap between those
  rounds}."""
  method = {s: r for s, r in loaded.get(comp.method, {}).items() if records.usable(r)}
  base = {s: r for s, r in loaded.get(comp.baseline, {}).items() if records.usable(r)}
  out = dict(label=comp.label, seeds=paired.paired_seeds(method, base), steps=[],
             baseline={t: [] for t in targets}, method={t: [] for t in targets})
  for seed in out['seeds']:
    pair = suite_runs.on_common_rounds(base[seed], method[seed])
    for side, run in zip(('baseline', 'method'), pair):
      points = list(zip(run['curve_rounds'], run['curve_accuracy']))
      for t in targets:
        out[side][t].append(run_results.first_round_reaching(points, t))
    out['steps'].append(int(np.diff([0] + pair[0]['curve_rounds']).max()))
  out['speedup'] = {t: _mean_rounds(out['baseline'][t]) / _mean_rounds(out['method'][t])
                    for t in targets}
  return out


def _mean_rounds(rounds: list) -> float:
  """The mean over seeds; NaN when a seed never reached the target (or there are none)."""
  return float(np.mean(rounds)) if rounds and None not in rounds else float('nan')


def _rounds_cell(rounds: list) -> str:
  mean = _mean_rounds(rounds)
  return (f'{mean:.0f}' if np.isfinite(mean) else 'n/a') + ' (' + ', '.join(
      'never' if r is None else str(r) for r in rounds) + ')'


def _speedup_text(value: float) -> str:
  return f'{value:.2f}×' if np.isfinite(value) else 'n/a'


def rounds_to_target_results(tuned: suites.Suite) -> list:
  """[(suite, rounds its runs are read over, rounds_to_targets of a comparison)] over every
  suite of the tuned suite's method with finished seeds, at the tuned suite's targets."""
  return [(s, suite_runs.reported_rounds(s), r) for _, s in method_suites(tuned.name)
          for r in (rounds_to_targets(suite_runs.collect(s), c, tuned.targets)
                    for c in s.comparisons)
          if r['seeds']]


def _paper_rounds(tuned: suites.Suite) -> tuple:
  """(the paper's figures from paper_numbers.json, its targets in order, 'the paper's
  speed-ups' text)."""
  paper = suites.load_paper_numbers()['rounds_to_target'][tuned.name]
  targets = sorted(paper['rounds'], key=float)
  runs = [paper['rounds'][t] for t in targets]
  return paper, targets, ' / '.join(
      _speedup_text(r['fedavg'] / r[tuned.name]) for r in runs)


def _rounds_to_target_lines(suite: suites.Suite) -> list:
  if not suite.targets:
    return []
  results = rounds_to_target_results(suite)
  percents = [f'{100 * t:g}%' for t in suite.targets]
  paper, paper_targets, speedups = _paper_rounds(suite)
  steps = sorted({step for _, _, r in results for step in r['steps']})
  lines = [f'## {ROUNDS_TO_TARGET}', ''] + prose(
      f'The question of the paper\'s {paper["where"]}: the rounds to '
      f'{" and ".join(percents)} test accuracy and the speed-up over the baseline, for every '
      'protocol\'s runs (no new runs). A round is the first evaluated one at or above the '
      'target, each pair of runs (method and baseline, one seed) read at the rounds both '
      f'evaluated: every {" or ".join(map(str, steps))} rounds up to their last ones (seeds '
      'made at different evaluation schedules), so a count is late by less than that step, '
      'and a curve that swings may cross the target between two evaluations and fall back '
      'before the next: the count is the first evaluated crossing. Cells: the mean over seeds '
      '(n/a when a seed never got there), then each seed\'s. Speed-up: the baseline\'s mean '
      'rounds / the method\'s (below 1: slower than the baseline), the ratio of the means as '
      'the paper\'s ratio of its runs\' rounds, rather than the mean of per-seed ratios, which '
      'one evaluation step swings in a short count (5 against 10 rounds is 2×). The paper '
      f'({paper["dataset"]}, ' + ' and '.join(
          f'{t}%: FedAvg {paper["rounds"][t]["fedavg"]}, {suite.method} '
          f'{paper["rounds"][t][suite.name]} rounds' for t in paper_targets)
      + f'): speed-up {speedups}.') + ['']
  head = ' | '.join(f'baseline, {p} | method, {p} | speed-up, {p}' for p in percents)
  lines += [f'| protocol | comparison | rounds run | seeds | {head} |',
            '|---' * (4 + 3 * len(percents)) + '|']
  for s, rounds, r in results:
    cells = ' | '.join(f'{_rounds_cell(r["baseline"][t])} | {_rounds_cell(r["method"][t])} | '
                       f'{_speedup_text(r["speedup"][t])}' for t in suite.targets)
    lines.append(f'| {protocol_of(s)} | {r["label"]} | {rounds} | {len(r["seeds"])} | '
                 f'{cells} |')
  return lines + ['']


# --------------------------------------------------------------------------- #
# Formatting
# --------------------------------------------------------------------------- #

PROSE_WIDTH = 100


def prose(text: str, bullet: bool = False) -> list:
  """A paragraph (or a '- ' list item) as lines of at most PROSE_WIDTH characters, paragraph
  breaks kept."""
  out = []
  for i, paragraph in enumerate(text.split('\n\n')):
    if i:
      out.append('')
    out += textwrap.wrap(paragraph, PROSE_WIDTH, break_long_words=False,
                         break_on_hyphens=False,
                         initial_indent='- ' if bullet and not i else '',
                         subsequent_indent='  ' if bullet else '')
  return out


def level(mean_std: tuple) -> str:
  """'mean ± std' (points), '(one seed)' without a spread."""
  return paired.mean_and_spread(*mean_std)


def paper_text(c: dict) -> str:
  p = c['paper']
  if 'baseline' in p and 'method' in p:
    return f'{p["baseline"]:.2f} → {p["method"]:.2f} ({c["paper_margin"]:+.2f}, {p["dataset"]})'
  sign = p.get('sign', 0)
  claim = 'a gain (sign only)' if sign > 0 else 'a loss (sign only)' if sign < 0 else 'n/a'
  return claim + (f'; {p["dataset"]}' if p.get('dataset') else '')


def cell(text: str) -> str:
  """`text` as one markdown table cell: a bar not already escaped is escaped."""
  return re.sub(r'(?<!\\)\|', r'\\|', text)


def verdict_cell(c: dict) -> str:
  stuck = stuck_text(c)
  return f'**{VERDICT_WORDS[c["verdict"]]}**' + (f' ({stuck})' if stuck else '')


# --------------------------------------------------------------------------- #
# Settings, paper against ours
# --------------------------------------------------------------------------- #

PARTITIONS = dict(dirichlet=lambda config: f'Dir {config.dirichlet_alpha:g}',
                  shards=lambda config: f'shards {config.shards_per_client}',
                  classes=lambda config: f'{config.classes_per_client} classes per client',
                  cluster_mc=lambda config: 'cluster MC', cluster_uc=lambda config: 'cluster UC',
                  cluster_bc=lambda config: 'cluster BC', iid=lambda config: 'IID',
                  quantity=lambda config: f'quantity skew {config.quantity_alpha:g}')
DATASETS = dict(fashion_mnist='Fashion-MNIST', digits='digits')
MODELS = dict(simple_cnn='simple CNN', fedavg_cnn='FedAvg CNN', tiny_cnn='tiny CNN',
              mlp_2nn='2NN', mlp_2nn_dropout='2NN, dropout 0.1')
# Which Adam a run trained with: TFF's build_adam adds eps to the un-corrected sqrt(v).
ADAMS = dict(adam='TFF Adam', torch_adam='PyTorch Adam')


def _optimizer(config) -> str:
  if config.algorithm in ('fedsgd', 'fedlex_sgd'):   # no local step: the server's rate is the step
    return f'one full-batch gradient, server lr {config.server_lr:g}'
  if config.client_optimizer in ADAMS:
    text = f'{ADAMS[config.client_optimizer]} lr {config.client_lr:g}'
  else:
    text = f'SGD lr {config.client_lr:g}' + (f', momentum {config.client_momentum:g}'
                                        if config.client_momentum else '')
  if config.client_lr_decay != 1:
    text += f' (× {config.client_lr_decay:g} a round)'
  return text + (f', weight decay {config.client_weight_decay:g}' if config.client_weight_decay else '')


def _method_settings(config) -> str:
  a = config.algorithm
  if a == 'fedcda':
    return (f'K {config.fedcda_cache_size}, B {config.fedcda_batches}, L {config.fedcda_smoothness:g}, warmup '
            f'{config.fedcda_warmup_rounds}, {config.fedcda_selection.replace("_", "-")}')
  if a == 'fedcross':
    accel = (f'dynamic α and {config.fedcross_num_propellers} propellers over '
             f'{config.fedcross_accel_rounds} rounds' if config.fedcross_accel_rounds else 'no acceleration')
    similarity = (' (layer-wise sum)' if config.fedcross_similarity == 'layerwise' else '')
    return (f'α {config.fedcross_alpha:g}, {config.fedcross_selection.replace("_", " ")}{similarity}, '
            f'{accel}')
  if a == 'cadis':
    weights = 'eq. 1 weights' if config.cadis_sample_weighted else 'weights 1/\\|C_i\\|'
    quirks = (', KD σ over n − 1' if config.cadis_kd_std == 'sample' else '') + (
        ', the code\'s slips (pair index j − i − 1, abs())' if config.cadis_reference_quirks else '')
    return (f'λ {config.cadis_kd_weight:g}, τ₀ {config.cadis_threshold:g} → {config.cadis_threshold_max:g}, '
            f'{weights}{quirks}')
  if a in methods.FEDLEX_ALGORITHMS:
    patience = (f' (patience {config.fedlex_exploration_patience})'
                if config.fedlex_exploration_patience else '')
    normalize = ', mean before normalising' if config.fedlex_normalize == 'after_mean' else ''
    server = f', server lr {config.server_lr:g}' if config.server_lr >= 0 else ''
    return (f'{100 * config.fedlex_explorer_fraction:g}% of clients explore '
            f'{config.fedlex_exploration_epochs} epochs{patience}{normalize}{server}')
  return ''


# The settings table's rows: (heading, formatter of an ExperimentConfig).
SETTINGS = (
    ('data', lambda config: f'{DATASETS.get(config.dataset, config.dataset)}, {PARTITIONS[config.partition](config)}'),
    ('model', lambda config: MODELS.get(config.model, config.model)),
    ('clients', lambda config: f'{config.num_clients}, {config.clients_per_round} per round'),
    ('local epochs', lambda config: str(config.local_epochs)),
    ('batch', lambda config: str(config.batch_size)),
    ('client optimizer', _optimizer),
    ('rounds', lambda config: str(config.rounds)),
    ('method', _method_settings),
)


def suite_configs(suite: suites.Suite) -> dict:
  """{run: ExperimentConfig} of every run of the suite's comparisons (tuned)."""
  tuned = suites.load_tuned(suite.name)
  names = [r for comp in suite.comparisons for r in (comp.baseline, comp.method)]
  return {r: experiment_config.ExperimentConfig(**suite.config_overrides(r, tuned))
          for r in dict.fromkeys(names)}


def settings_values(suite: suites.Suite) -> dict:
  """{heading: [distinct values over the suite's runs]} (the method row over its method runs,
  the client optimizer as 'run: value' where runs differ)."""
  configs = suite_configs(suite)
  method_runs = [comp.method for comp in suite.comparisons]
  out = {}
  for heading, show in SETTINGS:
    over = method_runs if heading == 'method' else list(configs)
    values = {r: show(configs[r]) for r in over}
    distinct = list(dict.fromkeys(v for v in values.values() if v))
    if heading == 'client optimizer' and len(distinct) > 1:   # which runs train how
      distinct = [v + ' (' + ', '.join(r for r, w in values.items() if w == v) + ')'
                  for v in distinct]
    out[heading] = distinct
  out['results read'] = [('best round' if verdict_key(suite) == 'best' else
                          f'last 10 rounds (verdict: last {suite_runs.WINDOW})')
                         + f', seeds {", ".join(map(str, suite.seeds))}']
  return out


def _cell(values: list, same: list) -> str:
  """Our values, each in bold where the paper's settings do not hold it (a value naming its
  runs is compared without them)."""
  return ' / '.join(v if re.sub(r' \([a-z0-9_., ]+\)$', '', v) in same else f'**{v}**'
                    for v in values)


def settings_table(method: str, columns: list) -> list:
  """Paper | ours per suite in `columns` ([(heading, suite)]), our values in bold where they
  differ from the paper's."""
  paper = suites.load_paper_numbers()['settings'][method]
  lines = ['| setting | paper | ' + ' | '.join(h for h, _ in columns) + ' |',
           '|---' * (2 + len(columns)) + '|']
  values = [settings_values(s) for _, s in columns]
  for heading in [h for h, _ in SETTINGS] + ['results read']:
    entry = paper[heading]
    shown, same = (entry, [entry]) if isinstance(entry, str) else (entry['show'], entry['same'])
    lines.append(f'| {heading} | {shown} | ' + ' | '.join(_cell(v[heading], same)
                                                           for v in values) + ' |')
  return lines


# --------------------------------------------------------------------------- #
# Curves: one panel per setting, one colour per method on every page
# --------------------------------------------------------------------------- #


def _method_of(run: str) -> str:
  """A run name without its setting's suffix (fedavg_dir0.1 -> fedavg)."""
  return re.sub(r'_(dir|beta|shards)[0-9.]+$', '', run)


@functools.lru_cache(maxsize=None)
def _colour_order() -> tuple:
  return tuple(dict.fromkeys(_method_of(r) for s in suites.SUITES.values()
                             for r in s.run_names))


def colour_of(run: str) -> str:
  """The same colour for a method (its run name without the setting) on every page."""
  return curves.PALETTE[_colour_order().index(_method_of(run)) % len(curves.PALETTE)]


def panels(suite: suites.Suite) -> list:
  """[(title, [runs])] of a suite's curves (curves.panels); a comparison between two methods
  (its baseline another comparison's method) has both curves in their baseline's panel
  already."""
  methods = {c.method for c in suite.comparisons}
  return curves.panels([c for c in suite.comparisons if c.baseline not in methods])


def suite_groups(suite: suites.Suite, loaded: dict, prefix: str = '') -> list:
  return [(prefix + title, {r: list(loaded.get(r, {}).values()) for r in names})
          for title, names in panels(suite)]


# --------------------------------------------------------------------------- #
# A suite's page
# --------------------------------------------------------------------------- #


def _settings_lines(suite: suites.Suite) -> list:
  tuned = suites.load_tuned(suite.name)
  fields = {r: suite.config_overrides(r, tuned) for r in suite.run_names}
  shared = {k: v for k, v in next(iter(fields.values())).items()
            if all(f.get(k) == v for f in fields.values())}
  lines = ['Shared by every run: ' + ', '.join(f'`{k}={v}`' for k, v in sorted(shared.items()))
           + '.', '', '| run | its own settings |', '|---|---|']
  for run, f in fields.items():
    own = ', '.join(f'`{k}={v}`' for k, v in sorted(f.items()) if k not in shared)
    if run in suite.borrowed:
      maker, made_as = suite.borrowed[run]
      own += f' (the [{maker}](../{maker}/results.md) suite\'s `{made_as}`, read at this length)'
    lines.append(f'| {run} | {own} |')
  return lines + [''] + prose('What differs from the paper: ' + suite.scaled) + ['']


SETTINGS_BESIDE_THE_PAPER = 'Settings beside the paper\'s'


def _beside_the_paper_lines(suite: suites.Suite) -> list:
  """A method's tuned suite: the paper's settings beside every protocol of the method's
  suites (the table REPRODUCTION.md links to)."""
  if suite.name not in METHODS:
    return []
  return [f'## {SETTINGS_BESIDE_THE_PAPER}', ''] + prose(
      'Every protocol we ran for the paper\'s method, beside the paper\'s own settings (and '
      'its authors\' code\'s, where the paper is silent); bold settings differ from the '
      'paper\'s.') + [''] + settings_table(suite.name, method_suites(suite.name)) + ['']


def _tuning_lines(suite: suites.Suite) -> list:
  if not suite.grid:
    return []
  tuned = suites.load_tuned(suite.name) or {}
  key = records.CRITERION_KEYS[suite.criterion]
  lines = ['## Tuning', '',
           f'Seed {declaration.TUNING_SEED} (apart from the reported seeds), '
           f'{suite.tuning_rounds or suite.common["rounds"]} rounds; the best '
           f'{"single round" if suite.criterion == "best" else "last-10 mean"} wins and is '
           'frozen in tuned.json.', '', '| run | grid point | accuracy (%) | chosen |',
           '|---|---|---|---|']
  for run, grid in suite.grid.items():
    chosen = tuned.get(suite.algorithm(run))
    for values in records.grid_points(grid):
      path = os.path.join(suites.suite_dir(suite.name), 'tuning',
                          declaration.tuning_name(run, values))
      try:
        r = records.at_length(records.load_run(path), suite.tuning_overrides(run, values)['rounds'])
        figure = 'diverged' if r['diverged'] else (
            paired.pct(r[key]) if r['finished'] else f'running ({r["rounds_done"]} rounds)')
      except FileNotFoundError:
        figure = 'not run yet'
      point = ', '.join(f'`{k}={v:g}`' for k, v in values.items())
      edge = [k for k, v in values.items() if len(grid[k]) > 1 and v in (grid[k][0], grid[k][-1])]
      mark = ('yes' + (f' (the grid\'s edge in {", ".join(edge)})' if edge else '')
              if values == chosen else '')
      lines.append(f'| {run} | {point} | {figure} | {mark} |')
  return lines + ['']


def _results_lines(suite: suites.Suite, results: list) -> list:
  key = verdict_key(suite)
  lines = ['| comparison | paper | seeds | baseline (%) | method (%) | margin, last 10 | '
           f'margin, last {suite_runs.WINDOW} | margin, best | verdict |',
           '|---|---|---|---|---|---|---|---|---|']
  for c in results:
    lines.append(f'| {c["label"]} | {paper_text(c)} | {len(c["seeds"])} | '
                 f'{level(c[key]["baseline"])} | {level(c[key]["method"])} | '
                 + ' | '.join(paired.margin_text(c[k]) for k, _ in FIGURES_READ)
                 + f' | {verdict_cell(c)} |')
  read = 'best round' if key == 'best' else f'mean over the last {suite_runs.WINDOW} rounds'
  return lines + [''] + prose(
      f'Levels: the {read}, mean ± std over seeds. Margins: method − baseline per paired seed, '
      'mean ± the 95% t half-width, then each seed\'s. The verdict reads the '
      f'{read} (REPRODUCTION.md says how).') + ['']


def _every_run_lines(suite: suites.Suite, loaded: dict) -> list:
  extra = suite.summary_columns
  lines = ['| run | seed | rounds | last 10 (%) | last 50 (%) | best (%) | final (%) | s/round |'
           + ''.join(f' {h} |' for h, _, _ in extra) + ' notes |',
           '|---' * (9 + len(extra)) + '|']
  for run, seeds in loaded.items():
    for seed in sorted(set(seeds) | set(suite.seeds)):
      r = seeds.get(seed)
      if r is None:
        lines.append(f'| {run} | {seed} | not run yet |' + ' |' * (6 + len(extra)))
        continue
      f = run_figures(r)
      notes = ([f'dropped {sum(n for _, n in r["dropped_clients"])} non-finite client updates '
                f'(rounds {", ".join(str(k) for k, _ in r["dropped_clients"][:3])}'
                + (', ...' if len(r['dropped_clients']) > 3 else '') + ')']
               if r['dropped_clients'] else [])
      if r.get('stale'):
        notes.append('made at other settings, left out: ' + ', '.join(r['stale']))
      elif r['diverged']:
        notes.append(f'{r["diverged"]}; left out')
      elif not r['finished']:
        notes.append('running or stopped (the same command continues it)')
      if suite_runs.never_left_chance(r):
        notes.append('never left chance')
      elif (at := suite_runs.fell_to_chance(r)):
        notes.append(f'fell to chance at round {at}')
      values = ''.join(f' {suite_runs.num(suite_runs.summary_value(r, path), spec)} |'
                       for _, path, spec in extra)
      lines.append(f'| {run} | {seed} | {r["rounds_done"]}/{r["rounds"]} | '
                   + ' | '.join(paired.pct(f[k]) for k in ('last10', 'window', 'best', 'final'))
                   + f' | {suite_runs.num(r["seconds_per_round"])} |{values} {"; ".join(notes)} |')
  return lines + ['']


def probe_comparisons(suite: suites.Suite, probe: suites.Probe) -> list:
  """The suite's comparisons a probe made: one side among its runs, both sides run."""
  loaded = suite_runs.collect_probe(suite, probe)
  return [c for c in comparisons(suite, loaded)
          if {c['method'], c['baseline']} & set(probe.runs)
          and c['method'] in loaded and c['baseline'] in loaded]


def _probe_lines(suite: suites.Suite) -> list:
  if not suite.probes:
    return []
  lines = ['## Probes', ''] + prose(
      'Runs at changed settings that test a diagnosis (`python -m benchmarks.compare '
      f'--suite={suite.name} --probes`), over their own seeds.') + ['',
           '| probe | question | changes | comparison | seeds | baseline (%) | method (%) | '
           'margin |', '|---|---|---|---|---|---|---|---|']
  key = verdict_key(suite)
  for probe in suite.probes:
    changes = ', '.join(f'`{k}={v}`' for k, v in sorted(probe.overrides.items()))
    shown = False
    for c in probe_comparisons(suite, probe):
      shown = True
      lines.append(f'| {probe.name} | {cell(probe.question)} | {changes} | {c["label"]} | '
                   f'{len(c["seeds"])} | {level(c[key]["baseline"])} | '
                   f'{level(c[key]["method"])} | {paired.margin_text(c[key])} |')
    if not shown:
      lines.append(f'| {probe.name} | {cell(probe.question)} | {changes} | not run yet | | | | |')
  return lines + ['']


def suite_page(suite: suites.Suite) -> tuple:
  """(results.md text, results.json text, loaded runs) of a suite."""
  loaded = suite_runs.collect(suite)
  results = comparisons(suite, loaded)
  done = sum(records.usable(r) for seeds in loaded.values() for r in seeds.values())
  # every declared seed, and any made beyond them (e.g. later seeds that narrow an interval)
  expected = sum(len(set(seeds) | set(suite.seeds)) for seeds in loaded.values())
  lines = [f'# {suite.title}', '', WRITTEN, ''] + prose(
      f'{done} of {expected} runs finished. The verdicts, beside the '
      'paper\'s protocol or the tuned one, are in [REPRODUCTION.md](../REPRODUCTION.md); this '
      'page holds every run. Commands (each continues where it stopped):') + ['']
  if suite.grid:
    lines.append(f'    python -m benchmarks.compare --suite={suite.name} --tune')
  lines += [f'    python -m benchmarks.compare --suite={suite.name}', '', '## Settings', '']
  lines += _settings_lines(suite) + _beside_the_paper_lines(suite) + _tuning_lines(suite)
  lines += ['## Results', ''] + _results_lines(suite, results)
  lines += [f'![test accuracy over rounds, one panel per setting](curves.png)', '']
  lines += _rounds_to_target_lines(suite)
  lines += ['## Every run', ''] + _every_run_lines(suite, loaded)
  lines += _probe_lines(suite)
  if suite.notes:
    lines += ['## What the runs show', ''] + prose(suite.notes) + ['']
  data = dict(comparisons=results,
              runs={run: {str(s): dict(run_figures(r), finished=r['finished'])
                          for s, r in seeds.items()} for run, seeds in loaded.items()})
  return ('\n'.join(lines),
          json.dumps(generated_files.json_ready(data), indent=1, sort_keys=True) + '\n', loaded)


def write_suite_page(suite: suites.Suite) -> None:
  out = suites.suite_dir(suite.name)
  page, data, loaded = suite_page(suite)
  os.makedirs(out, exist_ok=True)
  generated_files.write_text(os.path.join(out, 'results.md'), page)
  generated_files.write_text(os.path.join(out, 'results.json'), data)
  curves.plot(os.path.join(out, 'curves.png'), suite_groups(suite, loaded), colour_of)


# --------------------------------------------------------------------------- #
# REPRODUCTION.md, PROVENANCE.md and README's status
# --------------------------------------------------------------------------- #


def protocol_of(suite: suites.Suite) -> str:
  """How the pages call a suite's protocol: its paper protocol (Suite.protocol), `tuned`
  (the suite tunes its rates on a grid), or the paper's rate untuned."""
  if suite.paper_of:
    return suite.protocol
  return 'tuned' if suite.grid else 'paper\'s rate, untuned'


def method_suites(method: str) -> list:
  """[(heading, suite)]: the method's suites at its paper's protocol (if any), then the tuned
  one."""
  paper = [s for s in suites.SUITES.values() if s.paper_of == method]
  return [(f'ours: {protocol_of(s)}', s) for s in paper + [suites.SUITES[method]]]


# The verdicts in plain words (`verdict`'s codes; REPRODUCTION.md says what each means).
VERDICT_WORDS = {'reproduced': 'reproduced', 'reproduced (sign)': 'a gain, as claimed',
                 'smaller': 'a smaller gain', 'opposite': 'opposite',
                 'within noise': 'within noise', 'below resolution': 'too small to see',
                 'one seed': 'one seed', 'not run': 'not run yet',
                 'higher': 'higher', 'lower': 'lower', 'retired': 'retired (cost)'}


def headline_comparison(h: suites.Headline) -> tuple:
  """(suite, its probe or None, the comparison `compare` reads) of a headline."""
  suite = suites.SUITES[h.suite]
  probe = next((p for p in suite.probes if p.name == h.probe), None)
  loaded = suite_runs.collect_probe(suite, probe) if probe else suite_runs.collect(suite)
  c = next(c for c in comparisons(suite, loaded) if c['label'] == h.label)
  return suite, probe, dict(c, planned=len(probe.seeds if probe else suite.seeds))


def seeds_cell(c: dict) -> str:
  """How many paired seeds a comparison reads: 'n', or 'n of N' while seeds it plans
  (`planned`) are still to come."""
  n = len(c['seeds'])
  return f'{n} of {c["planned"]}' if n < c.get('planned', n) else str(n)


def _paper_figures(section: str, key: str) -> dict:
  return suites.load_paper_numbers()[section][key]


def judged(c: dict, figures: dict) -> dict:
  """The comparison `c` judged against the paper figures `figures` instead of its own."""
  margin = figures.get('method', np.nan) - figures.get('baseline', np.nan)
  key = c['verdict_key']
  out = dict(c, paper=figures, paper_margin=margin)
  if len(c['seeds']) >= MIN_SEEDS_FOR_VERDICT:
    out['verdict'] = verdict(margin, figures.get('sign', 0), c[key]['margin'],
                             c[key]['half_width'])
  return out


def headline_row(h: suites.Headline) -> str:
  suite, probe, c = headline_comparison(h)
  key = c['verdict_key']
  first = judged(c, _paper_figures(*h.judged)) if h.judged else c
  others = [judged(c, _paper_figures(*f)) for f in h.also]
  claim = h.claim.format(*(f'{x["paper_margin"]:+.2f}' for x in [first] + others))
  where = suite.name
  text = f'**{VERDICT_WORDS[first["verdict"]]}**'
  if others and first['verdict'] != 'one seed':
    text += (f' against {first["paper"]["dataset"]}; '
             + '; '.join(f'{VERDICT_WORDS[o["verdict"]]} against {o["paper"]["dataset"]}'
                         for o in others))
  text += f' ({margin_short(c[key])})'
  return (f'| {cell(claim)} | {cell(h.differs)} ([{where}]'
          f'({suite.name}/results.md)) | {text} | {seeds_cell(c)} | {cell(h.why)} |')


def level_short(mean_std: tuple) -> str:
  """A level as 'mean ± std', or 'mean' with one seed (the seeds column says so)."""
  return level(mean_std).replace(' (one seed)', '')


def margin_short(figure: dict) -> str:
  """A margin as '+m ± h', or '+m' with one seed (the seeds column says so)."""
  return paired.margin_text(figure, False).replace(' (one seed)', '')


def tuned_method(method: str) -> str:
  return suites.SUITES[method].method


def short_label(label: str, method: str) -> str:
  """A comparison's label in its method's section: without the method's name."""
  return re.sub(rf'^{re.escape(method)},? ', '', label)


def comparison_row(c: dict, protocol: str, method: str) -> str:
  """A comparison's row of REPRODUCTION.md's method tables."""
  key = c['verdict_key']
  label = short_label(c['label'], method)
  fell = len(c['stuck']) + len(c['collapsed'])
  note = f' ({fell} of {2 * len(c["seeds"])} runs ended at chance)' if fell else ''
  if not c['seeds']:
    return f'| {label} | {protocol} | 0 | | | {_paper_short(c)} | {verdict_cell(c)} |'
  return (f'| {label} | {protocol} | {seeds_cell(c)} | {level_short(c[key]["baseline"])} | '
          f'{margin_short(c[key])} | {_paper_short(c)} | '
          f'**{VERDICT_WORDS[c["verdict"]]}**{note} |')


def _paper_short(c: dict) -> str:
  p = c['paper_margin']
  return f'{p:+.2f}' if np.isfinite(p) else ('+' if c['paper'].get('sign', 0) > 0 else 'n/a')


def retired_text(suite: suites.Suite) -> str:
  """Why a retired paper protocol's runs are not made: the round time its timing probe's
  runs measured here, and what the suite's runs would take at it."""
  maker = suites.SUITES[suite.retired[0]]
  probe = next(p for p in maker.probes if p.name == suite.retired[1])
  times = [r['seconds_per_round'] for seeds in suite_runs.collect_probe(maker, probe).values()
           for r in seeds.values() if records.usable(r)]
  rounds = suite.common['rounds']
  hours = float(np.mean(times)) * rounds / 3600
  runs = len(suite.runs) * len(suite.seeds)
  return (f'retired, {min(times):.0f}-{max(times):.0f} s a round here at its local training '
          f'(probe {probe.name}): {hours:.1f} h a {rounds}-round run, {hours * runs:.0f} h for its '
          f'{runs} runs')


def federations_sentence() -> str:
  """FedCDA's level on the federations page beside FedAvg's."""
  from benchmarks import federations   # pylint: disable=g-import-not-at-top (imports report)
  loaded = federations.load(federations.STUDY)
  gaps = [100 * (loaded['fedavg', c]['last10_mean_accuracy']
                 - loaded['fedcda', c]['last10_mean_accuracy'])
          for c in federations.CONDITIONS if loaded['fedavg', c] and loaded['fedcda', c]]
  if not gaps:
    return ''
  page = os.path.join(federations.NAME, 'results.md')   # beside REPRODUCTION.md
  return (f'[Federations]({page}) (one seed, 100 clients, FedAvg\'s rate, '
          f'untuned for FedCDA): FedCDA ends {min(gaps):.1f}-{max(gaps):.1f} points below '
          'FedAvg.')


def seeds_factor_text(counts: list) -> str:
  """What n paired seeds resolve, for each n on the page."""
  return ', '.join(f'{paired.resolution(n):.2f} at {n} seeds' for n in sorted(set(counts))
                   if n >= 2)


INTRO = (
    'Does our implementation give each paper\'s gain? Our data: Fashion-MNIST. Method and '
    'baseline share each seed (client data, sampling, initial model). **Level**: test accuracy '
    '(%), mean ± std over seeds. **Margin**: method − baseline in points, mean ± its 95% paired '
    't interval (the method\'s level: baseline + margin). **Reading rule**: a run\'s best round where the paper reports its best '
    '(CADIS), else its mean over the last {window} rounds.')

VERDICTS_TEXT = (
    '**Verdicts** (of the interval): *reproduced*: excludes 0 on the paper\'s side, the margin '
    '≥ half the paper\'s; *a smaller gain*: under half; *opposite*: excludes 0 on the other '
    'side; *within noise*: holds 0; *too small to see*: holds 0, wider than the paper\'s '
    'margin. Its half-width: the per-seed margins\' std × {factors}. '
    'Machines: [PROVENANCE.md](PROVENANCE.md).')


def reproduction_page() -> str:
  heads = [(h, headline_comparison(h)[2]) for h in suites.HEADLINES]
  lines = ['# Reproducing the papers\' claims', '', WRITTEN, ''] + prose(
      INTRO.format(window=suite_runs.WINDOW)) + ['',
      '| paper\'s claim | closest protocol we ran: how it differs | verdict (margin) | seeds '
      '| why |', '|---|---|---|---|---|']
  lines += [headline_row(h) for h in suites.HEADLINES] + ['']
  counts = [len(c['seeds']) for _, c in heads]
  sections = []
  for method in METHODS:
    tuned = suites.SUITES[method]
    rows = []
    notes = []
    for _, suite in method_suites(method):
      protocol = protocol_of(suite)
      if suite.retired:
        notes.append(f'{protocol.capitalize()}: ' + retired_text(suite) + '.')
      for c in comparisons(suite, suite_runs.collect(suite)):
        rows.append(comparison_row(dict(c, planned=len(suite.seeds)), protocol, tuned.method))
        counts.append(len(c['seeds']))
      for probe in (p for p in suite.probes if p.name in suite.shown_probes):
        for c in probe_comparisons(suite, probe):
          rows.append(comparison_row(dict(c, planned=len(probe.seeds)),
                                     f'{protocol}, probe {probe.name}', tuned.method))
          counts.append(len(c['seeds']))
    for h, c in heads:   # a headline read from a probe: its row, judged as the headline is
      if h.method == method and h.probe:
        rows.append(comparison_row(judged(c, _paper_figures(*h.judged)) if h.judged else c,
                                   f'probe {h.probe}', tuned.method))
    links = ' · '.join(f'[{s.name}]({s.name}/results.md)' for _, s in method_suites(method))
    if os.path.exists(os.path.join(suites.HERE, f'{method}_diagnosis.py')):
      links += f' · [diagnosis]({method}/diagnosis.md)'
    sections += [f'## {tuned.method}', '', links, '',
                 '| comparison | protocol | seeds | baseline (%) | margin | paper | verdict |',
                 '|---|---|---|---|---|---|---|'] + rows + ['']
    notes += [tuned.bottom_line + (' ' + tuned.reference_line if tuned.reference_line else '')]
    if method == 'fedcda':
      notes.append(federations_sentence())
    for note in notes:
      if note:
        sections += prose(note, bullet=True)
    sections += ['']
  lines += prose(VERDICTS_TEXT.format(factors=seeds_factor_text(counts))) + [''] + sections
  for suite in other_suites():   # one line each: not one of the four papers
    pairs = {}
    for c in comparisons(suite, suite_runs.collect(suite)):
      pairs.setdefault((c['method'], c['baseline']), []).append(c)
    lines += prose(f'Beyond the papers, [{suite.method}]({suite.name}/results.md): ' + '; '.join(
        f'{c[0]["label"]}, {seeds_cell(dict(c[0], planned=len(suite.seeds)))} seeds, '
        f'{margin_short(c[0][c[0]["verdict_key"]])}: ' + ', '.join(
            f'**{VERDICT_WORDS[x["verdict"]]}** against {x["paper"]["dataset"]}\'s '
            f'{_paper_short(x)}' for x in c) for c in pairs.values()) + '.') + ['']
  return '\n'.join(lines)


def other_suites() -> list:
  """Suites of methods beyond the four papers (neither a paper's tuned suite nor its
  protocol's), e.g. SCAFFOLD."""
  return [s for s in suites.SUITES.values() if s.name not in METHODS and not s.paper_of]


def write_method_figures() -> None:
  """figures/<method>.png: the method's panels at the paper's protocol, then tuned."""
  for method in METHODS:
    groups = []
    for _, suite in method_suites(method):
      groups += suite_groups(suite, suite_runs.collect(suite), f'{protocol_of(suite)}: ')
    curves.plot(os.path.join(FIGURES, f'{method}.png'), groups, colour_of)


def provenance_page() -> str:
  lines = ['# Where the runs were made', '', WRITTEN, ''] + prose(
      'A run is deterministic on one machine and code (a resumed run continues exactly); on '
      'another microarchitecture the last bits of a round can differ, and single rounds then '
      'drift apart. Machines: summary.json\'s `host` (processor, and its family/model since '
      '2026-12-02). Runs made again: a suite lengthened after its checkpoints were gone made '
      'its runs again from round 1 and kept the shorter ones in `earlier_runs/rounds<N>/`, '
      'compared here round by round (training loss, test accuracy and loss).') + ['',
           '| suite | runs | machines (runs) | evaluated every (runs) | runs made again: bit for '
           'bit / parted (first round they differ) |', '|---|---|---|---|---|']
  for suite in suites.SUITES.values():
    made = [records.load_run(p) for run in suite.runs
            for p in suite_runs.seed_dirs(suite, run).values()]
    if not made:
      continue
    hosts, every = {}, {}
    for r in made:
      host = r['summary'].get('host') or {}
      name = (host.get('cpu', 'not recorded') + (f' ({host["cpu_id"]})' if host.get('cpu_id')
                                                  else ''))
      hosts[name] = hosts.get(name, 0) + 1
      e = int(r['config'].get('eval_every', 1))
      every[e] = every.get(e, 0) + 1
    remade = suite_runs.remade_runs(suite)
    same = sum(r['first_difference'] is None for r in remade)
    parted = sorted(r['first_difference'] for r in remade if r['first_difference'] is not None)
    again = (f'{same} / {len(parted)}' + (f' (rounds {", ".join(map(str, parted))})'
                                          if parted else '')) if remade else 'none'
    lines.append(f'| {suite.name} | {len(made)} | '
                 + '; '.join(f'{h}: {n}' for h, n in sorted(hosts.items())) + ' | '
                 + ', '.join(f'{e}: {n}' for e, n in sorted(every.items())) + f' | {again} |')
  return '\n'.join(lines) + '\n'


def status_lines() -> list:
  """README's status: what a margin is, then each paper's headline verdict (REPRODUCTION.md's
  opening table, in short)."""
  lines = prose(
      'Each paper\'s claim at the closest protocol we ran; a margin is method − baseline in '
      'points, the mean over paired seeds ± its 95% paired t half-width (verdicts and every '
      'comparison: [REPRODUCTION.md](benchmarks/results/REPRODUCTION.md)).') + ['']
  for h in suites.HEADLINES:
    _, _, c = headline_comparison(h)
    first = judged(c, _paper_figures(*h.judged)) if h.judged else c
    paper = (f'paper {first["paper_margin"]:+.2f} on {first["paper"]["dataset"]}'
             if np.isfinite(first['paper_margin']) else 'the paper\'s sign only')
    lines += prose(f'{tuned_method(h.method)}: **{VERDICT_WORDS[first["verdict"]]}**, '
                   f'{margin_short(c[c["verdict_key"]])} over {seeds_cell(c)} '
                   f'seed{"s" if c.get("planned", 1) > 1 else ""} ({paper}), at {h.differs}; '
                   f'{h.why}.', bullet=True)
  return lines


def readme_with_status(text: str) -> str:
  """`text` (README.md) with the block between the status markers rewritten."""
  return generated_files.with_block(text, STATUS_BEGIN, STATUS_END,
                          ''.join(f'{line}\n' for line in status_lines()))


def write_all() -> None:
  """Every suite's page, REPRODUCTION.md, PROVENANCE.md and README.md's status block."""
  for suite in suites.SUITES.values():
    write_suite_page(suite)
  generated_files.write_text(REPRODUCTION, reproduction_page())
  write_method_figures()
  generated_files.write_text(PROVENANCE, provenance_page())
  with open(README) as f:
    text = f.read()
  generated_files.write_text(README, readme_with_status(text))


def write_study_pages(study) -> None:
  """`python -m benchmarks.study` on a suite's study file (its `report` key): every page, as
  `benchmarks.compare` writes them (the suite's page, REPRODUCTION.md and the rest read it).
  StudyFileError when no suite is declared by the file."""
  suite = suites.SUITES.get(study.name)
  if suite is None or not suite.study or not os.path.samefile(suite.study, study.path):
    raise study_file.StudyFileError(
        f'{study.path} report: "{study.report}" writes the pages of the suites of '
        'benchmarks/suites.py, and none is declared by this file; drop the key for the '
        'generic page')
  write_all()
  print(f'wrote {os.path.relpath(os.path.join(suites.suite_dir(suite.name), "results.md"))} '
        '(and every other page)')


def main() -> int:
  write_all()
  print('wrote every suite\'s results.md, REPRODUCTION.md and PROVENANCE.md', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
