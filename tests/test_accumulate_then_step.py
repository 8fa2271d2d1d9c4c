"""The slot-keyed row accumulator every stateful aggregator uses (accumulate_then_step.put_row)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_algos.aggregators import accumulate_then_step


@pytest.mark.parametrize('seed', range(4))
def test_rows_written_by_slot_and_merged_are_the_numpy_stack(seed):
  rng = np.random.default_rng(seed)
  num_rows = int(rng.integers(1, 7))
  shapes = [(3, 2), (5,)]
  # A random subset of the slots uploads, in random order, split over two partial
  # accumulators that a merge adds (as TFF may do); missing slots stay zero.
  slots = rng.permutation(num_rows)[:int(rng.integers(0, num_rows + 1))]
  values = {int(s): [rng.normal(size=sh).astype(np.float32) for sh in shapes] for s in slots}
  zero = [tf.zeros(sh, tf.float32) for sh in shapes]
  parts = [accumulate_then_step.zero_rows(zero, num_rows),
           accumulate_then_step.zero_rows(zero, num_rows)]
  for i, s in enumerate(slots):
    parts[i % 2] = accumulate_then_step.put_row(parts[i % 2], tf.constant(int(s)), values[int(s)])
  merged = accumulate_then_step.add_accumulators(parts[0], parts[1])
  stacked = accumulate_then_step.stack_rows(merged, zero)
  for j, sh in enumerate(shapes):
    want = np.zeros((num_rows,) + sh, np.float32)
    for s, v in values.items():
      want[s] = v[j]
    np.testing.assert_array_equal(stacked[j].numpy(), want)


def test_put_row_casts_to_the_rows_dtype_and_replaces_rather_than_adds():
  rows = accumulate_then_step.zero_rows([tf.zeros([2], tf.float64)], 3)
  rows = accumulate_then_step.put_row(rows, tf.constant(1), [tf.constant([1.5, 2.0], tf.float32)])
  rows = accumulate_then_step.put_row(rows, tf.constant(1), [tf.constant([4.0, 5.0], tf.float32)])
  stacked = accumulate_then_step.stack_rows(rows, [tf.zeros([2], tf.float64)])
  assert stacked[0].dtype == tf.float64
  np.testing.assert_array_equal(stacked[0].numpy(), [[0, 0], [4, 5], [0, 0]])


def test_zero_rows_are_empty_and_typed_with_unknown_dimensions():
  """The zero accumulator TFF serialises every round holds no model: each row's tensors are
  empty and their types leave the sizes open (a scalar stays a scalar); stacked, an
  unwritten row is zeros of the model's shapes."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  def zeros():
    return [tf.zeros([3, 2]), tf.zeros([5], tf.int32), tf.constant(0.0)]

  @tff.tensorflow.computation
  def accumulator():
    return accumulate_then_step.zero_rows(zeros(), 2)

  zero = zeros()

  row_type = accumulator.type_signature.result[0]
  assert [t.shape for t in row_type] == [(None, None), (None,), ()]
  rows = accumulator()
  assert [np.size(t) for t in rows[0]] == [0, 0, 1]
  stacked = accumulate_then_step.stack_rows(
      accumulate_then_step.put_row(accumulate_then_step.zero_rows(zero, 2), tf.constant(1),
                                   [tf.ones([3, 2]), tf.ones([5], tf.int32), tf.constant(2.0)]),
      zero)
  np.testing.assert_array_equal(stacked[0].numpy(), [np.zeros([3, 2]), np.ones([3, 2])])
  np.testing.assert_array_equal(stacked[1].numpy(), [np.zeros(5), np.ones(5)])
  np.testing.assert_array_equal(stacked[2].numpy(), [0.0, 2.0])
