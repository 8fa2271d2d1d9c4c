"""benchmarks/clients_together.py: K clients trained together give each client's result of
training alone through the library's own loop (stragglers, a client of work 0, momentum),
the steps each runs against NumPy, its refusals, the stacked forward pass (both convolutions)
against Keras, and which of a model's ops pfor batches over clients' own weights and which
grouped-convolution kernels the CPU lacks (docs/clients_together.md)."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import math  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from benchmarks import clients_together
from tff_algos import models

# Largest weight difference relative to the largest weight of its tensor, and largest
# per-client sum difference relative to the sum: float32 over a few dozen steps.
TOLERANCE = 1e-4
BATCH = 8


@pytest.mark.parametrize('model_name, momentum', [
    ('fedavg_cnn', None), ('fedavg_cnn', 0.9), ('mlp_2nn', None), ('mlp_2nn', 0.9)])
def test_clients_trained_together_equal_each_trained_alone(model_name, momentum):
  # Four clients of 23, 40, 9 and 12 examples from their own initial weights; the second
  # runs half its steps, the fourth none.
  result = clients_together.compare(model_name, momentum=momentum)
  assert result['clients'] == 4
  assert result['weight_difference'] < TOLERANCE, result
  assert result['sum_difference'] < TOLERANCE, result


def test_each_client_runs_its_own_steps_and_a_client_of_work_0_keeps_its_weights():
  sizes, works, epochs = (23, 40, 9, 12), (1.0, 0.3, 0.5, 0.0), 3
  clients = clients_together.digits_clients(sizes, works, epochs)
  keras = models.build_keras_model('mlp_2nn', (8, 8, 1), 10, seed=0)
  initial = [np.stack([w.numpy() + 0.01 * i for i in range(len(sizes))])
             for w in keras.trainable_weights]
  out = clients_together.build_together_training(
      keras, tff.learning.optimizers.build_sgdm(0.05), BATCH)(
          initial, clients_together.stack_clients(clients))
  steps = [math.ceil(w * epochs * math.ceil(n / BATCH) - 1e-9) for n, w in zip(sizes, works)]
  assert steps == [9, 5, 3, 0]
  np.testing.assert_array_equal(out['steps_trained'], steps)
  examples = [sum(min(BATCH, n - (s % math.ceil(n / BATCH)) * BATCH) for s in range(k))
              for n, k in zip(sizes, steps)]
  np.testing.assert_array_equal(out['examples_trained'], examples)
  for t, w in zip(out['trainable'], initial):
    np.testing.assert_array_equal(np.asarray(t)[3], w[3])
    assert all(np.any(np.asarray(t)[i] != w[i]) for i in range(3))


def test_stack_clients_pads_each_client_to_the_largest():
  clients = clients_together.digits_clients((5, 3), (1.0, 0.5), 2)
  stacked = clients_together.stack_clients(clients)
  assert stacked['x'].shape == (2, 5, 8, 8, 1) and stacked['order'].shape == (2, 2, 5)
  np.testing.assert_array_equal(stacked['n'], [5, 3])
  np.testing.assert_array_equal(stacked['work'], [1.0, 0.5])
  np.testing.assert_array_equal(stacked['x'][1, :3], clients[1]['x'])
  np.testing.assert_array_equal(stacked['x'][1, 3:], 0)
  np.testing.assert_array_equal(stacked['order'][1, :, :3], clients[1]['order'])
  with pytest.raises(ValueError, match='different numbers of epochs'):
    clients_together.stack_clients(clients + clients_together.digits_clients((4,), (1.0,), 1))


@pytest.mark.parametrize('name, layer', [('resnet20', 'BatchNormalization'),
                                         ('mlp_2nn_dropout', 'Dropout')])
def test_a_model_beyond_the_chain_is_refused_naming_its_layer(name, layer):
  with pytest.raises(ValueError, match=f'{layer} is not Conv2D, MaxPool2D, Flatten or Dense'):
    clients_together.layer_chain(models.build_keras_model(name, seed=0))


def test_an_optimizer_with_state_shared_by_the_clients_is_refused():
  keras = models.build_keras_model('mlp_2nn', (8, 8, 1), 10, seed=0)
  clients = clients_together.stack_clients(clients_together.digits_clients((9, 9), (1, 1), 1))
  weights = [np.stack([w.numpy()] * 2) for w in keras.trainable_weights]
  adam = clients_together.build_together_training(
      keras, tff.learning.optimizers.build_adam(0.01), BATCH)
  with pytest.raises(ValueError, match="state 'step' is not per weight"):
    adam(weights, clients)


def test_pfor_batches_dense_layers_but_runs_convolutions_one_client_at_a_time():
  # tf.vectorized_map over clients' own weights: MatMul becomes one batched matmul, while
  # Conv2D and its two gradients fall back to a while loop over the clients.
  cnn = models.build_keras_model('fedavg_cnn', (8, 8, 1), 10, seed=0)
  assert clients_together.pfor_loops(cnn) == [
      'Conv2D', 'Conv2DBackpropFilter', 'Conv2DBackpropInput']
  mlp = models.build_keras_model('mlp_2nn', (8, 8, 1), 10, seed=0)
  assert clients_together.pfor_loops(mlp) == []


def test_a_grouped_convolution_runs_forward_on_cpu_but_not_its_gradients():
  # Why training runs K convolutions (TRAINING_CONV): TensorFlow 2.14's CPU kernels refuse
  # both gradients of a grouped convolution. Run on a machine with a GPU, this test says so.
  x = tf.random.normal([2, 8, 8, 6])
  assert tf.nn.conv2d(x, tf.random.normal([3, 3, 2, 12]), 1, 'SAME').shape == [2, 8, 8, 12]
  grad = tf.random.normal([2, 8, 8, 12])
  with pytest.raises(tf.errors.InvalidArgumentError, match='grouped convolutions are not '
                     'supported on CPU'):
    tf.raw_ops.Conv2DBackpropInput(input_sizes=[2, 8, 8, 6], filter=tf.ones([3, 3, 2, 12]),
                                   out_backprop=grad, strides=[1, 1, 1, 1], padding='SAME')
  with pytest.raises(tf.errors.InvalidArgumentError, match='filter_size does not have enough'):
    tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 2, 12], out_backprop=grad,
                                    strides=[1, 1, 1, 1], padding='SAME')


def test_stacked_logits_are_each_clients_keras_logits():
  x = np.random.default_rng(0).random([3, 5, 8, 8, 1], np.float32)
  keras = [models.build_keras_model('fedavg_cnn', (8, 8, 1), 10, seed=i) for i in range(3)]
  chain = clients_together.layer_chain(keras[0])
  weights = [tf.stack(ws) for ws in zip(*[m.trainable_weights for m in keras])]
  for conv in clients_together.CONVS:
    logits = clients_together.stacked_logits(chain, weights, x, conv)
    for i, m in enumerate(keras):
      np.testing.assert_allclose(logits[i], m(x[i]), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='conv must be one of'):
    clients_together.stacked_logits(chain, weights, x, 'depthwise')
