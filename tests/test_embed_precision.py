"""`ctxrep embed --precision`: "auto" is recorded as the precision it chose (manifest and stderr), and a precision
that runs slower than float32 on this hardware says so in one line (a rule from the CPU's flags, never a timing)."""

from __future__ import annotations

import json

import pytest
import torch

from ctxrep.embed.corpus import EmbedJob, SentenceVectors, embed_corpus
from ctxrep.runtime import hardware


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("the bank raised its rates .\nwe sat on the river bank .\na short one\n")
    return path


def _embed(corpus, out, model, precision, **kwargs):
    lines = []
    job = EmbedJob(str(corpus), str(out), vectors=SentenceVectors(), model=model, precision=precision, **kwargs)
    embed_corpus(job, show_progress=False, log=lines.append)
    return json.loads((out / "manifest.json").read_text())["spec"], lines


def test_auto_records_the_precision_it_chose(corpus, tmp_path, tiny_models, monkeypatch):
    model = str(tiny_models["bert"])
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    spec, lines = _embed(corpus, tmp_path / "bf16", model, "auto")
    assert spec["precision"] == "bf16"  # what ran, not "auto"
    assert "precision: bf16 (auto: native bfloat16 on this device)" in lines
    _, again = _embed(corpus, tmp_path / "bf16", model, "bf16")  # the same run: already complete
    assert not any("differs" in line for line in again)

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    spec, lines = _embed(corpus, tmp_path / "fp32", model, "auto")
    assert spec["precision"] == "fp32"  # as a run without --precision records it
    assert "precision: fp32 (auto: no native bfloat16 on this device)" in lines
    with pytest.raises(ValueError, match=r"holds the output of a different run \(differs in: precision\)"):
        _embed(corpus, tmp_path / "bf16", model, "auto")  # bf16's folder; auto now chooses fp32


def test_a_precision_slower_than_float32_here_says_so(corpus, tmp_path, tiny_models, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert "fp16 on this CPU is emulated" in hardware.slower_than_fp32(cpu, "torch", "fp16")
    assert "bf16 on this CPU is emulated" in hardware.slower_than_fp32(cpu, "torch", "bf16")
    for precision in ("fp32", "int8"):
        assert hardware.slower_than_fp32(cpu, "torch", precision) is None
    assert hardware.slower_than_fp32(torch.device("cuda"), "torch", "fp16") is None
    assert hardware.slower_than_fp32(cpu, "openvino", "fp16") is None  # its own kernels choose
    _, lines = _embed(corpus, tmp_path / "fp16", str(tiny_models["bert"]), "fp16")
    assert [line for line in lines if line.startswith("note:")] == [
        "note: fp16 on this CPU is emulated (no avx512_fp16 or AMX-FP16): it runs slower than fp32 (2x measured)"
    ]

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512_fp16", "amx_bf16"}))
    assert hardware.slower_than_fp32(cpu, "torch", "fp16") is None
    assert hardware.slower_than_fp32(cpu, "torch", "bf16") is None
    _, lines = _embed(corpus, tmp_path / "fp16-native", str(tiny_models["bert"]), "fp16")
    assert not any(line.startswith("note:") for line in lines)
