"""How far FedProx's proximal term moves a round's update away from FedAvg's, measured.

  python -m benchmarks.fedprox_pull   # writes benchmarks/results/fedprox_pull.md and .json (~10 min)

FedProx adds (μ/2)·||w − w_t||² to each client's loss: every local step pulls the client's
weights back towards the round's global model w_t by η·μ·(w − w_t). How much that changes a
round depends on μ, the learning rate and the number of local steps, so it is measured here
in each suite that compares FedProx with FedAvg, at that suite's settings (the committed seed-0
runs' config.json, tuned rates included): from the same global model, one round of FedAvg and
one of FedProx with the same sampled clients and batch orders (the program's own round inputs
and processes), and the relative difference of their global-model updates
||Δ_FedProx − Δ_FedAvg|| / ||Δ_FedAvg||, beside the same for FedAvg made again with other
batch orders (how much a round changes anyway). The global model is FedAvg's at round 1 and
after FedAvg's first rounds (the global models the two runs share before their trajectories
part).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from benchmarks import suite_runs
from benchmarks import suites
from programs import generated_files

OUT = os.path.join(suites.RESULTS, 'fedprox_pull.md')
OUT_JSON = os.path.join(suites.RESULTS, 'fedprox_pull.json')   # the measurements the page shows
MEASURED_ROUNDS = (1, 11, 21)   # FedAvg's global model after 0, 10 and 20 of its rounds
RESHUFFLE_SEED = 1000   # added to the run's seed for the yardstick's batch orders
# (suite, FedProx run, FedAvg run): every comparison of FedProx with FedAvg in the suites.
PAIRS = tuple((s.name, c.method, c.baseline) for s in suites.SUITES.values()
              for c in s.comparisons if c.method.startswith('fedprox')
              and c.baseline.startswith('fedavg'))


def relative_difference(update, reference) -> float:
  """||update − reference|| / ||reference|| over all the tensors (lists of arrays)."""
  diff = sum(float(np.sum((np.asarray(u, np.float64) - np.asarray(r, np.float64)) ** 2))
             for u, r in zip(update, reference))
  norm = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in reference)
  return float(np.sqrt(diff / norm))


def local_steps(sizes, batch_size: int, epochs: int) -> float:
  """Mean local steps per client of a round (the last batch of an epoch may be smaller)."""
  return float(np.mean([epochs * -(-int(n) // batch_size) for n in sizes]))


def _config(suite: str, run: str):
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  path = os.path.join(suites.suite_dir(suite), 'runs', f'{run}_s0', 'config.json')
  with open(path) as f:
    return experiment_config.recorded_config(json.load(f))


def measure(suite: str, prox_run: str, avg_run: str) -> dict:
  """The relative differences at MEASURED_ROUNDS and the settings they depend on."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from programs import computations  # pylint: disable=g-import-not-at-top
  from programs import experiment  # pylint: disable=g-import-not-at-top
  from programs import experiment_config  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  avg_c, prox_c = _config(suite, avg_run), _config(suite, prox_run)
  # Only the algorithm and μ may differ: the measurement is of the proximal term alone.
  differing = {k for k, v in dataclasses.asdict(avg_c).items()
               if getattr(prox_c, k) != v} - {'algorithm', 'proximal_strength',
                                               *experiment_config.RESUMABLE_CHANGES}
  if differing:
    raise ValueError(f'{suite}: {prox_run} and {avg_run} differ in {sorted(differing)}')
  execution.initialize_runtime()
  fed = experiment.load_federated_data(avg_c)
  num_clients = min(avg_c.num_clients, fed.num_clients)
  processes = {}
  for c in (avg_c, prox_c):
    _, _, processes[c.algorithm], _ = computations.build_computations(c, fed, num_clients)
  avg, prox = processes['fedavg'], processes['fedprox']
  avg_state, prox_state = avg.initialize(), prox.initialize()
  rows = []
  for round_num in range(1, max(MEASURED_ROUNDS) + 1):
    sampled = data.sample_clients(num_clients, avg_c.clients_per_round, round_num, avg_c.seed)
    _, inputs = data.round_inputs(fed, round_num, avg_c.clients_per_round, avg_c.local_epochs,
                                  avg_c.seed, client_ids=sampled)
    inputs = [[element] for element in inputs]
    start = avg.get_model_weights(avg_state)
    next_avg, _ = avg.next(avg_state, inputs)
    if round_num in MEASURED_ROUNDS:
      prox_state = prox.set_model_weights(prox_state, start)
      next_prox, _ = prox.next(prox_state, inputs)
      # The yardstick: FedAvg from the same model and clients, other batch orders.
      _, reshuffled = data.round_inputs(fed, round_num, avg_c.clients_per_round,
                                        avg_c.local_epochs, avg_c.seed + RESHUFFLE_SEED,
                                        client_ids=sampled)
      next_reshuffled, _ = avg.next(avg_state, [[element] for element in reshuffled])
      w0 = [np.asarray(w) for w in start.trainable]
      delta = lambda s, p: [np.asarray(a) - b  # noqa: E731
                            for a, b in zip(p.get_model_weights(s).trainable, w0)]
      avg_delta = delta(next_avg, avg)
      rows.append(dict(
          round=round_num,
          relative_difference=relative_difference(delta(next_prox, prox), avg_delta),
          reshuffled=relative_difference(delta(next_reshuffled, avg), avg_delta),
          steps=local_steps([len(fed.client_arrays(int(i))[1]) for i in sampled],
                            avg_c.batch_size, avg_c.local_epochs)))
    avg_state = next_avg
  return dict(suite=suite, prox_run=prox_run, avg_run=avg_run, mu=prox_c.proximal_strength,
              lr=avg_c.client_lr, momentum=avg_c.client_momentum, batch_size=avg_c.batch_size,
              local_epochs=avg_c.local_epochs, rows=rows)


