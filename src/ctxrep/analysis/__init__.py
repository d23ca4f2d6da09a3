"""What a model knows: layer probes, attention heads, neighbours in context, and the HTML report.

    from ctxrep.analysis import run_probe, load_probe_data, head_statistics, OccurrenceIndex, build_report

Each name is imported on first use (`import ctxrep.analysis` alone loads neither torch nor any tool); the
submodules (`ctxrep.analysis.probe`, `.attention`, `.neighbors`, `.report`, `.corpus`) stay importable as before.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    # linear probes per layer and over a learned ScalarMix (probe.py)
    "ProbeData": "probe",
    "load_probe_data": "probe",
    "read_wic_pairs": "probe",
    "split_data": "probe",
    "extract_features": "probe",
    "fit_linear_probe": "probe",
    "fit_mix_probe": "probe",
    "MixProbe": "probe",
    "run_probe": "probe",
    "ProbeRow": "probe",
    "ProbeResult": "probe",
    # attention heads (attention.py)
    "require_attention": "attention",
    "head_statistics": "attention",
    "AttentionStats": "attention",
    "dependency_heads": "attention",
    "DependencyHeads": "attention",
    "RelationHead": "attention",
    "word_attention": "attention",
    "head_attention": "attention",
    "save_heatmap_png": "attention",
    "save_grid_png": "attention",
    "pruned_heads_mask": "attention",
    "check_head": "attention",
    # neighbours in context, the static contrast, WiC by layer (neighbors.py)
    "OccurrenceIndex": "neighbors",
    "Occurrence": "neighbors",
    "Neighbor": "neighbors",
    "Query": "neighbors",
    "parse_query": "neighbors",
    "read_queries": "neighbors",
    "StaticVocabulary": "neighbors",
    "static_vector": "neighbors",
    "static_neighbors": "neighbors",
    "no_static_table_reason": "neighbors",
    "wic_cosines": "neighbors",
    "best_threshold": "neighbors",
    "evaluate_wic": "neighbors",
    "WicLayer": "neighbors",
    "WicResult": "neighbors",
    # the word lists of a corpus file (corpus.py)
    "read_sentences": "corpus",
    # the one-page report (report.py)
    "build_report": "report",
    "SenseDemo": "report",
    "sense_similarities": "report",
}
_SUBMODULES = ("probe", "attention", "neighbors", "report", "corpus")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _SUBMODULES:  # `ctxrep.analysis.probe` without importing it first
        return importlib.import_module(f"ctxrep.analysis.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxrep.analysis' has no attribute {name!r}; its names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"ctxrep.analysis.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
