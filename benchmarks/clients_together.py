"""Clients trained together: K clients' local epochs in one TensorFlow computation over
stacked weights, checked against training each client alone (docs/clients_together.md).

  python -m benchmarks.clients_together   # one JSON line: the equality per model and
                                          # optimizer, and the ops pfor leaves in loops

A probe of the core, not a path of the library: it covers models that are a chain of
Conv2D, MaxPool2D, Flatten and Dense layers (`fedavg_cnn`, `simple_cnn`, `mlp_2nn`,
`tiny_cnn`), plain or momentum SGD, and no plug-in term. Each client keeps what it has
when trained alone: its own weights (row k of every stacked tensor), data, batch order,
number of examples, `work` share (a straggler stops after ceil(work x steps) steps, a client
of work 0 runs none) and optimizer state. Every step runs all K clients at once: client k's
batch is gathered from its own order and padded to the batch size, a mask keeps the padding
and the clients that have stopped out of the loss, and a client that has stopped keeps its
weights and optimizer state. The loss summed over clients has, for client k's weights, the
gradient of client k's own mean batch loss, so one tape gives every client's gradient.

No timing is taken here: what clients trained together cost needs idle cores.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos.client_work import local_training

# How a convolution runs over K clients' own filters: 'grouped', one convolution of K groups
# (client k's images in group k of the channels, its filter the group's); 'per_client', K
# convolutions in the one graph. TensorFlow 2.14's CPU kernels run a grouped convolution
# forward but refuse both its gradients, so training uses 'per_client'.
CONVS = ('grouped', 'per_client')
TRAINING_CONV = 'per_client'
# The model's compute ops, of which `pfor_loops` reports those pfor runs client by client.
MODEL_OPS = frozenset({
    'Conv2D', 'Conv2DBackpropInput', 'Conv2DBackpropFilter', 'MatMul', 'BatchMatMulV2',
    'MaxPool', 'MaxPoolGrad', 'Relu', 'ReluGrad', 'BiasAdd', 'BiasAddGrad',
    'SparseSoftmaxCrossEntropyWithLogits'})
_ACTIVATIONS = (tf.keras.activations.relu, tf.keras.activations.linear)


def _unsupported(layer) -> Optional[str]:
  """Why the stacked forward pass cannot run `layer`, or None."""
  kind = type(layer)
  if kind not in (tf.keras.layers.Conv2D, tf.keras.layers.MaxPool2D, tf.keras.layers.Flatten,
                  tf.keras.layers.Dense):
    return f'{kind.__name__} is not Conv2D, MaxPool2D, Flatten or Dense'
  if getattr(layer, 'data_format', 'channels_last') != 'channels_last':
    return 'only channels_last'
  if kind is tf.keras.layers.Conv2D and (tuple(layer.dilation_rate) != (1, 1)
                                         or layer.groups != 1):
    return 'a dilated or grouped Conv2D'
  if kind in (tf.keras.layers.Conv2D, tf.keras.layers.Dense) and (
      layer.activation not in _ACTIVATIONS):
    return 'an activation other than ReLU or none'
  return None


def layer_chain(keras_model: tf.keras.Model) -> list:
  """The model's layers in order: a chain from its one input of Conv2D, MaxPool2D, Flatten
  and Dense layers (ReLU or no activation, channels last); else one ValueError naming the
  first layer that is not."""
  if len(keras_model.inputs) != 1:
    raise ValueError(f'{keras_model.name}: the stacked forward pass takes one input')
  chain, previous = [], keras_model.inputs[0]
  for layer in keras_model.layers:
    if isinstance(layer, tf.keras.layers.InputLayer):
      continue
    problem = _unsupported(layer)
    if problem is None and layer.input is not previous:
      problem = 'its input is not the previous layer\'s output'
    if problem:
      raise ValueError(f'{keras_model.name}: layer {layer.name!r}: {problem}; the stacked '
                       'forward pass runs a chain of Conv2D, MaxPool2D, Flatten and Dense')
    chain.append(layer)
    previous = layer.output
  return chain


def _grouped_conv(h, kernel, strides, padding):
  """Client k's images h[k] [B, H, W, C] through its filter kernel[k] [kh, kw, C, O], as one
  convolution of K groups: channels k*C..(k+1)*C in, k*O..(k+1)*O out."""
  k, kh, kw, c, o = kernel.shape
  x = tf.reshape(tf.transpose(h, [1, 2, 3, 0, 4]), [-1, h.shape[2], h.shape[3], k * c])
  f = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]), [kh, kw, c, k * o])
  y = tf.nn.conv2d(x, f, strides, padding)
  y = tf.reshape(y, [-1, y.shape[1], y.shape[2], k, o])
  return tf.transpose(y, [3, 0, 1, 2, 4])


def _conv(h, kernel, layer, conv: str):
  strides, padding = tuple(layer.strides), layer.padding.upper()
  if conv == 'grouped':
    return _grouped_conv(h, kernel, strides, padding)
  return tf.stack([tf.nn.conv2d(h[i], kernel[i], strides, padding)
                   for i in range(kernel.shape[0])])


def _per_example(h, op):
  """op over h [K, B, ...] with the K clients' batches as one batch of K x B."""
  y = op(tf.reshape(h, [-1] + h.shape[2:].as_list()))
  return tf.reshape(y, [h.shape[0], -1] + y.shape[1:].as_list())


