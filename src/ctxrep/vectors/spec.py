"""What a set of vectors is: the settings that decide them, as writers record them and readers check them.

Torch-free and at the bottom of the layer order, so that the CLI, the embedding jobs and the readers can parse and
print these settings without loading a model.
"""

from __future__ import annotations

__all__ = ["parse_layers", "layers_text"]


def parse_layers(value: str) -> int | list[int] | str:
    """The CLI's --layers text ("-1", "0,3,6", "all", "mix") as the Featurizer's `layers` argument."""
    value = value.strip()
    if value in ("all", "mix"):
        return value
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        raise ValueError(f"--layers {value!r}: give a layer index, a comma-separated list, 'all' or 'mix'") from None
    return parts[0] if len(parts) == 1 else parts


def layers_text(layers: int | list[int] | str) -> str:
    """The inverse of `parse_layers`: how the manifest records the layers."""
    if isinstance(layers, str):
        return layers
    return str(layers) if isinstance(layers, int) else ",".join(str(i) for i in layers)
