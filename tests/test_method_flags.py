"""Every documented flag of programs/train.py changes what it claims to change.

The flag lists come from the tables of README.md and docs/, programs/train.py and the method registry
(programs/methods/), and are checked against each other. Each flag is then shown to reach
its target by the cheapest path:
- a method flag (BUILDER / STAGES / EXPLORATION target): the program's config -> builder path
  with the builder replaced by a recorder; a changed value must arrive in the flag's keyword
  (STAGES: its field of the builder's `client_stages`). That the
  keyword changes the computation is shown by the unit test named in KEYWORD_TESTS (checked
  to exist and to be in the default suite);
- a server, client or data flag: the recorded builder arguments, the optimizers'
  hyperparameters, the partition or the model;
- a flag of the loop (rounds, eval_every, progress, the output place, FedLEx's exploration
  and refresh): one 3-round FedLEx run on digits;
- the rest (resume, the worker flags): the default-suite test named in TESTED_ELSEWHERE.
"""

import ast
import dataclasses
import importlib
import inspect
import os
import re

import numpy as np
import pytest

from programs import computations
from programs import experiment
from programs import experiment_config
from programs import fedlex_exploration
from programs import methods
from programs.methods import option_table
from programs.methods import registry
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = dict(dataset='digits', num_clients=10, clients_per_round=4, batch_size=16,
            client_lr=0.1, progress=False)
NUM_CLIENTS = 10

# A valid value other than the default, per method flag: the registry may not grow a flag
# without one (test_every_method_flag_has_a_changed_value).
CHANGED = dict(
    fedcross_alpha=0.7, fedcross_selection='in_order', fedcross_alpha_schedule=True,
    fedcross_num_propellers=2, fedcross_accel_rounds=5, fedcross_similarity='layerwise',
    fedcda_cache_size=2, fedcda_batches=2, fedcda_warmup_rounds=7, fedcda_smoothness=0.5,
    fedcda_selection='newest', fedcda_warmup_weighting='uniform', fedcda_max_cache_gib=1.5,
    fedcda_cache_dtype='float16',
    cadis_threshold=0.9, cadis_threshold_max=0.99, cadis_kd_weight=0.5,
    cadis_kd_reduction='mean', cadis_similarity_layer='kernel', cadis_sample_weighted=False,
    cadis_closure='components', cadis_transitive=True,
    cadis_kd_std='sample', cadis_reference_quirks=True,
    scaffold_server_lr=0.5, scaffold_client_weighting='num_examples',
    scaffold_max_control_gib=1.5,
    fedlex_explorer_fraction=0.5, fedlex_exploration_epochs=2, fedlex_exploration_lr=0.05,
    fedlex_exploration_patience=3, fedlex_normalize='after_mean', fedlex_guidance_floor=0.1, fedlex_refresh=True,
    fedlex_guidance='placeholder', fedlex_explore_in_place=True)

# The plug-in flags' ClientStages fields (every builder takes them) -> the default-suite test
# showing that the field changes every client work's upload.
PLUGIN_KEYWORD_TESTS = {
    'guided': 'tests/test_plugins.py::test_each_option_changes_every_client_works_upload',
    'kd_weight': 'tests/test_plugins.py::test_each_option_changes_every_client_works_upload',
}

# (method, builder keyword or ClientStages field) -> the default-suite unit test showing that
# it changes the computation (against numpy or a reference), as 'file::test'.
KEYWORD_TESTS = {
    ('fedcross', 'alpha'): 'tests/test_fedcross.py::test_rules_and_cross_aggregate_match_numpy',
    ('fedcross', 'selection'):
        'tests/test_fedcross.py::test_rules_and_cross_aggregate_match_numpy',
    ('fedcross', 'similarity'):
        'tests/test_fedcross.py::test_layerwise_and_model_similarity_choose_differently',
    ('fedcross', 'alpha_schedule'): 'tests/test_fedcross.py::test_alpha_schedule_and_propellers',
    ('fedcross', 'num_propellers'): 'tests/test_fedcross.py::test_alpha_schedule_and_propellers',
    ('fedcross', 'accel_rounds'): 'tests/test_fedcross.py::test_alpha_schedule_and_propellers',
    ('fedcda', 'cache_size'): 'tests/test_fedcda.py::test_fifo_cache_keeps_the_newest_k_in_age_order',
    ('fedcda', 'num_batches'): 'tests/test_fedcda.py::test_cache_round_matches_numpy_brute_force',
    ('fedcda', 'warmup_rounds'): 'tests/test_fedcda.py::test_cache_round_matches_numpy_brute_force',
    ('fedcda', 'smoothness'): 'tests/test_fedcda.py::test_cache_round_matches_numpy_brute_force',
    ('fedcda', 'selection'): 'tests/test_fedcda.py::test_random_selection_picks_cached_models_only',
    ('fedcda', 'warmup_weighting'):
        'tests/test_fedcda.py::test_uniform_warmup_weighting_is_the_plain_mean',
    ('fedcda', 'max_cache_gib'): 'tests/test_fedcda.py::test_builder_refuses_a_cache_above_the_limit',
    ('fedcda', 'cache_dtype'):
        'tests/test_fedcda.py::test_lower_precision_cache_halves_the_state_inside_tff',
    ('cadis', 'threshold'): 'tests/test_cadis_clustering.py::test_server_step_matches_numpy_over_rounds',
    ('cadis', 'threshold_max'): 'tests/test_cadis_clustering.py::test_server_step_matches_numpy_over_rounds',
    ('cadis', 'kd_weight'): 'tests/test_cadis.py::test_lambda_zero_equals_plain_client_work_bit_for_bit',
    ('cadis', 'kd_reduction'): 'tests/test_cadis.py::test_kd_client_work_matches_plain_tf_reference',
    ('cadis', 'similarity_layer'): 'tests/test_cadis.py::test_build_cadis_refuses_bad_arguments',
    ('cadis', 'sample_weighted'): 'tests/test_cadis_clustering.py::test_server_step_matches_numpy_over_rounds',
    ('cadis', 'closure'): 'tests/test_cadis_clustering.py::test_server_step_matches_numpy_over_rounds',
    ('cadis', 'transitive'): 'tests/test_cadis_clustering.py::test_server_step_matches_numpy_over_rounds',
    ('cadis', 'kd_std'): 'tests/test_cadis.py::test_kd_std_sample_reaches_the_client_work',
    ('cadis', 'reference_quirks'):
        'tests/test_cadis_aggregator.py::test_reference_quirks_match_a_transcription_of_the_authors_code',
    ('scaffold', 'server_learning_rate'):
        'tests/test_scaffold.py::test_rounds_match_numpy_scaffold',
    ('scaffold', 'client_weighting'): 'tests/test_scaffold.py::test_rounds_match_numpy_scaffold',
    ('scaffold', 'max_control_gib'): 'tests/test_scaffold.py::test_refusals_name_the_reason',
    ('fedlex', 'exploration_patience'):
        'tests/test_fedlex.py::test_exploration_patience_stops_a_real_explorer',
    ('fedlex', 'normalize'): 'tests/test_fedlex.py::test_exploration_matches_numpy',
    ('fedlex', 'guidance_floor'): 'tests/test_fedlex.py::test_exploration_matches_numpy',
    # The general flags' keywords.
    ('fedprox', 'proximal_strength'): 'tests/test_baselines.py::test_fedprox_matches_plain_tf_reference',
    ('fedavgm', 'server_learning_rate'):
        'tests/test_method_flags.py::test_server_hyperparameters_reach_the_process_state',
    ('fedavgm', 'server_momentum'):
        'tests/test_method_flags.py::test_server_hyperparameters_reach_the_process_state',
    ('fedadam', 'server_learning_rate'):
        'tests/test_method_flags.py::test_server_hyperparameters_reach_the_process_state',
}

