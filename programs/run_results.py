"""What a run reports: metrics.csv's row of a round (its flattened metrics and client-work
costs), and at the end summary.json (with its time to accuracy), accuracy.png and
final_weights.npz."""

from __future__ import annotations

import collections
import json
import os
import platform
from typing import Optional

import numpy as np

from programs.experiment_config import ExperimentConfig
from programs.run_directory import write_json
from tff_algos.constants import CLIENT_ACCURACY_FIGURES  # no TensorFlow: flags come first

# metrics.csv's running totals of the bytes sent to and from the clients (payload + overhead),
# absent from runs made before they were counted; summary.json's totals of FedLEx's exploration.
CUMULATIVE_BYTES_COLUMNS = ('cumulative_bytes_down', 'cumulative_bytes_up')
EXPLORATION_BYTES = ('exploration_bytes_down', 'exploration_bytes_up')


def flatten_metrics(metrics, prefix='') -> dict:
  """A round's (nested) metrics as metrics.csv's columns 'a/b/c'."""
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, collections.abc.Mapping):
      flat.update(flatten_metrics(value, name + '/'))
    else:
      arr = np.asarray(value)
      if arr.ndim == 0:
        flat[name] = arr.item()
      elif 0 < arr.size <= 400:  # small arrays (e.g. FedCross similarity, collaborators) as JSON
        flat[name] = json.dumps(np.round(arr, 6).tolist())
  return flat


def is_cost_column(key: str, name: str) -> bool:
  """Whether metrics.csv column `key` holds the client-work cost metric `name`."""
  return key.startswith('client_work/') and key.split('/')[-1] == name


def round_costs(rows: list[dict], name: str) -> int:
  """The sum over rounds of the client-work cost metric `name` (client_work/.../name)."""
  return int(round(sum(float(value) for row in rows for key, value in row.items()
                   if is_cost_column(key, name) and value not in (None, ''))))


def _blank(value) -> bool:
  return value is None or value == ''


def first_round_reaching(points, target: float) -> Optional[int]:
  """The first round of `points` ((round, test accuracy), in round order) whose accuracy is at
  least `target`; None if none is."""
  return next((int(r) for r, a in points if float(a) >= target), None)


def evaluated_points(rows: list[dict]) -> list:
  """(round, test accuracy) of the rounds of metrics.csv's `rows` that were evaluated."""
  return [(int(r['round']), float(r['test_accuracy'])) for r in rows
          if not _blank(r.get('test_accuracy'))]


def cumulative_bytes(row: dict) -> Optional[float]:
  """The bytes sent down and up to the end of `row`'s round (None where the row does not
  count them)."""
  values = [row.get(k) for k in CUMULATIVE_BYTES_COLUMNS]
  return None if any(_blank(v) for v in values) else sum(float(v) for v in values)


def time_to_accuracy(rows: list[dict], targets, exploration_bytes: float = 0.0) -> list:
  """summary.json's time_to_accuracy: per target, the first evaluated round whose central test
  accuracy reaches it; the bytes down and up to the end of that round plus
  `exploration_bytes` (FedLEx's exploration before round 1 and, with --fedlex_refresh, its
  refreshes, all counted from round 1; None where the rows do not count bytes); and the
  training seconds of the rounds up to it (metrics.csv's `seconds`: training and FedLEx's
  refreshes, not evaluation). Round, bytes and seconds are None where it is never reached."""
  points = evaluated_points(rows)
  by_round = {int(r['round']): r for r in rows}
  out = []
  for target in targets:
    reached = first_round_reaching(points, target)
    entry = dict(target=float(target), round=reached, bytes=None, seconds=None)
    if reached is not None:
      sent = cumulative_bytes(by_round[reached])
      entry['bytes'] = None if sent is None else sent + float(exploration_bytes)
      entry['seconds'] = round(sum(float(r['seconds']) for r in rows
                                   if int(r['round']) <= reached), 4)
    out.append(entry)
  return out


def exploration_bytes(summary: dict) -> float:
  """FedLEx's exploration bytes, down and up, in a run's summary (0 where it has none)."""
  return sum(float(summary.get(k) or 0) for k in EXPLORATION_BYTES)


# metrics.csv's bytes columns of a round (docs/training_program.md, "Bytes on the wire").
ROUND_BYTES = ('bytes_down_payload', 'bytes_down_overhead', 'bytes_up_payload',
               'bytes_up_overhead')
def reported_clients(metrics: dict, sampled: int) -> int:
  """The round's clients that uploaded: its client work's `reported_clients` train metric,
  or every sampled client when the client work has none."""
  for key, value in metrics.items():
    if is_cost_column(key, 'reported_clients'):
      return int(round(float(value)))
  return sampled


