"""Keras model zoo with a known final `classifier` layer, and TFF `model_fn`s for it."""

from tff_algos.models.model_fns import as_model_fn
from tff_algos.models.model_fns import check_variable_model
from tff_algos.models.model_fns import input_spec_for
from tff_algos.models.model_fns import make_model_fn
from tff_algos.models.representation import classifier_layer
from tff_algos.models.representation import keras_model_of
from tff_algos.models.representation import representation_model
from tff_algos.models.zoo import build_keras_model
from tff_algos.models.zoo import char_lstm
from tff_algos.models.zoo import check_model_name
from tff_algos.models.zoo import CLASSIFIER_LAYER
from tff_algos.models.zoo import DEFAULT_INPUT_SHAPES
from tff_algos.models.zoo import DEFAULT_NUM_CLASSES
from tff_algos.models.zoo import fedavg_cnn
from tff_algos.models.zoo import mlp_2nn
from tff_algos.models.zoo import MODELS
from tff_algos.models.zoo import resnet20
from tff_algos.models.zoo import SEQUENCE_MODELS
from tff_algos.models.zoo import ShortcutA
from tff_algos.models.zoo import simple_cnn
from tff_algos.models.zoo import tiny_cnn
from tff_algos.models.zoo import vgg16

__all__ = [
    'CLASSIFIER_LAYER',
    'DEFAULT_INPUT_SHAPES',
    'DEFAULT_NUM_CLASSES',
    'MODELS',
    'SEQUENCE_MODELS',
    'ShortcutA',
    'as_model_fn',
    'build_keras_model',
    'char_lstm',
    'check_variable_model',
    'check_model_name',
    'classifier_layer',
    'fedavg_cnn',
    'input_spec_for',
    'keras_model_of',
    'make_model_fn',
    'mlp_2nn',
    'representation_model',
    'resnet20',
    'simple_cnn',
    'tiny_cnn',
    'vgg16',
]
