"""The training loop behind programs/train.py: data -> process -> rounds -> results.

Kept apart from the absl binary so that tests and notebooks can run an experiment from a
plain `ExperimentConfig`. `run_experiment` takes a run through named steps: check where it
resumes, start the runtime, load the data, build the computations, resume or initialise the
state, prepare the run directory, FedLEx's exploration, the round loop, finish. Per
experiment directory it writes `metrics.csv`, TensorBoard events, `checkpoints/`,
`summary.json`, `accuracy.png` and `partition.npz`.

The concepts around the loop have their own modules: programs/experiment_config.py (the
flags and their validation), programs/run_directory.py (the directory, its lock, checkpoints
and resume point), programs/computations.py (the TFF computations),
programs/fedlex_exploration.py, programs/stopping.py (signals, divergence, blow-ups) and
programs/run_results.py (what a run reports).

Resume is exact: client sampling, per-epoch batch orders and client faults are functions of
(seed, round, client), model initialisation of the seed, and everything else is in the
saved program state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import os
import re
import sys
import time
from typing import Any, Callable, Optional


from programs import checkpoint_writer
from programs import computations
from programs import experiment_config
from programs import fedlex_exploration
from programs.methods import registry
from programs import run_directory
from programs import run_results
from programs import stopping
from programs import user_code
from programs.experiment_config import (ExperimentConfig, ExperimentError, client_faults,
                                        validate)
from tff_algos.constants import CLIENT_ACCURACY_FIGURES  # no TensorFlow: flags come first


def load_federated_data(config: ExperimentConfig):
  """The FederatedDataset of the config (loaders and partitioners from data/)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  try:
    loaded = (user_code.load_dataset(config) if user_code.is_path(config.dataset)
              else data.load_dataset(config.dataset, config.data_dir))
  except (data.DatasetNotFoundError, data.DatasetFormatError) as e:
    raise ExperimentError(str(e)) from None
  except OSError as e:  # unreadable files: permissions, a directory where a file should be
    raise ExperimentError(f'cannot read {config.dataset}: {e.strerror}: {e.filename}') from None
  if isinstance(loaded, data.FederatedDataset):
    if config.num_clients > loaded.num_clients:
      raise ExperimentError(
          f'--num_clients={config.num_clients} but {config.dataset} has {loaded.num_clients} clients')
    return loaded
  params = dict(num_clients=config.num_clients, seed=config.seed)
  if config.partition == 'dirichlet':
    params['alpha'] = config.dirichlet_alpha
  elif config.partition == 'shards':
    params['shards_per_client'] = config.shards_per_client
  elif config.partition == 'classes':
    params['classes_per_client'] = config.classes_per_client
  elif config.partition == 'quantity':
    params['alpha'] = config.quantity_alpha
  try:
    return data.federate(loaded, data.make_partitioner(config.partition, **params))
  except data.PartitionError as e:
    # The partitioners' minimum client size is not a flag of this program: name the flags.
    reason = re.sub(r'(,? or a smaller min_size|lower min_size, )', '', str(e))
    raise ExperimentError(f'impossible partition: {reason}') from None


def with_client_test(config: ExperimentConfig, fed, num_clients: int):
  """(the data the clients train on, each of the first `num_clients` clients' test data or
  None when --client_test_fraction is 0).

  A dataset whose users come with their own test split (LEAF, TFF's SQLite) uses it, and its
  clients train on all their training data; any other holds --client_test_fraction of each
  client's examples out of training (`data.hold_out_client_test`, seeded by --seed).
  """
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  if not config.client_test_fraction:
    return fed, None
  if fed.client_test is None:
    fed = data.hold_out_client_test(fed, config.client_test_fraction, config.seed)
  client_test = fed.client_test[:num_clients]
  if not any(len(y) for _, y in client_test):
    raise ExperimentError(
        f'--client_test_fraction: none of the {num_clients} clients of {config.dataset} has test '
        'data of its own; give the users\' test split in --data_dir or drop the flag')
  return fed, client_test


