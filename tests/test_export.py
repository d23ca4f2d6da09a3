"""ONNX export: every subword family exported with dynamic axes matches ctxrep in ONNX Runtime; ELMo is refused."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from test_matrix import deberta_dir, modernbert_dir  # noqa: F401  (fixtures: DeBERTa-v3 and ModernBERT)

import ctxrep
from ctxrep.models.albert import AlbertConfig, AlbertModel
from ctxrep.runtime.export import ExportError, export_onnx, first_line


def run_both(file, encoder, lengths=(10, 4, 7, 2)):
    """last_hidden_state from ONNX Runtime and from ctxrep on a batch of a shape the export never saw."""
    g = torch.Generator().manual_seed(11)
    seq = max(lengths)
    ids = torch.randint(5, encoder.input_embeddings().shape[0], (len(lengths), seq), generator=g)
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if getattr(encoder.config, "type_vocab_size", 2) > 1:  # RoBERTa has one segment type
        batch["token_type_ids"][0, 5:] = 1
    session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    (got,) = session.run(["last_hidden_state"], {k: v.numpy() for k, v in batch.items() if k in names})
    with torch.no_grad():
        want = encoder.encode(batch).last_hidden_state.numpy()
    return got, want, mask.bool().numpy(), names


@pytest.fixture(scope="module")
def family_dirs(tiny_models, gpt2_dir, xlnet_dir):
    return dict(tiny_models) | {"gpt2": gpt2_dir, "xlnet": xlnet_dir}


NEW_FAMILIES = {  # issue 25's families: their conftest fixtures
    "xlm-roberta": "xlmr_dir",
    "camembert": "camembert_dir",
    "distilbert": "distilbert_dir",
    "mpnet": "mpnet_dir",
    "t5": "t5_dir",
    "deberta-v2": "deberta_dir",  # test_matrix.py's fixtures
    "modernbert": "modernbert_dir",
}


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "gpt2", "xlnet", *NEW_FAMILIES])
def test_each_family_exports_with_parity(family_dirs, tmp_path, family, request):
    if family in NEW_FAMILIES:
        family_dirs = {family: request.getfixturevalue(NEW_FAMILIES[family])}
    report = export_onnx(family_dirs[family], tmp_path / "model.onnx")
    encoder = ctxrep.load_model(family_dirs[family])
    assert report.path.is_file() and report.max_abs_diff <= 1e-4 and report.opset == 17
    got, want, real, names = run_both(report.path, encoder)
    assert got.shape == want.shape == (4, 10, encoder.hidden_size)
    assert np.abs(got[real] - want[real]).max() <= 1e-4
    assert names == report.input_names
    assert ("token_type_ids" in names) == encoder.reads_segments
    assert report.family == encoder.family


@pytest.mark.parametrize("share", ["all", "attention"])
def test_albert_exports_from_the_encoder_and_from_its_folder(tmp_path, share):
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=90,
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=24,
        max_position_embeddings=32,
        share=share,
    )
    model = AlbertModel(config).eval()
    model.save_pretrained(tmp_path / "albert")
    encoder = AlbertModel.from_pretrained(tmp_path / "albert")
    report = export_onnx(encoder, tmp_path / "albert.onnx")
    got, want, real, names = run_both(report.path, model)
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    assert np.abs(got[real] - want[real]).max() <= 1e-4 and report.max_abs_diff <= 1e-4


def test_export_leaves_the_encoder_in_its_mode(tiny_models, tmp_path):
    encoder = ctxrep.load_model(tiny_models["bert"]).train()
    export_onnx(encoder, tmp_path / "m.onnx")
    assert encoder.training and all(m.training for m in encoder.modules())


def test_elmo_is_refused_in_one_line(elmo_dir, tmp_path):
    with pytest.raises(ExportError, match="elmo cannot be exported to ONNX: it reads words as characters") as e:
        export_onnx(f"elmo:{elmo_dir}", tmp_path / "elmo.onnx")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "elmo.onnx").exists()


def test_a_graph_that_differs_is_refused_and_not_written(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr("ctxrep.runtime.export.check_onnx", lambda file, encoder: 0.5)
    with pytest.raises(
        ExportError,
        match="bert: no ONNX export matched ctxrep's output \\(torchscript: max abs "
        "difference 0.5 > 0.0001\\); try another --opset",
    ):
        export_onnx(tiny_models["bert"], tmp_path / "m.onnx", exporters=("torchscript",))
    # An exporter's reason is one line: torch.export's is its exception summary, not its advice.
    advice = (
        "Failed to export the model with torch.export. \x1b[96mThis is step 1/3\x1b[0m of exporting.\n- Modify "
        "the model code\n## Exception summary\n\n<class 'GuardOnDataDependentSymNode'>: Could not guard\n\nmore"
    )
    assert first_line(RuntimeError(advice)) == "<class 'GuardOnDataDependentSymNode'>: Could not guard"
    assert first_line(RuntimeError("\x1b[96mplain\x1b[0m\nsecond")) == "plain"
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(TypeError, match="takes a ctxrep encoder or a model folder, got a Linear"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "m.onnx")
    model = AlbertModel(
        AlbertConfig(
            vocab_size=20,
            embedding_size=4,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
            max_position_embeddings=16,
        )
    )
    with pytest.raises(ValueError, match="exporters must be a non-empty selection of"):
        export_onnx(model, tmp_path / "m.onnx", exporters=("jit",))


def test_cli_command(tiny_models, tmp_path):
    from ctxrep.cli.export import export

    out = tmp_path / "sub" / "bert.onnx"
    result = CliRunner().invoke(export, ["--format", "onnx", "--model", str(tiny_models["bert"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    assert (
        f"wrote {out} (bert, opset 17, torchscript exporter; inputs input_ids, attention_mask, token_type_ids)"
        in result.output
    )
    assert "max abs difference" in result.output

    result = CliRunner().invoke(export, ["--model", str(tmp_path / "nowhere"), "--out", str(out)])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(export, ["--format", "tflite", "--model", "x", "--out", str(out)])
    assert result.exit_code == 2 and "'tflite' is not 'onnx'" in result.output
