"""The frozen / fine-tune split lives in one place (ctxrep.tasks.modes): the estimators' files do not branch on the
mode, and each mode object builds the batches' units the way the estimators used to themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import ctxrep.tasks
from ctxrep.models.loading import load_encoder
from ctxrep.tasks import SequenceClassifier, TokenTagger
from ctxrep.tasks.modes import FINETUNE, FROZEN, mode_of

TASKS = Path(ctxrep.tasks.__file__).parent
# every file of tasks/ and compress/ but the two that hold the split (modes.py, and network.py's Representation)
SCANNED = sorted(p for p in TASKS.glob("*.py") if p.name not in ("modes.py", "network.py"))
SCANNED += sorted((TASKS.parent / "compress").glob("*.py"))


def _mode_comparisons(path: Path) -> list[str]:
    """Comparisons that read the mode: `x.mode == ...`, `... == "frozen"`, `rep.mode != "finetune"`, ..."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        reads_mode = any(isinstance(s, ast.Attribute) and s.attr == "mode" for s in sides)
        names_mode = any(isinstance(s, ast.Constant) and s.value in ("frozen", "finetune") for s in sides)
        if reads_mode or names_mode:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_estimators_do_not_branch_on_the_mode():
    assert len(SCANNED) > 10 and any(p.name == "prune.py" for p in SCANNED)
    found = [c for path in SCANNED for c in _mode_comparisons(path)]
    assert found == [], f"mode branches outside tasks/modes.py: {found}"


def test_mode_of_names_the_choices():
    assert mode_of("finetune") is FINETUNE and mode_of("frozen") is FROZEN
    assert FINETUNE.trains_encoder and not FROZEN.trains_encoder
    with pytest.raises(ValueError, match=r"mode must be one of \('finetune', 'frozen'\), got 'fine-tune'"):
        mode_of("fine-tune")


def _batch(est, X):
    est.backbone_ = load_encoder(est.model)
    est.frozen_shape_ = [est.backbone_.model.num_layers + 1, est.backbone_.model.hidden_size]
    call = est._call()
    return call, est._collate(est._examples(est._check_X(X), None, call), call)


@pytest.mark.parametrize("word_pooling", ["first", "mean"])
def test_finetune_units_pool_each_words_pieces(tiny_models, word_pooling):
    X = [["unbelievably", "good"], ["a", "b", "c"]]
    tagger = TokenTagger(str(tiny_models["bert"]), "finetune", word_pooling)
    call, batch = _batch(tagger, X)
    assert call.mode is FINETUNE and call.features is None
    pool = batch["pool"]  # (batch, words, pieces)
    assert pool.shape[:2] == (2, 3) and pool.shape[2] == batch["input_ids"].shape[1]
    assert torch.allclose(pool[0, :2].sum(-1), torch.ones(2)) and pool[0, 2].sum() == 0  # padding word
    pieces_of_first = int((pool[0, 0] > 0).sum())
    assert pieces_of_first == 1 if word_pooling == "first" else pieces_of_first > 1  # "unbelievably" is split
    assert batch["cls_position"].tolist() == [0, 0] and batch["labels"].shape == (2, 3)


def test_frozen_units_are_cached_features(tiny_models, tmp_path):
    X = ["good great fine", "bad"]
    clf = SequenceClassifier(str(tiny_models["bert"]), "frozen", "mean", cache_dir=str(tmp_path))
    call, batch = _batch(clf, X)
    assert call.mode is FROZEN and call.features is not None
    assert set(batch) == {"features", "mask", "labels"}  # no pieces, no cls_position
    assert batch["features"].shape == (2, 3, 3, 32) and batch["mask"].sum(1).tolist() == [3, 1]
