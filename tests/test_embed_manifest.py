"""The manifest of `ctxrep embed` keeps the vector settings once, in its `spec`; `settings` holds only what decides
the texts read and the shard layout. A resumed run compares both; a manifest of the previous layout (the vector
settings repeated inside `settings`) still resumes, or is refused in one line that says what to do."""

from __future__ import annotations

import json
import shutil

import pytest

from ctxrep.embed.corpus import EmbedJob, ShardFolder, WordVectors, embed_corpus

TEXTS = [f"sentence {i} lifts the beam" for i in range(5)]
VECTOR_KEYS = {"model", "layers", "pooling", "sentence_pooling", "precision", "backend", "quantize", "output"}


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def _embed(model, src, out, logs=None, **options):
    job = EmbedJob(str(src), ShardFolder(str(out), shard_size=2), vectors=WordVectors(**options), model=str(model))
    return embed_corpus(job, show_progress=False, log=(logs.append if logs is not None else lambda m: None))


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


def _as_previous_version(out, model, unfinished: bool, **legacy):
    """Rewrite OUT's manifest as ctxrep wrote it before the vector settings moved out of `settings`."""
    manifest = _manifest(out)
    old = {"model": str(model), "layers": "-1", "pooling": "mean", "sentence_pooling": "auto"}
    manifest["settings"].update({**old, **legacy})
    if unfinished:  # stopped after two of three shards
        last = manifest["shards"].pop()
        (out / last["file"]).unlink()
        (out / last["index"]).unlink()
        manifest["complete"] = False
        del manifest["texts"], manifest["rows"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_the_vector_settings_are_kept_once_in_the_spec(tiny_models, src, tmp_path):
    _embed(tiny_models["bert"], src, tmp_path / "o")
    manifest = _manifest(tmp_path / "o")
    assert not VECTOR_KEYS & set(manifest["settings"]), manifest["settings"]
    assert {"input", "size", "mtime_ns", "format", "level", "shard_size", "storage"} <= set(manifest["settings"])
    assert manifest["spec"]["model"] == str(tiny_models["bert"]) and manifest["spec"]["layers"] == 2


def test_resume_compares_the_spec_not_the_settings_as_typed(tiny_models, src, tmp_path):
    out = tmp_path / "o"
    _embed(tiny_models["bert"], src, out)  # layers -1: the last of the tiny model's 2 layers
    again = _embed(tiny_models["bert"], src, out, layers=2)  # the same vectors, asked another way
    assert again.already_complete
    with pytest.raises(ValueError, match=r"holds the output of a different run \(differs in: layers\)") as e:
        _embed(tiny_models["bert"], src, out, layers=1)
    assert "layers 2 != 1" in str(e.value) and "use another --out directory" in str(e.value)
    with pytest.raises(ValueError, match=r"differs in: shard_size"):
        embed_corpus(
            EmbedJob(str(src), ShardFolder(str(out), shard_size=3), model=str(tiny_models["bert"])), show_progress=False
        )


def test_a_previous_version_manifest_resumes_to_the_same_bytes(tiny_models, src, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    _embed(tiny_models["bert"], src, full)
    shutil.copytree(full, part)
    _as_previous_version(part, tiny_models["bert"], unfinished=True)
    logs = []
    summary = _embed(tiny_models["bert"], src, part, logs)
    assert "resuming after 4 texts in 2 complete shards" in logs
    assert summary.texts == 5 and summary.shards == 3 and not summary.already_complete
    for name in ("shard-00002.safetensors", "index-00002.tsv"):
        assert (part / name).read_bytes() == (full / name).read_bytes()
    manifest = _manifest(part)  # written again in the new layout
    assert manifest["complete"] and not VECTOR_KEYS & set(manifest["settings"])
    assert manifest["spec"] == _manifest(full)["spec"]


def test_a_previous_version_manifest_of_another_run_is_refused_in_one_line(tiny_models, src, tmp_path):
    out = tmp_path / "o"
    _embed(tiny_models["bert"], src, out)
    manifest = _as_previous_version(out, tiny_models["bert"], unfinished=True, pooling="first")
    del manifest["spec"]  # written before manifests kept a spec: its settings say what made the vectors
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as e:
        _embed(tiny_models["bert"], src, out)
    message = str(e.value)
    assert "holds the output of a different run (differs in: pooling)" in message and "\n" not in message
    assert "use another --out directory or delete this one" in message


def test_a_manifest_that_says_nothing_of_its_vectors_is_refused_in_one_line(tiny_models, src, tmp_path):
    out = tmp_path / "o"
    _embed(tiny_models["bert"], src, out)
    manifest = _manifest(out)
    del manifest["spec"]
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as e:
        _embed(tiny_models["bert"], src, out)
    message = str(e.value)
    assert "lists 3 shards but neither the spec of their vectors nor the model that made them" in message
    assert f"delete {out} or use another --out directory" in message and "\n" not in message
