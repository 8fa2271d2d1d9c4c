"""The FedAvg rounds the timing benchmarks compare: the clients, a tight plain-TF loop, and our
resident process run as the training program runs it.

Shared by `round_overhead.py` and `client_training_vs_pytorch.py`; flag-free. TensorFlow is
imported here at module level: imported after absl has parsed the flags, Keras' Flatten fails
to build fedavg_cnn ("Attempt to convert a value (None)"), so a binary importing this module
imports TF before parsing.
"""

from __future__ import annotations

import collections
import hashlib
import time

import numpy as np
import tensorflow as tf

from programs import checkpoint_writer


def max_abs_difference(a, b) -> float:
  """The largest |a - b| over two structures of the same tensors (e.g. two models)."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


def client_split(ds, num_clients: int, per_client: int, seed: int) -> tuple:
  """(xs, ys): `num_clients` disjoint clients of `per_client` training examples of `ds`,
  picked by `seed`; ValueError when the data set holds fewer."""
  total = num_clients * per_client
  if total > ds.x_train.shape[0]:
    raise ValueError(f'{num_clients} x {per_client} examples > {ds.x_train.shape[0]} '
                     f'in {ds.name}')
  pick = np.random.default_rng(seed).permutation(ds.x_train.shape[0])[:total]
  return np.split(ds.x_train[pick], num_clients), np.split(ds.y_train[pick], num_clients)


def clients_sha256(xs, ys) -> str:
  """sha256 over the clients' examples and labels in order: which clients a run trained."""
  h = hashlib.sha256()
  for x, y in zip(xs, ys):
    h.update(np.ascontiguousarray(x).tobytes())
    h.update(np.ascontiguousarray(y).tobytes())
  return h.hexdigest()


def round_inputs(xs, ys, epochs: int, seed: int, round_num: int) -> list:
  """Each client's input of round `round_num` (`data.client_input`: its data and sample
  orders, drawn from (seed, round, client))."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  return [data.client_input(x, y, epochs, np.random.default_rng([seed, round_num, c, 1]), c, c)
          for c, (x, y) in enumerate(zip(xs, ys))]


class PlainTF:
  """A tight plain-TF FedAvg loop over a Keras model: one `tf.function` per client running
  all its local epochs of SGD over batches gathered beforehand ([steps, B, ...] tensors),
  then the example-weighted mean of the clients' deltas applied at server learning rate 1."""

  def __init__(self, keras_model: tf.keras.Model, lr: float, batch: int):
    self.keras_model = keras_model
    self.batch = batch
    variables = keras_model.trainable_variables
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lr = tf.constant(lr, tf.float32)

    @tf.function
    def client_epochs(global_weights, xb, yb):
      """All local epochs of one client over stacked batches xb [steps, B, ...]."""
      for v, w in zip(variables, global_weights):
        v.assign(w)
      loss_sum = tf.constant(0.0)
      correct = tf.constant(0.0)
      for i in tf.range(tf.shape(xb)[0]):
        x, y = xb[i], yb[i]
        with tf.GradientTape() as tape:
          logits = keras_model(x, training=True)
          loss = loss_fn(y, logits)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
          v.assign_sub(lr * g)
        count = tf.cast(tf.shape(y)[0], tf.float32)
        loss_sum += loss * count
        correct += tf.reduce_sum(tf.cast(
            tf.equal(tf.argmax(logits, -1, output_type=y.dtype), y), tf.float32))
      delta = [w - v for v, w in zip(variables, global_weights)]
      return delta, loss_sum, correct

    self.client_epochs = client_epochs

  def batches(self, inp) -> tuple:
    """A client input's batches in its sample order, stacked: (xb, yb) [steps, B, ...]."""
    steps = inp['order'].reshape(-1, self.batch)   # epochs x n / B full batches
    return tf.constant(inp['x'][steps]), tf.constant(inp['y'][steps])

  def round(self, weights: list, inputs: list) -> list:
    """The next global weights after a round of `inputs`' clients, as values (waited for)."""
    total_n = 0.0
    acc = [tf.zeros_like(w) for w in weights]
    for inp in inputs:
      delta, _, _ = self.client_epochs(weights, *self.batches(inp))
      n = float(inp['x'].shape[0])
      acc = [a + n * d for a, d in zip(acc, delta)]
      total_n += n
    new = [w - a / total_n for w, a in zip(weights, acc)]
    _ = [w.numpy() for w in new]   # wait for the values
    return new


def program_figures(round_num: int) -> collections.OrderedDict:
  """The program state's figures besides the server state, as programs/experiment.py's."""
  return collections.OrderedDict(round=round_num, best_accuracy=0.0,
                                 exploration_client_epochs=0.0)


class ProgramRun:
  """A `ResidentProcess` run as the training program runs it by default: each round, the last
  round's state checkpointed by the program's own call (`CheckpointWriter.checkpoint`: the
  worker starts writing the version's tensors), the next round (while the worker writes),
  then the wait for that write, as the program's next checkpoint does, and the version's
  completion (which the program's writer thread does during the round after: counted here
  in full, an upper bound, and no write overlaps another's timing).

  A run past its start: `KEEP_VERSIONS` versions are written first (each alone, timed in
  `first_writes`), so every later version also drops the oldest, as from a run's fourth
  checkpoint on."""

  def __init__(self, resident, ckpt_dir: str, scratch_dir: str):
    self.resident = resident
    self.state, initial = resident.initial_state()
    self.writer = checkpoint_writer.CheckpointWriter(ckpt_dir)
    self.writer.prepare(resident, checkpoint_writer.program_state(initial, program_figures(0)),
                        scratch_dir=scratch_dir)
    self.version = 0
    self.first_writes = []
    for _ in range(checkpoint_writer.KEEP_VERSIONS):
      t0 = time.perf_counter()
      self._checkpoint()
      self.writer.wait()
      self.first_writes.append(time.perf_counter() - t0)

  def _checkpoint(self):
    self.version += 1
    self.writer.checkpoint(self.resident, self.state, program_figures(self.version),
                           self.version)

  def round(self, inputs: list) -> tuple:
    """One round of `inputs`' clients as the program runs it: (seconds of the checkpoint
    call, seconds of the wait after the round)."""
    t0 = time.perf_counter()
    self._checkpoint()
    snapshot = time.perf_counter() - t0
    self.state = self.resident.next(self.state, [[inp] for inp in inputs]).state
    t1 = time.perf_counter()
    self.writer.wait()
    return snapshot, time.perf_counter() - t1

  def model_weights(self):
    return self.resident.get_model_weights(self.state)

  def close(self):
    self.writer.close()
