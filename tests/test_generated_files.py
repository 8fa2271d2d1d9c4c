"""programs.generated_files: the marker-block rewrite and the atomic write every generated page
uses."""

import os

import pytest

from programs import generated_files

BEGIN, END = '<!-- begin -->', '<!-- end -->'


def test_with_block_replaces_only_what_lies_between_the_markers():
  text = f'head\n{BEGIN}\nold 1\nold 2\n{END}\ntail\n'
  assert (generated_files.with_block(text, BEGIN, END, 'new\n')
          == f'head\n{BEGIN}\nnew\n{END}\ntail\n')
  # Rewriting with the same body is the identity (pages regenerate byte for byte).
  same = generated_files.with_block(text, BEGIN, END, 'old 1\nold 2\n')
  assert same == text


@pytest.mark.parametrize('lost', [BEGIN, END])
def test_with_block_names_a_lost_marker(lost):
  text = f'head\n{BEGIN}\nold\n{END}\n'.replace(lost, '')
  with pytest.raises(ValueError, match='lost its marker'):
    generated_files.with_block(text, BEGIN, END, 'new\n')


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / 'page.md'
  path.write_text('before\n')
  generated_files.write_text(str(path), 'after\n')
  assert path.read_text() == 'after\n'
  assert os.listdir(tmp_path) == ['page.md']


def test_a_failed_write_keeps_the_old_file(tmp_path):
  path = tmp_path / 'page.md'
  path.write_text('before\n')
  with pytest.raises(RuntimeError):
    with generated_files.replacing(str(path)) as tmp:
      with open(tmp, 'w') as f:
        f.write('half')
      raise RuntimeError('writer died')
  assert path.read_text() == 'before\n'
  assert os.listdir(tmp_path) == ['page.md']