# Flags whose effect a default-suite test elsewhere shows.
TESTED_ELSEWHERE = {
    'method_kwargs': 'tests/test_user_code.py::test_method_kwargs_are_checked_against_the_builder',
    'client_dropout': 'tests/test_resume_methods.py::test_faults_change_what_runs_and_resume_exactly',
    'straggler_fraction':
        'tests/test_resume_methods.py::test_faults_change_what_runs_and_resume_exactly',
    'straggler_min_work':
        'tests/test_resume_methods.py::test_faults_change_what_runs_and_resume_exactly',
    'target_accuracy':
        'tests/test_train_program.py::test_every_dataset_has_a_default_target_pair_and_the_flag_overrides_it',
    'resume': 'tests/test_train_program.py::test_resume_after_kill_is_identical_to_unbroken_run',
    'workers': 'tests/test_distributed.py::test_program_on_given_and_local_services_reproduces_local_weights',
    'local_workers':
        'tests/test_distributed.py::test_program_on_given_and_local_services_reproduces_local_weights',
    'worker_timeout': 'tests/test_distributed.py::test_program_worker_flags_bad_input_is_one_line',
    'resident_state': 'tests/test_resident_state.py::test_program_resident_state_flag',
    'fedlex_guidance':
        'tests/test_fedlex.py::test_placeholder_guidance_matches_numpy_and_stays_in_the_state',
    'fedlex_explore_in_place':
        'tests/test_fedlex.py::test_explore_in_place_trains_the_explorers_in_sequence',
    'require_isolated_worker':
        'tests/test_worker_isolation.py::test_program_require_isolated_worker_flag',
    'client_test_fraction': 'tests/test_train_program.py::'
                            'test_client_test_fraction_holds_out_examples_and_evaluates_every_client',
    'blown_up_rounds':
        'tests/test_train_program.py::test_blown_up_rounds_are_announced_and_stop_the_run_checkpointed',
    'checkpoint_every': 'tests/test_resume_methods.py::'
                        'test_checkpoint_every_n_rounds_and_a_crash_between_repeats_the_same_rounds',
    # benchmarks/round_overhead.py's flag (docs/reproduction.md, "Micro-benchmarks").
    'server_share':
        'tests/benchmarks/test_benchmark_scripts.py::'
        'test_round_overhead_server_share_adds_0_epoch_rounds',
}



def _config(**changes):
  return experiment_config.ExperimentConfig(**dict(BASE, **changes))


def _flag_rows() -> list:
  """The --flags named in the first column of every table row of README.md and docs/."""
  pages = [os.path.join(ROOT, 'README.md')] + sorted(
      os.path.join(ROOT, 'docs', n) for n in os.listdir(os.path.join(ROOT, 'docs'))
      if n.endswith('.md'))
  rows = []
  for page in pages:
    with open(page) as f:
      lines = f.read().split('\n')
    # A table's header row (the one above its |---| line) names a column, not a flag.
    rows += [line for line, after in zip(lines, lines[1:] + [''])
             if line.startswith('| `--') and not after.startswith('|---')]
  return [name for row in rows for name in re.findall(r'`--([a-z0-9_]+)', row.split(' | ')[0])]


def _readme_flags() -> set:
  """Every flag the documentation's tables name."""
  return set(_flag_rows())


def _program_flags() -> set:
  from absl import flags  # pylint: disable=g-import-not-at-top
  import programs.train  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  by_module = flags.FLAGS.flags_by_module_dict()
  return {f.name for module in ('programs.train', 'programs.methods', 'programs.lr_schedules')
          for f in by_module.get(module, [])}


def _test_exists_in_default_suite(node_id: str) -> bool:
  path, name = node_id.split('::')
  with open(os.path.join(ROOT, path)) as f:
    source = f.read()
  tree = ast.parse(source)
  if any(isinstance(n, ast.Assign) and any(getattr(t, 'id', '') == 'pytestmark' for t in n.targets)
         and 'slow' in ast.get_source_segment(source, n) for n in tree.body):
    return False
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == name:
      return not any('slow' in ast.get_source_segment(source, d) for d in node.decorator_list)
  return False


# --------------------------------------------------------------------------- #
# The flag lists agree
# --------------------------------------------------------------------------- #


def test_readme_tables_program_and_config_name_the_same_flags():
  fields = {f.name for f in dataclasses.fields(experiment_config.ExperimentConfig)}
  assert _program_flags() == fields
  assert _readme_flags() == fields


def test_every_flag_is_documented_once():
  rows = _flag_rows()
  assert not {n for n in rows if rows.count(n) > 1}, sorted({n for n in rows if rows.count(n) > 1})


def test_docs_method_flag_table_is_the_registrys():
  with open(option_table.TABLE_PAGE) as f:
    page = f.read()
  block = f'{option_table.TABLE_BEGIN}\n{option_table.flag_table()}{option_table.TABLE_END}\n'
  assert block in page and option_table.page_with_table(page) == page, (
      'regenerate it: python -m programs.methods')


def test_every_method_flag_has_a_changed_value():
  """... and every exploration flag (general, read by guided runs)."""
  assert set(CHANGED) == {f.name for f in methods.all_flags() + registry.FEDLEX_FLAGS}
  for flag in methods.all_flags() + registry.FEDLEX_FLAGS:
    assert CHANGED[flag.name] != flag.default and type(CHANGED[flag.name]) is type(flag.default)


def test_every_flag_is_tested():
  """Each documented flag is exercised here or by a named default-suite test elsewhere."""
  here = (set(CHANGED) | set(GENERAL_FLAGS_TESTED_HERE))
  assert _readme_flags() <= here | set(TESTED_ELSEWHERE), _readme_flags() - here - set(TESTED_ELSEWHERE)
  for node_id in (list(TESTED_ELSEWHERE.values()) + list(KEYWORD_TESTS.values())
                  + list(PLUGIN_KEYWORD_TESTS.values())):
    assert _test_exists_in_default_suite(node_id), node_id


def test_every_builder_keyword_has_a_test_of_its_effect():
  keywords = set()
  for method in methods.METHODS.values():
    family = 'fedlex' if method.name in methods.FEDLEX_ALGORITHMS else method.name
    keywords |= {(family, f.kwarg) for f in method.flags if f.kwarg}
  keywords |= {('fedlex', f.kwarg) for f in registry.FEDLEX_FLAGS if f.kwarg}
  assert keywords <= set(KEYWORD_TESTS), keywords - set(KEYWORD_TESTS)
  assert {f.kwarg for f in registry.PLUGIN_FLAGS} == set(PLUGIN_KEYWORD_TESTS)


