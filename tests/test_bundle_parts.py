"""A tensor bundle written in parts (tff_algos/runtime/bundle_parts.py): how tensors are cut,
that the merged bundle reads as the tensors written whole, that only parts whose bytes
changed are written (the others linked from the previous bundle), and that each bundle
reads on its own once the one it linked from is removed."""

import itertools
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tff_algos.runtime import bundle_parts


def test_a_tensor_is_cut_along_the_most_leading_axes_that_leave_parts_big_enough():
  cases = {((1, 3, 1000), 4, 4000): 2, ((1, 3, 1000), 4, 4001): 0,
           ((5, 3, 1000), 4, 4000): 2, ((5, 3, 1000), 4, 12000): 1,
           ((5, 3, 1000), 4, 12001): 0, ((5, 3, 1000), 8, 8000): 2, ((5, 3, 1000), 8, 8001): 1,
           ((100,), 4, 1): 0, ((), 4, 1): 0, ((2, 1, 1), 4, 4): 2, ((1, 1, 7), 4, 4): 0}
  for (shape, itemsize, least), axes in cases.items():
    assert bundle_parts.part_axes(shape, itemsize, least) == axes, (shape, itemsize, least)
  rng = np.random.default_rng(0)
  for _ in range(200):
    shape = tuple(int(d) for d in rng.integers(1, 6, size=rng.integers(1, 5)))
    least = int(rng.integers(1, 400))
    axes = bundle_parts.part_axes(shape, 4, least)
    # Every cut that leaves >= 2 parts of >= `least` bytes, by brute force.
    valid = [m for m in range(1, len(shape))
             if np.prod(shape[:m]) >= 2 and 4 * np.prod(shape[m:]) >= least]
    assert axes == (max(valid) if valid else 0)
    assert bundle_parts.num_parts(shape, axes) == (np.prod(shape[:axes]) if axes else 0)


def test_a_slice_spec_names_one_part():
  assert bundle_parts.slice_spec((2, 3, 5), 2, 0) == '2 3 5 0,1:0,1:-'
  assert bundle_parts.slice_spec((2, 3, 5), 2, 4) == '2 3 5 1,1:1,1:-'
  assert bundle_parts.slice_spec((2, 3, 5), 1, 1) == '2 3 5 1,1:-:-'


def _tensors(rng):
  """Two tensors cut in parts (float32 [2, 3, 8] by 2 axes, float64 [4, 6] by 1) between
  two written whole (int32 [5], a string)."""
  return [rng.standard_normal([2, 3, 8]).astype(np.float32), np.arange(5, dtype=np.int32),
          rng.standard_normal([4, 6]), np.array(b'graph', dtype=object)]


NAMES = ['a', 'n', 'b', 's']
CUT = [(0, 2), (2, 1)]
PARTS = 6 + 4


def _write(tmp_path, version, tensors, previous=None, previous_version=None):
  """Writes version `version` in parts as the worker does, eagerly, then assembles it;
  returns (its fingerprints, the parts the writer wrote)."""
  directory = tmp_path / f'v{version}'
  written = directory / 'written'
  os.makedirs(written)
  fingerprints = bundle_parts.write_parts(
      str(written), NAMES,
      [tf.constant(t, tf.string) if t.dtype == object else tf.constant(t) for t in tensors],
      CUT, np.zeros([PARTS, 8], np.uint8) if previous is None else previous,
      previous is not None).numpy()
  wrote = sorted(int(f[len('part_'):-len('.index')]) for f in os.listdir(written)
                 if f.startswith('part_') and f.endswith('.index'))
  bundle_parts.assemble(str(written), str(directory), str(directory / 'variables'), PARTS,
                        None if previous_version is None else str(tmp_path / f'v{previous_version}'))
  assert not written.exists()
  return fingerprints, wrote


def _read(tmp_path, version):
  reader = tf.train.load_checkpoint(str(tmp_path / f'v{version}' / 'variables'))
  return [reader.get_tensor(name) for name in NAMES]


