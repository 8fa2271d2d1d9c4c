"""PEP 562 lazy exports for the package `__init__`s: names resolve (and import their module,
e.g. TensorFlow) on first use, so importing the package itself stays cheap."""

import importlib
import sys


def lazy_exports(package: str, exports: dict, submodules=()):
  """(__getattr__, __dir__, __all__) for package `package`.

  Args:
    package: the package's `__name__`.
    exports: {module name: (exported names, ...)}.
    submodules: subpackages/modules reachable as attributes after a bare `import package`.
  """
  where = {name: module for module, names in exports.items() for name in names}

  def __getattr__(name):  # pylint: disable=invalid-name
    if name in where:
      value = getattr(importlib.import_module(where[name]), name)
    elif name in submodules:
      value = importlib.import_module(f'{package}.{name}')
    else:
      raise AttributeError(f'module {package!r} has no attribute {name!r}')
    setattr(sys.modules[package], name, value)
    return value

  def __dir__():  # pylint: disable=invalid-name
    return sorted(set(vars(sys.modules[package])) | set(where))

  return __getattr__, __dir__, sorted(where)