def stacked_logits(chain: Sequence, weights: Sequence, x, conv: str = TRAINING_CONV):
  """Logits [K, B, classes]: client k's batch x[k] through its weights, row k of each of
  `weights` (the model's trainable tensors in its order, stacked on a leading K axis). K and
  the per-example shapes are static."""
  if conv not in CONVS:
    raise ValueError(f'conv must be one of {CONVS}, got {conv!r}')
  weights = list(weights)
  h = x
  for layer in chain:
    if isinstance(layer, tf.keras.layers.Conv2D):
      h = _conv(h, weights.pop(0), layer, conv)
      if layer.use_bias:
        h = h + weights.pop(0)[:, None, None, None, :]
      h = layer.activation(h)
    elif isinstance(layer, tf.keras.layers.MaxPool2D):
      h = _per_example(h, lambda t, layer=layer: tf.nn.max_pool2d(
          t, layer.pool_size, layer.strides, layer.padding.upper()))
    elif isinstance(layer, tf.keras.layers.Flatten):
      h = tf.reshape(h, [h.shape[0], -1, int(np.prod(h.shape[2:]))])
    else:  # Dense
      h = tf.matmul(h, weights.pop(0))
      if layer.use_bias:
        h = h + weights.pop(0)[:, None, :]
      h = layer.activation(h)
  if weights:
    raise ValueError(f'{len(weights)} weight tensors left over after the chain')
  return h


def stack_clients(elements: Sequence) -> collections.OrderedDict:
  """K clients' inputs (`data.client_input`'s structures) with a leading K axis, each padded
  to the largest client: x [K, n_max, ...], y [K, n_max], order [K, E, n_max] (padding 0),
  n [K] and work [K]. All must run the same number of epochs, as a round's clients do."""
  epochs = {np.shape(e['order'])[0] for e in elements}
  if len(epochs) != 1:
    raise ValueError(f'the clients run different numbers of epochs: {sorted(epochs)}')
  n_max = max(np.shape(e['x'])[0] for e in elements)

  def padded(a, axis):
    a = np.asarray(a)
    width = [(0, 0)] * a.ndim
    width[axis] = (0, n_max - a.shape[axis])
    return np.pad(a, width)

  return collections.OrderedDict(
      x=np.stack([padded(e['x'], 0) for e in elements]),
      y=np.stack([padded(e['y'], 0) for e in elements]).astype(np.int32),
      order=np.stack([padded(e['order'], 1) for e in elements]).astype(np.int32),
      n=np.array([np.shape(e['x'])[0] for e in elements], np.int32),
      work=np.array([e['work'] for e in elements], np.float32))


def _check_optimizer_state(optimizer, state, k: int) -> None:
  """Per-client optimizer state is state with the K axis; a scalar that is not a
  hyperparameter (Adam's step count) would be one count for all K clients."""
  hparams = optimizer.get_hparams(state)
  for key, value in state.items():
    if key not in hparams and any(t.shape.rank == 0 or t.shape[0] != k
                                  for t in tf.nest.flatten(value)):
      raise ValueError(f'the optimizer\'s state {key!r} is not per weight: clients trained '
                       'together need one per client (SGD and SGD with momentum have none)')


def _where(active, new, old):
  """new for the clients still training (active [K]), old for the others."""
  mask = tf.reshape(active, [-1] + [1] * (new.shape.rank - 1))
  return tf.where(mask, new, old)


