"""The memory of TFF's worker over rounds with the server state resident in it.

A value TFF 0.87's C++ worker computes keeps the values it was computed from alive, so a
state kept in the worker (`tff_algos.ResidentProcess`) would carry every earlier round with
it; `ResidentProcess.next` detaches each new state, and `refresh_every` places it anew every
so many rounds besides (0 = never, the default). This runs
FedCDA at the reproduction's Dir 0.1 setting (20 clients, 4 per round; its cache's size: benchmarks/results/RESULTS.md)
through ResidentProcess for each `--refresh_every` (or through `process.next`: "direct"),
each in its own process (a fresh worker), evaluating and checkpoint-materializing every
round as the training program does, and prints the worker's resident memory (RSS) after
each round. Memory, not time: other work on the machine does not change it.

  .venv/bin/python -m benchmarks.worker_memory --rounds=30 --refresh_every=0,10
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


from absl import flags

from programs import flag_parsing  # pylint: disable=g-import-not-at-top

_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Rounds per variant.', lower_bound=1)
_REFRESH = flags.DEFINE_list('refresh_every', ['0', '10'],
                             'ResidentProcess refresh periods to compare (0 = never; '
                             '"direct" = no resident state: process.next every round).')
_VARIANT = flags.DEFINE_string('variant', '', 'Internal: run one variant, print JSON.')


def _worker_rss_gb(execution) -> float:
  total = 0
  for pid in execution.worker_pids():
    with open(f'/proc/{pid}/status') as f:
      total += sum(int(line.split()[1]) for line in f if line.startswith('VmRSS'))
  return total / 1e6


def _one_variant(variant: str, rounds: int) -> list:
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  from programs import computations  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  from tff_algos.runtime import resident_state  # pylint: disable=g-import-not-at-top
  execution.initialize_runtime()
  c = experiment_config.ExperimentConfig(
      algorithm='fedcda', dataset='fashion_mnist', model='simple_cnn', partition='dirichlet',
      dirichlet_alpha=0.1, num_clients=20, clients_per_round=4, batch_size=50,
      local_epochs=1, fedcda_warmup_rounds=2, progress=False)
  fed = experiment.load_federated_data(c)
  _, _, process, evaluator = computations.build_computations(c, fed, c.num_clients)
  runner = (resident_state.DirectProcess(process) if variant == 'direct' else
            resident_state.ResidentProcess(process, c.clients_per_round,
                                           refresh_every=int(variant)))
  held = runner.adopt(process.initialize())
  rss = []
  for r in range(1, rounds + 1):
    sampled = data.sample_clients(c.num_clients, c.clients_per_round, r, c.seed)
    _, inputs = data.round_inputs(fed, r, c.clients_per_round, c.local_epochs, c.seed,
                                  client_ids=sampled)
    with execution.collector_paused():
      held, _ = runner.next(held, [[x] for x in inputs])
      evaluator(runner.get_model_weights(held))
      runner.materialize(held)   # the program's checkpoint
    rss.append(_worker_rss_gb(execution))
  return rss


def main(argv):
  del argv
  if _VARIANT.value:
    print(json.dumps(_one_variant(_VARIANT.value, _ROUNDS.value)))
    return
  results = {}
  for text in _REFRESH.value:
    out = subprocess.run([sys.executable, '-m', 'benchmarks.worker_memory',
                          f'--variant={text}', f'--rounds={_ROUNDS.value}'],
                         capture_output=True, text=True, check=True)
    results[text] = json.loads(out.stdout.strip().splitlines()[-1])
  marks = sorted(m for m in {1, 5} | set(range(10, _ROUNDS.value + 1, 10)) | {_ROUNDS.value}
                 if m <= _ROUNDS.value)   # rounds 1, 5, every 10th and the last made
  print('| refresh_every | ' + ' | '.join(f'round {m}' for m in marks) +
        ' | growth over the last half (GB/round) |')
  print('|---|' + '---|' * len(marks) + '---|')
  for refresh, rss in results.items():
    half = len(rss) // 2
    slope = (rss[-1] - rss[half - 1]) / (len(rss) - half) if half else float('nan')
    cells = ' | '.join(f'{rss[m - 1]:.2f} GB' for m in marks)
    print(f'| {"never" if refresh == "0" else refresh} | {cells}' +
          f' | {slope:+.3f} |')


if __name__ == '__main__':
  flag_parsing.run(main)
