"""Long commands count texts (or sentences), not bytes: `ctxrep embed` and the pretraining corpus's tokenize step
write plain lines into a log such as `embed: 5/5 texts (100%), ...`; the file's bytes only estimate the total."""

from __future__ import annotations

import pytest

from ctxrep.data.corpus import CorpusConfig, pack_corpus
from ctxrep.data.tokenizer_training import train_tokenizer
from ctxrep.embed.corpus import EmbedJob, ShardFolder, embed_corpus

TEXTS = [f"sentence {i} lifts the beam" for i in range(5)]


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_embed_progress_counts_texts(tiny_models, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    job = EmbedJob(str(src), ShardFolder(str(tmp_path / "o"), 2), model=str(tiny_models["bert"]))
    embed_corpus(job, log=lambda m: None)  # pytest's stderr is no terminal: plain lines
    lines = _lines(capsys.readouterr().err, "embed: ")
    assert lines and lines[-1].startswith("embed: 5/5 texts (100%), "), lines
    assert lines[-1].endswith(", 5 texts read, 3 shards written") and not any(" B" in line for line in lines), lines


@pytest.mark.parametrize("gzipped", [False, True])
def test_embed_progress_of_a_resumed_run_starts_at_the_texts_kept(tiny_models, tmp_path, capsys, gzipped):
    import gzip
    import json

    src = tmp_path / ("in.txt.gz" if gzipped else "in.txt")
    data = ("\n".join(TEXTS) + "\n").encode()
    src.write_bytes(gzip.compress(data) if gzipped else data)
    out = tmp_path / "o"
    job = EmbedJob(str(src), ShardFolder(str(out), 2), model=str(tiny_models["bert"]))
    embed_corpus(job, show_progress=False, log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:2], False
    (out / "manifest.json").write_text(json.dumps(manifest))
    embed_corpus(job, log=lambda m: None)
    last = _lines(capsys.readouterr().err, "embed: ")[-1]
    assert last.startswith("embed: 5/5 texts (100%), "), last  # a gzip file's total: known once it is read
    assert last.endswith(", 3 shards written")


def test_tokenize_progress_counts_sentences(tmp_path, capsys):
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("The crane lifted the beam. It was heavy.\n\nA new document starts here.\n")
    tokenizer = tmp_path / "tok"
    train_tokenizer(text, "wordpiece", 200, tokenizer, lowercase=True, min_frequency=1)
    packed = pack_corpus(text, tokenizer, tmp_path / "packed", CorpusConfig(num_workers=1), progress=True)
    sentences = packed.manifest["counts"]["sentences"]
    lines = _lines(capsys.readouterr().err, "tokenize: ")
    assert lines and lines[-1].startswith(f"tokenize: {sentences}/{sentences} sentences (100%), "), lines
    assert not any(" B" in line for line in lines), lines
