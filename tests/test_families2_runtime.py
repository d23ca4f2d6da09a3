"""DeBERTa-v3 and ModernBERT on every backend x precision (tests/test_runtime.py's bars against the torch float32
forward) and under torch.compile: what `ctxrep embed --backend/--precision` and compile="auto" run for them."""

from __future__ import annotations

import pytest
from _families2 import deberta_dir, modernbert_dir
from test_runtime import COMBINATIONS, WORDS, check

from ctxrep import Featurizer
from ctxrep.runtime.fast import cpu_vector_isa

BUILD = {"deberta-v2": lambda p: deberta_dir(p, spm_model=True), "modernbert": modernbert_dir}
LONG = [("the dog runs today and the cat sleeps often while a bird sings " * 3).split()]  # past ModernBERT's window


@pytest.fixture(scope="module", params=list(BUILD))
def folder(request, tmp_path_factory) -> str:
    with pytest.MonkeyPatch.context() as mp:  # exported graphs in a fresh cache for this module
        mp.setenv("CTXREP_CACHE", str(tmp_path_factory.mktemp("ctxrep-cache")))
        yield str(BUILD[request.param](tmp_path_factory.mktemp(request.param) / "m"))


@pytest.mark.parametrize("backend, precision", list(COMBINATIONS), ids=[f"{b}-{p}" for b, p in COMBINATIONS])
def test_every_backend_and_precision_against_the_float32_forward(folder, backend, precision):
    reference = Featurizer(folder, layers="all", compile=False).embed_words(WORDS + LONG)
    fz = Featurizer(folder, layers="all", compile=False, backend=backend, precision=precision)
    assert (fz.backend, fz.precision) == (backend, precision)
    check(fz.embed_words(WORDS + LONG), reference, COMBINATIONS[backend, precision])


def test_compiled_encoder_matches_the_forward(folder):
    reference = Featurizer(folder, layers="all", compile=False).embed_words(WORDS + LONG)
    if not cpu_vector_isa():  # a CPU below AVX2 (`make test-isa`'s sse41 level): refused in one line
        with pytest.raises(ValueError, match="neither AVX2 nor AVX-512"):
            Featurizer(folder, layers="all", compile=True).embed_words(WORDS)
        return
    compiled = Featurizer(folder, layers="all", compile=True).embed_words(WORDS + LONG)
    check(compiled, reference, ("max_abs", 1e-4))
