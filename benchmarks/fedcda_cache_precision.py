"""FedCDA's cache in float16 / bfloat16 against float32: memory, selection and accuracy.

    .venv/bin/python -m benchmarks.fedcda_cache_precision            # the recorded run
    .venv/bin/python -m benchmarks.fedcda_cache_precision --rounds=4 --warmup_rounds=1 \
        --dataset=digits --model=tiny_cnn --num_clients=8 --clients_per_round=4

One process, the same clients and batches every round for each cache dtype:

* **Selection on the same history.** After every post-warmup round of the float32 run, its
  round is replayed eagerly (`cache_selection.cache_round`) on the same state and uploads
  with the cache rounded to each lower precision; the share of uploaders that select the
  same cached model as float32 is the selection agreement, and the eq. 8 objective is
  compared too. This isolates the effect of rounding from the divergence of two trajectories.
* **Accuracy.** Each dtype also runs as its own FedCDA process from the same initial model
  (`build_fedcda(cache_dtype=...)`), with central test accuracy every `--eval_every` rounds.
* **Memory.** The aggregator state's bytes, measured on the state, and the formula.

Prints a Markdown block for benchmarks/results/RESULTS.md and writes it with the per-round figures to
`--output` (JSON).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

from absl import flags

from programs import flag_parsing  # pylint: disable=g-import-not-at-top
from tff_algos import constants


flags.DEFINE_string('dataset', 'fashion_mnist', 'dataset (data.load_dataset)')
flags.DEFINE_string('model', 'simple_cnn', 'model (tff_algos.models.zoo)')
flags.DEFINE_integer('num_clients', 20, 'N')
flags.DEFINE_integer('clients_per_round', 4, 'P')
flags.DEFINE_float('dirichlet_alpha', 0.1, 'Dirichlet partition concentration')
flags.DEFINE_integer('rounds', 40, 'rounds per run')
flags.DEFINE_integer('warmup_rounds', 10, 'FedCDA warmup rounds')
flags.DEFINE_integer('local_epochs', 2, 'local epochs')
flags.DEFINE_integer('batch_size', 64, 'client batch size')
flags.DEFINE_float('client_lr', 0.01, 'client SGD learning rate')
flags.DEFINE_float('client_momentum', 0.5, 'client SGD momentum')
flags.DEFINE_integer('eval_every', 2, 'central evaluation every this many rounds')
flags.DEFINE_list('dtypes', ['float16', 'bfloat16'], 'lower-precision cache dtypes to compare')
flags.DEFINE_integer('seed', 0, 'partition, sampling and model seed')
flags.DEFINE_string('output', 'benchmarks/results/logs/fedcda_cache_precision.json', 'JSON output')
FLAGS = flags.FLAGS


def _replayed_round(prev, new, slots_clients, dtype, options):
  """Replays the float32 round (prev → new aggregator state) with the cache in `dtype`.

  The uploads are read back from `new` (each uploader's newest cache entry); returns
  (selected ring slot per uploader, objective_after) of the replay and of float32.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cache_selection  # pylint: disable=g-import-not-at-top
  k = options['cache_size']
  count = np.asarray(new['count'])
  ring = (count[slots_clients] - 1) % k
  models = tf.nest.map_structure(lambda c: c[slots_clients, ring],
                                 cache_selection.stacked_cache(new['cache'], new['selected_sum']))
  p = len(slots_clients)
  acc = collections.OrderedDict(
      models=models, client_index=np.asarray(slots_clients, np.int32),
      loss=np.asarray(new['losses'])[slots_clients, ring].astype(np.float32),
      valid=np.ones([p], np.float32), weight=np.ones([p], np.float32))
  low = tf.as_dtype(dtype)
  cache = tf.nest.map_structure(
      lambda c: np.asarray(tf.cast(c, low)),
      cache_selection.stacked_cache(prev['cache'], prev['selected_sum']))
  # ‖w‖² of the models as the low-precision cache holds them.
  sq = sum(np.sum(np.square(np.asarray(tf.cast(c, tf.float64)).reshape(
      c.shape[0], c.shape[1], -1)), axis=2) for c in tf.nest.flatten(cache))
  state = collections.OrderedDict(
      cache=cache_selection.chunked_cache(cache, len(prev['cache'][0])),
      losses=prev['losses'], sq_norms=tf.constant(sq, tf.float64),
      count=prev['count'], selected=prev['selected'],
      selected_sum=cache_selection.selected_sum_from_cache(cache, prev['count'],
                                                             prev['selected']),
      round_num=prev['round_num'])
  replay, _, m = cache_selection.cache_round(state, acc, **options)
  return (np.asarray(replay['selected'])[slots_clients],
          np.asarray(new['selected'])[slots_clients], float(m['objective_after']))


def main(argv):
  del argv
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from tff_algos import evaluation, execution, models  # pylint: disable=g-import-not-at-top
  from tff_algos.aggregators import cache_selection  # pylint: disable=g-import-not-at-top
  from tff_algos.fedcda import build_fedcda  # pylint: disable=g-import-not-at-top

  for dtype in FLAGS.dtypes:
    if dtype not in constants.FEDCDA_CACHE_DTYPES or dtype == 'float32':
      sys.exit(f'error: --dtypes takes lower-precision dtypes of '
               f'{tuple(constants.FEDCDA_CACHE_DTYPES)} other than float32, got {dtype!r}')
  execution.initialize_runtime()
  fed = data.federate(data.load_dataset(FLAGS.dataset),
                      data.DirichletPartitioner(FLAGS.num_clients, FLAGS.dirichlet_alpha,
                                                seed=FLAGS.seed))
  x0, _ = fed.client_arrays(0)
  model_fn = models.make_model_fn(FLAGS.model, tuple(x0.shape[1:]), fed.num_classes,
                                  seed=FLAGS.seed)
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=FLAGS.client_lr,
                                                 momentum=FLAGS.client_momentum or None)
  kwargs = dict(cache_size=3, num_batches=3, warmup_rounds=FLAGS.warmup_rounds,
                seed=FLAGS.seed)
  dtypes = ['float32', *FLAGS.dtypes]
  processes = {d: build_fedcda(model_fn, optimizer, FLAGS.batch_size, fed.num_clients,
                               FLAGS.clients_per_round, cache_dtype=d, **kwargs)
               for d in dtypes}
  evaluate = evaluation.build_central_evaluation(model_fn)
  states = {d: p.initialize() for d, p in processes.items()}
  memory = {d: int(sum(np.asarray(t).nbytes for t in tf.nest.flatten(states[d].aggregator)))
            for d in dtypes}
  options = dict(num_clients=fed.num_clients, clients_per_round=FLAGS.clients_per_round,
                 cache_size=3, num_batches=3, warmup_rounds=FLAGS.warmup_rounds,
                 smoothness=1.0, selection='batch_greedy', seed=FLAGS.seed)
  rows, agreement = [], {d: [] for d in FLAGS.dtypes}
  start = time.time()
  for round_num in range(FLAGS.rounds):
    ids, inputs = data.round_inputs(fed, round_num, FLAGS.clients_per_round,
                                    FLAGS.local_epochs, FLAGS.seed)
    slots_clients = np.asarray(ids, np.int32)
    row = collections.OrderedDict(round=round_num + 1)
    prev = states['float32'].aggregator
    for d in dtypes:
      with execution.collector_paused():  # one-element sequences, as the program passes
        out = processes[d].next(states[d], [[element] for element in inputs])
      states[d] = out.state
      agg = out.metrics['aggregator']
      row[f'{d}/switched'] = float(agg['switched'])
      row[f'{d}/objective_after'] = float(agg['objective_after'])
      if (round_num + 1) % FLAGS.eval_every == 0 or round_num + 1 == FLAGS.rounds:
        result = evaluate(processes[d].get_model_weights(states[d]), fed.x_test, fed.y_test)
        row[f'{d}/accuracy'] = float(result['accuracy'])
    if round_num >= FLAGS.warmup_rounds:
      new = states['float32'].aggregator
      for d in FLAGS.dtypes:
        replay, f32, objective = _replayed_round(prev, new, slots_clients, d, options)
        agreement[d].append(float(np.mean(replay == f32)))
        row[f'replay_{d}/same_selection'] = agreement[d][-1]
        row[f'replay_{d}/objective_after'] = objective
    rows.append(row)
    print(json.dumps(row), flush=True)

  def last_mean(d, n=10):
    values = [r[f'{d}/accuracy'] for r in rows if f'{d}/accuracy' in r][-max(1, n // FLAGS.eval_every):]
    return float(np.mean(values))

  summary = collections.OrderedDict(
      command='python -m benchmarks.fedcda_cache_precision ' + ' '.join(
          f'--{k}={getattr(FLAGS, k)}' for k in ('dataset', 'model', 'num_clients',
                                                 'clients_per_round', 'rounds', 'warmup_rounds')),
      seconds=round(time.time() - start, 1),
      aggregator_state_bytes=memory,
      last10_accuracy={d: last_mean(d) for d in dtypes},
      switched_total={d: sum(r[f'{d}/switched'] for r in rows) for d in dtypes},
      replay_same_selection={d: float(np.mean(a)) if a else None for d, a in agreement.items()},
      rows=rows)
  os.makedirs(os.path.dirname(FLAGS.output) or '.', exist_ok=True)
  with open(FLAGS.output, 'w') as f:
    json.dump(summary, f, indent=1)
  print(f'\n{summary["command"]}\n')
  print('| cache dtype | aggregator state | last-10-round accuracy | uploaders switching to an '
        'older model (all rounds) | same selection as float32 on the same history |')
  print('|---|---|---|---|---|')
  for d in dtypes:
    same = summary['replay_same_selection'].get(d)
    print(f'| {d} | {memory[d] / 2**20:.1f} MiB | {100 * summary["last10_accuracy"][d]:.2f}% | '
          f'{summary["switched_total"][d]:.0f} | '
          f'{"—" if same is None else f"{100 * same:.1f}%"} |')


if __name__ == '__main__':
  flag_parsing.run(main)
