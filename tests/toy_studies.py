"""Study-file text shared by the tests of study files (tests/test_study.py, the suites' own)."""

# Two runs, FedProx and FedAvg, and their comparison: a study file's runs and [[compare]]
# (its label, the comparison's last key, is the test's own).
FEDPROX_AGAINST_FEDAVG = '''
[runs.fedavg]
algorithm = "fedavg"
[runs.fedprox]
algorithm = "fedprox"
[[compare]]
method = "fedprox"
baseline = "fedavg"
'''
