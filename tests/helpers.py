"""Helpers shared by several test files."""

import asyncio
import collections
import json
import os

import tensorflow as tf


# Settings a method needs away from the program's defaults in the tests that run every method
# (SCAFFOLD takes plain client SGD only: tff_algos/client_work/corrected_training.py).
METHOD_SETTINGS = {'scaffold': dict(client_momentum=0.0)}


def as_tff_dataset(inp, batch_size, epochs=None):
  """TFF-style client data holding exactly the batches our loop gathers from `order`: per
  epoch, the examples in that epoch's order batched by `batch_size` (last batch smaller),
  epochs concatenated (TFF's client work does one pass over its dataset)."""
  x, y, order = inp['x'], inp['y'], inp['order']
  if epochs is not None:
    order = order[:epochs]
  out = None
  for o in order:
    ds = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x[o], y=y[o])).batch(batch_size)
    out = ds if out is None else out.concatenate(ds)
  return out


def run_async(coro):
  """Runs a coroutine on a private loop: asyncio.run() would close the default loop that
  tff.simulation's get_event_loop() relies on later."""
  loop = asyncio.new_event_loop()
  try:
    return loop.run_until_complete(coro)
  finally:
    loop.close()


def process_alive(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[1].split()[0] != 'Z'
  except OSError:
    return False


def leaf_femnist_user(rng, n):
  """A LEAF FEMNIST user of n examples: 784 pixels each, labels in [0, 62)."""
  return {'x': rng.random([n, 784]).round(3).tolist(), 'y': rng.integers(0, 62, n).tolist()}


def write_leaf_json(path, user_data):
  """Writes `user_data` ({user: {'x': [...], 'y': [...]}}) as one LEAF JSON file."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  users = list(user_data)
  blob = {'users': users, 'num_samples': [len(user_data[u]['y']) for u in users],
          'hierarchies': [], 'user_data': user_data}
  with open(path, 'w') as f:
    json.dump(blob, f)


SHAKESPEARE_TEXT = (
    'To be, or not to be, that is the question: Whether tis nobler in the mind to suffer '
    'The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles '
    'And by opposing end them. To die: to sleep; No more; and by a sleep to say we end '
    'The heart-ache and the thousand natural shocks That flesh is heir to.\n')


def leaf_shakespeare_users(names, samples_per_user, start=0):
  """LEAF Shakespeare users: x = 80-character windows of a text, y = the next character."""
  text = SHAKESPEARE_TEXT * 4
  users, offset = {}, start
  for name in names:
    xs, ys = [], []
    for _ in range(samples_per_user):
      xs.append(text[offset:offset + 80])
      ys.append(text[offset + 80])
      offset += 7
    users[name] = {'x': xs, 'y': ys}
  return users


def leaf_sent140_users(names, samples_per_user, seed=0):
  """LEAF Sent140 users: x = the 5-field tweet record, y = 0/1 sentiment of its words."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  happy, sad = ['love', 'great', 'happy', 'fun'], ['hate', 'awful', 'sad', 'bad']
  filler = ['the', 'day', 'was', 'really', 'so', 'this']
  users = {}
  for name in names:
    xs, ys = [], []
    for _ in range(samples_per_user):
      label = int(rng.integers(0, 2))
      words = list(rng.choice(filler, 4)) + list(rng.choice(happy if label else sad, 2))
      rng.shuffle(words)
      xs.append(['1467810369', 'Mon Apr 06 22:19:45 PDT 2009', 'NO_QUERY', name,
                 ' '.join(words)])
      ys.append(label)
    users[name] = {'x': xs, 'y': ys}
  return users


def leaf_femnist_users(names, samples_per_user, seed=0):
  """LEAF FEMNIST users: x = 784 pixels in [0, 1] (1 = background), y = one of 62 classes;
  each class is a fixed stroke pattern plus noise, so a model can learn it."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  patterns = np.random.default_rng(123).random([4, 784]) < 0.2
  users = {}
  for name in names:
    labels = rng.integers(0, 4, samples_per_user)
    pixels = np.where(patterns[labels], 0.0, 1.0) + rng.normal(0, 0.05, [samples_per_user, 784])
    users[name] = {'x': np.clip(pixels, 0, 1).round(3).tolist(), 'y': labels.tolist()}
  return users
