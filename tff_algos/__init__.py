"""tff_algos."""
