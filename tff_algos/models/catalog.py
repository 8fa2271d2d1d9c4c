"""What each zoo model consumes, importable without TensorFlow.

The training program checks `--model` against the dataset before TensorFlow starts (docs/training_program.md:
flags are validated first), so the model names and the kind of input each model takes live
here, free of any TF import. `zoo.MODELS` holds the builders under exactly these names
(tests/test_models.py checks the two agree).

Input kinds:
  * IMAGE: float32 features [n, *shape] (images; `mlp_2nn` flattens any shape), one int32
    label per example.
  * TOKENS_PER_POSITION: int32 token ids [n, L], one int32 target per position (TFF's
    Shakespeare windows: x = window[:-1], y = window[1:]).
  * TOKENS_TO_LABEL: int32 token ids [n, L], one int32 label per example (LEAF's
    Shakespeare next character after an 80-character window; Sent140 sentiment).
"""

IMAGE = 'image'
TOKENS_PER_POSITION = 'tokens_per_position'
TOKENS_TO_LABEL = 'tokens_to_label'

MODEL_INPUTS = {
    'fedavg_cnn': IMAGE,
    'simple_cnn': IMAGE,
    'mlp_2nn': IMAGE,
    'mlp_2nn_dropout': IMAGE,
    'resnet20': IMAGE,
    'vgg16': IMAGE,
    'char_lstm': TOKENS_PER_POSITION,
    'tiny_cnn': IMAGE,
    'leaf_char_lstm': TOKENS_TO_LABEL,
    'sent140_lstm': TOKENS_TO_LABEL,
}
MODEL_NAMES = tuple(MODEL_INPUTS)

INPUT_DESCRIPTIONS = {
    IMAGE: 'float images/features with one label each',
    TOKENS_PER_POSITION: 'token sequences with a target per position',
    TOKENS_TO_LABEL: 'token sequences with one label each',
}


def models_for(input_kind: str) -> tuple:
  """The model names that take `input_kind` inputs."""
  return tuple(name for name, kind in MODEL_INPUTS.items() if kind == input_kind)
