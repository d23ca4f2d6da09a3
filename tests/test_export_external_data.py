"""Graphs over protobuf's 2 GiB limit (a 0.6B decoder is 2.4 GB at float32) keep their weights in NAME.onnx.data
beside the .onnx: `ctxrep export` and the runtimes' graph cache write it, move it with the graph, and ONNX Runtime and
OpenVINO read it. Tested on tiny models with the limit patched down (export.EXTERNAL_DATA_LIMIT)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from _decoders import tiny_folder
from test_export import run_both
from test_runtime import COMBINATIONS, WORDS, check

import ctxrep
from ctxrep import Featurizer
from ctxrep.runtime import export, graphs


@pytest.fixture(scope="module")
def folders(tiny_models, tmp_path_factory) -> dict[str, str]:
    """A tiny encoder (BERT) and a tiny decoder (Qwen3)."""
    return {"bert": str(tiny_models["bert"]), "qwen3": str(tiny_folder(tmp_path_factory.mktemp("qwen3"), "qwen3"))}


def test_ctxrep_export_names_the_data_file(folders, small_limit, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    out = tmp_path / "model.onnx"
    done = CliRunner().invoke(main, ["export", "--model", folders["bert"], "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert f"its weights are in {out}.data" in done.output and "keep the two files together" in done.output


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(export, "EXTERNAL_DATA_LIMIT", 1024)  # every tiny model is "large"


def external_locations(graph) -> set[str]:
    proto = onnx.load(str(graph), load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_export_writes_the_weights_beside_the_graph_and_both_move_together(folders, family, small_limit, tmp_path):
    report = export.export_onnx(folders[family], tmp_path / "out" / "model.onnx")
    assert report.data_file == tmp_path / "out" / "model.onnx.data"
    assert sorted(os.listdir(tmp_path / "out")) == ["model.onnx", "model.onnx.data"]  # no temporary folder left
    assert external_locations(report.path) == {"model.onnx.data"}
    encoder = ctxrep.load_model(folders[family], dtype="fp32")
    assert report.data_file.stat().st_size >= 0.9 * export.weights_bytes(encoder)
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "out", moved)  # the pair is self-contained
    got, want, real, _ = run_both(moved / "model.onnx", encoder)
    assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_weights_an_exporter_put_outside_the_graph_are_kept_in_one_data_file(folders, tmp_path, monkeypatch):
    """The dynamo exporter writes NAME.data past 1.5 GiB whatever it is asked, the TorchScript one a file per tensor
    past 2 GiB: before, only the .onnx was moved out of the temporary folder and the weights were deleted with it."""
    run = export.export_graph

    def per_tensor(wrapper, example, file, *args):  # what the TorchScript exporter writes past 2 GiB
        run(wrapper, example, file, *args)
        onnx.save_model(onnx.load(str(file)), str(file), save_as_external_data=True, all_tensors_to_one_file=False)

    monkeypatch.setattr(export, "export_graph", per_tensor)
    report = export.export_onnx(folders["bert"], tmp_path / "model.onnx", exporters=("torchscript",))
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "model.onnx.data"]
    got, want, real, _ = run_both(report.path, ctxrep.load_model(folders["bert"], dtype="fp32"))
    assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_dynamo_exports_past_its_own_threshold_keep_their_weights(folders, tmp_path, monkeypatch):
    program = pytest.importorskip("torch.onnx._internal.exporter._onnx_program")
    monkeypatch.setattr(program, "_LARGE_MODEL_THRESHOLD", 0)  # as for a model over 1.5 GiB
    report = export.export_onnx(folders["qwen3"], tmp_path / "model.onnx", exporters=("dynamo",))
    assert report.data_file is not None and external_locations(report.path) == {"model.onnx.data"}
    got, want, real, _ = run_both(report.path, ctxrep.load_model(folders["qwen3"], dtype="fp32"))
    assert np.abs(got[real] - want[real]).max() <= 1e-4


RUNTIMES = [("onnxruntime", "fp32"), ("openvino", "fp32"), ("onnxruntime", "int8")]


@pytest.mark.parametrize("family", ["bert", "qwen3"])
@pytest.mark.parametrize("backend, precision", RUNTIMES, ids=[f"{b}-{p}" for b, p in RUNTIMES])
def test_runtimes_load_graphs_with_external_data(
    folders, family, backend, precision, small_limit, tmp_path, monkeypatch
):
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path))
    layers = [0, 1, -1]
    reference = Featurizer(folders[family], layers=layers, compile=False).embed_words(WORDS)
    fz = Featurizer(folders[family], layers=layers, compile=False, backend=backend, precision=precision)
    check(fz.embed_words(WORDS), reference, COMBINATIONS[backend, precision])
    (key,) = os.listdir(tmp_path / "graphs")
    name = "fp32.onnx" if precision == "fp32" else "ort-int8.onnx"
    assert external_locations(tmp_path / "graphs" / key / name) == {f"{name}.data"}
    assert not [p for p in (tmp_path / "graphs" / key).iterdir() if p.is_dir()]  # temporary folders are gone


def test_a_cached_graph_whose_data_file_is_gone_is_exported_again(folders, small_limit, tmp_path, monkeypatch):
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path))
    reference = Featurizer(folders["qwen3"], compile=False, backend="onnxruntime").embed_words(WORDS)
    model = Featurizer(folders["qwen3"]).model
    path = graphs.fp32_onnx(model, (model.num_layers,))
    assert export.graph_complete(path)
    export.data_file(path).unlink()
    assert not export.graph_complete(path)
    again = Featurizer(folders["qwen3"], compile=False, backend="onnxruntime").embed_words(WORDS)
    assert export.data_file(path).is_file()
    check(again, reference, ("max_abs", 1e-6))