def test_a_method_is_found_by_its_name():
  """--algorithm=X is declared in programs/methods/X.py (FedLEx's variants in fedlex.py, the
  baselines in baselines.py), whose builder is the library's builder of the same name."""
  import tff_algos  # pylint: disable=g-import-not-at-top
  for name, method in methods.METHODS.items():
    family = ('fedlex' if name in methods.FEDLEX_ALGORITHMS else
              'baselines' if name in methods.BASELINE_ALGORITHMS else name)
    assert os.path.exists(os.path.join(ROOT, 'programs', 'methods', f'{family}.py')), name
    assert method.builder.__module__ == f'programs.methods.{family}', name
    library = getattr(tff_algos, method.builder.__name__)
    assert library.__module__ == f'tff_algos.{family}', name


@pytest.mark.parametrize('alpha', [0.0, 0.4999, 0.5, 0.7, 0.99, 1.0, 1.5])
def test_fedcross_alpha_flag_and_builder_refuse_the_same_values(alpha):
  """One bound: the flag refuses exactly the alphas the library refuses ([0.5, 1), the
  paper's), each naming the interval."""
  from tff_algos.aggregators import cross_aggregation  # pylint: disable=g-import-not-at-top
  flag = next(f for f in methods.METHODS['fedcross'].flags if f.name == 'fedcross_alpha')
  try:
    cross_aggregation.validate_options(4, alpha, 'lowest_similarity', 1, 0)
    library_error = None
  except ValueError as e:
    library_error = str(e)
  assert (flag.error(alpha) is None) == (library_error is None) == (0.5 <= alpha < 1)
  if library_error:
    assert '[0.5, 1)' in flag.error(alpha) and '[0.5, 1)' in library_error


# --------------------------------------------------------------------------- #
# Method flags reach their builder keyword
# --------------------------------------------------------------------------- #


def _record_builder(monkeypatch, function: str) -> list:
  """Replaces the builder `tff_algos.<function>` (in the module that defines it) by a
  recorder of its (args, kwargs), which must fit its signature."""
  import tff_algos  # pylint: disable=g-import-not-at-top
  builder = getattr(tff_algos, function)
  module = importlib.import_module(builder.__module__)
  signature = inspect.signature(builder)
  calls = []

  def record(*args, **kwargs):
    signature.bind(*args, **kwargs)
    calls.append((args, kwargs))
    return 'built'

  monkeypatch.setattr(module, function, record)
  return calls


def _built_call(monkeypatch, config):
  """(args, kwargs) the program passes to the method's builder for `config`."""
  experiment_config.validate(config)
  calls = _record_builder(monkeypatch, methods.METHODS[config.algorithm].builder.__name__)
  assert computations.build_process(config, lambda: None, NUM_CLIENTS) == 'built'
  assert len(calls) == 1
  return calls[0]


METHOD_FLAG_CASES = [(m.name, f.name) for m in methods.METHODS.values() for f in m.flags
                     if f.target in (registry.BUILDER, registry.STAGES)]
EXPLORATION_FLAGS = [f.name for f in registry.FEDLEX_FLAGS if f.target == registry.EXPLORATION]


def _argument(flag, kwargs):
  """What `flag` set in a builder call's `kwargs`: its keyword, or its `client_stages` field."""
  if flag.target == registry.STAGES:
    return getattr(kwargs['client_stages'], flag.kwarg)
  return kwargs[flag.kwarg]


def _without(flag, kwargs) -> dict:
  """`kwargs` without what `flag` sets (its keyword, or its field of `client_stages`)."""
  if flag.target != registry.STAGES:
    return {k: v for k, v in kwargs.items() if k != flag.kwarg}
  stages = dataclasses.asdict(kwargs['client_stages'])
  del stages[flag.kwarg]
  return dict(kwargs, client_stages=stages)


@pytest.mark.parametrize('algorithm, name', METHOD_FLAG_CASES,
                         ids=[f'{a}-{n}' for a, n in METHOD_FLAG_CASES])
def test_method_flag_reaches_its_builder_keyword(monkeypatch, algorithm, name):
  flag = next(f for f in methods.METHODS[algorithm].flags if f.name == name)
  base = dict(helpers.METHOD_SETTINGS.get(algorithm, {}), algorithm=algorithm)
  _, default_kwargs = _built_call(monkeypatch, _config(**base))
  _, kwargs = _built_call(monkeypatch, _config(**base, **{name: CHANGED[name]}))
  assert _argument(flag, kwargs) == flag.transform(CHANGED[name]) != _argument(
      flag, default_kwargs)
  # ... and nothing else changed.
  assert _without(flag, kwargs) == _without(flag, default_kwargs)


# Every guided run explores: the fedlex_* presets, and every other method with --guided.
GUIDED_RUNS = [dict(algorithm=a) for a in methods.FEDLEX_ALGORITHMS] + [
    dict(helpers.METHOD_SETTINGS.get(a, {}), algorithm=a, guided=True)
    for a in methods.ALGORITHMS if a not in methods.FEDLEX_ALGORITHMS]
GUIDED_IDS = [r['algorithm'] + ('-guided' if r.get('guided') else '') for r in GUIDED_RUNS]


@pytest.mark.parametrize('run', GUIDED_RUNS, ids=GUIDED_IDS)
@pytest.mark.parametrize('name', EXPLORATION_FLAGS)
def test_fedlex_flag_reaches_the_exploration_builder(monkeypatch, run, name):
  flag = next(f for f in registry.FEDLEX_FLAGS if f.name == name)
  calls = _record_builder(monkeypatch, 'build_fedlex_exploration')
  for config in (_config(**run), _config(**run, **{name: CHANGED[name]})):
    experiment_config.validate(config)
    fedlex_exploration.exploration_computation(config, lambda: None, NUM_CLIENTS)
  (_, default_kwargs), (_, kwargs) = calls
  assert kwargs[flag.kwarg] == flag.transform(CHANGED[name]) != default_kwargs[flag.kwarg]


@pytest.mark.parametrize('algorithm', [a for a in methods.ALGORITHMS
                                       if a not in methods.FEDLEX_ALGORITHMS])
def test_exploration_flags_need_a_guided_run(algorithm):
  """Without --guided (and not fedlex_*) an exploration flag would be ignored: refused."""
  settings = dict(helpers.METHOD_SETTINGS.get(algorithm, {}), algorithm=algorithm)
  for flag in registry.FEDLEX_FLAGS:
    changed = {flag.name: CHANGED[flag.name]}
    with pytest.raises(experiment_config.ExperimentError, match=(
        f'^--{flag.name} is read only by a guided run \\(--guided or --algorithm=fedlex_\\*\\); '
        'add --guided or drop it$')):
      experiment_config.validate(_config(**settings, **changed))
    experiment_config.validate(_config(**settings, **changed, guided=True))


