"""Pretraining objectives: masking arithmetic, parity of losses and heads with transformers, Hugging Face round
trips, ELECTRA's replaced-token detection, the causal LM, short training runs, and the errors users see."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

import ctxrep  # noqa: E402
from ctxrep.models.bert import BertConfig  # noqa: E402
from ctxrep.models.gpt2 import GPT2Config  # noqa: E402
from ctxrep.objectives.causal_lm import CausalLMObjective  # noqa: E402
from ctxrep.objectives.electra import (  # noqa: E402
    ElectraObjective,
    ElectraObjectiveConfig,
    discriminator_loss,
    generator_config,
    replace_tokens,
)
from ctxrep.objectives.masked_lm import (  # noqa: E402
    BatchMasker,
    MaskedLMConfig,
    MaskedLMObjective,
    mask_tokens,
    word_start_table,
)
from ctxrep.objectives.next_sentence import next_sentence_loss  # noqa: E402
from ctxrep.text.tokenizer import Tokenizer  # noqa: E402

VOCAB = 60
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIALS = (PAD, CLS, SEP, MASK)
TOL = 1e-5


def mlm_config(**overrides) -> MaskedLMConfig:
    return MaskedLMConfig(**(dict(mask_token_id=MASK, special_token_ids=SPECIALS) | overrides))


def bert_config(model_type: str = "bert", **overrides) -> BertConfig:
    kwargs = dict(
        model_type=model_type,
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
        pad_token_id=PAD if model_type != "roberta" else 1,
    )
    return BertConfig(**(kwargs | overrides))


def make_batch(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """[CLS] tokens... [SEP] rows padded on the right to the longest; token ids >= 4 (no specials inside)."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.full((len(lengths), t), PAD)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, VOCAB, (n,), generator=g)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
    types = torch.zeros_like(ids)
    types[:, t // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


def special_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.isin(batch["input_ids"], torch.tensor(SPECIALS)) | ~batch["attention_mask"].bool()


# ---- mask_tokens: selection and corruption arithmetic ------------------------------------------------------------


def test_exact_number_of_selected_positions_and_specials_never_selected():
    # Candidates per row: 22 - 2 = 20 -> round(3.0) = 3; 12 - 2 = 10 -> round(1.5) = 2 (half to even, like
    # Python's round); 5 - 2 = 3 -> round(0.45) = 0 -> max(1, 0) = 1; [CLS] [SEP] alone has nothing to select.
    batch = make_batch([22, 12, 5, 2])
    special = special_mask(batch)
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        masked, labels = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config(), generator=g)
        selected = labels != -100
        assert selected.sum(1).tolist() == [3, 2, 1, 0]
        assert not bool((selected & special).any())
        assert torch.equal(labels[selected], batch["input_ids"][selected])
        assert torch.equal(masked[~selected], batch["input_ids"][~selected])  # only selected tokens change


def test_same_generator_seed_gives_the_same_mask_and_global_rng_is_used_when_none():
    batch = make_batch([30, 30])
    special = special_mask(batch)
    a = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config(), torch.Generator().manual_seed(5))
    b = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config(), torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    torch.manual_seed(7)
    c = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config())
    torch.manual_seed(7)
    d = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config())
    e = mask_tokens(batch["input_ids"], special, VOCAB, MASK, mlm_config())  # RNG advanced: another mask
    assert torch.equal(c[1], d[1]) and not torch.equal(d[1], e[1])


def test_80_10_10_split_over_many_draws():
    vocab = 1000
    ids = torch.randint(4, vocab, (400, 50), generator=torch.Generator().manual_seed(0))
    special = torch.zeros_like(ids, dtype=torch.bool)
    g = torch.Generator().manual_seed(1)
    masked, labels = mask_tokens(ids, special, vocab, MASK, mlm_config(mask_prob=0.5), g)
    selected = labels != -100
    n = int(selected.sum())
    assert n == 400 * 25
    to_mask = float((masked[selected] == MASK).sum()) / n
    kept = float((masked[selected] == ids[selected]).sum()) / n
    randomised = 1.0 - to_mask - kept
    # n = 10000 draws: the standard deviation of a 0.1 share is 0.003, of a 0.8 share 0.004; bounds are ~5 sd.
    # A random token equals the original (or [MASK]) with probability 1/1000, which moves shares by 1e-4.
    assert abs(to_mask - 0.8) < 0.02
    assert abs(kept - 0.1) < 0.015
    assert abs(randomised - 0.1) < 0.015
    random_tokens = masked[selected & (masked != MASK) & (masked != ids)]
    assert abs(float(random_tokens.float().mean()) - (vocab - 1) / 2) < 40  # uniform over the vocabulary


