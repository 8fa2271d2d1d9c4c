"""Helpers shared by several test files."""

import asyncio
import collections

import tensorflow as tf


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
