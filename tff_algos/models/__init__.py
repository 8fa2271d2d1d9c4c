"""Keras model zoo with a known final `classifier` layer, and TFF `model_fn`s for it.

Names are exported lazily (PEP 562): `tff_algos.models.catalog` (model names and the inputs
each takes) imports without TensorFlow, so programs can check `--model` before TF starts.

Modules (docs/architecture.md has the whole map):

* `catalog`: what each zoo model consumes, importable without TensorFlow.
* `model_fns`: `model_fn`s building fresh TFF models.
* `representation`: the classifier layer and the representation it reads.
* `zoo`: the papers' Keras models, each with a known final `classifier` layer.
"""

from typing import TYPE_CHECKING

from tff_algos._lazy_exports import lazy_exports

_EXPORTS = {
    'tff_algos.models.model_fns': ('as_model_fn', 'check_variable_model', 'input_spec_for',
                                   'make_model_fn'),
    'tff_algos.models.representation': (
        'classifier_layer', 'keras_model_of', 'representation_model'),
    'tff_algos.models.zoo': (
        'build_keras_model', 'char_lstm', 'check_model_name', 'CLASSIFIER_LAYER',
        'DEFAULT_INPUT_SHAPES', 'DEFAULT_NUM_CLASSES', 'DEFAULT_VOCAB_SIZES', 'fedavg_cnn',
        'leaf_char_lstm', 'mlp_2nn', 'mlp_2nn_dropout', 'MODELS', 'resnet20', 'SEQUENCE_MODELS',
        'sent140_lstm', 'ShortcutA', 'simple_cnn', 'tiny_cnn', 'TOKEN_MODELS', 'vgg16'),
}
_SUBMODULES = ('catalog', 'model_fns', 'representation', 'zoo')
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)


if TYPE_CHECKING:  # static analysers and IDEs see the real names
  from tff_algos.models.model_fns import (  # noqa: F401
      as_model_fn, check_variable_model, input_spec_for, make_model_fn)
  from tff_algos.models.representation import (  # noqa: F401
      classifier_layer, keras_model_of, representation_model)
  from tff_algos.models.zoo import (  # noqa: F401
      CLASSIFIER_LAYER, DEFAULT_INPUT_SHAPES, DEFAULT_NUM_CLASSES, DEFAULT_VOCAB_SIZES, MODELS,
      SEQUENCE_MODELS, TOKEN_MODELS, ShortcutA, build_keras_model, char_lstm, check_model_name,
      fedavg_cnn, leaf_char_lstm, mlp_2nn, mlp_2nn_dropout, resnet20, sent140_lstm, simple_cnn,
      tiny_cnn, vgg16)
