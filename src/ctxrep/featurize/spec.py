"""What a set of vectors is: the settings that decide them, as writers record them and readers check them.

    spec = FeaturizerSpec.of(featurizer)       # what this Featurizer's vectors are
    spec.to_dict(); FeaturizerSpec.from_dict(d) # as manifest.json / index.json record it
    spec.check(other, where="ix/index.json")    # SpecMismatch naming every field that differs

`ctxrep embed`'s manifest, `SentenceIndex.save` and `ctxrep index build` record one; `load_vectors(.., expect=)`,
`SentenceIndex.load(.., featurizer=)` and text queries check it. Torch-free (the featurize package loads its other
names on first use), so that the CLI, the embedding jobs and the readers can parse and print these settings without
loading a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = [
    "DEFAULT_SENTENCE_POOLING",
    "FeaturizerSpec",
    "SENTENCE_ONLY",
    "SENTENCE_POOLINGS",
    "SpecMismatch",
    "parse_layers",
    "layers_text",
]

# How a text becomes one sentence vector (Featurizer(sentence_pooling=...)), and THE default of every entry point
# (the Featurizer, ctxrep embed, index build, similarity, serve, mteb): "auto", the model folder's own pooling where
# it declares one (a sentence-transformers modules.json), else the mean of the word vectors.
SENTENCE_POOLINGS = ("mean", "cls", "model", "lasttoken", "auto")  # featurize/pooling.py's SENTENCE_POOLERS + auto
DEFAULT_SENTENCE_POOLING = "auto"


# fields that decide sentence vectors only (word vectors are the same whatever they say)
SENTENCE_ONLY = ("sentence_pooling", "normalize", "dimensions", "prompt")


class SpecMismatch(ValueError):
    """A reader asked for other vectors than were written (the message names each field that differs)."""


@dataclass(frozen=True)
class FeaturizerSpec:
    """Every setting that decides a vector (the Featurizer's keyword arguments, resolved: sentence_pooling "auto"
    and precision "auto" as decided, the window length and stride as used). None means "not recorded" (a record
    written by an older ctxrep) and is not compared.

    model: a packaged or Hub name, or a local folder as an absolute path. revision: the Hub commit the weights came
    from (a snapshot in the Hugging Face cache), None for folders and packaged models. layers: an index, a list,
    "all", "mix", or {"mix": weights, "gamma": g} for a ScalarMix. dimensions and prompt: what
    `embed_sentences(dimensions=, prompt=, prompt_name=)` was given (`ctxrep embed` records them; a Featurizer's own
    spec leaves them None, so a reader's featurizer is not compared on them).
    """

    model: str
    revision: str | None = None
    layers: int | list[int] | str | dict = -1
    pooling: str = "mean"
    sentence_pooling: str = "mean"
    normalize: bool = False
    precision: str | None = "fp32"
    backend: str | None = "torch"
    max_length: int | None = None
    stride: int | None = None
    head: str = "dense"  # what turns the token states into the vectors: "dense", "sparse" (SPLADE), "multi-vector"
    dimensions: int | None = None  # sentence vectors cut to their first N coordinates, then renormalised
    prompt: str | None = None  # the text put before every text ("" none), a folder's prompt resolved from its name

    @classmethod
    def of(cls, featurizer) -> FeaturizerSpec:
        """The spec of a ctxrep.Featurizer (read from its public attributes), or of a sibling encoder (SparseEncoder,
        MultiVectorEncoder: its own `spec`)."""
        if not hasattr(featurizer, "layer_indices") and isinstance(getattr(featurizer, "spec", None), FeaturizerSpec):
            return featurizer.spec
        if not all(hasattr(featurizer, a) for a in ("source", "layer_indices", "pooling", "sentence_pooling")):
            raise TypeError(f"expected a ctxrep.Featurizer, got {type(featurizer).__name__}")
        mix, indices = featurizer.mix, [int(i) for i in featurizer.layer_indices]
        every = indices == list(range(featurizer.num_layers + 1))
        if mix is not None:  # saved as its weights and scale; rebuilt with ScalarMix.from_weights
            weights, gamma = mix.weights.detach().cpu().tolist(), float(mix.gamma.detach().reshape(-1)[0])
            plain = gamma == 1.0 and max(weights) - min(weights) < 1e-7
            layers = "mix" if plain else {"mix": weights, "gamma": gamma}
        elif featurizer.single_layer:
            layers = indices[0]
        else:
            layers = "all" if every else indices
        model, revision = model_identity(featurizer.source.name, featurizer.source.folder)
        return cls(
            model=model,
            revision=revision,
            layers=layers,
            pooling=featurizer.pooling,
            sentence_pooling=featurizer.sentence_pooling,
            normalize=bool(featurizer.normalize),
            precision=featurizer.precision,
            backend=featurizer.backend,
            max_length=int(featurizer.max_length),
            stride=int(featurizer.plan.stride),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "the record") -> FeaturizerSpec:
        """The spec a writer recorded; unknown keys are refused (a newer ctxrep wrote it)."""
        if not isinstance(data, dict) or "model" not in data:
            raise SpecMismatch(f"{where}: no featurizer spec (a dict with 'model'); write it again with this ctxrep")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecMismatch(
                f"{where}: unknown spec field(s) {', '.join(unknown)} (written by a newer ctxrep?); upgrade ctxrep"
            )
        data = dict(data)
        if isinstance(data.get("layers"), (list, tuple)):
            data["layers"] = [int(i) for i in data["layers"]]
        return cls(**data)

    @classmethod
    def from_embed_settings(cls, settings: dict) -> FeaturizerSpec:
        """The spec of a `ctxrep embed` folder written before manifests kept one (its requested settings)."""
        precision = settings.get("precision") or ("int8" if settings.get("quantize") == "int8" else "fp32")
        sentence_pooling = settings.get("sentence_pooling", "mean")
        return cls(
            model=str(settings["model"]),
            layers=parse_layers(str(settings.get("layers", "-1"))),
            pooling=settings.get("pooling", "mean"),
            sentence_pooling=None if sentence_pooling == "auto" else sentence_pooling,  # decided at load: unknown
            precision=None if precision == "auto" else precision,
            backend=settings.get("backend", "torch"),
        )

    def featurizer_kwargs(self) -> dict:
        """Keyword arguments of ctxrep.Featurizer that give these vectors (a ScalarMix rebuilt from its weights)."""
        out: dict = {
            "model": self.model
            if self.revision is None or Path(self.model).is_dir()
            else f"{self.model}@{self.revision}",
            "layers": self.layers,
            "pooling": self.pooling,
            "normalize": self.normalize,
        }
        if isinstance(self.layers, dict):
            from ctxrep.modules.scalar_mix import ScalarMix

            out["layers"] = ScalarMix.from_weights(self.layers["mix"], gamma=self.layers["gamma"])
        for name in ("sentence_pooling", "precision", "backend", "max_length", "stride"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def differences(self, other: FeaturizerSpec, ignore: tuple[str, ...] = ()) -> list[str]:
        """Each field both record and that differs, as "field written != asked" (fields in `ignore` left out)."""
        out = []
        if "dense" not in (self.head, other.head):  # token heads never read the sentence settings
            ignore = (*ignore, *SENTENCE_ONLY)
        for f in fields(self):
            if f.name in ignore:
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a is None or b is None or (f.name == "layers" and not (_resolved(a) and _resolved(b))):
                continue  # not recorded, or layers counted from the top in an old record: not comparable
            if _canonical(a) != _canonical(b):
                out.append(f"{f.name} {a!r} != {b!r}")
        return out

    def check(self, asked: FeaturizerSpec, where: str, fix: str = "", ignore: tuple[str, ...] = ()) -> None:
        """Raise SpecMismatch when `asked` (the reader's featurizer) would give other vectors than this (written)
        spec: `where` names the record, `fix` says what to do; `ignore`: fields that do not decide the reader's
        vectors (SENTENCE_ONLY for word vectors)."""
        diff = self.differences(asked, ignore)
        if diff:
            raise SpecMismatch(
                f"{where} holds other vectors than asked for (written != asked: {'; '.join(diff)})"
                + (f"; {fix}" if fix else "; use a featurizer with the recorded settings, or write them again")
            )


def _resolved(layers) -> bool:
    """False for layers counted from the top (-1), which only the model resolves."""
    return not any(isinstance(i, int) and i < 0 for i in ([layers] if isinstance(layers, int) else layers))


def _canonical(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):  # a ScalarMix: compare its weights to float32 precision
        return {
            k: [round(float(x), 6) for x in v] if isinstance(v, list) else round(float(v), 6) for k, v in value.items()
        }
    return value


def model_identity(name: str, folder: Path | None) -> tuple[str, str | None]:
    """(model, revision) of a loaded model: a local folder as its absolute path, a Hub name without "@revision" and
    the commit of the snapshot it was read from (the Hugging Face cache's snapshots/COMMIT folder)."""
    name = str(name)
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local.resolve()), None
    revision = None
    if folder is not None and Path(folder).parent.name == "snapshots":
        revision = Path(folder).name
    elif "@" in name:
        revision = name.partition("@")[2]
    return name.partition("@")[0], revision


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
