"""Embedding jobs: `ctxrep embed` over a corpus, in one process, worker processes or on Ray."""
