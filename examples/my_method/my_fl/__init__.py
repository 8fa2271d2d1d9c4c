"""A researcher's own package (docs/your_own.md): a method, a model and a data set."""
