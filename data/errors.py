"""The two errors every loader raises, each a one-line message that programs print instead
of a traceback: files absent (where to put them, what to run), or present but unreadable."""

__all__ = ['DatasetNotFoundError', 'DatasetFormatError']


class DatasetNotFoundError(FileNotFoundError):
  """Dataset files are absent; str(error) is one line saying how to get them."""

  def __init__(self, message: str):
    super().__init__(' '.join(message.split()))

  def __str__(self) -> str:
    return self.args[0]


class DatasetFormatError(ValueError):
  """Dataset files exist but cannot be read (corrupt, truncated, wrong layout);
  str(error) is one line naming the file and what is wrong with it."""

  def __init__(self, message: str):
    super().__init__(' '.join(str(message).split()))

  def __str__(self) -> str:
    return self.args[0]


def type_name(value) -> str:
  """`value`'s class as the messages name it: module and name (`tff_algos.data.datasets.
  FederatedDataset`), so a class of the same name from elsewhere reads apart from ours."""
  cls = type(value)
  return cls.__qualname__ if cls.__module__ == 'builtins' else f'{cls.__module__}.{cls.__qualname__}'