def evaluated_round(round_num: int, config: ExperimentConfig) -> bool:
  """Whether the run evaluates on the test set after `round_num`: every --eval_every rounds,
  each of the last --eval_last rounds, and always the last."""
  return round_num % config.eval_every == 0 or round_num > config.rounds - max(config.eval_last, 1)


def run_experiment(config: ExperimentConfig, log: Callable[[str], None] = None,
                   stop: Optional[stopping.StopRequests] = None) -> dict:
  """Runs (or resumes) an experiment; returns the summary dict written to summary.json.

  Nothing in the experiment directory is written before the flags, the data, the model and,
  on --resume, the saved run have been checked. With `stop` (a StopRequests), a signal ends
  the run at the next round boundary by raising `Interrupted`. A directory another live
  process is running is refused (RunDirectoryBusy).
  """
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  validate(config)
  made = run_directory.make_output_dir(config.experiment_dir)
  try:
    with run_directory.exclusive_run_directory(config.experiment_dir), contextlib.ExitStack() as closing:
      return _run_experiment(config, log, stop, closing)
  except run_directory.RunDirectoryBusy:
    # The directory is the other process's, made by it between our look and our makedirs
    # (empty while that process checks its data): removing it would leave that process
    # writing into a path a third one then makes anew.
    raise
  except BaseException:
    run_directory.remove_empty(made)
    raise


def _run_experiment(config: ExperimentConfig, log: Callable[[str], None],
                    stop: Optional[stopping.StopRequests], closing: contextlib.ExitStack) -> dict:
  """run_experiment, with the experiment directory made and held; `closing` releases what
  the run holds (the resident state's scratch directory) however it ends."""
  started = time.time()
  start_round = run_directory.resume_point(config, log)
  _start_runtime(config)
  run_data = _load_data(config)
  built = _build_computations(config, run_data, log)
  run = _resume_or_initialise(config, built, start_round, stop, closing, log)
  _prepare_run_directory(config, run_data, run.start_round)
  guidance = _start_guidance(config, run_data, built, run, log)
  run.seconds_before_rounds = time.time() - started
  _round_loop(config, run, run_data, built, guidance, log)
  return _finish(config, run, run_data, built, guidance)


def _start_runtime(config: ExperimentConfig) -> None:
  """TFF's runtime: local, or the --workers / --local_workers worker services."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  try:
    execution.initialize_runtime(workers=execution.parse_worker_addresses(config.workers),
                                 local_workers=config.local_workers,
                                 worker_timeout_seconds=config.worker_timeout,
                                 require_isolated_worker=config.require_isolated_worker)
  except (execution.WorkerUnavailableError, execution.WorkerNotIsolatedError) as e:
    raise ExperimentError(str(e)) from None


@dataclasses.dataclass
class _RunData:
  """The data a run trains and evaluates on."""

  fed: Any                     # the FederatedDataset the clients train on
  num_clients: int             # the clients taking part (--num_clients, or fewer if it has fewer)
  client_test: Optional[list]  # each client's own test data; None without per-client evaluation


def _load_data(config: ExperimentConfig) -> _RunData:
  fed = load_federated_data(config)
  if len(fed.y_test) == 0:
    raise ExperimentError(
        f'{config.dataset} has no central test examples (no accuracy can be measured); give its '
        'test split data (LEAF: test/*.json) in --data_dir')
  num_clients = min(config.num_clients, fed.num_clients)
  fed, client_test = with_client_test(config, fed, num_clients)
  return _RunData(fed, num_clients, client_test)


@dataclasses.dataclass
class _Built:
  """A run's computations (computations.build_computations) and how it runs them."""

  model_name: str
  model_fn: Callable
  process: Any
  evaluator: computations.Evaluator
  client_evaluator: Optional[computations.ClientEvaluator]
  resident: bool   # the server state stays in TFF's local worker between rounds
  traffic: Any     # communication.ClientTraffic: one client's bytes per round