def build_together_training(keras_model: tf.keras.Model,
                            optimizer: tff.learning.optimizers.Optimizer, batch_size: int):
  """Returns `train(weights, clients)` as a `tf.function`: K clients' local training at once.

  `weights`: the model's trainable tensors, each stacked on a leading K axis (client k's
  initial weights in row k); `clients`: `stack_clients`'s structure. Returns an OrderedDict
  of the trained stacked weights (`trainable`) and per-client [K] sums, as
  `local_training.build_local_training` reports them for one client: `loss_sum`,
  `correct`, `examples_trained`, `steps_trained`.
  """
  chain = layer_chain(keras_model)
  local_training.check_client_training(optimizer, batch_size)

  @tf.function
  def train(weights, clients):
    weights = [tf.convert_to_tensor(w) for w in weights]
    k = weights[0].shape[0]
    x, y, order, n = clients['x'], clients['y'], clients['order'], clients['n']
    epochs, n_max = tf.shape(order)[1], tf.shape(order)[2]
    per_epoch = (n + batch_size - 1) // batch_size
    num_steps = local_training.work_share(clients['work'], epochs * per_epoch)
    state = tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(
        tuple(tf.TensorSpec(w.shape, w.dtype) for w in weights)))
    _check_optimizer_state(optimizer, state, k)
    loss_sum = correct = examples = tf.zeros([k])
    for step in tf.range(tf.reduce_max(num_steps)):
      active = step < num_steps
      safe_per_epoch = tf.maximum(per_epoch, 1)
      epoch = tf.minimum(step // safe_per_epoch, epochs - 1)
      position = ((step % safe_per_epoch) * batch_size)[:, None] + tf.range(batch_size)
      valid = tf.logical_and(position < n[:, None], active[:, None])
      rows = tf.gather(order, epoch, batch_dims=1)
      idx = tf.gather(rows, tf.minimum(position, n_max - 1), batch_dims=1)
      idx = tf.where(valid, idx, 0)
      xb, yb = tf.gather(x, idx, batch_dims=1), tf.gather(y, idx, batch_dims=1)
      mask = tf.cast(valid, tf.float32)
      count = tf.reduce_sum(mask, 1)
      with tf.GradientTape() as tape:
        tape.watch(weights)
        logits = stacked_logits(chain, weights, xb, TRAINING_CONV)
        example_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits)
        client_loss = tf.reduce_sum(example_loss * mask, 1) / tf.maximum(count, 1.0)
        total = tf.reduce_sum(client_loss)
      grads = tape.gradient(total, weights)
      new_state, new_weights = optimizer.next(state, tuple(weights), tuple(grads))
      weights = [_where(active, u, w) for u, w in zip(new_weights, weights)]
      state = tf.nest.map_structure(
          lambda u, s: _where(active, u, s) if s.shape.rank else u, new_state, state)
      hit = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=yb.dtype), yb), tf.float32)
      loss_sum += client_loss * count
      correct += tf.reduce_sum(hit * mask, 1)
      examples += count
    return collections.OrderedDict(
        trainable=weights, loss_sum=loss_sum, correct=correct, examples_trained=examples,
        steps_trained=tf.cast(num_steps, tf.float32))

  return train


def train_alone(model_fn, optimizer, batch_size: int, initial: Sequence, element):
  """One client through the library's own loop (`build_local_training`), as the reference:
  an OrderedDict of the same fields as `build_together_training`'s, for that client."""
  model = model_fn()
  out = local_training.build_local_training(model, optimizer, batch_size)(
      tff.learning.models.ModelWeights(trainable=list(initial), non_trainable=[]), element)
  return collections.OrderedDict(
      trainable=[np.asarray(t) for t in out.model_weights.trainable],
      loss_sum=float(out.loss_sum), correct=float(out.correct),
      examples_trained=float(out.examples_trained), steps_trained=float(out.steps_trained))


def _ops_in_while_bodies(graph_def) -> set:
  functions = {f.signature.name: f for f in graph_def.library.function}
  nodes = list(graph_def.node) + [n for f in functions.values() for n in f.node_def]
  found = set()
  for node in nodes:
    if node.op in ('While', 'StatelessWhile'):
      found.update(n.op for n in functions[node.attr['body'].func.name].node_def)
  return found


