"""Keras model zoo with a known final `classifier` layer, and TFF `model_fn`s for it.

Names are exported lazily (PEP 562): `tff_algos.models.catalog` (model names and the inputs
each takes) imports without TensorFlow, so programs can check `--model` before TF starts.
"""

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    'tff_algos.models.model_fns': ('input_spec_for', 'make_model_fn'),
    'tff_algos.models.representation': (
        'classifier_layer', 'keras_model_of', 'representation_model'),
    'tff_algos.models.zoo': (
        'build_keras_model', 'char_lstm', 'check_model_name', 'CLASSIFIER_LAYER',
        'DEFAULT_INPUT_SHAPES', 'DEFAULT_NUM_CLASSES', 'DEFAULT_VOCAB_SIZES', 'fedavg_cnn',
        'leaf_char_lstm', 'mlp_2nn', 'MODELS', 'resnet20', 'SEQUENCE_MODELS', 'sent140_lstm',
        'ShortcutA', 'simple_cnn', 'tiny_cnn', 'TOKEN_MODELS', 'vgg16'),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


_SUBMODULES = ('catalog', 'model_fns', 'representation', 'zoo')


def __getattr__(name):
  module = _WHERE.get(name)
  if module is None and name in _SUBMODULES:  # `pkg.sub` after a bare `import pkg`
    return importlib.import_module(f'{__name__}.{name}')
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the real names
  from tff_algos.models.model_fns import input_spec_for, make_model_fn  # noqa: F401
  from tff_algos.models.representation import (  # noqa: F401
      classifier_layer, keras_model_of, representation_model)
  from tff_algos.models.zoo import (  # noqa: F401
      CLASSIFIER_LAYER, DEFAULT_INPUT_SHAPES, DEFAULT_NUM_CLASSES, DEFAULT_VOCAB_SIZES, MODELS,
      SEQUENCE_MODELS, TOKEN_MODELS, ShortcutA, build_keras_model, char_lstm, check_model_name,
      fedavg_cnn, leaf_char_lstm, mlp_2nn, resnet20, sent140_lstm, simple_cnn, tiny_cnn, vgg16)
