"""`ctxrep serve`: the HTTP service over a Featurizer."""