@pytest.mark.parametrize('algorithm', methods.ALGORITHMS)
def test_plugin_flags_reach_every_builder(monkeypatch, algorithm):
  """--guided and --kd_weight arrive as fields of the builder's one `client_stages` (with
  nothing else changed); a plain run passes none. fedlex_* pass their guidance, cadis its
  --cadis_kd_* flags; FedSGD's single gradient refuses KD in one line; CADIS's own λ is
  --cadis_kd_weight unless --kd_weight is given, never both."""
  from tff_algos.client_work import plugins  # pylint: disable=g-import-not-at-top
  method = methods.METHODS[algorithm]
  settings = dict(helpers.METHOD_SETTINGS.get(algorithm, {}), algorithm=algorithm)
  _, default_kwargs = _built_call(monkeypatch, _config(**settings))
  preset = (plugins.ClientStages(kd_weight=1.0) if algorithm == 'cadis' else
            plugins.ClientStages(guided=True) if method.guided else None)
  assert default_kwargs.get('client_stages') == preset
  plain = {k: v for k, v in default_kwargs.items() if k != 'client_stages'}

  def stages(**changes):
    _, kwargs = _built_call(monkeypatch, _config(**settings, **changes))
    assert {k: v for k, v in kwargs.items() if k != 'client_stages'} == plain
    return kwargs['client_stages']

  preset = preset or plugins.ClientStages()
  assert stages(guided=True) == dataclasses.replace(preset, guided=True)
  assert method.is_guided(_config()) == method.guided
  if not method.local_steps:
    with pytest.raises(experiment_config.ExperimentError, match=(
        f'^--kd_weight does not apply to --algorithm={algorithm}: FedSGD takes its one '
        'gradient at the received model, .*; drop it$')):
      experiment_config.validate(_config(**settings, kd_weight=0.5))
    return
  assert stages(kd_weight=0.5) == dataclasses.replace(preset, kd_weight=0.5)
  assert stages(kd_weight=0.0) == dataclasses.replace(preset, kd_weight=0.0)
  if algorithm == 'cadis':
    with pytest.raises(experiment_config.ExperimentError, match=(
        '^--kd_weight and --cadis_kd_weight both set the KD weight; drop --cadis_kd_weight$')):
      experiment_config.validate(_config(**settings, kd_weight=0.5, cadis_kd_weight=0.3))
  with pytest.raises(experiment_config.ExperimentError, match='^--kd_weight must be a finite number'):
    experiment_config.validate(_config(**settings, kd_weight=float('nan')))


@pytest.mark.parametrize('run', GUIDED_RUNS, ids=GUIDED_IDS)
def test_exploration_lr_is_the_explorers_rate(monkeypatch, run):
  """--fedlex_exploration_lr sets the explorers' SGD rate; 0 (the default) = --client_lr."""
  calls = _record_builder(monkeypatch, 'build_fedlex_exploration')
  for changes in ({}, dict(fedlex_exploration_lr=CHANGED['fedlex_exploration_lr'])):
    config = _config(**run, **changes)
    experiment_config.validate(config)
    fedlex_exploration.exploration_computation(config, lambda: None, NUM_CLIENTS)
  rates = [args[1].initialize(())['learning_rate'] for args, _ in calls]
  assert rates == [BASE['client_lr'], CHANGED['fedlex_exploration_lr']]
  for bad in (-0.1, float('inf'), float('nan')):
    with pytest.raises(experiment_config.ExperimentError,
                       match=f'^--fedlex_exploration_lr must be >= 0 and finite, got {bad}$'):
      experiment_config.validate(_config(**run, fedlex_exploration_lr=bad))


def test_a_run_recorded_before_exploration_lr_existed_is_the_same_run():
  """A config.json without the key is --fedlex_exploration_lr=0 (explore at --client_lr): it
  resumes and counts as the declared run; another explorers' rate does not."""
  config = _config(algorithm='fedlex_avgm')
  recorded = {k: v for k, v in dataclasses.asdict(config).items()
              if k != 'fedlex_exploration_lr'}
  assert experiment_config.settings_changed(recorded, config) == ''
  config.fedlex_exploration_lr = 0.05
  assert experiment_config.settings_changed(recorded, config) == (
      'it was run with --fedlex_exploration_lr=0.0 (now --fedlex_exploration_lr=0.05)')


def test_a_cosine_schedule_makes_rounds_part_of_the_run():
  """--rounds may grow on --resume, unless a cosine schedule runs over it; the build key
  holds the cosine's rounds (a rerun in this process builds the process anew)."""
  config = _config(rounds=5)
  recorded = dataclasses.asdict(config)
  assert experiment_config.settings_changed(recorded, dataclasses.replace(config, rounds=8)) == ''
  cosine = dataclasses.replace(config, server_lr_schedule='cosine')
  recorded = dataclasses.asdict(cosine)
  assert experiment_config.settings_changed(recorded, dataclasses.replace(cosine, rounds=8)) == (
      'it was run with --rounds=5 (now --rounds=8)')
  fed = experiment.load_federated_data(config)
  keys = {computations._build_key(c, fed, NUM_CLIENTS)  # pylint: disable=protected-access
          for c in (config, dataclasses.replace(config, rounds=8), cosine,
                    dataclasses.replace(cosine, rounds=8))}
  assert len(keys) == 3


def test_explorer_fraction_sets_the_number_of_explorers():
  for fraction, count in ((0.2, 2), (0.5, 5), (1.0, 10)):
    explorers = fedlex_exploration.fedlex_explorers(
        _config(algorithm='fedlex_avgm', fedlex_explorer_fraction=fraction), NUM_CLIENTS)
    assert len(np.unique(explorers)) == count and explorers.max() < NUM_CLIENTS


@pytest.mark.parametrize('algorithm', methods.ALGORITHMS)
def test_another_methods_flags_are_refused(algorithm):
  for flag in methods.all_flags():
    if flag in methods.METHODS[algorithm].flags:
      continue
    with pytest.raises(experiment_config.ExperimentError, match=f'--{flag.name} is not used'):
      experiment_config.validate(_config(algorithm=algorithm, **{flag.name: CHANGED[flag.name]}))


# --------------------------------------------------------------------------- #
# Server, client and data flags
# --------------------------------------------------------------------------- #


def _hparams(optimizer) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  state = optimizer.initialize((tf.TensorSpec([2], tf.float32),))
  return {k: round(float(v), 6) for k, v in optimizer.get_hparams(state).items()}


