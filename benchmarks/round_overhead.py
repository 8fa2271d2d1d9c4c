"""Seconds per round of every method against a tight plain-TF loop doing the same local work.

Builds, on identical clients, three things doing the same FedAvg work (one local epoch of
SGD per client, example-weighted mean of the deltas, server SGD with learning rate 1.0):

  plain_tf  a tight plain-TF loop in this Python process: one `tf.function` per client
            epoch over pre-gathered tensor batches of a Keras model;
  ours      `tff_algos.baselines.build_fedavg` (whole-client tensors, batches gathered
            in-graph by `tff_algos.client_work.build_local_training`);
  tff       `tff.learning.algorithms.build_weighted_fed_avg` with `tf.data` clients.

(`ours@exposed`, on request: `ours` on a second local runtime whose worker is not isolated
from the network, as TFF starts it: what the isolation, a namespace and a relay, costs a
round.)

and every method of the project on the same clients and batches (built by the training
program's `computations.build_process`; client SGD without momentum at the same learning rate,
every client taking part; FedCDA with no warm-up, so its cache selection runs every round):

  fedcross, fedcda, cadis (KD, lambda = 1), cadis_nokd (lambda = 0),
  fedlex_avgm, fedlex_sgd, fedlex_opt, fedlex_prox (guided client steps; the guidance is
  the initial one, exploration is not timed), scaffold.

They run INTERLEAVED round by round in one process (the order rotates every round), so
load from other users of the machine hits all alike. Prints the median seconds per round of
each after the warm-up rounds, and each one's ratio to plain_tf. With --server_share, each
TFF variant also runs, interleaved, rounds whose clients train for 0 epochs (same clients,
same uploads, same server step): that round's time over the full round is an upper bound
of the server step's share (it also holds the dispatch and the upload); their models must
end where they started (printed). CADIS with KD and
FedLEx-SGD (one full-batch gradient per client) do other local work than the plain-TF
loop: their ratio is to plain TF's SGD epoch, stated as such. With --resident, each TFF
variant also runs through `tff_algos.ResidentProcess` (its server state kept in the worker
between rounds instead of crossing to it and back), and both copies must end on the same
weights. Each resident variant also runs, interleaved, as the training program runs it by
default (<name>@program): a checkpoint every round, made by the program's own call
(`CheckpointWriter.checkpoint`: it starts the worker's write of the version's tensors, which
runs while the next round does), then the next round; the variant's round ends with
`CheckpointWriter.wait`, which waits for the write, as the program's next checkpoint does,
and completes the version, so that no write overlaps another variant's round. The program's
writer thread completes the version during the round after instead: here that completion
counts in full (an upper bound). The timed rounds time a run past its start: before them each
writer has written its first KEEP_VERSIONS versions (each alone, timed and printed), so each
timed version also drops the oldest, as from a run's fourth checkpoint on. What checkpoints add to a round is that variant's time
less the resident round's, and "as the program runs it" gives the default
cadence (every round) and --checkpoint_every=N (that addition spread over N rounds). For
reference, a checkpoint made in the round loop's thread (bringing the state back and
writing it) is timed too, with the state crossing as a file (ResidentProcess's default
transfer) and as TFF values (`transfer='values'`, timed from the same state).

  .venv/bin/python benchmarks/round_overhead.py --examples_per_client=200 --rounds=3

--json=PATH also writes the figures for a script to read (benchmarks/clients_per_round.py):
each variant's median and least s/round and median ratio to plain_tf; with --resident, each
@resident variant's default_s and default_ratio_to_plain_tf (a checkpoint every round, as the
program runs it by default), snapshot_s (the checkpoint call's part in the round loop:
starting the worker's write), wait_s (the round's end: what the worker's write had left
after the next round, and completing the version), first_writes_s (the run's first versions,
each written alone before the timed rounds), version_mb and written_mb (the last version's
size, and what of it was written anew: the rest is the previous version's files, the parts
of a large tensor that did not change), program_s and program_ratio_to_plain_tf
(--checkpoint_every), checkpoint_cpu_s (the machine's CPU seconds a checkpoint every round
adds: the @program round's less the resident round's, medians of user + system), and
checkpoint_s (materialize_s of it) of a checkpoint made in the round loop's thread, with the
same under transfer_values. Every variant also has cpu_user_s and cpu_system_s: the median
CPU seconds of its rounds, the machine's (/proc/stat: every process and kernel thread), so
work that a busy machine's wall time hides in part (a checkpoint written beside the round)
shows in full.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np
# TF is imported here, not inside main(): imported after absl's app.run has parsed the
# flags, Keras' Flatten fails to build fedavg_cnn ("Attempt to convert a value (None)").
import tensorflow as tf

from benchmarks import fedavg_rounds  # pylint: disable=g-import-not-at-top
from benchmarks.fedavg_rounds import max_abs_difference
from benchmarks.method_builds import build_method  # pylint: disable=g-import-not-at-top
from benchmarks.method_builds import load_data  # pylint: disable=g-import-not-at-top
from programs import flag_parsing
from programs import generated_files  # pylint: disable=g-import-not-at-top
from programs import run_directory  # pylint: disable=g-import-not-at-top
from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
from tff_algos.runtime import state_transfer  # pylint: disable=g-import-not-at-top

_MODEL = flags.DEFINE_string('model', 'fedavg_cnn', 'tff_algos.models zoo model.')
_DATASET = flags.DEFINE_enum('dataset', 'fashion_mnist', ['fashion_mnist', 'digits'],
                             'Data (fashion_mnist falls back to digits if it is missing).')
_CLIENTS = flags.DEFINE_integer('clients', 10, 'Clients per round (all clients take part).')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 600, 'Examples per client.')
_BATCH = flags.DEFINE_integer('batch_size', 50, 'Local batch size.')
_EPOCHS = flags.DEFINE_integer('epochs', 1, 'Local epochs.')
_LR = flags.DEFINE_float('client_lr', 0.1, 'Client SGD learning rate.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per variant.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed rounds per variant first.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed for data selection, orders and model init.')
_VARIANTS = flags.DEFINE_list(
    'variants', ['plain_tf', 'ours', 'tff'],
    'Which of plain_tf, ours, ours@exposed (ours on a worker not isolated from the network), '
    'tff and the methods (fedcross, fedcda, cadis, cadis_nokd, fedlex_avgm, fedlex_sgd, '
    'fedlex_opt, fedlex_prox, scaffold) to run; "all" = every one.')
_LOCAL_WORKERS = flags.DEFINE_integer(
    'local_workers', 0, 'Also run `ours` split across this many worker services started here '
    '(variant ours_w, TFF\'s mergeable-comp context), interleaved with the local runtime.')
_SERVER_SHARE = flags.DEFINE_bool(
    'server_share', False, 'Also time 0-epoch rounds of each TFF variant (server step share).')
_MANAGE_GC = flags.DEFINE_bool(
    'manage_gc', True, 'As programs/train.py does: freeze the long-lived heap after the '
    'warm-up round and pause the garbage collector during each timed call (all variants).')
_RESIDENT = flags.DEFINE_bool(
    'resident', False, 'Also run each TFF variant with its server state resident in the '
    'worker (tff_algos.ResidentProcess; variant <name>@resident), interleaved with the '
    'same process through process.next, and check both end on the same weights.')
_JSON = flags.DEFINE_string(
    'json', None, 'Also write the figures to this JSON file: the setup, and for each variant '
    'its median and least s/round over the timed rounds and its median ratio to plain_tf.')
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 10, 'With --resident: the training program\'s --checkpoint_every, for '
    'the "as the program runs it" figure (resident round + one checkpoint per this many '
    'rounds).', lower_bound=1)
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1, 'Passed to the TFF runtime (-1 = no limit).')

METHODS = ('fedcross', 'fedcda', 'cadis', 'cadis_nokd', 'fedlex_avgm', 'fedlex_sgd',
           'fedlex_opt', 'fedlex_prox', 'scaffold')
VARIANTS = ('plain_tf', 'ours', 'ours@exposed', 'tff') + METHODS


def machine_cpu_s() -> tuple:
  """The machine's CPU time so far, all processes (this one, TFF's workers, the kernel's
  threads): (user, system) seconds from /proc/stat, (0, 0) where there is none. A round's
  difference counts its CPU work whichever process or kernel thread does it, which its wall
  time on busy cores shows only in part."""
  try:
    with open('/proc/stat') as f:
      fields = [int(x) for x in f.readline().split()[1:8]]
  except OSError:
    return 0.0, 0.0
  tick = os.sysconf('SC_CLK_TCK')
  user, nice, system, _, _, irq, softirq = fields
  return (user + nice) / tick, (system + irq + softirq) / tick


def _version_bytes(ckpt_dir: str) -> tuple:
  """(bytes of the newest version, bytes of its files that are not the previous version's)."""
  newest, previous = [os.path.join(ckpt_dir, f'program_state_{v}')
                      for v in run_directory.checkpointed_rounds(ckpt_dir)[-1:-3:-1]]

  def files(directory):
    return {os.path.join(d, f) for d, _, names in os.walk(directory) for f in names}
  shared = {os.stat(f).st_ino for f in files(previous)}
  sizes = {os.stat(f).st_ino: (os.stat(f).st_size, os.stat(f).st_ino in shared)
           for f in files(newest)}
  return (sum(size for size, _ in sizes.values()),
          sum(size for size, old in sizes.values() if not old))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TFF logs every Keras model it wraps
  t_start = time.perf_counter()
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime(max_concurrent_computation_calls=_MAX_CALLS.value)
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import baselines  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top

  num_clients, per_client, batch, epochs = (_CLIENTS.value, _EXAMPLES.value, _BATCH.value,
                                            _EPOCHS.value)
  if per_client % batch:
    raise app.UsageError('examples_per_client must be a multiple of batch_size '
                         '(the plain-TF loop stacks full batches)')
  ds = load_data(_DATASET.value)
  try:
    xs, ys = fedavg_rounds.client_split(ds, num_clients, per_client, _SEED.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  input_shape = ds.input_shape
  model_fn = models.make_model_fn(_MODEL.value, input_shape, ds.num_classes, seed=_SEED.value)
  client_opt = tff.learning.optimizers.build_sgdm(learning_rate=_LR.value)
  server_opt = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

  requested = VARIANTS if 'all' in _VARIANTS.value else tuple(_VARIANTS.value)
  unknown = sorted(set(requested) - set(VARIANTS))
  if unknown:
    raise app.UsageError(f'--variants: unknown {", ".join(unknown)}; choose from {", ".join(VARIANTS)}')
  t0 = time.perf_counter()
  ours = baselines.build_fedavg(model_fn, client_opt, batch, server_opt)
  builds = dict(ours=time.perf_counter() - t0)
  stock = None   # TFF's own FedAvg, built only when timed
  if 'tff' in requested:
    t0 = time.perf_counter()
    stock = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=client_opt, server_optimizer_fn=server_opt)
    builds['tff'] = time.perf_counter() - t0
  processes = dict(ours=ours)
  contexts = {}
  if 'ours@exposed' in requested:   # the same process on a worker TFF's way (every interface)
    processes['ours@exposed'] = ours
    contexts['ours@exposed'] = execution.local_context(
        max_concurrent_computation_calls=_MAX_CALLS.value, isolate=False)
  if _LOCAL_WORKERS.value > 0:
    processes['ours_w'] = ours
    contexts['ours_w'] = execution.distributed_context(local_workers=_LOCAL_WORKERS.value)
    requested += ('ours_w',)
  for name in METHODS:
    if name in requested:
      t0 = time.perf_counter()
      processes[name] = build_method(name, model_fn, num_clients, batch, _LR.value, _SEED.value)
      builds[name] = time.perf_counter() - t0
  state_ours = ours.initialize()
  state_tff = stock.initialize() if stock is not None else None
  w0 = ours.get_model_weights(state_ours)
  num_params = sum(int(np.prod(np.shape(t))) for t in w0.trainable)

  # Plain TF: a Keras model created after TFF has built its processes (TFF_NOTES traps).
  keras_model = models.build_keras_model(_MODEL.value, input_shape, ds.num_classes,
                                         seed=_SEED.value)
  plain = fedavg_rounds.PlainTF(keras_model, _LR.value, batch)
  plain_weights = [tf.constant(np.asarray(t)) for t in w0.trainable]
  for v, w in zip(keras_model.trainable_variables, plain_weights):  # same start as TFF's
    v.assign(w)

  def tff_dataset(inp):
    x, y, order = inp['x'], inp['y'], inp['order']
    parts = [tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x[o], y=y[o])).batch(batch) for o in order]
    out = parts[0]
    for p in parts[1:]:
      out = out.concatenate(p)
    return out

  print(f'setup: {ds.name} {num_clients} clients x {per_client} examples, batch {batch}, '
        f'{epochs} epoch(s), model {_MODEL.value} ({num_params:,} params), '
        f'{_WARMUP.value} warm-up + {_ROUNDS.value} timed rounds, interleaved; load average '
        f'{os.getloadavg()[0]:.1f} (2 cores)', flush=True)
  print('build: ' + ', '.join(f'{k} {v:.1f} s' for k, v in builds.items()), flush=True)

  variants = tuple(v for v in VARIANTS + ('ours_w',) if v in requested)
  if 'plain_tf' not in variants or len(variants) < 2:
    raise app.UsageError('--variants needs plain_tf and at least one other variant')
  # 0-epoch rounds of the TFF variants whose clients take our inputs (not TFF's tf.data).
  empty_variants = tuple(v for v in variants if v in processes) if _SERVER_SHARE.value else ()
  residents = {}
  if _RESIDENT.value:
    # refresh_every=0: no refresh falls into the timed rounds (each round detaches its state).
    residents = {v: resident_state.ResidentProcess(processes[v], num_clients,
                                                   refresh_every=0)
                 for v in variants if v in processes and v not in ('ours_w', 'ours@exposed')}
    variants += tuple(f'{v}@resident' for v in residents)
    variants += tuple(f'{v}@program' for v in residents)
  # With --resident too, the 0-epoch rounds also run resident (<name>@resident@0): the
  # server step's share of the round as the program runs it.
  empty_runs = tuple(f'{v}@0' for v in empty_variants) + tuple(
      f'{v}@resident@0' for v in empty_variants if v in residents)
  times = {v: [] for v in variants + empty_runs}
  cpu = {v: [] for v in variants + empty_runs}   # (user, system) s of the machine's CPUs
  state = dict(plain=plain_weights, tff=state_tff)
  state.update({name: p.initialize() for name, p in processes.items() if name != 'ours'})
  state['ours'] = state_ours
  state.update({f'{name}@0': processes[name].initialize() for name in empty_variants})
  state.update({f'{name}@resident': r.initialize() for name, r in residents.items()})
  # The program's checkpoints (<name>@program): each run past its start (ProgramRun), its
  # writer in a temp directory, prepared as the program prepares its own.
  scratch = tempfile.TemporaryDirectory()
  program_runs = {name: fedavg_rounds.ProgramRun(r, os.path.join(scratch.name, name),
                                                 scratch.name)
                  for name, r in residents.items()}
  snapshot_times = {name: [] for name in residents}
  wait_times = {name: [] for name in residents}

  def program_round(name, round_num):
    """A round as programs/experiment.py runs it by default (fedavg_rounds.ProgramRun)."""
    snapshot, wait = program_runs[name].round(inputs)
    if round_num >= _WARMUP.value:
      snapshot_times[name].append(snapshot)
      wait_times[name].append(wait)
  state.update({f'{name}@resident@0': residents[name].initialize()
                for name in empty_variants if name in residents})

  def run_variant(variant, round_num):
    if variant.endswith('@program'):
      program_round(variant.split('@')[0], round_num)
    elif variant == 'plain_tf':
      state['plain'] = plain.round(state['plain'], inputs)
    elif variant == 'tff':
      state['tff'] = stock.next(state['tff'], datasets).state
    elif '@resident' in variant:
      state[variant] = residents[variant.split('@')[0]].next(
          state[variant], [[inp] for inp in (empty_inputs if variant.endswith('@0')
                                             else inputs)]).state
    else:
      name, empty = variant.split('@')[0], variant.endswith('@0')
      context = contexts.get(variant[:-len('@0')] if empty else variant)
      with (tff.framework.get_context_stack().install(context) if context
            else contextlib.nullcontext()):
        state[variant] = processes[name].next(
            state[variant], [[inp] for inp in (empty_inputs if empty else inputs)]).state

  total_rounds = _WARMUP.value + _ROUNDS.value
  for r in range(total_rounds):
    inputs = fedavg_rounds.round_inputs(xs, ys, epochs, _SEED.value, r)
    empty_inputs = [data.client_input(xs[c], ys[c], 0, np.random.default_rng(0), c, c)
                    for c in range(num_clients)]
    datasets = [tff_dataset(inp) for inp in inputs]
    timed = variants + empty_runs
    shift = r % len(timed)
    order = timed[shift:] + timed[:shift]
    line = []
    for variant in order:
      c0, t0 = machine_cpu_s(), time.perf_counter()
      gc_guard = execution.collector_paused() if _MANAGE_GC.value else contextlib.nullcontext()
      with gc_guard:
        run_variant(variant, r)
      dt, c1 = time.perf_counter() - t0, machine_cpu_s()
      line.append(f'{variant} {dt:.2f}s')
      if r >= _WARMUP.value:
        times[variant].append(dt)
        cpu[variant].append((c1[0] - c0[0], c1[1] - c0[1]))
    if _MANAGE_GC.value and r == _WARMUP.value - 1:
      execution.freeze_long_lived_objects()
    tag = 'warm-up' if r < _WARMUP.value else 'timed'
    print(f'round {r} ({tag}): ' + ', '.join(line), flush=True)

  print(f'load average at end: {os.getloadavg()[0]:.1f} (2 cores; shared machine)')
  med = {v: statistics.median(t) for v, t in times.items()}
  low = {v: min(t) for v, t in times.items()}  # least disturbed by other load
  cpu_med = {v: tuple(statistics.median(c[i] for c in cs) for i in (0, 1))
             for v, cs in cpu.items()}
  print('\nmedian s/round: ' + ', '.join(f'{v} {med[v]:.3f}' for v in variants))
  print('median CPU s/round (the machine\'s, user + system): ' + ', '.join(
      f'{v} {cpu_med[v][0]:.2f} + {cpu_med[v][1]:.2f}' for v in variants))
  for v in variants:
    if v != 'plain_tf':
      print(f'ratio {v} / plain_tf: {med[v] / med["plain_tf"]:.2f}x')
  if 'ours' in variants and 'ours@exposed' in variants:
    print(f'isolation: ours (worker isolated) / ours@exposed (worker on every interface): '
          f'{med["ours"] / med["ours@exposed"]:.2f}x')
  figures = dict(
      setup=dict(dataset=ds.name, model=_MODEL.value, num_params=num_params,
                 clients=num_clients, examples_per_client=per_client, batch_size=batch,
                 epochs=epochs, warmup_rounds=_WARMUP.value, rounds=_ROUNDS.value,
                 load_average=os.getloadavg()[0]),
      variants={v: dict(median_s=med[v], min_s=low[v],
                        ratio_to_plain_tf=med[v] / med['plain_tf'],
                        cpu_user_s=cpu_med[v][0], cpu_system_s=cpu_med[v][1])
                for v in times})
  if empty_variants:
    print('\n| variant | s/round median (min) | / plain_tf median (min) | 0-epoch round s median '
          '(min) | server share, upper bound, median (min) |')
    print('|---|---|---|---|---|')
    for v in empty_variants + tuple(f'{v}@resident' for v in empty_variants
                                    if v in residents):
      e = v + '@0'
      print(f'| {v} | {med[v]:.3f} ({low[v]:.3f}) | {med[v] / med["plain_tf"]:.2f}x '
            f'({low[v] / low["plain_tf"]:.2f}x) | {med[e]:.3f} ({low[e]:.3f}) | '
            f'{100 * med[e] / med[v]:.1f}% ({100 * low[e] / low[v]:.1f}%) |')
    # No client took a step in those rounds: each model must be where it started.
    moved = {v: max_abs_difference(processes[v].get_model_weights(state[f'{v}@0']), w0)
             for v in empty_variants}
    moved.update({f'{v}@resident': max_abs_difference(
        residents[v].get_model_weights(state[f'{v}@resident@0']), w0)
                  for v in empty_variants if v in residents})
    print('0-epoch rounds: max |final - initial weights| ' +
          ', '.join(f'{v} {d:.2e}' for v, d in moved.items()))

  plain_weights, state_ours, state_tff = state['plain'], state['ours'], state['tff']
  w_ours = ours.get_model_weights(state_ours).trainable
  diff_plain = max_abs_difference(w_ours, plain_weights)
  line = f'final weights max |ours - plain_tf| {diff_plain:.2e}'
  if 'tff' in variants and 'ours' in variants:
    w_tff = stock.get_model_weights(state_tff).trainable
    diff_tff = max_abs_difference(w_ours, w_tff)
    line += f', max |ours - tff| {diff_tff:.2e}'
  if 'ours' in variants:
    print(line)
  for run in program_runs.values():
    run.close()
  # The newest version's size, and what of it was written anew (its other files are the
  # previous version's: the parts that did not change, bundle_parts).
  version_bytes = {name: _version_bytes(run.writer.ckpt_dir)
                   for name, run in program_runs.items()}
  scratch.cleanup()
  loop = asyncio.new_event_loop()
  for name, resident in residents.items():
    diff = max_abs_difference(resident.get_model_weights(state[f'{name}@resident']),
                              processes[name].get_model_weights(state[name]))
    # The training program brings the state back for each checkpoint and writes it (TFF's
    # FileProgramStateManager, as programs/experiment.py): once a round with
    # --checkpoint_every=1, once every N rounds with N: with the default transfer='files' the
    # worker writes the state to a file that Python reads. The same is timed with
    # transfer='values' (the state through TFF's gRPC values), from the same state.
    by_transfer = {}
    for transfer in state_transfer.TRANSFERS:
      if transfer == 'files':
        runner, held = resident, state[f'{name}@resident']
      else:
        runner = resident_state.ResidentProcess(processes[name], num_clients, refresh_every=0,
                                                transfer=transfer)
        # A state computed in the worker (one placed from Python would come back at no cost).
        held = runner.next(runner.adopt(resident.materialize(state[f'{name}@resident'])),
                           [[inp] for inp in inputs]).state
      back, write = [], []
      with tempfile.TemporaryDirectory() as ckpt_dir:
        manager = tff.program.FileProgramStateManager(ckpt_dir, keep_total=2)
        for version in range(1, 4):
          t0 = time.perf_counter()
          python_state = runner.materialize(held)
          t1 = time.perf_counter()
          loop.run_until_complete(manager.save(
              collections.OrderedDict(state=python_state, round=version), version))
          t2 = time.perf_counter()
          back.append(t1 - t0)
          write.append(t2 - t1)
          # A new round's state (a state already brought back would come back at no cost).
          held = runner.next(held, [[inp] for inp in inputs]).state
      back, write = statistics.median(back), statistics.median(write)
      # In the round loop's thread, one checkpoint every N rounds (N = --checkpoint_every).
      n = _CHECKPOINT_EVERY.value
      program = med[name + '@resident'] + (back + write) / n
      by_transfer[transfer] = dict(
          checkpoint_s=back + write, materialize_s=back, checkpoint_every=n,
          program_s=program, program_ratio_to_plain_tf=program / med['plain_tf'])
    files, values = by_transfer['files'], by_transfer['values']
    first_writes = program_runs[name].first_writes
    # As programs/train.py runs it now: what its checkpoints add to a resident round, every
    # round (the default) and spread over --checkpoint_every rounds.
    n = _CHECKPOINT_EVERY.value
    default = med[name + '@program']
    added = default - med[name + '@resident']
    program = med[name + '@resident'] + added / n
    figures['variants'][name + '@resident'].update(
        files, in_loop_program_s=files['program_s'], default_s=default,
        default_ratio_to_plain_tf=default / med['plain_tf'],
        snapshot_s=statistics.median(snapshot_times[name]),
        version_mb=version_bytes[name][0] / 1e6, written_mb=version_bytes[name][1] / 1e6,
        wait_s=statistics.median(wait_times[name]),
        first_writes_s=first_writes,
        program_s=program,
        program_ratio_to_plain_tf=program / med['plain_tf'])
    figures['variants'][name + '@resident']['transfer_values'] = values
    print(f'final weights max |{name}@resident - {name}| {diff:.2e}; a checkpoint in the round '
          f'loop\'s thread: materialize {files["materialize_s"]:.3f} s + write '
          f'{files["checkpoint_s"] - files["materialize_s"]:.3f} s (with transfer=\'values\': '
          f'materialize {values["materialize_s"]:.3f} s); the program\'s checkpoint in the round '
          f'loop (starting the worker\'s write) {statistics.median(snapshot_times[name]):.3f} s, '
          f'the wait after the next round {statistics.median(wait_times[name]):.3f} s; the '
          f'run\'s first {len(first_writes)} versions, each written alone before the timed '
          f'rounds: {", ".join(f"{t:.3f}" for t in first_writes)} s; the last version '
          f'{version_bytes[name][0] / 1e6:.1f} MB, {version_bytes[name][1] / 1e6:.1f} MB of it '
          'written anew')
    print(f'as the program runs it ({name}, resident): default (a checkpoint every round) '
          f'{default:.3f} s/round, {default / med["plain_tf"]:.2f}x plain_tf (resident round '
          f'{med[name + "@resident"] / med["plain_tf"]:.2f}x, through process.next '
          f'{med[name] / med["plain_tf"]:.2f}x); --checkpoint_every={n}: {program:.3f} s/round, '
          f'{program / med["plain_tf"]:.2f}x plain_tf')
    (ru, rs), (du, ds) = cpu_med[name + '@resident'], cpu_med[name + '@program']
    added_cpu = (du + ds) - (ru + rs)
    figures['variants'][name + '@resident']['checkpoint_cpu_s'] = added_cpu
    plain_cpu = sum(cpu_med['plain_tf'])   # (0 when a round is shorter than the clock's tick)
    share = (f' ({added_cpu / plain_cpu:+.1%} of the plain-TF round\'s CPU)' if plain_cpu > 0
             else '')
    print(f'CPU per round ({name}, the machine\'s, user + system): resident {ru:.2f} + '
          f'{rs:.2f} s, default (a checkpoint every round) {du:.2f} + {ds:.2f} s: the '
          f'checkpoints add {added_cpu:+.2f} s{share}')
  loop.close()
  if _JSON.value:
    generated_files.write_json(_JSON.value, figures)
  print(f'total wall time {time.perf_counter() - t_start:.0f} s')


if __name__ == '__main__':
  flag_parsing.run(main)