def test_probabilities_of_the_config_are_used():
    ids = torch.randint(4, VOCAB, (50, 40), generator=torch.Generator().manual_seed(0))
    special = torch.zeros_like(ids, dtype=torch.bool)
    cfg = mlm_config(mask_prob=1.0, replace_prob=1.0, random_prob=0.0)
    masked, labels = mask_tokens(ids, special, VOCAB, MASK, cfg, torch.Generator().manual_seed(0))
    assert bool((labels == ids).all()) and bool((masked == MASK).all())
    cfg = mlm_config(mask_prob=1.0, replace_prob=0.0, random_prob=0.0)  # BERT's "keep" only
    masked, _ = mask_tokens(ids, special, VOCAB, MASK, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(masked, ids)


def test_whole_word_masking_selects_all_pieces_of_a_word_together():
    # Words of 1..4 pieces: starts marks the first piece of each word.
    pattern = [1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1] * 3
    t = len(pattern) + 2
    ids = torch.randint(4, VOCAB, (8, t), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = CLS, SEP
    starts = torch.tensor([1] + pattern + [1], dtype=torch.bool).expand(8, t)
    special = torch.isin(ids, torch.tensor(SPECIALS))
    word = starts.long().cumsum(1)  # (batch, seq) word index of each piece
    target = max(1, round(len(pattern) * 0.15))  # 42 candidates -> 6
    cfg = mlm_config(whole_word=True)
    for seed in range(30):
        g = torch.Generator().manual_seed(seed)
        _, labels = mask_tokens(ids, special, VOCAB, MASK, cfg, g, word_starts=starts)
        selected = labels != -100
        for row in range(8):
            chosen_words = set(word[row][selected[row]].tolist())
            assert chosen_words, "at least one word is always selected"
            for w in chosen_words:  # every piece of a chosen word is selected
                assert bool(selected[row][word[row] == w].all())
            assert int(selected[row].sum()) <= target
            assert not bool(selected[row, 0]) and not bool(selected[row, -1])


def test_word_start_table_from_wordpiece_and_byte_level_bpe(minilm_path, tmp_path):
    from conftest import _roberta_tokenizer

    tok = Tokenizer.from_model_dir(minilm_path)
    pieces = tok.backend.encode(["unaffable", "words"], is_pretokenized=True, add_special_tokens=False)
    assert pieces.tokens == ["una", "##ffa", "##ble", "words"]
    table = word_start_table(tok)
    assert table[pieces.ids].tolist() == [True, False, False, True]
    assert bool(table[[0, 100, 101, 102, 103]].all())  # specials count as word starts

    _roberta_tokenizer(tmp_path)
    bpe = Tokenizer.from_model_dir(tmp_path)
    enc = bpe.backend.encode(["Contextual", "vectors"], is_pretokenized=True, add_special_tokens=False)
    table = word_start_table(bpe)
    assert [t.startswith("Ġ") for t in enc.tokens] == table[enc.ids].tolist()
    assert table[enc.ids].sum() == 2


def test_mlm_config_from_tokenizer(minilm_path):
    cfg = MaskedLMConfig.from_tokenizer(Tokenizer.from_model_dir(minilm_path), whole_word=True)
    assert cfg.mask_token_id == 103 and cfg.special_token_ids == (0, 100, 101, 102, 103) and cfg.whole_word


def test_static_masking_repeats_one_of_n_masks_whatever_the_batch():
    batch = make_batch([40, 30, 25])  # long enough that two copies picking the same positions is unlikely
    masker = BatchMasker(mlm_config(static_copies=3), VOCAB)
    seen: dict[int, set] = {0: set(), 1: set(), 2: set()}
    torch.manual_seed(0)
    for _ in range(40):
        _, labels = masker(batch["input_ids"], batch["attention_mask"])
        for row in range(3):
            seen[row].add(tuple(labels[row].tolist()))
    assert [len(s) for s in seen.values()] == [3, 3, 3]
    # The same sequence in another batch (other position, other padding) gets one of the same masks.
    n = 30
    alone = {"input_ids": batch["input_ids"][1:2, :n], "attention_mask": batch["attention_mask"][1:2, :n]}
    for _ in range(10):
        _, labels = masker(alone["input_ids"], alone["attention_mask"])
        assert tuple(labels[0].tolist()) + (-100,) * (40 - n) in seen[1]
    # Dynamic masking draws a fresh mask each time.
    dynamic = BatchMasker(mlm_config(), VOCAB)
    masks = {tuple(dynamic(batch["input_ids"], batch["attention_mask"])[1][0].tolist()) for _ in range(40)}
    assert len(masks) > 10


# ---- MaskedLMObjective: parity with transformers and round trips ---------------------------------------------------


def masked_inputs(batch: dict[str, torch.Tensor], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return mask_tokens(batch["input_ids"], special_mask(batch), VOCAB, MASK, mlm_config(mask_prob=0.3), g)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_mlm_loss_matches_transformers_and_decoder_sees_only_selected_positions(tmp_path, model_type):
    torch.manual_seed(0)
    obj = MaskedLMObjective(bert_config(model_type), mlm_config()).eval()
    with torch.no_grad():  # a nonzero bias, so that saving it under the right name matters
        obj.head.bias.normal_()
    batch = make_batch([18, 11, 15])
    if model_type == "roberta":  # RoBERTa pads with 1
        batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 1)
        batch["token_type_ids"].zero_()
    masked, labels = masked_inputs(batch)
    decoder_inputs = []
    hook = obj.head.decoder.register_forward_hook(lambda m, i, o: decoder_inputs.append(i[0].shape))
    out = obj.loss(masked, labels, batch["attention_mask"], batch["token_type_ids"])
    hook.remove()
    assert decoder_inputs == [torch.Size([int((labels != -100).sum()), 32])]  # (selected, embedding), not (b*t, .)

    obj.save_pretrained(tmp_path)
    cls = transformers.BertForMaskedLM if model_type == "bert" else transformers.RobertaForMaskedLM
    ref = cls.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = ref(
            input_ids=masked,
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=labels,
        ).loss
    assert abs(out.loss.item() - float(expected)) < TOL
    assert out.metrics["mlm_loss"] == pytest.approx(float(expected), abs=TOL)
    assert out.num_tokens == int(batch["attention_mask"].sum())


def test_bert_pretraining_with_nsp_matches_transformers(tmp_path):
    torch.manual_seed(0)
    obj = MaskedLMObjective(bert_config(), mlm_config(), nsp=True).eval()
    batch = make_batch([18, 11, 15])
    nsp_labels = torch.tensor([0, 1, 1])
    masked, labels = masked_inputs(batch, seed=3)
    out = obj.loss(masked, labels, batch["attention_mask"], batch["token_type_ids"], nsp_labels)
    obj.save_pretrained(tmp_path)
    ref = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        r = ref(
            input_ids=masked,
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=labels,
            next_sentence_label=nsp_labels,
        )
        enc = obj.encoder(masked, attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"])
        nsp_logits = obj.nsp_head(enc.pooler_output)
    assert torch.allclose(nsp_logits, r.seq_relationship_logits, atol=TOL)
    assert abs(out.loss.item() - float(r.loss)) < TOL  # transformers' total: MLM + NSP
    expected_nsp = F.cross_entropy(r.seq_relationship_logits, nsp_labels)
    assert out.metrics["nsp_loss"] == pytest.approx(float(expected_nsp), abs=TOL)

    # ctxrep.load_model loads the encoder (the heads are left out) with the same hidden states.
    loaded = ctxrep.load_model(tmp_path)
    with torch.no_grad():
        again = loaded(masked, attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"])
    assert torch.allclose(again.last_hidden_state, enc.last_hidden_state, atol=TOL)
    assert torch.allclose(again.pooler_output, enc.pooler_output, atol=TOL)


def test_next_sentence_loss_known_answer():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    # Row 0: uniform -> log 2. Row 1, label NotNext (1): p = 1 / (3 + 1) -> log 4.
    expected = (math.log(2.0) + math.log(4.0)) / 2
    assert float(next_sentence_loss(logits, torch.tensor([0, 1]))) == pytest.approx(expected, abs=1e-6)


def test_forward_masks_with_the_global_rng_reproducibly():
    torch.manual_seed(0)
    obj = MaskedLMObjective(bert_config(), mlm_config(), nsp=True).eval()
    batch = make_batch([18, 11]) | {"next_sentence_label": torch.tensor([0, 1])}
    torch.manual_seed(11)
    a = obj(batch)
    torch.manual_seed(11)
    b = obj(batch)
    assert a.loss.item() == b.loss.item()
    torch.manual_seed(11)
    masked, labels = obj.masker(batch["input_ids"], batch["attention_mask"])
    c = obj.loss(masked, labels, batch["attention_mask"], batch["token_type_ids"], batch["next_sentence_label"])
    assert c.loss.item() == a.loss.item()
    assert a.metrics["masked_tokens"] == 2 + 1  # 16 candidates -> round(2.4) = 2; 9 -> round(1.35) = 1


# ---- ELECTRA --------------------------------------------------------------------------------------------------------


def electra_config(**overrides) -> BertConfig:
    return bert_config("electra", add_pooling_layer=False, **overrides)


def test_generator_is_scaled_by_the_fraction_and_shares_the_embeddings():
    disc = electra_config(hidden_size=64, embedding_size=32, intermediate_size=128)
    gen = generator_config(disc, 0.25)
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (16, 1, 32)
    assert (gen.embedding_size, gen.num_hidden_layers, gen.vocab_size) == (32, 2, VOCAB)
    obj = ElectraObjective(disc, ElectraObjectiveConfig(mlm=mlm_config()))
    d, g = obj.discriminator.embeddings, obj.generator.embeddings
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings", "norm"):
        assert getattr(d, name) is getattr(g, name)
    assert obj.generator_head.decoder.weight is d.word_embeddings.weight
    assert d.project is not None and g.project is not None and d.project is not g.project  # 32 -> 64 and 32 -> 16


def test_replaced_token_labels_and_discriminator_loss_known_answer():
    input_ids = torch.tensor([[1, 10, 11, 12, 2], [1, 20, 21, 2, 0]])
    labels = torch.tensor([[-100, 10, -100, 12, -100], [-100, -100, 21, -100, -100]])
    sampled = torch.tensor([33, 12, 21])  # row 0: 10 -> 33 (replaced), 12 -> 12 (same: original); row 1: 21 -> 21
    corrupted, is_replaced = replace_tokens(input_ids, labels, sampled)
    assert corrupted.tolist() == [[1, 33, 11, 12, 2], [1, 20, 21, 2, 0]]
    assert is_replaced.tolist() == [[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]

    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    logits = torch.zeros(2, 5)
    logits[0, 1] = math.log(3.0)  # replaced, p = 3/4 -> BCE log(4/3)
    logits[1, 4] = 100.0  # padding: ignored
    # 9 real tokens: 8 at logit 0 (log 2 each) and one at log(4/3).
    expected_disc = (8 * math.log(2.0) + math.log(4.0 / 3.0)) / 9
    disc = discriminator_loss(logits, is_replaced, attention_mask)
    assert float(disc) == pytest.approx(expected_disc, abs=1e-6)


def test_electra_forward_with_a_fixed_generator_output():
    torch.manual_seed(0)
    obj = ElectraObjective(electra_config(), ElectraObjectiveConfig(mlm=mlm_config(mask_prob=0.3))).eval()
    with torch.no_grad():  # the generator's softmax puts all its mass on token 7
        obj.generator_head.bias.fill_(-1e4)
        obj.generator_head.bias[7] = 1e4
    batch = make_batch([16, 12, 9])
    batch["input_ids"][0, 3] = 7  # make sure some originals equal the forced sample
    batch["input_ids"][:, 1:8] = torch.where(batch["attention_mask"][:, 1:8] == 1, 7, batch["input_ids"][:, 1:8])
    torch.manual_seed(5)
    out = obj(batch)
    torch.manual_seed(5)
    _, labels = obj.masker(batch["input_ids"], batch["attention_mask"])
    selected = labels != -100
    expected_replaced = selected & (batch["input_ids"] != 7)
    assert out.metrics["masked_tokens"] == float(selected.sum())
    assert out.metrics["replaced_tokens"] == float(expected_replaced.sum())
    assert 0 < out.metrics["replaced_tokens"] < out.metrics["masked_tokens"]  # both cases happen

    corrupted = batch["input_ids"].masked_fill(selected, 7)
    with torch.no_grad():
        h = obj.discriminator(corrupted, batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        disc = discriminator_loss(obj.discriminator_head(h), expected_replaced.long(), batch["attention_mask"])
    assert out.metrics["discriminator_loss"] == pytest.approx(float(disc), abs=1e-6)
    expected_total = out.metrics["generator_loss"] + 50.0 * out.metrics["discriminator_loss"]
    assert out.loss.item() == pytest.approx(expected_total, rel=1e-6)
    assert out.num_tokens == 16 + 12 + 9


def test_sampling_does_not_backpropagate_into_the_generator_from_the_discriminator():
    torch.manual_seed(0)
    obj = ElectraObjective(electra_config(), ElectraObjectiveConfig(mlm=mlm_config(), disc_weight=1.0))
    batch = make_batch([16, 12])
    torch.manual_seed(1)
    obj(batch).loss.backward()
    with_gen = obj.generator.layers[0].intermediate.weight.grad.clone()
    obj.zero_grad()
    # With lambda = 0 the generator's gradient is the same: nothing reaches it through the sampled tokens.
    obj.config.disc_weight = 0.0
    torch.manual_seed(1)
    obj(batch).loss.backward()
    assert torch.allclose(obj.generator.layers[0].intermediate.weight.grad, with_gen, atol=1e-7)


def test_electra_saves_the_discriminator_for_transformers_and_ctxrep(tmp_path):
    torch.manual_seed(0)
    obj = ElectraObjective(electra_config(embedding_size=16), ElectraObjectiveConfig(mlm=mlm_config())).eval()
    obj.save_pretrained(tmp_path)
    batch = make_batch([16, 12])
    ref = transformers.ElectraForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        h = obj.discriminator(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        ours = obj.discriminator_head(h)
        theirs = ref(**batch).logits
    assert ref.config.model_type == "electra" and ref.config.embedding_size == 16
    real = batch["attention_mask"].bool()  # an unpadded batch (>= 10% padding) has 0 at padding
    assert torch.allclose(ours[real], theirs[real], atol=TOL)
    loaded = ctxrep.load_model(tmp_path)
    with torch.no_grad():
        again = loaded(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
    assert torch.allclose(again, h, atol=TOL)
    assert not any(k.startswith("generator") for k in transformers.AutoModel.from_pretrained(tmp_path).state_dict())


# ---- causal LM ------------------------------------------------------------------------------------------------------


def gpt2_config() -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=0.2,
        bos_token_id=2,
        eos_token_id=2,
    )


def test_causal_lm_loss_ignores_padding_and_loads_in_transformers(tmp_path):
    torch.manual_seed(0)
    obj = CausalLMObjective(gpt2_config()).eval()
    batch = make_batch([12, 7])
    del batch["token_type_ids"]
    out = obj(batch)
    obj.save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        r = ref(**batch, labels=labels)
        ours = obj.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()  # an unpadded batch (>= 10% padding) has logits 0 at padding
    assert torch.allclose(ours[real], r.logits[real], atol=TOL)
    assert abs(out.loss.item() - float(r.loss)) < TOL
    # Known answer: the mean over the 11 + 6 real next tokens, padding never a target.
    logp = ours.log_softmax(-1)
    terms = [-logp[b, i, batch["input_ids"][b, i + 1]] for b, n in enumerate([12, 7]) for i in range(n - 1)]
    assert out.loss.item() == pytest.approx(float(torch.stack(terms).mean()), abs=TOL)
    assert out.num_tokens == 19


# ---- 30 Adam steps on a tiny repeated batch --------------------------------------------------------------------------


def train(objective: torch.nn.Module, batch: dict[str, torch.Tensor], steps: int = 30) -> list[float]:
    opt = torch.optim.Adam(objective.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        out = objective(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    return losses


@pytest.mark.parametrize("name", ["mlm", "mlm+nsp", "electra", "causal"])
def test_training_decreases_the_loss(name):
    torch.manual_seed(0)
    batch = make_batch([20, 20, 16, 12])
    static = mlm_config(static_copies=1)  # the same mask every step: a fixed target
    if name == "mlm":
        objective = MaskedLMObjective(bert_config(initializer_range=0.02), static)
    elif name == "mlm+nsp":
        objective = MaskedLMObjective(bert_config(initializer_range=0.02), static, nsp=True)
        batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    elif name == "electra":
        objective = ElectraObjective(electra_config(initializer_range=0.02), ElectraObjectiveConfig(mlm=static))
    else:
        objective = CausalLMObjective(gpt2_config())
    losses = train(objective.train(), batch)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.85 * first, losses


# ---- errors users see ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(mask_prob=0.0), "mask_prob must be in (0, 1]"),
        (dict(replace_prob=0.8, random_prob=0.3), "sum to at most 1"),
        (dict(static_copies=0), "static_copies must be None"),
        (dict(mask_token_id=None), "MaskedLMConfig.from_tokenizer"),
        (dict(mask_token_id=VOCAB), "outside the vocabulary"),
    ],
)
def test_bad_masking_configs_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        MaskedLMObjective(bert_config(), mlm_config(**overrides))
    assert message in str(e.value)


def test_bad_objective_setups_are_refused():
    with pytest.raises(ValueError, match="RoBERTa dropped it"):
        MaskedLMObjective(bert_config("roberta"), mlm_config(), nsp=True)
    with pytest.raises(ValueError, match="set add_pooling_layer=True"):
        MaskedLMObjective(bert_config(add_pooling_layer=False), mlm_config(), nsp=True)
    with pytest.raises(ValueError, match="ElectraObjective"):
        MaskedLMObjective(bert_config("electra"), mlm_config())
    with pytest.raises(ValueError, match="word_start=word_start_table"):
        MaskedLMObjective(bert_config(), mlm_config(whole_word=True))
    with pytest.raises(ValueError, match="model_type='electra'"):
        ElectraObjective(bert_config(), ElectraObjectiveConfig(mlm=mlm_config()))
    with pytest.raises(ValueError, match="ELECTRA has no pooler"):
        ElectraObjective(bert_config("electra"), ElectraObjectiveConfig(mlm=mlm_config()))
    with pytest.raises(ValueError, match="does not divide"):
        generator_config(electra_config(hidden_size=32, num_attention_heads=8), 0.4)  # 13 hidden, 3 heads
    with pytest.raises(ValueError, match="generator_size_fraction must be in"):
        generator_config(electra_config(), 0.0)


def test_bad_batches_are_refused():
    torch.manual_seed(0)
    obj = MaskedLMObjective(bert_config(), mlm_config(), nsp=True)
    batch = make_batch([10, 8])
    with pytest.raises(ValueError, match="has no next_sentence_label.*SegmentPairPacker"):
        obj(batch)
    with pytest.raises(ValueError, match="must be 0 .B follows A. or 1"):
        obj(batch | {"next_sentence_label": torch.tensor([0, 2])})
    with pytest.raises(ValueError, match="one label per sequence"):
        obj(batch | {"next_sentence_label": torch.tensor([0, 1, 1])})
    with pytest.raises(ValueError, match="must both be .batch, seq."):
        obj(batch | {"attention_mask": batch["attention_mask"][:, :-1]})
    with pytest.raises(ValueError, match="special_tokens_mask has shape"):
        mask_tokens(batch["input_ids"], special_mask(batch)[:1], VOCAB, MASK, mlm_config())
    with pytest.raises(ValueError, match="whole_word=True needs word_starts"):
        mask_tokens(batch["input_ids"], special_mask(batch), VOCAB, MASK, mlm_config(whole_word=True))
    with pytest.raises(ValueError, match="no next token to predict"):
        CausalLMObjective(gpt2_config())({"input_ids": torch.tensor([[5], [6]])})
