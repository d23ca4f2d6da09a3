"""The BERT / RoBERTa / ELECTRA encoder: parity with transformers, round trips, and loader errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.bert import BertConfig, BertModel
from ctxrep.models.loading import CheckpointError

REFERENCE = {"bert": transformers.BertModel, "roberta": transformers.RobertaModel, "electra": transformers.ElectraModel}


def padded_batch(vocab: int, pad: int, lengths=(12, 7, 3), low: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = pad
    return ids, mask


def assert_parity(ours, ref, ids, mask, token_type_ids=None) -> None:
    with torch.no_grad():
        a = ours(
            ids, attention_mask=mask, token_type_ids=token_type_ids, output_hidden_states=True, output_attentions=True
        )
        b = ref(
            ids, attention_mask=mask, token_type_ids=token_type_ids, output_hidden_states=True, output_attentions=True
        )
    real = mask.bool()
    assert len(a.hidden_states) == len(b.hidden_states) == ours.num_layers + 1
    for layer, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=1e-5), f"hidden state {layer} differs"
    assert len(a.attentions) == len(b.attentions) == ours.num_layers
    for layer, (x, y) in enumerate(zip(a.attentions, b.attentions)):
        q = real[:, None, :, None].expand_as(x)  # compare rows of real query tokens
        assert torch.allclose(x[q], y[q], atol=1e-5), f"attention {layer} differs"
    # The fast path (scaled_dot_product_attention) agrees with the explicit one.
    with torch.no_grad():
        fast = ours(ids, attention_mask=mask, token_type_ids=token_type_ids, output_hidden_states=True)
    for x, y in zip(fast.hidden_states, a.hidden_states):
        assert torch.allclose(x[real], y[real], atol=1e-5)


def test_minilm_parity_with_transformers(minilm_path):
    ours = ctxrep.load_model("minilm")
    ref = transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    ids, mask = padded_batch(30522, 0, lengths=(40, 17, 5), low=1000)
    types = torch.zeros_like(ids)
    types[0, 20:] = 1
    assert_parity(ours, ref, ids, mask, types)
    with torch.no_grad():
        assert torch.allclose(
            ours(ids, attention_mask=mask).pooler_output, ref(ids, attention_mask=mask).pooler_output, atol=1e-5
        )


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra"])
def test_tiny_parity_with_transformers(tiny_models, kind):
    path = tiny_models[kind]
    ours = ctxrep.load_model(path)
    ref = REFERENCE[kind].from_pretrained(path, attn_implementation="eager").eval()
    pad = ours.config.pad_token_id
    ids, mask = padded_batch(ours.config.vocab_size, pad)
    assert_parity(ours, ref, ids, mask)


def test_roberta_positions_start_after_padding_idx(tiny_models):
    model = ctxrep.load_model(tiny_models["roberta"])
    ids = torch.tensor([[0, 10, 11, 2, 1, 1]])  # <s> x x </s> <pad> <pad>
    assert model.position_ids(ids).tolist() == [[2, 3, 4, 5, 1, 1]]
    assert model.config.max_tokens == 64  # 66 positions minus the padding_idx + 1 offset


def test_electra_discriminator_head_is_not_loaded_but_encoder_is(tiny_models):
    model = ctxrep.load_model(tiny_models["electra"])
    assert model.config.embedding_size == 16 and model.embeddings.project is not None
    assert model.pooler is None


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra"])
def test_save_round_trip_loads_in_transformers(tiny_models, tmp_path, kind):
    ours = ctxrep.load_model(tiny_models[kind])
    ours.save_pretrained(tmp_path)
    ref = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert type(ref) is REFERENCE[kind]
    again = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(ours.config.vocab_size, ours.config.pad_token_id)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).last_hidden_state
        b = ref(ids, attention_mask=mask).last_hidden_state
        c = again(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert torch.allclose(a[real], b[real], atol=1e-5)
    assert torch.equal(a, c)


def test_masked_lm_checkpoint_with_prefix_loads(tmp_path):
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    ref = transformers.BertForMaskedLM(cfg).eval()
    ref.save_pretrained(tmp_path)
    ours = ctxrep.load_model(tmp_path)
    ids = torch.randint(1, 100, (2, 9))
    with torch.no_grad():
        assert torch.allclose(ours(ids).last_hidden_state, ref.bert(ids).last_hidden_state, atol=1e-5)


def test_pytorch_model_bin_loads_with_weights_only(tiny_models, tmp_path):
    src = tiny_models["bert"]
    shutil.copy(src / "config.json", tmp_path / "config.json")
    torch.save(load_file(src / "model.safetensors"), tmp_path / "pytorch_model.bin")
    a, b = ctxrep.load_model(src), ctxrep.load_model(tmp_path)
    ids = torch.randint(1, 1000, (1, 6))
    assert torch.equal(a(ids).last_hidden_state, b(ids).last_hidden_state)


def _copy_with_state(src, dst, edit):
    shutil.copy(src / "config.json", dst / "config.json")
    state = load_file(src / "model.safetensors")
    edit(state)
    save_file(state, dst / "model.safetensors")


def test_unknown_missing_and_misshaped_weights_are_all_named(tiny_models, tmp_path):
    def edit(state):
        state["encoder.layer.0.attention.self.extra.weight"] = torch.zeros(2)
        del state["encoder.layer.1.output.dense.bias"]
        state["embeddings.LayerNorm.weight"] = torch.ones(5)

    _copy_with_state(tiny_models["bert"], tmp_path, edit)
    with pytest.raises(CheckpointError) as e:
        ctxrep.load_model(tmp_path)
    msg = str(e.value)
    assert "encoder.layer.0.attention.self.extra.weight" in msg
    assert "missing 1 weights: encoder.layer.1.output.dense.bias" in msg
    assert "embeddings.LayerNorm.weight (5,) (expected (32,))" in msg


def test_corrupt_or_missing_weights_give_a_clear_error(tiny_models, tmp_path):
    shutil.copy(tiny_models["bert"] / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no weights found: expected model.safetensors or pytorch_model.bin"):
        ctxrep.load_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(CheckpointError, match="corrupt or unreadable safetensors file"):
        ctxrep.load_model(tmp_path)


def test_unsupported_model_type_and_position_type(tiny_models, tmp_path):
    cfg = json.loads((tiny_models["bert"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="model_type 'mamba', which ctxrep cannot load; it loads bert, ") as e:
        ctxrep.load_model(tmp_path)
    assert "ctxrep-albert" not in str(e.value) and "ctxrep_mt" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="relative_key"):
        BertConfig.from_hf_dict(cfg | {"position_embedding_type": "relative_key"})


def test_too_long_input_is_refused_with_advice():
    model = BertModel(
        BertConfig(
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
            max_position_embeddings=16,
            vocab_size=50,
        )
    )
    with pytest.raises(ValueError, match="longer than the model's 16 positions; ctxrep.Featurizer splits"):
        model(torch.ones(1, 17, dtype=torch.long))
