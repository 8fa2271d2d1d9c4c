"""How CADIS's and FedCDA's server side grows with the number of clients N.

For each N, builds the method as the training program does (P clients per round, indices
drawn from [0, N), the same small client data), then times, interleaved in one process:

  full   a round whose clients train one epoch;
  empty  a round whose clients train 0 epochs (same uploads, same server step): its time
         bounds the server step from above (it also holds dispatch and upload).

It also reports the aggregator state's size (it lives in the worker and travels back to
Python every round inside the process state) and the TFF worker's peak resident memory
(VmHWM of the worker_binary children, cumulative over the run, so read it per N in
increasing N).

With --server_step it times the method's server step alone instead. For FedCDA: the
aggregator's `cache_round` as one tf.function on a state whose N clients all hold full
caches (selection on, P random uploaders), with no TFF round around it, interleaved over the
Ns in one process, with each N's time as a ratio to the first N's. Beside it, the O(N·D)
mean over every cached client's selected model that the running `selected_sum` avoids,
timed the same way (a reference, not part of the step), and the update of one stacked
[N, K, ...] cache (`tensor_scatter_nd_update` of the P uploads, the unchunked alternative:
its input stays alive, so it writes a whole new cache). The step itself
runs on the chunked cache the process keeps (`cache_selection.push_and_read`): O(P·K·D)
arithmetic and copies, plus O(N·K) bookkeeping and one `tf.cond` per chunk.

  .venv/bin/python benchmarks/server_scale.py --method=cadis --num_clients=100,300,1000
  .venv/bin/python benchmarks/server_scale.py --method=fedcda --model=fedavg_cnn \
      --dataset=fashion_mnist --num_clients=10,25,50
  .venv/bin/python benchmarks/server_scale.py --method=fedcda --server_step \
      --num_clients=100,300,1000 --rounds=10

With --resident the rounds run through `tff_algos.ResidentProcess`, as the training program
runs them: the state stays in the worker, so a round does not move it (the round time
against N is then the server step's growth and nothing else):

  .venv/bin/python benchmarks/server_scale.py --method=fedcda --resident \
      --num_clients=100,300,1000 --rounds=5

For CADIS, --server_step times its server clustering step alone (its target: under a second
at N = 10,000): `clustering.clustering_step` as one `tf.function` in this process
(the same TF ops the worker runs, without TFF's dispatch), for each N and closure, all
(N, closure) pairs interleaved round by round in one process. Its input is a synthetic state
in which every client has been seen: 5 true clusters, co-participation for a fraction
(--pair_fraction) of the pairs, average similarity U(0.95, 1) within a cluster and
U(-0.2, 0.6) across; P uploads of 10-dim similarity vectors near their cluster's centre.

  .venv/bin/python benchmarks/server_scale.py --method=cadis --server_step \
      --num_clients=1000,3000,10000 --rounds=5
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags
from absl import logging

from programs import flag_parsing  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf  # before app.run parses flags (see round_overhead.py)

_METHOD = flags.DEFINE_enum('method', 'cadis', ['cadis', 'fedcda'],
                            'Method whose server side to scale.')
_NUM_CLIENTS = flags.DEFINE_list('num_clients', ['100', '300', '1000'], 'Values of N.')
_MODEL = flags.DEFINE_string('model', 'tiny_cnn', 'tff_algos.models zoo model.')
_DATASET = flags.DEFINE_enum('dataset', 'digits', ['fashion_mnist', 'digits'], 'Client data.')
_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'P.')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 50, 'Examples per client.')
_BATCH = flags.DEFINE_integer('batch_size', 25, 'Local batch size.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per variant.')
_CACHE = flags.DEFINE_integer('fedcda_cache_size', 3, 'FedCDA K.')
_MAX_GIB = flags.DEFINE_float('fedcda_max_cache_gib', 16.0, 'FedCDA refusal threshold.')
_RESIDENT = flags.DEFINE_bool(
    'resident', False, 'Run the rounds through tff_algos.ResidentProcess (the server state '
    'kept in the worker, as the training program does) instead of process.next.')
_SERVER_STEP = flags.DEFINE_bool(
    'server_step', False, 'Time the server step alone (module doc): CADIS\'s clustering_step '
    'per (N, closure); FedCDA\'s cache_round on full caches, with ratios to the first N.')
_CLOSURES = flags.DEFINE_list('closures', ['two_hop', 'components'],
                              'cadis --server_step: closures to time.')
_PAIR_FRACTION = flags.DEFINE_float(
    'pair_fraction', 0.5, 'cadis --server_step: fraction of client pairs seen together.')
_TRUE_CLUSTERS = flags.DEFINE_bool('with_true_clusters', False,
                                   'cadis --server_step: also compute the true-cluster metrics.')

# --method values that stop the script with the flags to use instead.
_REMOVED_METHODS = {'cadis_step': '--method=cadis --server_step'}


def synthetic_cadis_state(n: int, pair_fraction: float, true_clusters: np.ndarray):
  """(q, f) float32 [N, N] with every client seen (module doc), built in TF without float64
  N x N temporaries."""
  from tff_algos.aggregators import clustering  # pylint: disable=g-import-not-at-top

  @tf.function
  def make():
    tc = tf.constant(true_clusters, tf.int32)
    same = tf.equal(tc[:, None], tc[None, :])
    u = tf.random.stateless_uniform([n, n], [n, 1])
    avg = tf.where(same, 0.95 + 0.05 * u, -0.2 + 0.8 * u)
    avg = tf.linalg.band_part(avg, 0, -1)
    avg = avg + tf.transpose(avg)
    pairs = tf.cast(tf.random.stateless_uniform([n, n], [n, 2]) < pair_fraction, tf.float32)
    pairs = tf.linalg.band_part(pairs, 0, -1)
    f = tf.linalg.set_diag(pairs + tf.transpose(pairs), tf.ones([n]))
    q = tf.linalg.set_diag(f * avg, tf.ones([n]))
    return q, f

  q, f = make()
  assert bool(tf.reduce_all(clustering.seen_clients(f)))
  return q, f


def time_clustering_step():
  """--method=cadis --server_step: seconds of `clustering_step` per (N, closure), interleaved."""
  from tff_algos.aggregators import clustering  # pylint: disable=g-import-not-at-top
  per_round = _PER_ROUND.value
  sizes = [int(v) for v in _NUM_CLIENTS.value]
  print(f'setup: CADIS clustering_step alone (tf.function in this process), P={per_round} '
        f'uploads, every client seen, {_PAIR_FRACTION.value:.2f} of pairs seen together, '
        f'true-cluster metrics {"on" if _TRUE_CLUSTERS.value else "off"}, {_ROUNDS.value} '
        'timed calls per (N, closure) after 1 warm-up, interleaved', flush=True)
  print(f'load average at start: {os.getloadavg()[0]:.1f} (2 cores; shared machine)')
  cases = {}
  for n in sizes:
    rng = np.random.default_rng(n)
    truth = rng.integers(0, 5, n).astype(np.int32)
    q, f = synthetic_cadis_state(n, _PAIR_FRACTION.value, truth)
    ids = rng.choice(n, per_round, replace=False).astype(np.int32)
    centers = rng.normal(size=[5, 10])
    sim = (centers[truth[ids]] + 0.05 * rng.normal(size=[per_round, 10])).astype(np.float32)
    weights = rng.integers(10, 100, per_round).astype(np.float32)
    for closure in _CLOSURES.value:
      options = clustering.ClusteringOptions(closure=closure)
      tc = truth if (_TRUE_CLUSTERS.value or closure == 'oracle') else None

      def step(q, f, options=options, tc=tc, ids=ids, weights=weights, sim=sim):
        state = dict(q=q, f=f, tau=tf.constant(0.975), round_num=tf.constant(5))
        return clustering.clustering_step(state, ids, weights, sim, options, tc)

      cases[n, closure] = (tf.function(step), q, f)
  times = {key: [] for key in cases}
  cpu = {key: [] for key in cases}   # this process's CPU seconds (all its threads)
  results = {}
  keys = list(cases)
  for r in range(_ROUNDS.value + 1):
    for key in (keys if r % 2 == 0 else keys[::-1]):
      fn, q, f = cases[key]
      t0, c0 = time.perf_counter(), time.process_time()
      new_state, _, meas = fn(q, f)   # a tf.function call returns when all of it has run
      meas = {k: v.numpy() for k, v in meas.items()}
      if r:
        times[key].append(time.perf_counter() - t0)
        cpu[key].append(time.process_time() - c0)
      results[key] = meas
      del new_state
  print('| N | closure | state MB | step s (min / median) | CPU s (min) | '
        'cluster sizes of the uploads | num_clusters |')
  print('|---|---|---|---|---|---|---|')
  for (n, closure), ts in times.items():
    meas = results[n, closure]
    print(f'| {n} | {closure} | {2 * 4 * n * n / 2**20:.1f} | {min(ts):.3f} / '
          f'{statistics.median(ts):.3f} | {min(cpu[n, closure]):.3f} | '
          f'{" ".join(str(int(v)) for v in meas["cluster_sizes"])} | '
          f'{int(meas["num_clusters"])} |', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


def worker_peak_bytes() -> int:
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  peak = 0
  for pid in execution.worker_pids():
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          peak = max(peak, int(line.split()[1]) * 1024)
  return peak


def _full_caches(n, k, weights, rng):
  """A FedCDA aggregator state in which all n clients have uploaded 2K-ish times (random
  ring positions and selections) and its selected_sum, from random models like `weights`."""
  import collections  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cache_selection  # pylint: disable=g-import-not-at-top
  stacked = lambda t: (rng.normal(size=(n, k, *np.shape(t))) * 0.1).astype(np.float32)  # noqa: E731
  cache = tff.learning.models.ModelWeights(
      trainable=[stacked(t) for t in weights.trainable],
      non_trainable=[stacked(t) for t in weights.non_trainable])
  count = rng.integers(k, 3 * k, size=n).astype(np.int32)
  selected = rng.integers(0, k, size=n).astype(np.int32)
  sq_norms = sum(np.sum(np.square(c.reshape(n, k, -1).astype(np.float64)), axis=2)
                 for c in tf.nest.flatten(cache))
  return collections.OrderedDict(
      cache=cache, losses=rng.uniform(0.1, 2.0, size=(n, k)).astype(np.float32),
      sq_norms=sq_norms, count=count, selected=selected,
      selected_sum=cache_selection.selected_sum_from_cache(cache, count, selected),
      round_num=np.int32(1))


def _uploads(n, p, weights, rng):
  """A round's accumulator: P distinct random clients' random models."""
  import collections  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  model = lambda t: (rng.normal(size=(p, *np.shape(t))) * 0.1).astype(np.float32)  # noqa: E731
  return collections.OrderedDict(
      models=tff.learning.models.ModelWeights(
          trainable=[model(t) for t in weights.trainable],
          non_trainable=[model(t) for t in weights.non_trainable]),
      client_index=rng.choice(n, p, replace=False).astype(np.int32),
      loss=rng.uniform(0.1, 2.0, size=p).astype(np.float32),
      valid=np.ones([p], np.float32), weight=np.ones([p], np.float32))


def server_step_table(model_fn):
  """Prints FedCDA's server-step time per N (module doc, --server_step)."""
  import collections  # pylint: disable=g-import-not-at-top
  import functools  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cache_selection  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cross_round_cache  # pylint: disable=g-import-not-at-top
  from tff_algos.client_work import model_delta  # pylint: disable=g-import-not-at-top
  weights = model_delta.initial_model_weights_fn(model_fn)()
  d = cross_round_cache.num_weights(
      model_delta.initial_model_weights_fn(model_fn).type_signature.result)
  ns, p, k = [int(v) for v in _NUM_CLIENTS.value], _PER_ROUND.value, _CACHE.value
  rng = np.random.default_rng(0)
  cases = {}
  for n in ns:
    stacked = _full_caches(n, k, weights, rng)
    state = tf.nest.map_structure(tf.constant, collections.OrderedDict(
        stacked, cache=cache_selection.chunked_cache(
            stacked['cache'], cache_selection.chunk_clients(n, k, d))))
    stacked_cache = tf.nest.map_structure(tf.constant, stacked['cache'])
    step = tf.function(functools.partial(
        cache_selection.cache_round, num_clients=n, clients_per_round=p, cache_size=k,
        num_batches=min(3, p), warmup_rounds=0, smoothness=1.0, selection='batch_greedy',
        seed=0))
    rows = tf.stack([tf.range(n, dtype=tf.int32), state['selected']], axis=1)

    @tf.function
    def full_mean(cache, rows=rows):   # what every round computed before selected_sum
      return [tf.reduce_sum(tf.cast(tf.gather_nd(c, rows), tf.float64), axis=0) / len(rows)
              for c in tf.nest.flatten(cache)]

    acc = tf.nest.map_structure(tf.constant, _uploads(n, p, weights, rng))
    at = tf.stack([acc['client_index'], tf.zeros([p], tf.int32)], axis=1)

    @tf.function
    def cache_write(cache, models, at=at):   # a stacked cache's update (before chunks)
      return tf.nest.map_structure(lambda c, u: tf.tensor_scatter_nd_update(c, at, u),
                                   cache, models)

    cases[n] = dict(state=state, stacked=stacked_cache, acc=acc, step=step,
                    full_mean=full_mean,
                    cache_write=cache_write, times=[], mean=[], write=[])
  print(f'setup: FedCDA server step alone (cache_round as a tf.function), model '
        f'{_MODEL.value} (D={d}), P={p}, K={k}, B={min(3, p)}, batch_greedy, all N clients '
        f'cached; {_ROUNDS.value} timed calls per N after 1 untimed, Ns interleaved')
  print(f'load average at start: {os.getloadavg()[0]:.1f} (2 cores; shared machine)')
  for r in range(_ROUNDS.value + 1):
    for n in (ns if r % 2 else ns[::-1]):
      case = cases[n]
      t0 = time.perf_counter()
      _, result, _ = case['step'](case['state'], case['acc'])
      float(result['has_result'])
      t1 = time.perf_counter()
      float(case['full_mean'](case['stacked'])[0][0].numpy().flat[0])
      t2 = time.perf_counter()
      tf.nest.flatten(case['cache_write'](case['stacked'], case['acc']['models']))
      t3 = time.perf_counter()
      if r:
        case['times'].append(t1 - t0)
        case['mean'].append(t2 - t1)
        case['write'].append(t3 - t2)
  first = min(cases[ns[0]]['times'])
  print(f'| N | state MB | server step s (min / median) | step / step at N={ns[0]} (min) | '
        'a stacked cache\'s update s (min) | from-scratch mean s (min) |')
  print('|---|---|---|---|---|---|')
  for n in ns:
    case = cases[n]
    state_mb = sum(np.asarray(t).nbytes for t in tf.nest.flatten(case['state'])) / 2**20
    print(f'| {n} | {state_mb:.1f} | {min(case["times"]):.4f} / '
          f'{statistics.median(case["times"]):.4f} | {min(case["times"]) / first:.2f} | '
          f'{min(case["write"]):.4f} | {min(case["mean"]):.4f} |', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


def refuse_removed_method(argv):
  """A removed --method value stops the script with one error line naming what replaced
  it (before absl parses the flags)."""
  method = flags.FlagValues()
  flags.DEFINE_string('method', None, '', flag_values=method)
  method(argv, known_only=True)
  if method.method in _REMOVED_METHODS:
    sys.exit(f'error: --method={method.method} is now {_REMOVED_METHODS[method.method]}')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _SERVER_STEP.value and _METHOD.value == 'cadis':
    time_clustering_step()
    return
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from programs import computations  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top

  ds = data.load_fashion_mnist() if _DATASET.value == 'fashion_mnist' else data.load_digits()
  per_round, per_client = _PER_ROUND.value, _EXAMPLES.value
  xs = np.split(ds.x_train[:per_round * per_client], per_round)
  ys = np.split(ds.y_train[:per_round * per_client], per_round)
  model_fn = models.make_model_fn(_MODEL.value, ds.input_shape, ds.num_classes, seed=0)
  if _SERVER_STEP.value:
    server_step_table(model_fn)
    return
  print(f'setup: {_METHOD.value}, {ds.name}, model {_MODEL.value}, P={per_round} clients x '
        f'{per_client} examples per round, rounds through '
        f'{"ResidentProcess (state kept in the worker)" if _RESIDENT.value else "process.next"}, '
        f'batch {_BATCH.value}, {_ROUNDS.value} timed rounds per variant after 1 warm-up, full '
        'and empty rounds interleaved', flush=True)
  print(f'load average at start: {os.getloadavg()[0]:.1f} (2 cores; shared machine)')
  print('| N | state MB | full round s (min / median) | empty round s (min / median) | '
        'empty / full (min) | worker peak RSS MB |')
  print('|---|---|---|---|---|---|', flush=True)
  for n in [int(v) for v in _NUM_CLIENTS.value]:
    config = experiment_config.ExperimentConfig(
        algorithm=_METHOD.value, num_clients=n, clients_per_round=per_round,
        batch_size=_BATCH.value, client_lr=0.05, client_momentum=0.0,
        fedcda_warmup_rounds=0, fedcda_cache_size=_CACHE.value,
        fedcda_max_cache_gib=_MAX_GIB.value)
    try:
      process = computations.build_process(config, model_fn, n)
    except experiment_config.ExperimentError as e:
      print(f'| {n} | refused: {e} | | | | |', flush=True)
      continue
    runner = (resident_state.ResidentProcess(process, per_round, refresh_every=0)
              if _RESIDENT.value else resident_state.DirectProcess(process))
    states = dict(full=runner.initialize(), empty=runner.initialize())
    state_bytes = execution.value_bytes(
        process.initialize.type_signature.result.member.aggregator)
    times = dict(full=[], empty=[])
    for r in range(_ROUNDS.value + 1):
      ids = np.random.default_rng([n, r]).choice(n, per_round, replace=False)
      for variant in (('full', 'empty') if r % 2 else ('empty', 'full')):
        epochs = 1 if variant == 'full' else 0
        inputs = [[data.client_input(xs[s], ys[s], epochs, np.random.default_rng([r, s]),
                                     int(ids[s]), s)] for s in range(per_round)]
        t0 = time.perf_counter()
        with execution.collector_paused():
          states[variant] = runner.next(states[variant], inputs).state
        if r:
          times[variant].append(time.perf_counter() - t0)
      if r == 0:
        execution.freeze_long_lived_objects()
    full, empty = min(times['full']), min(times['empty'])  # min: least disturbed by load
    print(f'| {n} | {state_bytes / 2**20:.1f} | {full:.3f} / {statistics.median(times["full"]):.3f} | '
          f'{empty:.3f} / {statistics.median(times["empty"]):.3f} | {100 * empty / full:.0f}% | '
          f'{worker_peak_bytes() / 2**20:.0f} |', flush=True)
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  flag_parsing.run(main, check=refuse_removed_method)