# (changes, what the builder receives): keyword -> value, or keyword -> {hparam: value} for an
# optimizer.
SERVER_CASES = {
    'optimizer': (dict(server_optimizer='adam'),
                  dict(server_optimizer_fn=dict(learning_rate=0.01, beta_1=0.9))),
    'lr': (dict(server_lr=0.3), dict(server_optimizer_fn=dict(learning_rate=0.3))),
    'sgdm': (dict(server_optimizer='sgdm', server_lr=0.5, server_momentum=0.7),
             dict(server_optimizer_fn=dict(learning_rate=0.5, momentum=0.7))),
    'proximal': (dict(proximal_strength=0.2), dict(proximal_strength=0.2)),
    'avgm_lr': (dict(server_lr=0.3), dict(server_learning_rate=0.3)),
    'avgm_momentum': (dict(server_momentum=0.5), dict(server_momentum=0.5)),
}
SERVER_FLAG_CASES = {
    'fedavg': ('optimizer', 'lr', 'sgdm'), 'fedsgd': ('optimizer', 'lr', 'sgdm'),
    'cadis': ('optimizer', 'lr', 'sgdm'), 'fedlex_sgd': ('optimizer', 'lr', 'sgdm'),
    'fedprox': ('optimizer', 'lr', 'sgdm', 'proximal'),
    'fedlex_prox': ('optimizer', 'lr', 'sgdm', 'proximal'),
    'fedavgm': ('avgm_lr', 'avgm_momentum'), 'fedlex_avgm': ('avgm_lr', 'avgm_momentum'),
    'fedadam': ('avgm_lr',), 'fedlex_opt': ('avgm_lr',), 'fedcross': (), 'fedcda': (),
    'scaffold': (),
}
SERVER_PAIRS = [(a, case) for a, cases in SERVER_FLAG_CASES.items() for case in cases]


def test_server_flag_cases_cover_what_each_method_reads():
  assert set(SERVER_FLAG_CASES) == set(methods.ALGORITHMS)
  for algorithm, cases in SERVER_FLAG_CASES.items():
    covered = {name for case in cases for name in SERVER_CASES[case][0]}
    assert covered == set(methods.METHODS[algorithm].reads), algorithm


@pytest.mark.parametrize('algorithm, case', SERVER_PAIRS, ids=[f'{a}-{c}' for a, c in SERVER_PAIRS])
def test_server_flags_reach_the_builder(monkeypatch, algorithm, case):
  changes, expected = SERVER_CASES[case]
  _, default_kwargs = _built_call(monkeypatch, _config(algorithm=algorithm))
  _, kwargs = _built_call(monkeypatch, _config(algorithm=algorithm, **changes))
  for keyword, value in expected.items():
    if isinstance(value, dict):
      got = _hparams(kwargs[keyword])
      assert {k: got.get(k) for k in value} == value, got
      assert default_kwargs[keyword] is None or _hparams(default_kwargs[keyword]) != got
    else:
      assert kwargs[keyword] == value != default_kwargs[keyword]


def test_server_hyperparameters_reach_the_process_state(monkeypatch):
  """build_fedavgm / build_fedadam turn their keywords into the server optimizer of the FedAvg
  they build (which test_baselines.py's *_matches_tff tests show is the one applied)."""
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  calls = _record_builder(monkeypatch, 'build_fedavg')
  baselines.build_fedavgm(None, None, 16, server_learning_rate=0.3, server_momentum=0.5)
  baselines.build_fedadam(None, None, 16, server_learning_rate=0.07)
  (avgm_args, _), (adam_args, _) = calls
  assert _hparams(avgm_args[3]) == dict(learning_rate=0.3, momentum=0.5)
  assert _hparams(adam_args[3])['learning_rate'] == 0.07


def test_client_flags_reach_the_builder(monkeypatch):
  """--client_lr, --client_momentum, --batch_size, --clients_per_round, --num_clients, --seed."""
  args, _ = _built_call(monkeypatch, _config(client_lr=0.05, client_momentum=0.8, batch_size=7))
  assert _hparams(args[1]) == dict(learning_rate=0.05, momentum=0.8) and args[2] == 7
  args, _ = _built_call(monkeypatch, _config(algorithm='fedcross', clients_per_round=3))
  assert args[3] == 3
  args, kwargs = _built_call(monkeypatch, _config(algorithm='fedcda', seed=4))
  assert (args[3], args[4], kwargs['seed']) == (NUM_CLIENTS, 4, 4)


def _first_step(optimizer, gradient):
  """The step `optimizer` takes from 0 on one float32 gradient."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  w = tf.zeros([len(gradient)])
  _, updated = optimizer.next(optimizer.initialize(tf.TensorSpec(w.shape, tf.float32)), w,
                              tf.constant(gradient, tf.float32))
  return np.asarray(updated)


def test_client_optimizer_and_weight_decay_reach_the_builder(monkeypatch):
  """--client_optimizer=adam builds TFF's Adam and torch_adam PyTorch's (both with PyTorch's
  eps), at --client_lr; --client_weight_decay wraps the client optimizer (tff_algos.optimizers);
  FedLEx's explorers get the same one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  steps = {}
  for name in ('adam', 'torch_adam'):
    args, _ = _built_call(monkeypatch, _config(client_optimizer=name, client_lr=3e-4))
    hparams = args[1].get_hparams(args[1].initialize((tf.TensorSpec([2], tf.float32),)))
    assert {k: float(v) for k, v in hparams.items()} == pytest.approx(
        dict(learning_rate=3e-4, beta_1=0.9, beta_2=0.999, epsilon=1e-8), rel=1e-6)
    steps[name] = _first_step(args[1], [1e-9, 1.0])
  # The first step on a gradient g: PyTorch's lr * g / (|g| + eps); TFF's adds eps to
  # sqrt(v) = sqrt(1 - 0.999) |g| before the correction, i.e. eps about 31.6 times larger.
  np.testing.assert_allclose(steps['torch_adam'], [-3e-4 / 11, -3e-4], rtol=1e-5)
  tff_eps = 1e-8 / np.sqrt(1 - 0.999)
  np.testing.assert_allclose(steps['adam'], [-3e-4 * 1e-9 / (1e-9 + tff_eps), -3e-4], rtol=1e-5)
  args, _ = _built_call(monkeypatch, _config(client_lr=0.05, client_momentum=0.0,
                                             client_weight_decay=1e-5))
  assert _hparams(args[1]) == dict(learning_rate=0.05, weight_decay=1e-5)
  for name in ('adam', 'torch_adam'):
    explorer = computations.client_optimizer(
        _config(algorithm='fedlex_avgm', client_optimizer=name, client_weight_decay=1e-4), 0.2)
    assert _hparams(explorer)['learning_rate'] == 0.2
    assert _hparams(explorer)['weight_decay'] == 1e-4
  np.testing.assert_allclose(_first_step(explorer, [1e-9]), [-0.2 * 1e-9 / 1.1e-8], rtol=1e-5)


def _record_schedules(monkeypatch) -> list:
  """Replaces tff_algos.schedules.with_lr_schedules by a recorder of its (process, client,
  server)."""
  from tff_algos import schedules  # pylint: disable=g-import-not-at-top
  wrapped = []

  def record(process, client=None, server=None):
    wrapped.append((process, client, server))
    return 'scheduled'

  monkeypatch.setattr(schedules, 'with_lr_schedules', record)
  return wrapped