def bytes_columns(traffic, sampled: int, metrics: dict, previous: Optional[dict]) -> dict:
  """A round's bytes columns: `traffic` (`communication.ClientTraffic`) for `sampled`
  downloading clients and the reporting ones uploading, with running totals from
  `previous` (the row before, None for round 1)."""
  row = traffic.round_bytes(sampled, reported_clients(metrics, sampled))
  for total, direction in zip(CUMULATIVE_BYTES_COLUMNS, ('down', 'up')):
    before = int(float(previous[total])) if previous and previous.get(total) else 0
    row[total] = before + row[f'bytes_{direction}_payload'] + row[f'bytes_{direction}_overhead']
  return row


def bytes_summary(rows: list[dict], traffic) -> dict:
  """summary.json's bytes entries: the run's totals per column and one client's bytes per
  round (`traffic`, a `communication.ClientTraffic`)."""
  def total(key):
    return int(sum(float(r[key]) for r in rows if r.get(key) not in (None, '')))

  summary = collections.OrderedDict((key, total(key)) for key in ROUND_BYTES)
  summary['cumulative_bytes_down'] = summary['bytes_down_payload'] + summary['bytes_down_overhead']
  summary['cumulative_bytes_up'] = summary['bytes_up_payload'] + summary['bytes_up_overhead']
  summary['bytes_per_client_round'] = collections.OrderedDict(
      down_payload=traffic.down_payload, down_overhead=traffic.down_overhead,
      up_payload=traffic.up_payload, up_overhead=traffic.up_overhead)
  return summary


