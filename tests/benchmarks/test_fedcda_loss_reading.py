"""benchmarks/fedcda_diagnosis.py's F_n reading: on a state the method's own round has just
written, `select_both_ways` with the losses unscaled makes the round's selection."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import fedcda_diagnosis as diagnosis
from tff_algos.aggregators import cache_selection


@pytest.mark.parametrize('seed', range(3))
def test_select_both_ways_unscaled_is_the_rounds_selection(seed):
  rng = np.random.default_rng(seed)
  n, k, p, d = 7, 3, 3, 5
  count = rng.integers(1, 6, n).astype(np.int32)
  count[rng.choice(n, 2, replace=False)] = 0            # two clients never seen
  cache = rng.normal(size=[n, k, d]).astype(np.float32)
  losses = rng.uniform(0.1, 2.0, [n, k]).astype(np.float32)
  selected = ((count - 1 - rng.integers(0, k, n)) % k).astype(np.int32)
  state = collections.OrderedDict(
      cache=[tf.constant(cache)], losses=tf.constant(losses),
      sq_norms=tf.constant(np.sum(cache.astype(np.float64) ** 2, axis=2)),
      count=tf.constant(count), selected=tf.constant(selected),
      # the running sum of the selected models, from the cache
      selected_sum=cache_selection.selected_sum_from_cache([cache], count, selected),
      round_num=tf.constant(10, tf.int32))
  uploaders = np.sort(rng.choice(n, p, replace=False)).astype(np.int32)
  acc = collections.OrderedDict(
      models=[tf.constant(rng.normal(size=[p, d]).astype(np.float32))],
      client_index=tf.constant(uploaders), loss=tf.constant(rng.uniform(0.1, 2, p), tf.float32),
      valid=tf.ones([p]), weight=tf.ones([p]))
  new, _, _ = cache_selection.cache_round(state, acc, num_clients=n, clients_per_round=p,
                                          cache_size=k, num_batches=1, warmup_rounds=0,
                                          smoothness=1.0, selection='exact', seed=0)
  after = dict(models=new['cache'][0].numpy().astype(np.float64),
               losses=new['losses'].numpy().astype(np.float64), count=new['count'].numpy(),
               selected=new['selected'].numpy(), round=10)
  choice, before, objective = diagnosis.select_both_ways(
      after, uploaders, np.ones(n), cache_size=k, num_batches=1, smoothness=1.0)
  slots = (after['count'][uploaders] - 1 - choice) % k
  np.testing.assert_array_equal(slots, after['selected'][uploaders])
  assert objective <= before
  # the sum reading weighs each client's losses by its batches: a large enough weight on a
  # client's losses makes it pick its lowest-loss cached model
  heavy = np.ones(n)
  heavy[uploaders[0]] = 1e6
  choice, _, _ = diagnosis.select_both_ways(
      after, uploaders, heavy, cache_size=k, num_batches=1, smoothness=1.0)
  have = min(after['count'][uploaders[0]], k)
  ring = (after['count'][uploaders[0]] - 1 - np.arange(have)) % k
  assert choice[0] == int(np.argmin(after['losses'][uploaders[0], ring]))