@pytest.mark.parametrize('algorithm', methods.ALGORITHMS)
def test_schedule_flags_wrap_every_method_with_such_a_rate(monkeypatch, algorithm):
  """--client_lr_decay and the client schedule flags wrap every method with local steps, the
  server schedule flags every method with a server optimizer (tff_algos.schedules, whose
  effect tests/test_schedules.py checks against rates set by hand); constant schedules leave
  the process as built."""
  from tff_algos.schedules import Schedule  # pylint: disable=g-import-not-at-top
  wrapped = _record_schedules(monkeypatch)
  config = _config(algorithm=algorithm, **helpers.METHOD_SETTINGS.get(algorithm, {}))
  _record_builder(monkeypatch, methods.METHODS[algorithm].builder.__name__)
  assert computations.build_process(config, lambda: None, NUM_CLIENTS) == 'built'
  assert not wrapped   # constant schedules leave the process as built
  method = methods.METHODS[algorithm]
  cases = [(dict(client_lr_decay=0.99), method.local_steps,
            (Schedule('exponential', decay=0.99), Schedule())),
           (dict(server_lr_schedule='step', server_lr_decay=0.5), method.server_rate,
            (Schedule(), Schedule('step', decay=0.5)))]
  for changes, has_rate, expected in cases:
    changed = dataclasses.replace(config, **changes)
    if not has_rate:
      with pytest.raises(experiment_config.ExperimentError, match='to schedule|takes no local step'):
        experiment_config.validate(changed)
      continue
    experiment_config.validate(changed)
    assert computations.build_process(changed, lambda: None, NUM_CLIENTS) == 'scheduled'
    assert wrapped[-1] == ('built',) + expected


# A valid setting of each schedule flag (with what it needs) -> the Schedule (client, server)
# it makes; every flag of programs/lr_schedules.py appears in a key.
SCHEDULE_SETTINGS = [
    (dict(client_lr_schedule='cosine'), ('cosine', dict(rounds=3)), None),
    (dict(client_lr_schedule='step', client_lr_decay=0.5, client_lr_decay_every=2),
     ('step', dict(decay=0.5, every=2)), None),
    (dict(client_lr_schedule='cosine', client_lr_floor=0.1, client_lr_warmup_rounds=1),
     ('cosine', dict(floor=0.1, rounds=3, warmup_rounds=1)), None),
    (dict(client_lr_warmup_rounds=2), ('constant', dict(warmup_rounds=2)), None),
    (dict(server_lr_schedule='exponential', server_lr_decay=0.9), None,
     ('exponential', dict(decay=0.9))),
    (dict(server_lr_decay=0.9), None, ('exponential', dict(decay=0.9))),
    (dict(server_lr_schedule='step', server_lr_decay=2.0, server_lr_decay_every=3), None,
     ('step', dict(decay=2.0, every=3))),
    (dict(server_lr_schedule='cosine', server_lr_floor=0.5, server_lr_warmup_rounds=2), None,
     ('cosine', dict(floor=0.5, rounds=3, warmup_rounds=2))),
]


def test_every_schedule_flag_reaches_its_schedule(monkeypatch):
  from programs import lr_schedules  # pylint: disable=g-import-not-at-top
  from tff_algos.schedules import Schedule  # pylint: disable=g-import-not-at-top
  assert {name for changes, _, _ in SCHEDULE_SETTINGS for name in changes} == set(
      lr_schedules.FLAG_NAMES) | {'client_lr_decay'}
  wrapped = _record_schedules(monkeypatch)
  _record_builder(monkeypatch, methods.METHODS['fedavg'].builder.__name__)
  for changes, client, server in SCHEDULE_SETTINGS:
    config = _config(rounds=3, **changes)
    experiment_config.validate(config)
    computations.build_process(config, lambda: None, NUM_CLIENTS)
    make = lambda spec: Schedule() if spec is None else Schedule(spec[0], **spec[1])  # noqa: E731
    assert wrapped[-1][1:] == (make(client), make(server)), changes


@pytest.mark.parametrize('changes, message', [
    (dict(client_lr_schedule='linear'), "--client_lr_schedule='linear' is unknown; choose one of"),
    (dict(server_lr_decay=0.0), '--server_lr_decay must be a number > 0'),
    (dict(client_lr_schedule='step', client_lr_decay_every=0),
     '--client_lr_decay_every must be at least 1'),
    (dict(client_lr_schedule='cosine', client_lr_floor=1.5), r'--client_lr_floor must be in \[0, 1\]'),
    (dict(server_lr_warmup_rounds=-1), '--server_lr_warmup_rounds must be at least 0'),
    (dict(client_lr_schedule='step'), '--client_lr_schedule=step needs --client_lr_decay'),
    (dict(server_lr_schedule='exponential'), '--server_lr_schedule=exponential needs'),
    (dict(client_lr_schedule='cosine', client_lr_decay=0.5),
     '--client_lr_decay is not used by --client_lr_schedule=cosine'),
    (dict(server_lr_decay=0.5, server_lr_decay_every=2),
     '--server_lr_decay_every is used only with --server_lr_schedule=step'),
    (dict(client_lr_floor=0.1), '--client_lr_floor is used only with --client_lr_schedule=cosine'),
    (dict(server_lr_schedule='cosine', server_lr_warmup_rounds=30),
     '--server_lr_warmup_rounds=30 leaves no round of the cosine in --rounds=30'),
    (dict(algorithm='fedsgd', client_lr_warmup_rounds=2),
     '--client_lr_schedule: fedsgd takes no local step'),
    (dict(algorithm='fedlex_sgd', client_lr_schedule='cosine'), 'fedlex_sgd takes no local step'),
    (dict(algorithm='fedcross', server_lr_schedule='cosine'),
     '--server_lr_schedule: fedcross takes no server optimizer step'),
    (dict(algorithm='fedcda', server_lr_warmup_rounds=1), 'fedcda takes no server optimizer'),
])
def test_bad_schedule_flags_are_refused(changes, message):
  with pytest.raises(experiment_config.ExperimentError, match=message):
    experiment_config.validate(_config(**changes))


@pytest.mark.parametrize('changes, message', [
    (dict(client_optimizer='rmsprop'), '--client_optimizer=\'rmsprop\' is unknown'),
    (dict(client_lr_decay=0.0), '--client_lr_decay must be a number > 0'),
    (dict(client_lr_decay=float('inf')), '--client_lr_decay must be a number > 0'),
    (dict(algorithm='fedsgd', client_lr_decay=0.99), '--client_lr_decay: fedsgd takes no local'),
    (dict(algorithm='fedlex_sgd', client_lr_decay=0.99), 'fedlex_sgd takes no local step'),
    (dict(client_optimizer='adam', client_momentum=0.9), '--client_momentum is used only'),
    (dict(client_optimizer='torch_adam', client_momentum=0.9), '--client_momentum is used only'),
    (dict(client_weight_decay=-1.0), '--client_weight_decay must be a number >= 0'),
    (dict(algorithm='cadis', cadis_closure='oracle'),
     '--cadis_closure=oracle takes the clusters from a cluster-skewed partition'),
    # SCAFFOLD's option II holds for plain SGD only (tff_algos/client_work/corrected_training.py)
    (dict(algorithm='scaffold'), '--algorithm=scaffold needs plain client SGD .* add '
     '--client_momentum=0'),
    (dict(algorithm='scaffold', client_optimizer='adam'), 'needs plain client SGD'),
    (dict(algorithm='scaffold', client_optimizer='torch_adam'), 'needs plain client SGD')])
