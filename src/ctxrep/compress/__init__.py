"""Making encoders smaller: attention-head importance and pruning (prune.py).

from ctxrep.compress.prune import head_importance, prune_iteratively, accuracy_curve, estimator_loss
"""