def _build_computations(config: ExperimentConfig, run_data: _RunData, log) -> _Built:
  """The run's computations, checked against the runtime they run on."""
  from tff_algos import communication  # pylint: disable=g-import-not-at-top
  fed, num_clients, client_test = run_data.fed, run_data.num_clients, run_data.client_test
  model_name, model_fn, process, evaluator = computations.build_computations(
      config, fed, num_clients)
  traffic = communication.process_traffic(process)
  client_evaluator = computations.ClientEvaluator(
      computations.per_client_evaluation(config, fed, num_clients, len(client_test)),
      client_test) if client_test else None
  computations.check_distributable(config, [process.next] + (
      [client_evaluator.computation] if client_evaluator else []))
  resident = config.resident_state and not (config.workers or config.local_workers)
  computations.check_state_crosses(config, process, resident)
  note = user_code.method(config.algorithm).note(config)
  if note:
    log(note)
  return _Built(model_name, model_fn, process, evaluator, client_evaluator, resident, traffic)


class _Run:
  """A run between its rounds: its server state, the program state a checkpoint saves,
  metrics.csv's rows, and its checkpoints (a CheckpointWriter) and stop requests.

  With --resident_state (local runtime) the server state stays in TFF's worker between
  rounds (`held`); `state` is its copy in Python (brought back at the end of the run). On
  worker services both are the same Python value.
  """

  def __init__(self, config: ExperimentConfig, runner, loop, checkpoints, held, state,
               program_state, start_round: int, stop: Optional[stopping.StopRequests]):
    self.c, self.runner, self.loop, self.stop = config, runner, loop, stop
    self.checkpoints = checkpoints
    self.held, self.state, self.program_state = held, state, program_state
    self.start_round = start_round
    self.exp_dir = config.experiment_dir
    self.ckpt_dir = os.path.join(self.exp_dir, 'checkpoints')
    self.csv_path = os.path.join(self.exp_dir, 'metrics.csv')
    self.rows, self.best, self.writer, self.progress = [], -1.0, None, None
    self.seconds_before_rounds = 0.0   # this process's start-up (run_results.startup_seconds)
    self.last_round = self.checkpointed = start_round

  def open_rounds(self) -> None:
    """Takes up metrics.csv, TensorBoard and the progress bar where the run starts."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    c = self.c
    if self.held is None:
      self.held = self.runner.adopt(self.state)
    self.rows = [r for r in run_directory.csv_rows(self.csv_path)
                 if int(r['round']) <= self.start_round]
    self.best = float(self.program_state['best_accuracy'])
    self.writer = tf.summary.create_file_writer(os.path.join(self.exp_dir, 'tensorboard'))
    if c.progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.progress = tqdm(total=c.rounds, initial=self.start_round, unit='round',
                           file=sys.stderr, dynamic_ncols=True)
    self.last_round = self.checkpointed = self.start_round

  def checkpoint(self) -> None:
    """Checkpoints the state after `last_round` (what a resume continues from):
    `CheckpointWriter.checkpoint` starts the worker's write of the resident state's version,
    which the next checkpoint, a stop or the end of the run waits for, and completes the
    version asked for before it."""
    figures = collections.OrderedDict(
        round=self.last_round, best_accuracy=self.best,
        exploration_client_epochs=float(self.program_state['exploration_client_epochs']))
    self.checkpoints.checkpoint(self.runner, self.held, figures, self.last_round)
    self.checkpointed = self.last_round

  def check_stop(self) -> None:
    """Raises Interrupted, checkpointed, if a stop signal has been recorded."""
    if self.stop is not None and self.stop.signum is not None:
      if self.progress is not None:
        self.progress.close()  # the message below goes on its own line
      if self.checkpointed < self.last_round:   # rounds since the last --checkpoint_every
        self.checkpoint()
      self.checkpoints.wait()
      self.writer.flush()
      raise stopping.Interrupted(self.stop.signum, self.last_round, self.exp_dir)

  def warn(self, message: str, log) -> None:
    if self.progress is not None:
      self.progress.write(message, file=sys.stderr)
    else:
      log(message)

  def record(self, round_num: int, row: dict) -> None:
    """Adds a round's row to metrics.csv and its numbers to TensorBoard."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.rows.append(row)
    try:
      run_directory.write_csv(self.csv_path, self.rows)
      with self.writer.as_default(step=round_num):
        for key, value in row.items():
          if key != 'round' and isinstance(value, (int, float)) and math.isfinite(value):
            tf.summary.scalar(key, value)
    except Exception as e:  # pylint: disable=broad-except
      self.refused_write(e, 'the round\'s metrics')

  def refused_write(self, error: Exception, what: str) -> None:
    """Raises `error`, as one line if the file system refused a write (a full disk)."""
    if not checkpoint_writer.is_write_failure(error):
      raise error
    self.checkpoints.wait(raise_error=False)
    raise checkpoint_writer.write_error(what, self.exp_dir, error,
                                        self.checkpoints.checkpointed) from None

  def close(self) -> None:
    """Waits for the checkpoint in flight (its failure raised unless an error is already
    ending the run)."""
    ending = sys.exc_info()[0] is not None
    if self.progress is not None:
      self.progress.close()
    try:
      self.writer.flush()
    except Exception as e:  # pylint: disable=broad-except
      if not ending:
        self.refused_write(e, 'TensorBoard\'s events')
    self.checkpoints.close(raise_error=not ending)


