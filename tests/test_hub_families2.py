"""DeBERTa-v3 and ModernBERT by Hub name, downloaded by the real code from tests/test_hub.py's local server, with
the files their published repositories hold (microsoft/deberta-v3-base, answerdotai/ModernBERT-base), shrunk: ctxrep
fetches what it reads and nothing else, and the model and tokenizer it builds match transformers' on the same
download."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from _families2 import CORPUS, deberta_dir, modernbert_dir
from test_hub import FakeServer, _files, _sha

import ctxrep
from ctxrep.models.loading import load_encoder

TEXTS = CORPUS + ["Héllo wörld, ça va? 東京 🙂", "the bank of the river"]


@pytest.fixture()
def server(tmp_path, monkeypatch):
    """test_hub.py's environment (empty caches in tmp_path, online, no proxy for 127.0.0.1) and its server."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path / "ctxrep"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    servers = []

    def start(repos: dict) -> FakeServer:
        servers.append(FakeServer(repos))
        monkeypatch.setenv("HF_ENDPOINT", servers[-1].url)
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _check_download(name: str, folder, transformers_model) -> None:
    """The encoder and tokenizer ctxrep built from the download against transformers' on the same folder."""
    loaded = load_encoder(name)
    assert loaded.folder == folder
    ref_tok = transformers.AutoTokenizer.from_pretrained(folder)
    ref = transformers_model.from_pretrained(folder).eval()
    for text in TEXTS:
        pieces = loaded.tokenizer.encode_words([text.split()])[0]
        ids, _, _ = loaded.tokenizer.build_inputs(pieces.ids)
        assert ids == ref_tok(text)["input_ids"], text
    batch = ref_tok(TEXTS[:4], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = loaded.model(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        theirs = ref(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()
    assert torch.allclose(ours[real], theirs[real], atol=1e-5)
    vectors = ctxrep.Featurizer(name, layers="all").embed_words([t.split() for t in TEXTS])
    assert [v.shape[0] for v in vectors] == [len(t.split()) for t in TEXTS]
    assert all(np.isfinite(v).all() for v in vectors)


def test_deberta_v3_repository(server, tmp_path):
    """config.json, pytorch_model.bin (the MLM checkpoint: "deberta." prefix, lm_predictions, an unused absolute
    position table), spm.model and tokenizer_config.json are fetched; TensorFlow, Rust and generator files are not."""
    files = _files(deberta_dir(tmp_path / "src", spm_model=True))
    files |= {
        "README.md": b"# tiny deberta-v3\n",
        "tf_model.h5": b"\0" * 64,
        "rust_model.ot": b"\0" * 64,
        "generator_config.json": b"{}",
        ".gitattributes": b"*.bin filter=lfs\n",
    }
    s = server({"org/deberta-v3-tiny": {"refs": {"main": _sha(21)}, "commits": {_sha(21): files}}})
    from ctxrep.models import hub

    folder = hub.hub_folder("org/deberta-v3-tiny", progress=False)
    assert sorted(_files(folder)) == ["config.json", "pytorch_model.bin", "spm.model", "tokenizer_config.json"]
    for unread in ("tf_model.h5", "rust_model.ot", "generator_config.json", "README.md"):
        assert s.fetched(unread) == 0, unread
    assert load_encoder("org/deberta-v3-tiny").model.family == "deberta-v2"
    _check_download("org/deberta-v3-tiny", folder, transformers.DebertaV2Model)


def test_modernbert_repository(server, tmp_path):
    """config.json in the published (transformers 4.48) format, model.safetensors of ModernBertForMaskedLM,
    tokenizer.json with its config and special-tokens map are fetched; the ONNX exports are not."""
    files = _files(modernbert_dir(tmp_path / "src"))
    files |= {
        "README.md": b"# tiny modernbert\n",
        "onnx/model.onnx": b"\0" * 64,
        "onnx/model_quantized.onnx": b"\0" * 64,
        ".gitattributes": b"*.safetensors filter=lfs\n",
    }
    s = server({"org/ModernBERT-tiny": {"refs": {"main": _sha(22)}, "commits": {_sha(22): files}}})
    from ctxrep.models import hub

    folder = hub.hub_folder("org/ModernBERT-tiny", progress=False)
    assert sorted(_files(folder)) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert s.fetched(".onnx") == 0 and s.fetched("README.md") == 0
    model = load_encoder("org/ModernBERT-tiny").model
    assert model.family == "modernbert" and model.max_tokens == 64
    _check_download("org/ModernBERT-tiny", folder, transformers.ModernBertModel)


@pytest.mark.parametrize("family", ["deberta-v2", "modernbert"])
def test_cli_info_names_the_family_by_hub_name(server, tmp_path, family):
    from click.testing import CliRunner

    from ctxrep.cli import main

    build = {"deberta-v2": lambda p: deberta_dir(p, spm_model=True), "modernbert": modernbert_dir}[family]
    server({"org/m": {"refs": {"main": _sha(23)}, "commits": {_sha(23): _files(build(tmp_path / "src"))}}})
    result = CliRunner().invoke(main, ["info", "org/m"])
    assert result.exit_code == 0, result.output
    assert f"{family} encoder" in result.output