def run_summary(config: ExperimentConfig, rows: list[dict], model_name: str, state,
                exploration_client_epochs: float, client_test, exp_dir: str):
  """summary.json's general entries of a finished run (`rows`: its metrics.csv; `state`: its
  final server state; `client_test`: the clients' test data, None without per-client
  evaluation); the method's own entries come from `registry.Method.summary` (programs/methods/)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_algos import execution  # pylint: disable=g-import-not-at-top
  accuracies = [float(r['test_accuracy']) for r in rows if r.get('test_accuracy') not in (None, '')]
  seconds = [float(r['seconds']) for r in rows[1:]] or [float(r['seconds']) for r in rows]
  summary = collections.OrderedDict(
      algorithm=config.algorithm, dataset=config.dataset, partition=config.partition, model=model_name,
      rounds=len(rows),
      final_accuracy=accuracies[-1] if accuracies else None,
      best_accuracy=max(accuracies) if accuracies else None,
      last10_mean_accuracy=float(np.mean(accuracies[-10:])) if accuracies else None,
      seconds_per_round=float(np.median(seconds)) if seconds else None,
      # Counted by the clients (their client_epochs / examples_trained metrics), not
      # rounds x clients x epochs: FedSGD takes no local epoch.
      client_epochs_training=round_costs(rows, 'client_epochs'),
      examples_trained=round_costs(rows, 'examples_trained'),
      exploration_client_epochs=exploration_client_epochs,
      dropped_clients=int(sum(int(float(r.get('dropped_clients') or 0)) for r in rows)),
      # Sampled clients that never reported (--client_dropout), over the run.
      unreported_clients=int(sum(int(float(r.get('unreported_clients') or 0)) for r in rows)),
      aggregator_state_bytes=int(sum(np.asarray(t).nbytes
                                     for t in tf.nest.flatten(state.aggregator))),
      # Measured inside the worker services, not this process's tf.config (docs/distributed.md, "Accelerators").
      compute_devices=execution.worker_devices(),
      # Where the program ran: seconds_per_round compares across runs only on one machine.
      host=host_description(),
      # As given (relative to where the program ran): committed run records hold no
      # machine-specific absolute paths.
      experiment_dir=exp_dir,
      accuracy_plot=os.path.join(exp_dir, 'accuracy.png'),
  )
  if client_test:   # the last evaluation's, as final_accuracy
    last = [r for r in rows if r.get('client_accuracy_mean') not in (None, '')]
    summary.update((k, float(last[-1][k]) if last else None) for k in CLIENT_ACCURACY_FIGURES)
    summary['clients_evaluated'] = sum(1 for _, y in client_test if len(y))
  return summary


def startup_seconds(seconds_before_rounds: float, session_rows: list[dict]) -> float:
  """summary.json's `startup_seconds`: what starting the run cost beside its rounds, in the
  process that finished it: the seconds before its first round (loading the data, building
  the computations, starting TFF's worker, restoring a checkpoint), plus its first round's
  whole seconds above the median of its later ones (the worker compiling the computations),
  when it made later ones. `session_rows`: metrics.csv's rows of the rounds it made."""
  whole = [float(r['round_seconds']) for r in session_rows
           if r.get('round_seconds') not in (None, '')]
  first_excess = max(0.0, whole[0] - float(np.median(whole[1:]))) if len(whole) > 1 else 0.0
  return round(seconds_before_rounds + first_excess, 3)


FINAL_WEIGHTS = 'final_weights.npz'


def weight_names(variable_model) -> list[str]:
  """The names final_weights.npz keys a model's weights by, in `ModelWeights` order
  (trainable, then non-trainable): each variable's name without its ':0' (a Keras model's
  'layer/kernel', unique in the model); a name that would repeat (a FunctionalModel's
  variables are all 'Variable') is numbered, 'Variable_1', ...."""
  names, seen = [], set()
  for v in (list(variable_model.trainable_variables)
            + list(variable_model.non_trainable_variables)):
    name = v.name.split(':')[0]
    base, n = name, 0
    while name in seen:
      n += 1
      name = f'{base}_{n}'
    seen.add(name)
    names.append(name)
  return names


def write_final_weights(exp_dir: str, model_fn, final_weights) -> None:
  """final_weights.npz: the global model's weights keyed by `weight_names` (the model built
  in a throwaway graph, whose layer names are a fresh process's), in `ModelWeights` order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    names = weight_names(model_fn())
  arrays = [np.asarray(w) for w in
            list(final_weights.trainable) + list(final_weights.non_trainable)]
  np.savez(os.path.join(exp_dir, FINAL_WEIGHTS), **dict(zip(names, arrays)))


def load_final_weights(exp_dir: str) -> list:
  """final_weights.npz's arrays in `ModelWeights` order (trainable, then non-trainable)."""
  with np.load(os.path.join(exp_dir, FINAL_WEIGHTS)) as f:
    return [f[k] for k in f.files]


def write_results(config: ExperimentConfig, exp_dir: str, rows: list[dict], summary: dict,
                  final_weights, model_fn) -> None:
  """Writes final_weights.npz, summary.json and accuracy.png into `exp_dir`."""
  write_final_weights(exp_dir, model_fn, final_weights)
  write_json(os.path.join(exp_dir, 'summary.json'), summary)
  plot_accuracy(rows, os.path.join(exp_dir, 'accuracy.png'),
                f'{config.algorithm} on {config.dataset} ({config.partition})', exploration_bytes(summary))


def host_description(cpuinfo: str = '/proc/cpuinfo') -> dict:
  """Where the program runs (the driver; remote workers' own devices are in
  `compute_devices`): {'cpu': the processor's model name, 'cores': the cores this process
  may use} and, where /proc/cpuinfo gives them, 'cpu_id' ('family F model M stepping S')
  and 'vector_extensions' (its AVX/AMX/FMA flags, sorted).

  The model name alone does not tell two machines apart whose float results differ: two
  "AMD EPYC" machines here made the same FedAvgM round 1 end at training losses 0.7370 and
  0.7030 (our reading: TensorFlow's CPU kernels choose their code path by the vector
  extensions); with these fields a run's record says which it ran on.
  """
  fields = {}
  try:
    with open(cpuinfo) as f:
      for line in f:   # the first value of each key: the first processor's
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  except OSError:   # not Linux
    pass
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:   # not Linux
    cores = os.cpu_count()
  host = {'cpu': fields.get('model name') or platform.processor() or platform.machine(),
          'cores': cores}
  if all(k in fields for k in ('cpu family', 'model', 'stepping')):
    host['cpu_id'] = 'family {} model {} stepping {}'.format(
        fields['cpu family'], fields['model'], fields['stepping'])
  if 'flags' in fields:
    host['vector_extensions'] = ' '.join(sorted(
        flag for flag in fields['flags'].split() if flag.startswith(('avx', 'amx', 'fma'))))
  return host


def plot_accuracy(rows: list[dict], path: str, title: str, explored_bytes: float = 0.0) -> None:
  """accuracy.png: test accuracy over rounds (central, and the clients' spread when evaluated)
  and, where metrics.csv counts bytes, the central test accuracy against the megabytes sent
  down and up so far (`explored_bytes`, FedLEx's exploration, counted before round 1)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  points = evaluated_points(rows)
  by_bytes = [((explored_bytes + cumulative_bytes(r)) / 1e6, float(r['test_accuracy']))
              for r in rows if not _blank(r.get('test_accuracy'))
              and cumulative_bytes(r) is not None]
  fig, axes = plt.subplots(1, 2 if by_bytes else 1, figsize=(11 if by_bytes else 6, 4),
                           squeeze=False)
  ax = axes[0][0]
  if points:
    ax.plot(*zip(*points), marker='.', label='central test set')
  spread = [(int(r['round']), *(float(r[k]) for k in CLIENT_ACCURACY_FIGURES))
            for r in rows if r.get('client_accuracy_mean') not in (None, '')]
  if spread:   # per-client evaluation: the mean over clients, the band down to p10, the min
    rounds, mean, _, p10, lowest = zip(*spread)
    ax.plot(rounds, mean, color='tab:orange', label='clients: mean')
    ax.fill_between(rounds, p10, mean, color='tab:orange', alpha=0.25,
                    label='clients: 10th percentile to mean')
    ax.plot(rounds, lowest, color='tab:orange', linestyle=':', label='clients: min')
    ax.legend(loc='lower right', fontsize='small')
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if by_bytes:
    ax = axes[0][1]
    ax.plot(*zip(*by_bytes), marker='.')
    ax.set_xlabel('bytes sent down and up so far (MB)')
    ax.set_ylabel('test accuracy')
    ax.set_title('accuracy against communication')
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path + '.tmp.png', dpi=100)
  plt.close(fig)
  os.replace(path + '.tmp.png', path)