def _assert_read_as(tmp_path, version, tensors):
  for got, want in zip(_read(tmp_path, version), tensors, strict=True):
    if want.dtype == object:
      assert got == want.item()
    else:
      assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _inode(tmp_path, version, part):
  return os.stat(tmp_path / f'v{version}' / bundle_parts.PARTS_DIR /
                 f'part_{part}{bundle_parts.DATA_SUFFIX}').st_ino


def test_only_changed_parts_are_written_and_every_bundle_reads_whole(tmp_path):
  rng = np.random.default_rng(1)
  first = _tensors(rng)
  fingerprints, wrote = _write(tmp_path, 1, first)
  assert wrote == list(range(PARTS))   # nothing to link from: every part
  _assert_read_as(tmp_path, 1, first)
  reader = tf.train.load_checkpoint(str(tmp_path / 'v1' / 'variables'))
  assert reader.get_variable_to_shape_map() == {'a': [2, 3, 8], 'n': [5], 'b': [4, 6],
                                                's': []}
  # Change one cached row of `a` (part 1 * 3 + 2 = 5) by one ulp, and row 3 of `b` (6 + 3).
  second = [t.copy() for t in first]
  second[0][1, 2, 4] = np.nextafter(second[0][1, 2, 4], np.float32(np.inf))
  second[2][3, 0] += 1.0
  second[1][0] = 7   # the whole tensors are rewritten every time
  fingerprints_2, wrote = _write(tmp_path, 2, second, fingerprints, 1)
  assert wrote == [5, 9]
  assert [p for p in range(PARTS) if (fingerprints[p] != fingerprints_2[p]).any()] == [5, 9]
  _assert_read_as(tmp_path, 2, second)
  for part in range(PARTS):   # the parts left unwritten are the previous bundle's files
    assert (_inode(tmp_path, 2, part) == _inode(tmp_path, 1, part)) == (part not in (5, 9))
  # A third from the second, then the first two removed: the third reads on its own.
  third = [t.copy() for t in second]
  third[0][0, 0, 0] = -1.0
  _, wrote = _write(tmp_path, 3, third, fingerprints_2, 2)
  assert wrote == [0]
  shutil.rmtree(tmp_path / 'v1')
  shutil.rmtree(tmp_path / 'v2')
  _assert_read_as(tmp_path, 3, third)


def test_without_a_previous_bundle_every_part_is_written(tmp_path):
  """`linkable` False: the fingerprints given are not compared (they may equal the
  tensors' own)."""
  tensors = _tensors(np.random.default_rng(2))
  fingerprints, _ = _write(tmp_path, 1, tensors)
  os.makedirs(tmp_path / 'v2' / 'written')
  bundle_parts.write_parts(
      str(tmp_path / 'v2' / 'written'), NAMES,
      [tf.constant(t, tf.string) if t.dtype == object else tf.constant(t) for t in tensors],
      CUT, fingerprints, False)
  assert len([f for f in os.listdir(tmp_path / 'v2' / 'written') if f.endswith('.index')]) == (
      PARTS + 1)


def test_a_part_left_unwritten_with_nothing_to_link_is_an_error(tmp_path):
  rng = np.random.default_rng(3)
  tensors = _tensors(rng)
  fingerprints, _ = _write(tmp_path, 1, tensors)
  written = tmp_path / 'v2' / 'written'
  os.makedirs(written)
  bundle_parts.write_parts(
      str(written), NAMES,
      [tf.constant(t, tf.string) if t.dtype == object else tf.constant(t) for t in tensors],
      CUT, fingerprints, True)
  with pytest.raises(FileNotFoundError, match='no bundle precedes it'):
    bundle_parts.assemble(str(written), str(tmp_path / 'v2'), str(tmp_path / 'v2' / 'variables'),
                          PARTS, None)


def test_fingerprints_tell_apart_rows_that_differ_in_one_bit():
  rng = np.random.default_rng(4)
  rows = rng.standard_normal([16, 100]).astype(np.float32)
  bits = rows.view(np.uint32).copy()
  for row, column, bit in itertools.product(range(0, 16, 5), (0, 57, 99), (0, 31)):
    flipped = bits.copy()
    flipped[row, column] ^= np.uint32(1 << bit)
    a = tf.fingerprint(rows).numpy()
    b = tf.fingerprint(flipped.view(np.float32)).numpy()
    assert [r for r in range(16) if (a[r] != b[r]).any()] == [row]


