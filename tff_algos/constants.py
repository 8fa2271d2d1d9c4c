"""Names shared by tff_algos and the programs, kept free of TensorFlow: the training program
reads them before its flags are checked, when nothing may start TensorFlow yet."""

# The four figures over clients of the per-client evaluation, in
# `evaluation.summarize_client_accuracies`' order (the program's metrics.csv columns).
CLIENT_ACCURACY_FIGURES = ('client_accuracy_mean', 'client_accuracy_std',
                           'client_accuracy_p10', 'client_accuracy_min')
