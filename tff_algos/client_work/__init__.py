"""Client work: the shared fast local-training loop and the client work processes built on it.

Modules (docs/architecture.md has the whole map):

* `corrected_training`: SCAFFOLD's corrected local SGD.
* `distillation`: CADIS's knowledge-distillation loss.
* `local_training`: the one fast local-training loop every method's clients run.
* `model_delta`: client work uploading a model delta (the FedAvg family, FedSGD, CADIS).
* `model_upload`: client work uploading the trained model keyed by index and slot (FedCross,
  FedCDA).
* `plugins`: the plug-ins every client work takes as one `ClientStages`: FedLEx's guidance,
  CADIS's KD term.
"""
from tff_algos.client_work.corrected_training import build_corrected_client_work
from tff_algos.client_work.local_training import (
    LocalTrainingOutput, build_local_training, client_data_type,
    client_element_type, finalize_training_metrics, single_element, training_metric_sums,
    upload_weight, zero_if_non_finite)
from tff_algos.client_work.model_delta import (
    build_model_delta_client_work, build_update_finalizer,
    initial_model_weights_fn, model_input_spec, model_weights_type,
    sum_and_finalize_training_metrics)
from tff_algos.client_work.model_upload import build_model_upload_client_work, model_upload_type
from tff_algos.client_work.plugins import ClientStages
