"""Client work: the shared fast local-training loop and the client work processes built on it."""
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
