"""The encoder interface's depth and capability members (models/encoder.py), on a tiny model of every family.

Every parameter of every family has a depth in 0..L; blocks sit above 0 (ALBERT's shared blocks and Marian's
encoder.layers included: the depth was once guessed from parameter names and missed them); names that are not
parameters are refused in one line. Capabilities say what a tool may do, and do it: prune_heads removes heads,
the fusable attention modules hold query/key/value, init_student builds a smaller model of the same family whose
layers are copies. The tools' side (discriminative learning rates, gradual unfreezing) is checked on ALBERT.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctxrep.models.albert import AlbertConfig, AlbertModel
from ctxrep.models.bert import BertConfig, BertModel
from ctxrep.models.deberta_v2 import DebertaV2Config, DebertaV2Model
from ctxrep.models.distilbert import DistilBertConfig, DistilBertModel
from ctxrep.models.elmo import Elmo, ElmoBiLM, ElmoConfig
from ctxrep.models.encoder import Encoder
from ctxrep.models.gpt2 import GPT2Config, GPT2Model
from ctxrep.models.marian import MarianConfig, MarianMTModel
from ctxrep.models.modernbert import ModernBertConfig, ModernBertModel
from ctxrep.models.mpnet import MPNetConfig, MPNetModel
from ctxrep.models.student import check_distillable, distillable_families, init_student
from ctxrep.models.t5 import T5Config, T5EncoderModel
from ctxrep.models.xlnet import XLNetConfig, XLNetModel
from ctxrep.tasks.network import Representation, TaskNetwork, encoder_depths, network_depths, unfreeze_from_top


def _bert(model_type: str) -> BertModel:
    return BertModel(
        BertConfig(
            model_type=model_type,
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=24,
            max_position_embeddings=40,
            pad_token_id=1 if model_type in ("roberta", "xlm-roberta", "camembert") else 0,
            embedding_size=8 if model_type == "electra" else None,
            add_pooling_layer=model_type != "electra",
        )
    )


def _albert(share: str, groups: int = 1) -> AlbertModel:
    return AlbertModel(
        AlbertConfig(
            vocab_size=40,
            embedding_size=8,
            hidden_size=16,
            num_hidden_layers=4,
            num_hidden_groups=groups,
            num_attention_heads=4,
            intermediate_size=24,
            max_position_embeddings=32,
            share=share,
        )
    )


def _marian(pre_ln: bool = False, shared: bool = True) -> MarianMTModel:
    return MarianMTModel(
        MarianConfig(
            vocab_size=30,
            decoder_vocab_size=30 if shared else 20,
            d_model=16,
            encoder_layers=3,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=24,
            decoder_ffn_dim=24,
            max_position_embeddings=32,
            share_encoder_decoder_embeddings=shared,
            tie_word_embeddings=shared,
            normalize_before=pre_ln,
        )
    )


def _elmo_bilm() -> ElmoBiLM:
    config = ElmoConfig(filters=[(1, 4), (2, 8)], n_highway=1, lstm_dim=24, projection_dim=8, n_layers=2)
    return ElmoBiLM(config)


BUILDERS = {
    "bert": lambda: _bert("bert"),
    "roberta": lambda: _bert("roberta"),
    "electra": lambda: _bert("electra"),
    "albert-all": lambda: _albert("all"),
    "albert-all-2-groups": lambda: _albert("all", groups=2),
    "albert-attention": lambda: _albert("attention"),
    "albert-ffn": lambda: _albert("ffn"),
    "albert-none": lambda: _albert("none"),
    "gpt2": lambda: GPT2Model(GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=3, n_head=4)),
    "xlnet": lambda: XLNetModel(XLNetConfig(vocab_size=40, d_model=16, n_layer=3, n_head=4, d_inner=24)),
    "marian": lambda: _marian(),
    "marian-pre-ln-two-vocabularies": lambda: _marian(pre_ln=True, shared=False),
    "elmo": _elmo_bilm,
    # issue 25's families
    "xlm-roberta": lambda: _bert("xlm-roberta"),
    "camembert": lambda: _bert("camembert"),
    "distilbert": lambda: DistilBertModel(
        DistilBertConfig(vocab_size=40, max_position_embeddings=40, n_layers=3, n_heads=4, dim=16, hidden_dim=24)
    ),
    "mpnet": lambda: MPNetModel(
        MPNetConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=24,
            max_position_embeddings=40,
        )
    ),
    "t5": lambda: T5EncoderModel(
        T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=3, num_heads=4, feed_forward_proj="gated-gelu")
    ),
    "deberta-v2": lambda: DebertaV2Model(  # v3's shape: shared keys, log buckets, LayerNorm-ed relative table
        DebertaV2Config(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=24,
            max_position_embeddings=40,
            relative_attention=True,
            position_buckets=4,
            pos_att_type="p2c|c2p",
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
        )
    ),
    "modernbert": lambda: ModernBertModel(
        ModernBertConfig(
            vocab_size=40,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=40,
            local_attention=2,
            pad_token_id=0,
        )
    ),
}


@pytest.fixture(params=sorted(BUILDERS))
def encoder(request) -> Encoder:
    torch.manual_seed(0)
    return BUILDERS[request.param]()


# ---- depth ---------------------------------------------------------------------------------------------------------


def test_every_parameter_has_a_depth_and_every_layer_has_parameters(encoder):
    depth = encoder_depths(encoder)
    names = [name for name, _ in encoder.named_parameters()]
    assert list(depth) == names
    L = encoder.num_layers
    assert set(depth.values()) <= set(range(L + 1))
    assert 0 in depth.values(), "the embeddings (ELMo: the char CNN) sit at depth 0"
    if not isinstance(encoder, AlbertModel) or encoder.config.share == "none":
        assert set(range(1, L + 1)) <= set(depth.values()), "each layer owns parameters at its own depth"
    blocks = [n for n in names if n.split(".")[0] in ("layers", "h", "attention_blocks", "ffn_blocks", "encoder")]
    blocks += [n for n in names if n.split(".")[0] in ("forward_layers", "backward_layers")]
    assert blocks and all(depth[n] >= 1 for n in blocks), {n: depth[n] for n in blocks if depth[n] < 1}


def test_a_name_that_is_not_a_parameter_is_refused_in_one_line(encoder):
    for name in ("nonsense.weight", "layers.99.weight", "pooler_x"):
        with pytest.raises(ValueError, match="is not a parameter of this") as e:
            encoder.layer_of(name)
        assert "\n" not in str(e.value)


def test_the_base_class_does_not_guess():
    class Bare(Encoder):
        family = "bare"

    with pytest.raises(NotImplementedError, match="layer_of"):
        Bare().layer_of("anything")


@pytest.mark.parametrize(
    "share, groups, expected",
    [
        # 4 layer runs; a shared block's depth is the highest layer that runs it
        ("all", 1, {"attention_blocks.0": 4, "ffn_blocks.0": 4}),
        ("all", 2, {"attention_blocks.0": 2, "attention_blocks.1": 4, "ffn_blocks.0": 2, "ffn_blocks.1": 4}),
        ("attention", 1, {"attention_blocks.0": 4, "ffn_blocks.0": 1, "ffn_blocks.3": 4}),
        ("ffn", 1, {"attention_blocks.0": 1, "attention_blocks.2": 3, "ffn_blocks.0": 4}),
        ("none", 1, {"attention_blocks.1": 2, "ffn_blocks.2": 3}),
    ],
)
def test_albert_blocks_sit_at_the_highest_layer_that_uses_them(share, groups, expected):
    model = _albert(share, groups)
    for block, d in expected.items():
        assert model.layer_of(f"{block}.query.weight" if "attention" in block else f"{block}.ffn.weight") == d
    assert model.layer_of("embedding_hidden_mapping_in.weight") == 0 and model.layer_of("pooler.bias") == 4


def test_marian_depths_are_the_encoder_sides():
    model = _marian(pre_ln=True, shared=False)
    assert model.layer_of("shared.weight") == 0
    assert model.layer_of("encoder.layers.0.fc1.weight") == 1 and model.layer_of("encoder.layers.2.fc2.bias") == 3
    for above in ("encoder.layer_norm.weight", "decoder.layers.0.fc1.weight", "decoder_embed_tokens.weight"):
        assert model.layer_of(above) == 3, above


def test_elmo_wrapper_adds_its_mixes_at_the_top():
    bilm = _elmo_bilm()
    elmo = Elmo(bilm, num_output_representations=2, freeze=False)
    depth = encoder_depths(elmo)
    assert depth["scalar_mixes.1.gamma"] == 2
    assert {d for n, d in depth.items() if n.startswith("bilm.char_cnn.")} == {0}
    assert {d for n, d in depth.items() if n.startswith("bilm.backward_layers.1.")} == {2}


# ---- the tools: discriminative learning rates and gradual unfreezing on ALBERT ------------------------------------


class _Head(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2)

    def forward(self, x, batch):
        return self.linear(x[:, 0])


def _network(encoder: Encoder) -> TaskNetwork:
    return TaskNetwork(Representation("finetune", encoder=encoder, dropout=0.0), _Head(encoder.hidden_size))


def test_discriminative_lr_gives_albert_blocks_their_layer_rates():
    from ctxrep.tasks.network import make_optimizer

    network = _network(_albert("attention"))
    depth, top = network_depths(network)
    assert top == 4
    groups = make_optimizer(network, 1e-3, 0.01, discriminative_lr_factor=2.0).param_groups
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    enc = network.representation.encoder
    assert lr_of[id(enc.embeddings.word_embeddings.weight)] == pytest.approx(1e-3 / 2**4)
    assert lr_of[id(enc.attention_blocks[0].query.weight)] == pytest.approx(1e-3), "shared: the top layer's rate"
    for i in range(4):
        assert lr_of[id(enc.ffn_blocks[i].ffn.weight)] == pytest.approx(1e-3 / 2 ** (3 - i)), i


def test_gradual_unfreezing_reaches_albert_blocks_from_the_first_epoch():
    network = _network(_albert("all", groups=2))
    enc = network.representation.encoder
    unfreeze_from_top(network, 0)
    assert not any(p.requires_grad for p in enc.parameters()), "epoch 0: the head only"
    unfreeze_from_top(network, 1)  # the top layer: run by group 1's blocks
    assert enc.attention_blocks[1].query.weight.requires_grad and enc.ffn_blocks[1].ffn.weight.requires_grad
    assert not enc.attention_blocks[0].query.weight.requires_grad
    unfreeze_from_top(network, 3)  # layers 2..4: group 0 runs layer 2
    assert enc.attention_blocks[0].query.weight.requires_grad
    assert not enc.embeddings.word_embeddings.weight.requires_grad
    unfreeze_from_top(network, 5)
    assert all(p.requires_grad for p in enc.parameters())


# ---- capabilities --------------------------------------------------------------------------------------------------


def test_capabilities_are_declared_by_the_families_that_have_them():
    assert BertModel.can_prune_heads and not any(c.can_prune_heads for c in (AlbertModel, GPT2Model, XLNetModel))
    assert not MarianMTModel.can_prune_heads and not ElmoBiLM.can_prune_heads
    assert all(c.can_distill for c in (BertModel, GPT2Model, XLNetModel))
    assert not any(c.can_distill for c in (AlbertModel, MarianMTModel, ElmoBiLM))
    assert {"bert", "roberta", "electra", "gpt2", "xlnet"} <= set(distillable_families())
    assert not {"albert", "marian", "elmo"} & set(distillable_families())


def test_prune_heads_where_declared_and_refused_elsewhere(encoder):
    if encoder.can_prune_heads:
        encoder.prune_heads({0: [1]})
        assert encoder.heads_per_layer()[0] == encoder.num_heads - 1 and encoder.kept_heads()[0][0] == 0
        mask = torch.ones(encoder.num_layers, encoder.num_heads)
        encoder(torch.tensor([[2, 3, 4]]), head_mask=mask)  # forward takes the mask variables
    else:
        with pytest.raises(ValueError, match="cannot have attention heads removed") as e:
            encoder.prune_heads({0: [1]})
        assert "\n" not in str(e.value)


def test_fusable_qkv_modules_hold_three_projections_of_one_input(encoder):
    names = encoder.fusable_qkv_modules()
    assert (len(names) > 0) == isinstance(encoder, (BertModel, DistilBertModel, MPNetModel))
    for name in names:
        module = encoder.get_submodule(name)
        assert all(isinstance(getattr(module, p), nn.Linear) for p in ("query", "key", "value"))
        assert module.query_key_value is None  # the slot the fast path fills


def _run(encoder: Encoder, ids: torch.Tensor) -> torch.Tensor:
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return encoder.eval().encode(batch).last_hidden_state


def test_a_student_copies_the_chosen_layers_or_is_refused(encoder):
    if not encoder.can_distill:
        with pytest.raises(ValueError, match="cannot be distilled") as e:
            check_distillable(encoder)
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="cannot teach a student"):
            encoder.init_student([0])
        return
    L = encoder.num_layers
    student = init_student(encoder, [0, L - 1])
    assert type(student) is type(encoder) and student.family == encoder.family and student.num_layers == 2
    own = dict(encoder.named_parameters())
    for name, p in student.named_parameters():
        parts = name.split(".")
        if len(parts) > 2 and parts[1].isdigit():  # a block: student layer j came from teacher layer layers[j]
            parts[1] = str([0, L - 1][int(parts[1])])
        torch.testing.assert_close(p, own[".".join(parts)], atol=0, rtol=0, msg=name)
    ids = torch.tensor([[2, 5, 7, 9]])
    whole = encoder.init_student(list(range(L)))  # every layer: the teacher itself
    torch.testing.assert_close(_run(whole, ids), _run(encoder, ids), atol=0, rtol=0)
    narrow = encoder.init_student([0], hidden_size=8)
    assert narrow.hidden_size == 8 and narrow.num_heads == encoder.num_heads and narrow.num_layers == 1
    assert _run(narrow, ids).shape == (1, 4, 8)
    with pytest.raises(ValueError, match="wider than the teacher's 16"):
        encoder.init_student([0], hidden_size=32)
    with pytest.raises(ValueError, match="increasing and distinct"):
        encoder.init_student([1, 0])
