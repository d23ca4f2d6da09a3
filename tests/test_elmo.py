"""ELMo: character ids, the official weight layout, the biLM's equations, round trips and bad input.

The known-answer tests write a tiny weight file in the exact bilm-tf layout from seeded NumPy arrays and
check the model against a direct NumPy transcription of bilm-tf's graph (model.py): TF gate order i, j, f, o
with forget_bias 1.0, the highway `carry_gate * relu(transform) + (1 - carry_gate) * x`, and the backward LM
run on the reversed sentence.
"""

from __future__ import annotations

import json
import warnings
from importlib.resources import files

import numpy as np
import pytest
import torch

from ctxrep.models.elmo import (
    Elmo,
    ElmoBiLM,
    ElmoConfig,
    official_shapes,
    read_hdf5,
    write_hdf5,
)
from ctxrep.models.loading import CheckpointError
from ctxrep.text.char_ids import batch_to_ids

h5py = pytest.importorskip("h5py")  # a test extra of ctxrep; installed in the dev environment

TINY_OPTIONS = {
    # Clips this small are hit by the random test weights, so clipping is exercised (the published value is 3).
    "lstm": {
        "use_skip_connections": True,
        "projection_dim": 5,
        "cell_clip": 0.8,
        "proj_clip": 0.6,
        "dim": 8,
        "n_layers": 2,
    },
    "char_cnn": {
        "activation": "relu",
        "filters": [[1, 3], [2, 4], [3, 5]],
        "n_highway": 2,
        "embedding": {"dim": 4},
        "n_characters": 262,
        "max_characters_per_token": 50,
    },
}


def tiny_options(activation: str = "relu") -> dict:
    options = json.loads(json.dumps(TINY_OPTIONS))
    options["char_cnn"]["activation"] = activation
    return options