def test_bad_client_optimizer_flags_are_refused(changes, message):
  with pytest.raises(experiment_config.ExperimentError, match=message):
    experiment_config.validate(_config(**changes))


def _labels_per_client(fed):
  return [np.unique(fed.client_arrays(i)[1]) for i in range(fed.num_clients)]


def _sizes(fed):
  return [len(fed.client_arrays(i)[1]) for i in range(fed.num_clients)]


def test_partition_flags_change_the_partition():
  load = lambda **changes: experiment.load_federated_data(_config(**changes))  # noqa: E731
  default = load()
  assert default.num_clients == NUM_CLIENTS and load(num_clients=6).num_clients == 6
  assert _sizes(load(seed=1)) != _sizes(default)
  assert _sizes(load(dirichlet_alpha=5.0)) != _sizes(default)
  iid = load(partition='iid')
  assert max(_sizes(iid)) - min(_sizes(iid)) <= 1
  for k in (2, 3):
    fed = load(partition='classes', classes_per_client=k)
    assert {len(labels) for labels in _labels_per_client(fed)} == {k}
  one, three = (load(partition='shards', shards_per_client=s) for s in (1, 3))
  assert max(len(l) for l in _labels_per_client(one)) < max(len(l) for l in _labels_per_client(three))
  even, skewed = (load(partition='quantity', quantity_alpha=a) for a in (100.0, 0.3))
  assert np.std(_sizes(skewed)) > 2 * np.std(_sizes(even))


def test_dataset_and_data_dir_are_read(tmp_path):
  from tests.helpers import write_leaf_json  # pylint: disable=g-import-not-at-top
  users = {f'u{i}': {'x': [[0.5] * 784] * 3, 'y': [i, i, i]} for i in range(3)}
  for split in ('train', 'test'):
    write_leaf_json(str(tmp_path / split / 'a.json'), users)
  fed = experiment.load_federated_data(
      _config(dataset='femnist_leaf', data_dir=str(tmp_path), num_clients=3))
  assert fed.num_clients == 3 and sorted(np.concatenate(_labels_per_client(fed))) == [0, 1, 2]


def test_model_flag_chooses_the_model(monkeypatch):
  monkeypatch.setattr(computations, '_LAST_BUILT', {})
  monkeypatch.setattr(computations, 'build_process', lambda *args: 'built')
  monkeypatch.setattr(computations, 'Evaluator', lambda *args: None)
  fed = experiment.load_federated_data(_config())
  sizes = {}
  for model in ('', 'mlp_2nn'):
    name, model_fn, _, _ = computations.build_computations(_config(model=model), fed, NUM_CLIENTS)
    sizes[name] = sum(int(np.prod(v.shape)) for v in model_fn().trainable_variables)
  assert set(sizes) == {'tiny_cnn', 'mlp_2nn'} and sizes['tiny_cnn'] != sizes['mlp_2nn']


def test_a_rerun_reuses_the_per_client_evaluation(monkeypatch):
  """--client_test_fraction's computation is kept in the run's _LAST_BUILT entry: a rerun of
  the configuration in this process reuses it; another configuration builds its own."""
  from tff_algos import evaluation  # pylint: disable=g-import-not-at-top

  class Evaluator:
    def __init__(self, *args):
      pass

    def on(self, *args):
      return self

  made = []
  monkeypatch.setattr(computations, '_LAST_BUILT', {})
  monkeypatch.setattr(computations, 'build_process', lambda *args: 'built')
  monkeypatch.setattr(computations, 'Evaluator', Evaluator)
  monkeypatch.setattr(evaluation, 'build_per_client_evaluation',
                      lambda model_fn, n: made.append((model_fn, n)) or object())
  config = _config(client_test_fraction=0.2)
  fed, client_test = experiment.with_client_test(
      config, experiment.load_federated_data(config), NUM_CLIENTS)

  def run(c):
    _, model_fn, _, _ = computations.build_computations(c, fed, NUM_CLIENTS)
    return model_fn, computations.per_client_evaluation(c, fed, NUM_CLIENTS, len(client_test))

  first = run(config)
  assert run(dataclasses.replace(config, rounds=config.rounds + 5)) == first
  assert made == [(first[0], len(client_test))]
  other = run(dataclasses.replace(config, seed=1))
  assert other[1] is not first[1] and made[1] == (other[0], len(client_test))


# --------------------------------------------------------------------------- #
# The loop's flags: one short run
# --------------------------------------------------------------------------- #

LOOP_RUN = dict(algorithm='fedlex_avgm', num_clients=6, clients_per_round=3, rounds=3,
                eval_every=3, eval_last=2, local_epochs=2, fedlex_explorer_fraction=0.5,
                fedlex_exploration_epochs=2, fedlex_refresh=True, progress=True,
                experiment_name='loop')