def page(results: list) -> str:
  lines = suite_runs.diagnosis_header('FedProx against FedAvg: how far the proximal term moves '
                                  'a round', sys.modules[__name__])
  measured = [r['round'] for r in results[0]['rows']] if results else []   # as recorded
  lines += ['| suite | runs | μ | client lr (momentum) | local steps per client | '
            + ' | '.join(f'round {r}: FedProx (other batch orders)' for r in measured)
            + ' |', '|---|---|---|---|---|' + '---|' * len(measured)]
  for m in results:
    steps = np.mean([r['steps'] for r in m['rows']])
    cells = ' | '.join(f'{100 * r["relative_difference"]:.1f}% ({100 * r["reshuffled"]:.1f}%)'
                       for r in m['rows'])
    lines.append(f'| {m["suite"]} | `{m["prox_run"]}` vs `{m["avg_run"]}` | {m["mu"]:g} | '
                 f'{m["lr"]:g} ({m["momentum"]:g}) | {steps:.1f} | {cells} |')
  ratios = {f'{m["suite"]} `{m["prox_run"]}`': [r['reshuffled'] / r['relative_difference']
                                                 for r in m['rows']] for m in results}
  lines += ['', 'Other batch orders change a round more than FedProx\'s term does: ' + ', '.join(
      f'{min(v):.0f} to {max(v):.0f} times as much ({k})' for k, v in ratios.items()) + '.']
  lines += ['', 'Each cell: ||Δ_FedProx − Δ_FedAvg|| / ||Δ_FedAvg||, the two global-model '
            'updates of one round from the same global model (FedAvg\'s at that round of its '
            'seed-0 run), clients and batch orders; in brackets the yardstick, the same for '
            'FedAvg run again with other batch orders (seed + '
            f'{RESHUFFLE_SEED}): how much a round changes anyway. The rounds are deterministic '
            '(the same round made twice differs by 0).']
  return '\n'.join(lines).rstrip('\n') + '\n'


def main() -> int:
  results = [measure(*pair) for pair in PAIRS]
  generated_files.write_text(OUT_JSON, json.dumps(results, indent=1) + '\n')
  return suite_runs.write_diagnosis(OUT, lambda: page(results))


if __name__ == '__main__':
  sys.exit(main())