def official_arrays(options: dict, seed: int = 0, softmax_vocab: int | None = None) -> dict[str, np.ndarray]:
    """Random float32 arrays with the dataset names and shapes of a bilm-tf dump, built by hand."""
    rng = np.random.default_rng(seed)
    cnn, lstm = options["char_cnn"], options["lstm"]
    c, p, h = cnn["embedding"]["dim"], lstm["projection_dim"], lstm["dim"]
    f = sum(n for _, n in cnn["filters"])

    def r(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    a = {"char_embed": r(cnn["n_characters"] - 1, c, scale=1.0)}
    for i, (width, num) in enumerate(cnn["filters"]):
        a[f"CNN/W_cnn_{i}"], a[f"CNN/b_cnn_{i}"] = r(1, width, c, num), r(num)
    for k in range(cnn["n_highway"]):
        a[f"CNN_high_{k}/W_carry"], a[f"CNN_high_{k}/b_carry"] = r(f, f), r(f)
        a[f"CNN_high_{k}/W_transform"], a[f"CNN_high_{k}/b_transform"] = r(f, f), r(f)
    a["CNN_proj/W_proj"], a["CNN_proj/b_proj"] = r(f, p), r(p)
    for d in range(2):
        for l in range(lstm["n_layers"]):
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"
            a[cell + "W_0"], a[cell + "B"], a[cell + "W_P_0"] = r(2 * p, 4 * h), r(4 * h), r(h, p)
    if softmax_vocab:
        a["softmax/W"], a["softmax/b"] = r(softmax_vocab, p), r(softmax_vocab)
    return a


def write_model_dir(path, options: dict, arrays: dict[str, np.ndarray]):
    path.mkdir(parents=True, exist_ok=True)
    (path / "options.json").write_text(json.dumps(options))
    with h5py.File(path / "weights.hdf5", "w") as fout:
        for name, value in arrays.items():
            fout.create_dataset(name, data=value)
    return path


# ---- NumPy transcription of bilm-tf ---------------------------------------------------------------------


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_char_cnn(a, options, ids):
    """ids (tokens, max_chars) -> conv features z, highway output, projected token vectors."""
    cnn = options["char_cnn"]
    act = {"relu": lambda x: np.maximum(x, 0.0), "tanh": np.tanh}[cnn["activation"]]
    table = np.concatenate([np.zeros((1, cnn["embedding"]["dim"]), np.float32), a["char_embed"]])  # id 0 = padding
    e = table[ids].astype(np.float64)  # (tokens, L, c)
    L = ids.shape[1]
    feats = []
    for i, (width, _) in enumerate(cnn["filters"]):
        w = a[f"CNN/W_cnn_{i}"][0]  # (width, c, num)
        conv = np.stack([np.einsum("nkc,kcf->nf", e[:, t : t + width], w) for t in range(L - width + 1)], 1)
        feats.append(act((conv + a[f"CNN/b_cnn_{i}"]).max(axis=1)))
    z = np.concatenate(feats, axis=-1)
    x = z
    for k in range(cnn["n_highway"]):
        g = f"CNN_high_{k}/"
        carry = sigmoid(x @ a[g + "W_carry"] + a[g + "b_carry"])
        transform = np.maximum(x @ a[g + "W_transform"] + a[g + "b_transform"], 0.0)
        x = carry * transform + (1.0 - carry) * x
    return z, x, x @ a["CNN_proj/W_proj"] + a["CNN_proj/b_proj"]


def np_lstm_step(a, cell, options, x, m_prev, c_prev):
    """tf.nn.rnn_cell.LSTMCell(num_proj, cell_clip, proj_clip), forget_bias=1.0."""
    lstm = options["lstm"]
    i, j, f, o = np.split(np.concatenate([x, m_prev], -1) @ a[cell + "W_0"] + a[cell + "B"], 4, axis=-1)
    c = sigmoid(f + 1.0) * c_prev + sigmoid(i) * np.tanh(j)
    c = np.clip(c, -lstm["cell_clip"], lstm["cell_clip"])
    m = (sigmoid(o) * np.tanh(c)) @ a[cell + "W_P_0"]
    return np.clip(m, -lstm["proj_clip"], lstm["proj_clip"]), c


def np_bilm(a, options, sentence_ids):
    """One unpadded sentence (words, max_chars) with <S>/</S> added -> layers for its words (words, 2p)."""
    lstm = options["lstm"]
    p, h = lstm["projection_dim"], lstm["dim"]
    bos = np.array([259, 257, 260] + [261] * 47)
    eos = np.array([259, 258, 260] + [261] * 47)
    ids = np.concatenate([bos[None], sentence_ids, eos[None]])
    x = np_char_cnn(a, options, ids)[2]
    layers = [np.concatenate([x, x], -1)]
    inputs = {0: x, 1: x[::-1]}  # bilm-tf feeds the backward LM the reversed sentence (reverse_sequence)
    for l in range(lstm["n_layers"]):
        outs = {}
        for d in (0, 1):
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"
            m, c, out = np.zeros(p), np.zeros(h), []
            for t in range(len(ids)):
                m, c = np_lstm_step(a, cell, options, inputs[d][t], m, c)
                out.append(m)
            outs[d] = np.array(out) + (inputs[d] if l > 0 else 0.0)  # ResidualWrapper from layer 1 on
        inputs = outs
        layers.append(np.concatenate([outs[0], outs[1][::-1]], -1))
    return [layer[1:-1] for layer in layers]


SENTENCES = [["The", "cat", "sat", "."], ["Où", "?"], ["ELMo", "helps", "a", "lot", "today", "!"]]


@pytest.fixture
def tiny_dir(tmp_path):
    return write_model_dir(tmp_path / "tiny", tiny_options(), official_arrays(tiny_options()))


# ---- batch_to_ids -----------------------------------------------------------------------------------------


def test_batch_to_ids_known_answers():
    ids = batch_to_ids([["Hi", "é"], ["a"]])
    assert ids.shape == (2, 2, 50) and ids.dtype == torch.long
    # [begin-of-word 258, bytes, end-of-word 259, padding 260 ...], all + 1
    assert ids[0, 0].tolist() == [259, ord("H") + 1, ord("i") + 1, 260] + [261] * 46
    assert ids[0, 1].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260] + [261] * 46  # "é" is two UTF-8 bytes
    assert ids[1, 0].tolist() == [259, ord("a") + 1, 260] + [261] * 47
    assert ids[1, 1].tolist() == [0] * 50  # a missing word is all zeros
    boundary = batch_to_ids([["<S>", "</S>", "<s>"]])[0]
    assert boundary[0].tolist() == [259, 257, 260] + [261] * 47  # bilm-tf / AllenNLP spell <S> with char 256
    assert boundary[1].tolist() == [259, 258, 260] + [261] * 47
    assert boundary[2].tolist() == [259, ord("<") + 1, ord("s") + 1, ord(">") + 1, 260] + [261] * 45