def _resume_or_initialise(config: ExperimentConfig, built: _Built, start_round: int,
                          stop: Optional[stopping.StopRequests],
                          closing: contextlib.ExitStack, log) -> _Run:
  """The run with its state: the last checkpoint's (resume) or the process's initial one."""
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  exp_dir = config.experiment_dir
  ckpt_dir = os.path.join(exp_dir, 'checkpoints')
  # Its files go in the experiment's directory (the checkpoints' file system); a killed run
  # leaves its scratch directory behind, removed here.
  resident_state.remove_scratch_directories(exp_dir)
  runner = (resident_state.ResidentProcess(built.process, config.clients_per_round,
                                           scratch_dir=exp_dir)
            if built.resident else resident_state.DirectProcess(built.process))
  closing.callback(runner.close)
  loop = asyncio.new_event_loop()
  closing.callback(loop.close)   # (also when what follows raises, before the run exists)
  checkpoints = checkpoint_writer.CheckpointWriter(ckpt_dir, checkpointed=start_round, log=log)
  held, state = runner.initial_state()   # (a resume or FedLEx's exploration replaces both)
  program_state = checkpoint_writer.program_state(state, collections.OrderedDict(
      round=0, best_accuracy=-1.0, exploration_client_epochs=0.0))
  run_directory.remove_unfinished_checkpoints(ckpt_dir)
  checkpoints.prepare(runner, program_state, scratch_dir=exp_dir)
  if start_round:
    # The newest checkpoint that reads (an unreadable newer one is removed, with a warning).
    restored, _ = run_directory.load_checkpoint(loop, checkpoints.manager, program_state,
                                                exp_dir, log)
    program_state = restored
    state, held = restored['state'], None
    start_round = checkpoints.checkpointed = int(restored['round'])
    log(f'resuming {exp_dir} after round {start_round}')
  return _Run(config, runner, loop, checkpoints, held, state, program_state, start_round, stop)


def _prepare_run_directory(config: ExperimentConfig, run_data: _RunData, start_round: int) -> None:
  """The run is known valid from here on: only now is its record (re)written."""
  exp_dir = config.experiment_dir
  run_directory.write_json(os.path.join(exp_dir, 'config.json'),
                            dict(dataclasses.asdict(config), user_code=user_code.fingerprints(config)))
  diverged = os.path.join(exp_dir, run_directory.DIVERGED)
  if not start_round and os.path.exists(diverged):
    os.remove(diverged)   # an earlier start diverged in round 1
  partition_path = os.path.join(exp_dir, 'partition.npz')
  fed = run_data.fed
  if fed.partition is not None and not (start_round and os.path.exists(partition_path)):
    fed.partition.save(partition_path)
  run_directory.truncate_tensorboard(os.path.join(exp_dir, 'tensorboard'), start_round)