def pfor_loops(keras_model: tf.keras.Model, clients: int = 2, batch: int = 4) -> list:
  """The model's compute ops (MODEL_OPS) that `tf.vectorized_map` runs one client at a time,
  in a while loop, when it vectorizes one step's gradient over clients with their own
  weights; the others it turns into one batched op."""
  chain = layer_chain(keras_model)

  def client_gradient(args):
    weights, xb, yb = args
    with tf.GradientTape() as tape:
      tape.watch(weights)
      logits = stacked_logits(chain, [w[None] for w in weights], xb[None], 'per_client')[0]
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))
    return tape.gradient(loss, weights)

  specs = ([tf.TensorSpec([clients] + w.shape.as_list(), w.dtype)
            for w in keras_model.trainable_weights],
           tf.TensorSpec([clients, batch] + keras_model.inputs[0].shape.as_list()[1:]),
           tf.TensorSpec([clients, batch], tf.int32))
  vectorized = tf.function(lambda w, x, y: tf.vectorized_map(client_gradient, (w, x, y)))
  graph = vectorized.get_concrete_function(*specs).graph
  return sorted(_ops_in_while_bodies(graph.as_graph_def()) & MODEL_OPS)


def digits_clients(sizes: Sequence[int], works: Sequence[float], epochs: int,
                   seed: int = 0) -> list:
  """Clients of digits (8x8x1): client i takes the next sizes[i] training examples, its own
  seeded epoch orders and work works[i] (`data.client_input`)."""
  from tff_algos import data  # pylint: disable=g-import-not-at-top
  ds = data.load_digits()
  starts = np.cumsum([0] + list(sizes))
  return [data.client_input(ds.x_train[s:s + n], ds.y_train[s:s + n], epochs,
                            np.random.default_rng([seed, i]), i, i, w)
          for i, (s, n, w) in enumerate(zip(starts, sizes, works))]


def compare(model_name: str, *, sizes=(23, 40, 9, 12), works=(1.0, 0.5, 1.0, 0.0),
            epochs: int = 2, batch_size: int = 8, learning_rate: float = 0.05,
            momentum: Optional[float] = None) -> collections.OrderedDict:
  """Clients trained together against each trained alone, on digits, each client starting
  from its own weights (the zoo model of seed k): the largest difference of any weight
  relative to the largest weight of its tensor, and of any per-client sum."""
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  clients = digits_clients(sizes, works, epochs)
  keras = [models.build_keras_model(model_name, (8, 8, 1), 10, seed=i)
           for i in range(len(clients))]
  initial = [[w.numpy() for w in m.trainable_weights] for m in keras]
  optimizer = lambda: tff.learning.optimizers.build_sgdm(learning_rate, momentum)  # noqa: E731
  together = build_together_training(keras[0], optimizer(), batch_size)(
      [np.stack(ws) for ws in zip(*initial)], stack_clients(clients))
  model_fn = models.make_model_fn(model_name, (8, 8, 1), 10, seed=0)
  weight_diff, sum_diff = 0.0, 0.0
  for i, element in enumerate(clients):
    alone = train_alone(model_fn, optimizer(), batch_size, initial[i], element)
    for a, t in zip(alone['trainable'], together['trainable']):
      scale = max(float(np.max(np.abs(a))), 1e-12)
      weight_diff = max(weight_diff, float(np.max(np.abs(np.asarray(t[i]) - a))) / scale)
    for key in ('loss_sum', 'correct', 'examples_trained', 'steps_trained'):
      sum_diff = max(sum_diff, abs(float(together[key][i]) - alone[key]) /
                     max(abs(alone[key]), 1.0))
  return collections.OrderedDict(model=model_name, momentum=momentum,
                                 clients=len(clients),
                                 weight_difference=weight_diff, sum_difference=sum_diff)


def main() -> int:
  from tff_algos import models  # pylint: disable=g-import-not-at-top
  results = collections.OrderedDict(equality=[], pfor_loops={})
  for name in ('fedavg_cnn', 'mlp_2nn'):
    results['equality'].append(compare(name))
    results['equality'].append(compare(name, momentum=0.9))
    results['pfor_loops'][name] = pfor_loops(models.build_keras_model(name, (8, 8, 1), 10))
  print(json.dumps(results))
  return 0


if __name__ == '__main__':
  sys.exit(main())