def test_sentence_boundary_ids_added_by_the_model(tiny_dir):
    model = ElmoBiLM.from_pretrained(tiny_dir)
    assert model.bos_ids.tolist() == [259, 257, 260] + [261] * 47  # <S>: bow, bos char 256, eow, pad; + 1
    assert model.eos_ids.tolist() == [259, 258, 260] + [261] * 47  # </S>: bow, eos char 257, eow, pad; + 1


def test_long_word_is_truncated_with_a_warning():
    long_word = "x" * 60
    with pytest.warns(UserWarning, match=r"truncated to their first 48 bytes.*'x{60}'"):
        ids = batch_to_ids([["short", long_word]])
    assert ids[0, 1].tolist() == [259] + [ord("x") + 1] * 48 + [260]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch_to_ids([["y" * 48]])  # exactly 48 bytes fits: no warning


def test_empty_sentence_is_refused_with_its_index():
    with pytest.raises(ValueError, match=r"sentence 1 is empty"):
        batch_to_ids([["fine"], [], ["also", "fine"]])
    with pytest.raises(ValueError, match="empty batch"):
        batch_to_ids([])
    with pytest.raises(TypeError, match="sentence 0 is a str"):
        batch_to_ids(["not tokenised"])


# ---- the loader against the published equations ----------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_char_cnn_highway_projection_match_numpy(tmp_path, activation):
    options = tiny_options(activation)
    a = official_arrays(options, seed=1)
    model = ElmoBiLM.from_pretrained(write_model_dir(tmp_path, options, a))
    # repeated words: the CNN encodes each distinct word once and must put the vectors back in order
    ids = batch_to_ids([["The", "cat", "ÉLAN", "x" * 40, "cat", "The", "cat"]])[0]  # (7, 50)
    z_np, high_np, proj_np = np_char_cnn(a, options, ids.numpy())
    with torch.no_grad():
        z = model.char_cnn.convolve(ids)
        high = model.char_cnn.highway(z)
        proj = model.char_cnn(ids)
    np.testing.assert_allclose(z.numpy(), z_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(high.numpy(), high_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(proj.numpy(), proj_np, rtol=1e-5, atol=1e-5)


def test_one_lstm_step_matches_tf_lstm_cell(tiny_dir):
    options = tiny_options()
    a = read_hdf5(tiny_dir / "weights.hdf5")
    model = ElmoBiLM.from_pretrained(tiny_dir)
    rng = np.random.default_rng(3)
    x, m, c = rng.standard_normal((3, 5)), rng.uniform(-0.6, 0.6, (3, 5)), rng.uniform(-0.8, 0.8, (3, 8))
    clipped = 0
    for d, layers in enumerate((model.forward_layers, model.backward_layers)):
        for l, layer in enumerate(layers):
            m_np, c_np = np_lstm_step(a, f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/", options, x, m, c)
            with torch.no_grad():
                xt, mt, ct = (torch.tensor(v, dtype=torch.float32) for v in (x, m, c))
                h_t, c_t = layer.step(layer.input_gates(xt), mt, ct)
            np.testing.assert_allclose(h_t.numpy(), m_np, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(c_t.numpy(), c_np, rtol=1e-5, atol=1e-6)
            clipped += int((np.abs(c_np) == 0.8).sum() + (np.abs(m_np) == 0.6).sum())
    assert 0 < clipped < 4 * 3 * 13  # both clips are exercised, and not every value is clipped


def test_bilm_layers_match_numpy_for_a_padded_batch(tiny_dir):
    options = tiny_options()
    a = read_hdf5(tiny_dir / "weights.hdf5")
    model = ElmoBiLM.from_pretrained(tiny_dir)
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out = model(ids)
    assert model.num_layers == 2 and model.hidden_size == 10
    assert len(out.hidden_states) == 3 and out.last_hidden_state is out.hidden_states[-1]
    assert out.mask.tolist() == [[True] * 4 + [False] * 2, [True] * 2 + [False] * 4, [True] * 6]
    for s, sentence in enumerate(SENTENCES):
        n = len(sentence)
        expected = np_bilm(a, options, ids[s, :n].numpy())
        for j in range(3):
            np.testing.assert_allclose(out.hidden_states[j][s, :n].numpy(), expected[j], rtol=1e-4, atol=1e-5)
            assert not out.hidden_states[j][s, n:].any()  # padding words are zero
    np.testing.assert_array_equal(out.hidden_states[0][..., :5], out.hidden_states[0][..., 5:])  # [x; x]


def test_keep_boundaries_adds_bos_and_eos_positions(tiny_dir):
    model = ElmoBiLM.from_pretrained(tiny_dir)
    ids = batch_to_ids(SENTENCES[:2])
    with torch.no_grad():
        words, full = model(ids), model(ids, keep_boundaries=True)
    assert full.hidden_states[1].shape == (2, 6, 10)
    assert full.mask.tolist() == [[True] * 6, [True] * 4 + [False] * 2]
    torch.testing.assert_close(full.hidden_states[2][1, 1:3], words.hidden_states[2][1, :2])
    for h in full.hidden_states:
        assert not h[1, 4:].any()  # positions after </S> are zero in every layer


# ---- round trips ------------------------------------------------------------------------------------------


def test_save_then_load_gives_identical_outputs(tiny_dir, tmp_path):
    model = ElmoBiLM.from_pretrained(tiny_dir)
    model.save_pretrained(tmp_path / "saved")
    again = ElmoBiLM.from_pretrained(tmp_path / "saved")
    assert again.config == model.config
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        for h1, h2 in zip(model(ids).hidden_states, again(ids).hidden_states):
            assert torch.equal(h1, h2)
    original, written = read_hdf5(tiny_dir / "weights.hdf5"), read_hdf5(tmp_path / "saved" / "weights.hdf5")
    assert written.keys() == original.keys()
    for name in original:
        # B goes through + 1.0 (forget bias) and - 1.0 in float32: equal to within one rounding of 1.0.
        np.testing.assert_allclose(written[name], original[name], rtol=0, atol=1.2e-7 if name.endswith("/B") else 0)
    assert json.loads((tmp_path / "saved" / "options.json").read_text()) == tiny_options()


def test_softmax_is_loaded_and_saved_when_the_file_has_it(tmp_path):
    options = tiny_options()
    a = official_arrays(options, softmax_vocab=7)
    model = ElmoBiLM.from_pretrained(write_model_dir(tmp_path / "lm", options, a))
    assert model.config.has_softmax and model.config.n_tokens_vocab == 7
    np.testing.assert_array_equal(model.softmax.weight.detach().numpy(), a["softmax/W"])  # (vocab, proj) as stored
    model.save_pretrained(tmp_path / "saved")
    np.testing.assert_array_equal(read_hdf5(tmp_path / "saved" / "weights.hdf5")["softmax/b"], a["softmax/b"])


def test_published_download_names_are_found(tmp_path):
    options, a = tiny_options(), official_arrays(tiny_options())
    (tmp_path / "elmo_tiny_options.json").write_text(json.dumps(options))
    write_hdf5(a, tmp_path / "elmo_tiny_weights.hdf5")
    assert ElmoBiLM.from_pretrained(tmp_path).config.projection_dim == 5


# ---- determinism ------------------------------------------------------------------------------------------


def test_a_sentence_gets_the_same_vectors_alone_in_a_batch_and_after_other_batches(tiny_dir):
    model = ElmoBiLM.from_pretrained(tiny_dir)
    target = ["The", "cat", "sat", "."]
    with torch.no_grad():
        alone = model(batch_to_ids([target])).hidden_states
        batched = model(batch_to_ids([["A", "much", "longer", "sentence", "than", "it", "."], target, ["Hi"]]))
        model(batch_to_ids([["Something", "else", "entirely"]] * 4))
        later = model(batch_to_ids([target])).hidden_states
    for j in range(3):
        torch.testing.assert_close(batched.hidden_states[j][1, :4], alone[j][0], rtol=1e-5, atol=1e-5)  # GEMM blocking
        assert torch.equal(later[j], alone[j])


# ---- parameter counts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, millions", [("small", 13.6), ("medium", 28.0), ("original", 93.6)])
def test_published_shapes_have_the_published_parameter_counts(name, millions):
    """allennlp.org/elmo lists 13.6M / 28.0M / 93.6M. Counted here: every parameter of the biLM that the
    published weight files hold -- character embeddings, convolutions, highway, projection and the four
    projected LSTMs (input, recurrent, bias, projection) -- and not the softmax, which those files do not
    contain. (The 262 x 16 character embeddings change the count by 0.004M, below the page's precision.)"""
    options = json.loads(files("ctxrep").joinpath(f"configs/elmo_{name}.json").read_text())
    config = ElmoConfig.from_options(options)
    with torch.device("meta"):  # shapes only: no memory for the 93.6M weights
        model = ElmoBiLM(config)
    total = sum(p.numel() for p in model.parameters())
    assert round(total / 1e6, 1) == millions
    file_total = sum(int(np.prod(s)) for s in official_shapes(config).values())
    assert file_total + config.char_embedding_dim == total  # the file lacks only the padding row


# ---- Elmo (scalar mixes for task models) ------------------------------------------------------------------


def test_elmo_mixes_are_trainable_and_the_bilm_frozen(tiny_dir):
    elmo = Elmo.from_pretrained(tiny_dir, num_output_representations=2, dropout=0.0)
    assert not any(p.requires_grad for p in elmo.bilm.parameters())
    assert all(p.requires_grad for p in elmo.scalar_mixes.parameters())
    ids = batch_to_ids(SENTENCES)
    out = elmo(ids)
    assert len(out.representations) == 2 and out.representations[0].shape == (3, 6, 10)
    with torch.no_grad():
        layers = elmo.bilm(ids)
    assert torch.equal(out.mask, layers.mask)
    # Fresh mixes weight every layer 1/3 with gamma 1 (eq. 1 with s = softmax(0)).
    torch.testing.assert_close(out.representations[1], sum(layers.hidden_states) / 3)
    out.representations[0].sum().backward()
    assert elmo.scalar_mixes[0].gamma.grad is not None and elmo.scalar_mixes[1].gamma.grad is None


def test_elmo_layer_norm_sees_words_and_boundaries_but_not_padding(tiny_dir):
    elmo = Elmo.from_pretrained(tiny_dir, dropout=0.0, do_layer_norm=True).eval()
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out = elmo(ids).representations[0]
        full = elmo.bilm(ids, keep_boundaries=True)
        expected = elmo.scalar_mixes[0](full.hidden_states, full.mask)[:, 1:7]
    torch.testing.assert_close(out[2], expected[2])
    torch.testing.assert_close(out[1, :2], expected[1, :2])
    assert not out[1, 2:].any()


# ---- bad input --------------------------------------------------------------------------------------------


def test_options_that_do_not_match_the_weights_name_dataset_and_shapes(tmp_path):
    options = tiny_options()
    a = official_arrays(options)
    options["lstm"]["projection_dim"] = 6
    options["char_cnn"]["filters"][1] = [2, 7]
    with pytest.raises(CheckpointError) as err:
        ElmoBiLM.from_pretrained(write_model_dir(tmp_path, options, a))
    msg = str(err.value)
    assert "CNN/W_cnn_1 (1, 2, 4, 4) (expected (1, 2, 4, 7))" in msg
    assert "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0 (8, 5) (expected (8, 6))" in msg
    assert "options.json" in msg


def test_missing_and_unknown_datasets_are_all_named(tmp_path):
    options = tiny_options()
    a = official_arrays(options)
    del a["CNN_high_1/b_carry"], a["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"]
    a["extra/thing"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointError) as err:
        ElmoBiLM.from_pretrained(write_model_dir(tmp_path, options, a))
    msg = str(err.value)
    assert "missing 2 datasets: CNN_high_1/b_carry, RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B" in msg
    assert "1 unknown datasets: extra/thing" in msg


def test_bad_options_and_folders(tmp_path):
    options = tiny_options()
    options["lstm"]["use_peepholes"] = True
    with pytest.raises(CheckpointError, match="use_peepholes"):
        ElmoConfig.from_options(options, source="x.json")
    with pytest.raises(CheckpointError, match="'char_cnn' section is missing"):
        ElmoConfig.from_options({"lstm": {}})
    with pytest.raises(CheckpointError, match="expected options.json"):
        ElmoBiLM.from_pretrained(tmp_path)


def test_bad_character_ids_are_refused(tiny_dir):
    model = ElmoBiLM.from_pretrained(tiny_dir)
    with pytest.raises(ValueError, match=r"shape \(batch, words, 50\)"):
        model(torch.ones(2, 3, dtype=torch.long))
    ids = batch_to_ids([["a", "b", "c"]])
    ids[0, 1] = 0
    with pytest.raises(ValueError, match="sentence 0 has an all-zero"):
        model(ids)
