"""Vectors after the model: the shard store, similarity, nearest-neighbour indexes, the MTEB adapter."""