def test_on_a_file_system_without_hard_links_parts_are_copied(tmp_path, monkeypatch):
  rng = np.random.default_rng(5)
  first = _tensors(rng)
  fingerprints, _ = _write(tmp_path, 1, first)

  def no_links(source, target):
    raise PermissionError(1, 'Operation not permitted', source)
  monkeypatch.setattr(os, 'link', no_links)
  second = [t.copy() for t in first]
  second[2][0, 0] += 1.0
  _, wrote = _write(tmp_path, 2, second, fingerprints, 1)
  assert wrote == [6]
  assert all(_inode(tmp_path, 2, part) != _inode(tmp_path, 1, part) for part in range(PARTS))
  shutil.rmtree(tmp_path / 'v1')
  _assert_read_as(tmp_path, 2, second)


def test_a_bundles_record_names_each_part_that_no_longer_matches_it(tmp_path):
  """The record holds each part's slice, its fingerprint (of its row's bytes, as tf.fingerprint
  of the numpy row gives it) and its data file's size (os.stat); `damaged_parts` finds none
  in a bundle as written, then names a truncated part ('size'), a part with bytes flipped
  ('fingerprint') and one whose record's fingerprint differs ('fingerprint'), in a later
  bundle sharing those files too."""
  tensors = _tensors(np.random.default_rng(6))
  fingerprints, _ = _write(tmp_path, 1, tensors)
  slices = bundle_parts.part_slices([(i, axes, n) for (i, axes), n in zip(CUT, (6, 4))],
                                    NAMES, [t.shape for t in tensors],
                                    [t.dtype.name for t in tensors])
  bundle_parts.write_record(str(tmp_path / 'v1'), slices, fingerprints, whole=True)
  record = bundle_parts.read_record(str(tmp_path / 'v1'))
  rows = ([tensors[0].reshape(6, -1)[r] for r in range(6)] +
          [tensors[2].reshape(4, -1)[r] for r in range(4)])
  files = [str(tmp_path / 'v1' / bundle_parts.PARTS_DIR / f'part_{p}{bundle_parts.DATA_SUFFIX}')
           for p in range(PARTS)]
  assert record['whole'] and [(p['name'], p['slice']) for p in record['parts']] == (
      [('a', bundle_parts.slice_spec((2, 3, 8), 2, r)) for r in range(6)] +
      [('b', bundle_parts.slice_spec((4, 6), 1, r)) for r in range(4)])
  assert [p['fingerprint'] for p in record['parts']] == [
      tf.fingerprint(row[None]).numpy()[0].tobytes().hex() for row in rows]
  assert [p['size'] for p in record['parts']] == [os.path.getsize(f) for f in files]
  assert bundle_parts.damaged_parts(str(tmp_path / 'v1')) == {}
  second = [t.copy() for t in tensors]
  second[2][0, 0] += 1.0
  fingerprints_2, _ = _write(tmp_path, 2, second, fingerprints, 1)
  bundle_parts.write_record(str(tmp_path / 'v2'), slices, fingerprints_2, whole=False)
  with open(files[1], 'r+b') as f:
    f.truncate(os.path.getsize(files[1]) - 1)
  with open(files[3], 'r+b') as f:
    f.seek(os.path.getsize(files[3]) // 2)
    f.write(b'\xff\xfe\xfd\xfc')
  record['parts'][7]['fingerprint'] = '00' * bundle_parts.FINGERPRINT_BYTES
  assert bundle_parts.damaged_parts(str(tmp_path / 'v1'), record) == {
      files[1]: 'size', files[3]: 'fingerprint', files[7]: 'fingerprint'}
  assert bundle_parts.damaged_parts(str(tmp_path / 'v2')) == {
      f.replace('v1', 'v2'): what for f, what in ((files[1], 'size'), (files[3], 'fingerprint'))}
