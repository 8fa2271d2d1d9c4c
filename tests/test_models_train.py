"""Every zoo model trains for one round through a TFF process (`tff_algos.build_fedavg`).

Two clients of tiny synthetic data in each model's input format (small images, or short
zero-padded token windows for `char_lstm`), one local epoch, one round: the global model's
trainable weights must move, every weight must stay finite, and the clients' training loss
must be finite. Inputs are shrunk to keep the round cheap (ResNet-20 on 8x8, the CNNs on 8x8
or 16x16); VGG-16 keeps 32x32 because its five poolings need it.

BatchNorm (ResNet-20, VGG-16): the moving statistics are non-trainable variables, which the
processes do not aggregate yet (only trainables are averaged), so here they are only checked
to be finite.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow_federated as tff

from tff_algos import data
import tff_algos
from tff_algos import models
from tff_algos.models import catalog

CLIENT_SIZES = (6, 5)
BATCH = 4
NUM_CLASSES = 4
SEQ_LEN, VOCAB = 6, 10

# name -> per-example input shape (the smallest each architecture accepts comfortably).
INPUT_SHAPES = {
    'tiny_cnn': (8, 8, 1),
    'mlp_2nn': (8, 8, 1),
    'mlp_2nn_dropout': (8, 8, 1),
    'fedavg_cnn': (8, 8, 1),
    'simple_cnn': (16, 16, 1),   # two 'valid' 5x5 convolutions and two poolings
    'resnet20': (8, 8, 3),
    'vgg16': (32, 32, 3),        # five 2x2 poolings
    'char_lstm': (SEQ_LEN,),
    'leaf_char_lstm': (SEQ_LEN,),
    'sent140_lstm': (SEQ_LEN,),
}
# Classes of the models whose output is not NUM_CLASSES: next-token models predict a token.
OUTPUT_CLASSES = {'char_lstm': VOCAB, 'leaf_char_lstm': VOCAB, 'sent140_lstm': 2}


pytestmark = pytest.mark.usefixtures('runtime')


def synthetic_client(name, n, rng):
  """(x, y) of n examples in the input format of model `name`."""
  if catalog.MODEL_INPUTS[name] == catalog.TOKENS_TO_LABEL:
    # LEAF's form: a token window (padding id 0 at its end) and one label per example.
    x = rng.integers(1, VOCAB, size=(n, SEQ_LEN)).astype(np.int32)
    for row in x:
      row[rng.integers(2, SEQ_LEN + 1):] = 0
    return x, rng.integers(0, OUTPUT_CLASSES[name], size=n).astype(np.int32)
  if catalog.MODEL_INPUTS[name] == catalog.TOKENS_PER_POSITION:
    # Next-token windows with trailing padding (id 0) of random length, as the Shakespeare
    # pipeline makes them.
    windows = rng.integers(1, VOCAB, size=(n, SEQ_LEN + 1)).astype(np.int32)
    for row in windows:
      row[rng.integers(2, SEQ_LEN + 2):] = 0
    return windows[:, :-1], windows[:, 1:]
  x = rng.random((n, *INPUT_SHAPES[name]), dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
  return x, y


def weights_arrays(weights):
  return ([np.asarray(t) for t in weights.trainable],
          [np.asarray(t) for t in weights.non_trainable])


# Every model in the default suite: ResNet-20's and VGG-16's rounds (their BatchNorm layers
# make the largest computations to trace and compile) take about 13 s each under protobuf 4,
# against 3.5 and 2 minutes under protobuf 3.20's pure-Python implementation.
@pytest.mark.parametrize('name', sorted(models.MODELS))
def test_zoo_model_trains_one_round(name):
  num_classes = OUTPUT_CLASSES.get(name, NUM_CLASSES)
  vocab = VOCAB if catalog.MODEL_INPUTS[name] != catalog.IMAGE else None
  model_fn = models.make_model_fn(name, INPUT_SHAPES[name], num_classes, seed=0,
                                  vocab_size=vocab)
  process = tff_algos.build_fedavg(
      model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.05), BATCH)
  rng = np.random.default_rng(0)
  client_data = []
  for index, n in enumerate(CLIENT_SIZES):
    x, y = synthetic_client(name, n, rng)
    client_data.append([data.client_input(x, y, 1, rng, index, index)])

  state = process.initialize()
  before, _ = weights_arrays(process.get_model_weights(state))
  out = process.next(state, client_data)
  after, non_trainable = weights_arrays(process.get_model_weights(out.state))

  train = out.metrics['client_work']['train']
  assert train['num_examples'] == sum(CLIENT_SIZES)
  assert train['non_finite_clients'] == 0
  assert np.isfinite(train['loss']) and train['loss'] > 0
  assert all(np.all(np.isfinite(w)) for w in after + non_trainable)
  moved = [float(np.max(np.abs(a - b))) for a, b in zip(after, before)]
  # Every trainable variable gets a gradient (the model has no dead branch) and moves.
  assert min(moved) > 0, moved
  assert max(moved) > 1e-4, moved