def _start_guidance(config: ExperimentConfig, run_data: _RunData, built: _Built, run: _Run,
                    log) -> Optional[fedlex_exploration.Guidance]:
  """FedLEx's exploration of a guided run (None otherwise), explored before round 1 when
  the run starts afresh; then the run's rounds open."""
  guidance = fedlex_exploration.guidance(config, run_data.fed, built.process, built.model_fn,
                                         run_data.num_clients)
  if guidance is not None and run.start_round == 0:
    run.state, explore_metrics = guidance.initial_state(run.state)
    run.held = None
    run.program_state['exploration_client_epochs'] = explore_metrics['exploration_client_epochs']
    log(f'FedLEx exploration: {len(guidance.explorers)} explorers, '
        f'{explore_metrics["exploration_client_epochs"]:.0f} client-epochs')
  run.open_rounds()
  if guidance is not None and run.start_round:
    guidance.resume_bytes(run.rows[-1] if run.rows else None)
  return guidance


def _round_loop(config: ExperimentConfig, run: _Run, run_data: _RunData, built: _Built,
                guidance: Optional[fedlex_exploration.Guidance], log) -> None:
  """Rounds start_round + 1 to --rounds, each recorded in metrics.csv and TensorBoard and
  checkpointed every --checkpoint_every rounds and after the last; a stop request, diverged
  training or --blown_up_rounds blown-up rounds in a row end the loop, checkpointed."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  frozen = frozen_after_eval = False
  in_a_row = stopping.blown_up_rounds_in_a_row(run.rows)   # blown-up rounds just before this one
  rows = run.rows
  accuracy = float(rows[-1]['test_accuracy']) if rows and rows[-1].get('test_accuracy') else float('nan')
  try:
    for round_num in range(run.start_round + 1, config.rounds + 1):
      run.check_stop()
      t0 = time.time()
      round_metrics = _train_round(config, run, run_data, guidance, round_num)
      seconds = time.time() - t0
      metrics = run_results.flatten_metrics(round_metrics)
      train_loss = metrics.get('client_work/train/loss', float('nan'))
      dropped = stopping.dropped_clients(metrics)
      reported = run_results.reported_clients(metrics, config.clients_per_round)
      in_a_row = _check_round(config, run, round_num, train_loss, dropped, reported, in_a_row, log)
      # seconds: the round's training (and FedLEx's exploration); round_seconds, filled in
      # after the evaluation: the whole round as the program runs it (what --plan sizes by).
      row = collections.OrderedDict(round=round_num, seconds=round(seconds, 4),
                                    round_seconds=None, dropped_clients=dropped,
                                    reported_clients=reported,
                                    unreported_clients=config.clients_per_round - reported)
      row.update(metrics)
      row.update(run_results.bytes_columns(built.traffic, config.clients_per_round, metrics,
                                           rows[-1] if rows else None))
      if guidance is not None and guidance.exploration is not None:
        row['exploration_client_epochs'] = float(run.program_state['exploration_client_epochs'])
        row.update(guidance.bytes)
      evaluated = evaluated_round(round_num, config)
      if evaluated:
        accuracy = _evaluate(run, built, row)
      row['round_seconds'] = round(time.time() - t0, 4)
      run.record(round_num, row)
      run.last_round = round_num
      if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
        run.checkpoint()
      if config.blown_up_rounds and in_a_row >= config.blown_up_rounds:
        if run.checkpointed < run.last_round:
          run.checkpoint()
        raise stopping.blown_up_error(round_num, in_a_row, run.last_round, run.ckpt_dir,
                                      config.client_lr)
      if not frozen or (evaluated and not frozen_after_eval):
        # Everything alive now (TFF's compiled computations, ~1M objects) lives as long as
        # the run: keep the garbage collector from re-traversing it every round.
        execution.freeze_long_lived_objects()
        frozen, frozen_after_eval = True, frozen_after_eval or evaluated
      if run.progress is not None:
        run.progress.set_postfix(loss=f'{train_loss:.4f}', acc=f'{accuracy:.4f}', refresh=False)
        run.progress.update(1)
    run.check_stop()
  finally:
    run.close()


def _train_round(config: ExperimentConfig, run: _Run, run_data: _RunData,
                 guidance: Optional[fedlex_exploration.Guidance], round_num: int) -> dict:
  """Trains round `round_num` on its sampled clients (and refreshes FedLEx's guidance);
  returns the round's metrics."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  fed, num_clients = run_data.fed, run_data.num_clients
  sampled = data.sample_clients(num_clients, config.clients_per_round, round_num, config.seed)
  _, inputs = data.round_inputs(fed, round_num, config.clients_per_round, config.local_epochs, config.seed,
                                client_ids=sampled, faults=client_faults(config))
  # The runner's calls pause the collector themselves; FedLEx's exploration is paused here.
  run.held, round_metrics = run.runner.next(run.held, [[element] for element in inputs])
  if guidance is not None:
    with execution.collector_paused():
      run.held, explored = guidance.after_round(round_num, sampled, run.runner, run.held)
    if explored is not None:
      run.program_state['exploration_client_epochs'] = (
          float(run.program_state['exploration_client_epochs']) + explored)
  return round_metrics


def _check_round(config: ExperimentConfig, run: _Run, round_num: int, train_loss: float,
                 dropped: int, reported: int, in_a_row: int, log) -> int:
  """Ends the run if its training diverged, else warns of left-out clients and blown-up
  training; returns the blown-up rounds in a row up to this one (a round nobody reported
  in trained nothing: it neither adds to them nor breaks them)."""
  if not reported:
    run.warn(stopping.nobody_reported_warning(round_num, config.clients_per_round), log)
    return in_a_row
  diverged = stopping.divergence(round_num, train_loss, dropped, reported)
  if diverged:
    run_directory.write_diverged(run.exp_dir, diverged)
    raise stopping.diverged_error(diverged, run.checkpointed, run.ckpt_dir, config.client_lr)
  warnings = [stopping.dropped_warning(round_num, dropped, reported)] if dropped else []
  in_a_row = in_a_row + 1 if stopping.blew_up(train_loss) else 0
  if in_a_row:
    warnings.append(stopping.blown_up_warning(round_num, train_loss, config.client_lr, in_a_row,
                                              config.blown_up_rounds))
  for message in warnings:
    run.warn(message, log)
  return in_a_row


def _evaluate(run: _Run, built: _Built, row: dict) -> float:
  """Evaluates the global model on the test set (and the clients' own); adds the figures
  to `row` and returns the test accuracy."""
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  weights = run.runner.get_model_weights(run.held)
  with execution.collector_paused():
    accuracy, test_loss = built.evaluator(weights)
    client_figures = built.client_evaluator(weights) if built.client_evaluator else {}
  run.best = max(run.best, accuracy)
  row['test_accuracy'] = accuracy
  row['test_loss'] = test_loss
  row.update((k, client_figures[k]) for k in CLIENT_ACCURACY_FIGURES if client_figures)
  return accuracy


def _finish(config: ExperimentConfig, run: _Run, run_data: _RunData, built: _Built,
            guidance: Optional[fedlex_exploration.Guidance]) -> dict:
  """Writes the run's results (summary.json, accuracy.png, final_weights.npz); returns the
  summary."""
  run.state = run.runner.materialize(run.held)
  summary = run_results.run_summary(
      config, run.rows, built.model_name, run.state,
      float(run.program_state['exploration_client_epochs']), run_data.client_test, run.exp_dir)
  summary.update(run_results.bytes_summary(run.rows, built.traffic))
  summary['startup_seconds'] = run_results.startup_seconds(
      run.seconds_before_rounds, [r for r in run.rows if int(r['round']) > run.start_round])
  if guidance is not None and guidance.exploration is not None:
    summary.update(guidance.bytes)
  final_weights = run.runner.get_model_weights(run.held)   # (only the weights leave the worker)
  record = registry.RunRecord(config, run.rows, run.state, final_weights, run_data.num_clients)
  method = user_code.method(config.algorithm)
  summary.update(method.summary(record), user_code=user_code.fingerprints(config))
  summary.update(registry.plugin_summary(method, record))
  # Last: it counts the exploration's bytes, whichever entry above records them.
  summary['time_to_accuracy'] = run_results.time_to_accuracy(
      run.rows, experiment_config.target_accuracies(config), run_results.exploration_bytes(summary))
  run_results.write_results(config, run.exp_dir, run.rows, summary, final_weights,
                            built.model_fn)
  return summary
