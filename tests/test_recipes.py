"""A pretraining objective is one unit: its recipe (objectives/recipe.py) in one table (objectives/recipes.py).
The pipeline, its config and the CLI read everything about an objective from the table: they name no objective,
a recipe added to the table trains, and the [objective] keys two recipes share mean the same in both."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from conftest import write_corpus

import ctxrep
from ctxrep.objectives import recipes as table
from ctxrep.objectives.causal_lm import CLM
from ctxrep.objectives.recipe import PretrainError, Recipe
from ctxrep.train import pretrain_config
from ctxrep.train.pretrain import pretrain
from ctxrep.train.pretrain_config import load_config, readers, reading_table

SRC = Path(ctxrep.__file__).parent
PIPELINE = ("train/pretrain.py", "train/pretrain_config.py", "train/config.py", "cli/pretrain.py")


def _code_strings(path: Path) -> set[str]:
    """The string constants of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }


@pytest.mark.parametrize("module", PIPELINE)
def test_the_pipeline_never_branches_on_an_objective_name(module):
    names = set(table.OBJECTIVES) & _code_strings(SRC / module)
    assert not names, f"{module} names the objective(s) {sorted(names)}: put what they decide into their recipes"


def test_every_recipe_ends_its_objective_file_and_the_table_lists_each_once():
    assert len(set(table.RECIPES)) == len(table.RECIPES) == len(table.OBJECTIVES)
    files = {}
    for r in table.RECIPES.values():
        module = r.build.__module__
        files.setdefault(module, []).append(r.name)
    for module in files:
        tree = ast.parse((SRC / (module.removeprefix("ctxrep.").replace(".", "/") + ".py")).read_text())
        last = tree.body[-1]
        assert isinstance(last, ast.Assign) and isinstance(last.value, ast.Call), module
        assert getattr(last.value.func, "id", None) == "Recipe", f"{module} does not end with its recipe"


def test_the_reading_table_is_read_off_the_recipes():
    assert readers("encoder", "share") == ("mlm+sop",)  # ALBERT's sharing: only its recipe maps it
    assert readers("objective", "k") == ("plm",)
    assert readers("elmo", "lstm.dim") == ("bilm",) and readers("distill", "teacher") == ("distill",)
    for r in table.RECIPES.values():
        for key in r.shape_keys:
            assert r.name in readers("encoder", key)
        for f in dataclasses.fields(r.settings) if r.settings else ():
            assert r.name in readers("objective", f.name)
        assert (r.name in readers("tokenizer", "vocab_size")) == r.trains_tokenizer


def test_objective_keys_two_recipes_share_must_agree(monkeypatch):
    @dataclasses.dataclass
    class Other:
        mask_prob: float = 0.5  # masked recipes default to 0.15

    monkeypatch.setitem(table.RECIPES, "other", dataclasses.replace(CLM, name="other", settings=Other))
    with pytest.raises(TypeError, match="mask_prob: other's settings give it another type or default"):
        pretrain_config._union_of_settings()


def test_a_recipe_added_to_the_table_is_offered_read_and_trained(monkeypatch, tmp_path):
    """A new objective is one Recipe and one row: here a causal LM under another name."""
    toy = Recipe("toy", CLM.build, shape_keys=CLM.shape_keys, tokenizer_kinds=("bpe",))
    monkeypatch.setitem(table.RECIPES, "toy", toy)
    assert readers("encoder", "hidden_size")[-1] == "toy" and "toy" not in readers("encoder", "share")
    assert reading_table().splitlines()[0].endswith("| span-corruption | toy |")
    with pytest.raises(PretrainError, match="--encoder.share: \\[encoder\\] share is read by mlm\\+sop, not by toy"):
        load_config("tiny", [("encoder.share", "none")], "toy")
    corpus = write_corpus(tmp_path / "text")
    metrics = pretrain(
        "toy", load_config("tiny", objective="toy"), corpus, tmp_path / "out", max_steps=2, progress=False
    )
    assert metrics["step"] == 2
    record = json.loads((tmp_path / "out" / "pretrain.json").read_text())
    assert record["objective"] == "toy" and set(record["settings"]["encoder"]) == set(toy.shape_keys)
    assert "objective" not in record["settings"]  # no settings dataclass: no [objective] key read
    assert ctxrep.load_model(tmp_path / "out").num_layers == 2


def test_an_unknown_objective_lists_the_table():
    with pytest.raises(PretrainError, match="objective 'bert' is unknown; use one of mlm, mlm\\+nsp, .*distill"):
        table.recipe("bert")