@pytest.fixture(scope='module')
def loop_run(tmp_path_factory):
  import csv  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('loop')
  config = _config(root_output_dir=str(root), **LOOP_RUN)
  import contextlib  # pylint: disable=g-import-not-at-top
  # A real file: the TFF worker started by the run inherits stderr's file descriptor.
  with open(root / 'stderr.txt', 'w+') as stderr, contextlib.redirect_stderr(stderr):
    summary = experiment.run_experiment(config)
    stderr.seek(0)
    printed = stderr.read()
  with open(root / 'loop' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  return config, summary, rows, printed, root


def test_explored_initial_state_explores_as_a_run_does(loop_run):
  """`fedlex_exploration.explored_initial_state` (what benchmarks build on): the initial state with
  FedLEx's guidance explored by the run's explorers, within their epoch budget, and no more
  client-epochs than the run's first row counts (which adds its refreshes)."""
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  config, _, rows, _, _ = loop_run
  fed = experiment.load_federated_data(config)
  _, model_fn, process, _ = computations.build_computations(config, fed, config.num_clients)
  state, stats = fedlex_exploration.explored_initial_state(config, fed, process, model_fn,
                                                           config.num_clients)
  explorers = fedlex_exploration.fedlex_explorers(config, config.num_clients)
  assert 0 < stats['exploration_client_epochs'] <= (
      len(explorers) * config.fedlex_exploration_epochs)
  assert stats['exploration_client_epochs'] <= float(rows[0]['exploration_client_epochs'])
  unexplored = fedlex.get_guidance(process.initialize())
  assert any(not np.array_equal(a, b)
             for a, b in zip(fedlex.get_guidance(state), unexplored))


def test_loop_flags(loop_run):
  """--rounds, --eval_every, --eval_last, --root_output_dir/--experiment_name, --progress."""
  config, summary, rows, stderr, root = loop_run
  assert [int(r['round']) for r in rows] == [1, 2, 3] and summary['rounds'] == 3
  # Round 3 by --eval_every=3, round 2 only as one of the --eval_last=2 (round 1 by neither).
  assert [bool(r['test_accuracy']) for r in rows] == [False, True, True]
  assert summary['last10_mean_accuracy'] == pytest.approx(
      np.mean([float(r['test_accuracy']) for r in rows[1:]]))
  assert summary['experiment_dir'] == str(root / 'loop')
  assert os.path.exists(root / 'loop' / 'summary.json')
  assert '3/3' in stderr  # the progress bar


def test_fedlex_exploration_and_refresh_flags(loop_run):
  """--fedlex_explorer_fraction, --fedlex_exploration_epochs, --fedlex_refresh."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  config, summary, rows, _, _ = loop_run
  explorers = fedlex_exploration.fedlex_explorers(config, config.num_clients)
  assert len(explorers) == 3
  expected, cumulative = 3 * 2, []   # explorers x exploration epochs, then each refresh
  for round_num in (1, 2, 3):
    sampled = data.sample_clients(config.num_clients, config.clients_per_round, round_num,
                                  config.seed)
    expected += 2 * len(np.intersect1d(sampled, explorers))
    cumulative.append(expected)
  assert cumulative[-1] > 6  # the refresh did run
  assert [float(r['exploration_client_epochs']) for r in rows] == cumulative
  assert summary['exploration_client_epochs'] == cumulative[-1]


def test_client_flags_and_costs_in_the_run(loop_run):
  """--num_clients, --clients_per_round and --seed choose each round's clients, which train
  --local_epochs epochs each; the costs in summary.json are what they counted."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  config, summary, rows, _, _ = loop_run
  fed = experiment.load_federated_data(config)
  for row in rows:
    sampled = data.sample_clients(config.num_clients, config.clients_per_round,
                                  int(row['round']), config.seed)
    assert len(sampled) == 3
    examples = sum(len(fed.client_arrays(int(i))[1]) for i in sampled)
    assert float(row['client_work/train/num_examples']) == examples
    assert float(row['client_work/train/examples_trained']) == 2 * examples
    assert float(row['client_work/train/client_epochs']) == 3 * 2
  assert summary['client_epochs_training'] == 3 * 3 * 2
  assert summary['examples_trained'] == sum(
      float(r['client_work/train/examples_trained']) for r in rows)


GENERAL_FLAGS_TESTED_HERE = (
    'algorithm', 'dataset', 'data_dir', 'partition', 'dirichlet_alpha', 'shards_per_client',
    'classes_per_client', 'quantity_alpha', 'num_clients', 'clients_per_round', 'rounds',
    'local_epochs', 'batch_size', 'client_lr', 'client_momentum', 'client_optimizer',
    'client_weight_decay', 'client_lr_decay', *experiment_config.lr_schedules.FLAG_NAMES,
    'server_optimizer', 'server_lr',
    'server_momentum', 'proximal_strength', 'model', 'seed', 'eval_every', 'eval_last', 'root_output_dir',
    'experiment_name', 'progress', 'guided', 'kd_weight')


def test_every_compare_suite_run_is_a_valid_configuration():
  """benchmarks/suites.py's runs, tuning runs and probe runs use only flags their method
  reads, with valid values."""
  from benchmarks import suites  # pylint: disable=g-import-not-at-top
  from programs.studies import records  # pylint: disable=g-import-not-at-top
  for suite in suites.SUITES.values():
    tuned = suites.load_tuned(suite.name)
    for run in suite.runs:
      experiment_config.validate(experiment_config.ExperimentConfig(**suite.config_overrides(run, tuned)))
    for run, grid in suite.grid.items():
      for values in records.grid_points(grid):
        experiment_config.validate(experiment_config.ExperimentConfig(**suite.tuning_overrides(run, values)))
    for probe in suite.probes:
      for run in probe.runs:
        experiment_config.validate(experiment_config.ExperimentConfig(**suite.probe_overrides(probe, run,
                                                                                tuned)))


def test_fedcda_says_when_a_run_is_warmup_throughout():
  note = methods.METHODS['fedcda'].note
  config = experiment_config.ExperimentConfig(algorithm='fedcda', rounds=10, fedcda_warmup_rounds=10)
  assert 'is its warmup FedAvg throughout' in note(config)
  assert note(dataclasses.replace(config, fedcda_warmup_rounds=9)) is None
  assert all(m.note(dataclasses.replace(config, algorithm=m.name)) is None
             for m in methods.METHODS.values() if m.name != 'fedcda')


def test_fedlex_placeholder_explored_in_place_reads_the_last_tl_base(runtime):
  """--fedlex_guidance=placeholder --fedlex_explore_in_place: each explorer trains 1 +
  --fedlex_exploration_epochs epochs in place (its tl_base epoch first; inputs drawn as the
  run draws them), round 1 starts from the last one's model, and the G installed after round
  1 is the placeholder of the last explorer's tl_base, not of that model."""
  del runtime
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import fedlex  # pylint: disable=g-import-not-at-top
  config = _config(algorithm='fedlex_avgm', fedlex_guidance='placeholder',
                   fedlex_explore_in_place=True, fedlex_exploration_epochs=2)
  fed = experiment.load_federated_data(config)
  _, model_fn, process, _ = computations.build_computations(config, fed, NUM_CLIENTS)
  guidance = fedlex_exploration.guidance(config, fed, process, model_fn, NUM_CLIENTS)
  state0 = process.initialize()
  state, metrics = guidance.initial_state(state0)
  explorers = guidance.explorers
  _, inputs = data.round_inputs(fed, 0, len(explorers), 3, config.seed + 1,
                                client_ids=explorers)
  weights, want, _ = fedlex.explore_in_place(
      guidance.exploration, process.get_model_weights(state0), [[x] for x in inputs],
      guidance='placeholder')
  assert metrics['exploration_client_epochs'] == 3 * len(explorers)
  for a, b in zip(process.get_model_weights(state).trainable, weights.trainable):
    np.testing.assert_array_equal(a, b)
  for g, w in zip(guidance.placeholder, want):
    np.testing.assert_array_equal(g, w)
  of_round_1 = fedlex.placeholder_guidance(weights.trainable)
  assert max(np.abs(g - w).max() for g, w in zip(guidance.placeholder, of_round_1)) > 1e-3


def test_fedlex_placeholder_guidance_refuses_the_exploration_flags():
  """--fedlex_guidance=placeholder explores nothing: the explorers' flags are refused unless
  --fedlex_explore_in_place trains them; --fedlex_normalize and --fedlex_refresh always."""
  config = _config(algorithm='fedlex_avgm', fedlex_guidance='placeholder')
  experiment_config.validate(config)
  for name in ('fedlex_exploration_epochs', 'fedlex_normalize', 'fedlex_refresh'):
    with pytest.raises(experiment_config.ExperimentError, match=f'--{name} is not read'):
      experiment_config.validate(dataclasses.replace(config, **{name: CHANGED[name]}))
  experiment_config.validate(dataclasses.replace(config, fedlex_explore_in_place=True,
                                          fedlex_exploration_epochs=2))
  with pytest.raises(experiment_config.ExperimentError, match='fedlex_guidance'):
    experiment_config.validate(dataclasses.replace(config, fedlex_guidance='scout'))
