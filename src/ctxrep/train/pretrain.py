"""Pretrain a model from plain text: tokenizer, packed corpus, objective, Trainer, a loadable model folder.

    pretrain("mlm", load_config("tiny"), "corpus/", "runs/bert-tiny")

Steps (`ctxrep pretrain` runs exactly this):
1. the tokenizer: `--tokenizer PATH`, else OUT/tokenizer.json from an earlier run, else trained on the
   corpus (WordPiece or byte-level BPE as [tokenizer] kind says for mlm / mlm+nsp / electra; byte-level BPE
   for clm; for plm byte-level BPE plus <sep> and <cls> with XLNet's template "A <sep> <cls>");
2. its vocabulary must have exactly [tokenizer] vocab_size entries, the model's embedding rows;
3. the corpus is packed into OUT/corpus/ (reused when up to date) and its last sentences are held out
   ([data] eval_fraction) for the trainer's evaluations;
4. the objective's `PretrainRun` (segment pairs for mlm+nsp, RoBERTa FULL-SENTENCES otherwise);
5. `Trainer(...).train(resume=...)`. OUT itself becomes the model folder: config.json, model.safetensors,
   tokenizer.json, tokenizer_config.json (ctxrep.load_model, ctxrep.Featurizer and transformers load it);
   OUT/log.jsonl holds the training log, OUT/checkpoint/ the resumable state, OUT/pretrain.json the
   objective and the resolved config.

Configs are TOML files with the sections [encoder], [tokenizer], [data], [objective], [trainer] (the
fields of the dataclasses below and of TrainerConfig) and [elmo] (the biLM shape, read by
ctxrep.objectives.bilm). Shipped configs live in ctxrep/configs/pretrain/ and are named without ".toml".
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ctxrep.data.corpus import CorpusConfig, PackedCorpus, pack_corpus
from ctxrep.data.packing import (
    FullSentencesConfig,
    FullSentencesPacker,
    PackingError,
    SegmentPairConfig,
    SegmentPairPacker,
    ShortSequenceWarmup,
)
from ctxrep.tokenize import Tokenizer
from ctxrep.train import distributed
from ctxrep.train.run import PretrainRun
from ctxrep.train.trainer import CHECKPOINT_DIR, Trainer, TrainerConfig

OBJECTIVES = ("mlm", "mlm+nsp", "electra", "clm", "plm", "bilm")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "pretrain"
RUN_FILE = "pretrain.json"
CORPUS_DIR = "corpus"
XLNET_SPECIALS = ("<sep>", "<cls>")


class PretrainError(ValueError):
    """A config, corpus or output folder that cannot be used for pretraining, with what to change."""


# ------------------------------------------------------------------------------------------- config


@dataclass
class EncoderSection:
    """The network's shape. BERT names; clm maps them onto GPT2Config, plm onto XLNetConfig."""

    model_type: str = "bert"  # "bert" or "roberta" for mlm; electra always builds "electra"
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 0  # 0 = hidden_size; ELECTRA-small has narrower embeddings projected up
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02


@dataclass
class TokenizerSection:
    kind: str = "wordpiece"  # for mlm / mlm+nsp / electra; clm and plm always use byte-level BPE
    vocab_size: int = 30522  # tokenizer entries = the model's embedding rows
    lowercase: bool = True
    min_frequency: int = 2


@dataclass
class DataSection:
    max_length: int = 128  # tokens per sequence, special tokens included
    short_seq_prob: float = 0.1  # mlm+nsp: pairs aiming at a random shorter length (BERT)
    short_seq_warmup_length: int = 0  # short-sequence warm-up length; 0 = no warm-up
    short_seq_warmup_steps: int = 0  # optimizer steps at short_seq_warmup_length (BERT: 90% of its steps at 128)
    document_boundary: str = "file"  # "file" or "blank_line"
    strip_gutenberg: bool = True
    eval_fraction: float = 0.02  # share of the corpus's tokens held out (its last sentences); 0 = no evaluation
    num_workers: int = 0  # tokenizer processes for packing; 0 = one per CPU, 1 = this process


@dataclass
class ObjectiveSection:
    mask_prob: float = 0.15  # mlm, mlm+nsp, electra
    replace_prob: float = 0.8  # of the selected tokens: [MASK]
    random_prob: float = 0.1  # ... a random token (the rest stay unchanged)
    whole_word: bool = False
    static_copies: int = 0  # 0 = dynamic masking (RoBERTa); N = one of N fixed masks per sequence (BERT)
    generator_size_fraction: float = 0.25  # electra: generator hidden / heads / intermediate vs discriminator
    disc_weight: float = 50.0  # electra: lambda
    k: int = 6  # plm: predict the last 1/K of each factorization order
    span_prediction: bool = False  # plm
    max_span: int = 5  # plm
    bidirectional_context: bool = True  # plm


SECTIONS: dict[str, type] = {
    "encoder": EncoderSection,
    "tokenizer": TokenizerSection,
    "data": DataSection,
    "objective": ObjectiveSection,
    "trainer": TrainerConfig,
}
FREE_SECTIONS = ("elmo",)  # passed on to the biLM builder, which checks them


@dataclass
class PretrainConfig:
    encoder: EncoderSection
    tokenizer: TokenizerSection
    data: DataSection
    objective: ObjectiveSection
    trainer: TrainerConfig
    raw: dict = field(default_factory=dict)  # the whole TOML after overrides (what build_bilm_run reads)
    source: str = ""  # the file it came from


def config_path(name_or_path: str | Path) -> Path:
    """A shipped config name ("tiny", "small", "bert-base", ...) or the path of a TOML file."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = CONFIG_DIR / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
    raise PretrainError(f"config {str(name_or_path)!r} is neither a TOML file nor a shipped config ({names})")


def load_config(name_or_path: str | Path, overrides: list[tuple[str, str]] = ()) -> PretrainConfig:
    """Read a TOML config, apply `overrides` ((key, text value): "trainer.lr" or "lr" when unambiguous)."""
    path = config_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PretrainError(f"{path}: not valid TOML ({e})") from None
    for section, value in raw.items():
        if section not in SECTIONS and section not in FREE_SECTIONS:
            known = ", ".join(f"[{s}]" for s in (*SECTIONS, *FREE_SECTIONS))
            raise PretrainError(f"{path}: unknown section [{section}]; the sections are {known}")
        if not isinstance(value, dict):
            raise PretrainError(f"{path}: {section} must be a [{section}] table, not a value")
        if section in SECTIONS:
            hints = _field_types(SECTIONS[section])
            for key in value:
                if key not in hints:
                    raise PretrainError(f"{path}: unknown key {key!r} in [{section}]; known: {', '.join(hints)}")
    for key, text in overrides:
        _apply_override(raw, key, text, path)
    sections = {}
    for name, cls in SECTIONS.items():
        hints = _field_types(cls)
        values = {k: _coerce(v, hints[k], f"{path}: [{name}] {k}") for k, v in raw.get(name, {}).items()}
        try:
            sections[name] = cls(**values)
        except (TypeError, ValueError) as e:
            raise PretrainError(f"{path}: [{name}]: {e}") from None
    return PretrainConfig(**sections, raw=raw, source=str(path))


def _field_types(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _apply_override(raw: dict, key: str, text: str, path: Path) -> None:
    """Set raw[section][field] from "--section.field VALUE" or "--field VALUE" (when one section has it)."""
    key = key.replace("-", "_")
    if "." in key:
        section, name = key.split(".", 1)
        if section in SECTIONS:
            if name not in _field_types(SECTIONS[section]):
                raise PretrainError(f"--{key}: [{section}] in {path} has no key {name!r}")
        elif section in FREE_SECTIONS:
            table = raw.get(section, {})
            *parents, leaf = name.split(".")
            for p in parents:
                table = table.get(p, {}) if isinstance(table, dict) else {}
            if not isinstance(table, dict) or leaf not in table:
                raise PretrainError(f"--{key}: {path} has no key {name!r} in [{section}] to override")
        else:
            raise PretrainError(f"--{key}: unknown section {section!r} (sections: {', '.join(SECTIONS)}, elmo)")
    else:
        owners = [s for s, cls in SECTIONS.items() if key in _field_types(cls)]
        owners += [s for s in FREE_SECTIONS if isinstance(raw.get(s), dict) and key in raw[s]]
        if not owners:
            raise PretrainError(f"--{key}: no config section has a key {key!r} ({path})")
        if len(owners) > 1:
            options = " or ".join(f"--{s}.{key}" for s in owners)
            raise PretrainError(f"--{key} is ambiguous: sections {', '.join(owners)} all have it; use {options}")
        section, name = owners[0], key
    value = _parse_value(text)
    if section in SECTIONS:
        value = _coerce(value, _field_types(SECTIONS[section])[name], f"--{key}")
    table = raw.setdefault(section, {})
    *parents, leaf = name.split(".")
    for p in parents:
        table = table[p]
    table[leaf] = value


def _parse_value(text: str):
    """A TOML literal (1e-3, true, [0.9, 0.98], "x"), or else the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _coerce(value, hint, where: str):
    """Check a value against a dataclass field type (int, float, bool, str, tuple[float, float])."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            return tuple(float(v) for v in value)
        raise PretrainError(f"{where}: expected a list of numbers like [0.9, 0.999], got {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise PretrainError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ the run


def pretrain(
    objective: str,
    config: PretrainConfig,
    corpus: str | Path,
    out_dir: str | Path,
    max_steps: int | None = None,
    resume: bool = False,
    tokenizer: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Train `objective` on the text of `corpus` into `out_dir`; returns the trainer's last metrics.

    Call `distributed.init_distributed()` first under torchrun: rank 0 trains the tokenizer and packs the
    corpus while the others wait.
    """
    if objective not in OBJECTIVES:
        raise PretrainError(f"objective {objective!r} is unknown; use one of {', '.join(OBJECTIVES)}")
    if max_steps is not None:
        config.trainer.max_steps = max_steps
    out = Path(out_dir)
    corpus = Path(corpus)
    ctx = distributed.current()
    _check_out_dir(out, objective, config, resume, ctx)

    torch.manual_seed(config.trainer.seed)  # the same initial weights on every process and every run
    if objective == "bilm":
        from ctxrep.objectives.bilm import build_bilm_run

        # rank 0 builds the vocabulary and packs the text; the others then find both in `out` and reuse them
        run = ctx.main_first(lambda: build_bilm_run(config.raw, corpus, out),
                             lambda: build_bilm_run(config.raw, corpus, out, progress=False))  # fmt: skip
    else:

        def prepare():
            tok = prepare_tokenizer(objective, config, corpus, out, tokenizer)
            return tok, pack_corpus(corpus, out, out / CORPUS_DIR, _corpus_config(config.data), progress=progress)

        tok, packed = ctx.main_first(prepare, lambda: (Tokenizer.from_model_dir(out), PackedCorpus.open(out / CORPUS_DIR)))
        run = build_run(objective, config, packed, tok)
    trainer = Trainer(run.objective, config.trainer, run.train_data, out, run.eval_data, run.save_model)
    return trainer.train(resume=resume)


def _check_out_dir(out: Path, objective: str, config: PretrainConfig, resume: bool, ctx) -> None:
    """Refuse to resume a run of another objective; record this run's objective and config."""
    record = out / RUN_FILE
    has_checkpoint = (out / CHECKPOINT_DIR / "trainer_state.json").is_file()
    if resume:
        if not record.is_file():
            raise PretrainError(f"{out}: nothing to resume ({RUN_FILE} is missing); start the run without --resume")
        saved = json.loads(record.read_text())
        if saved.get("objective") != objective:
            raise PretrainError(
                f"{out} holds a {saved.get('objective')} run, not {objective}; resume with "
                f"--objective {saved.get('objective')}, or pretrain {objective} into another --out folder"
            )
        return
    if has_checkpoint:
        raise PretrainError(
            f"{out} already holds a checkpoint; pass --resume to continue that run, or choose another --out folder"
        )
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        settings = {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}
        text = json.dumps({"objective": objective, "config": config.source, "settings": settings}, indent=2)
        record.write_text(text + "\n")


def _corpus_config(data: DataSection) -> CorpusConfig:
    if data.document_boundary not in ("file", "blank_line"):
        raise PretrainError(f"[data] document_boundary={data.document_boundary!r}: use 'file' or 'blank_line'")
    workers = None if data.num_workers == 0 else data.num_workers
    return CorpusConfig(data.document_boundary, data.strip_gutenberg, workers)


def tokenizer_kind(objective: str, config: PretrainConfig) -> str:
    """WordPiece or BPE for the BERT family as the config says; byte-level BPE for clm and plm."""
    return "bpe" if objective in ("clm", "plm") else config.tokenizer.kind


def prepare_tokenizer(
    objective: str, config: PretrainConfig, corpus: Path, out: Path, tokenizer: str | Path | None = None
) -> Tokenizer:
    """The run's tokenizer in out/: copied from `tokenizer`, kept from an earlier run, or trained on the corpus."""
    from ctxrep.tokenizer_training import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    t = config.tokenizer
    if tokenizer is not None:
        source = Path(tokenizer)
        source_file = source / "tokenizer.json" if source.is_dir() else source
        if not source_file.is_file():
            raise PretrainError(
                f"--tokenizer {tokenizer}: no tokenizer.json there; pass a tokenizer.json file or its folder"
            )
        if source_file.resolve() != (out / "tokenizer.json").resolve():
            shutil.copyfile(source_file, out / "tokenizer.json")
            if (source_file.parent / "tokenizer_config.json").is_file():
                shutil.copyfile(source_file.parent / "tokenizer_config.json", out / "tokenizer_config.json")
        where = f"--tokenizer {tokenizer}"
    elif (out / "tokenizer.json").is_file():
        where = f"{out / 'tokenizer.json'} (from an earlier run)"
    else:
        kind = tokenizer_kind(objective, config)
        extra = len(XLNET_SPECIALS) if objective == "plm" else 0
        corpus_config = _corpus_config(config.data)
        train_tokenizer(corpus, kind, t.vocab_size - extra, out, t.lowercase, t.min_frequency, corpus_config)
        if objective == "plm":
            _add_xlnet_template(out)
        where = f"the {kind} tokenizer trained on {corpus}"
    tok = Tokenizer.from_model_dir(out)
    if tok.vocab_size != t.vocab_size:
        raise PretrainError(
            f"{where} has {tok.vocab_size} entries but the model's vocab_size is {t.vocab_size} ([tokenizer] "
            f"vocab_size in {config.source}); set --tokenizer.vocab_size {tok.vocab_size}, or use a larger corpus "
            "or another tokenizer"
        )
    return tok


def _add_xlnet_template(out: Path) -> None:
    """Give a trained byte-level BPE tokenizer XLNet's specials and template: A <sep> <cls>, A <sep> B <sep> <cls>."""
    from tokenizers import AddedToken, processors
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in XLNET_SPECIALS])
    sep, cls = (tok.token_to_id(s) for s in XLNET_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)],
    )
    tok.save(str(out / "tokenizer.json"))
    settings_file = out / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    settings.update(sep_token="<sep>", cls_token="<cls>", model_input_names=["input_ids", "attention_mask"])
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")


# ----------------------------------------------------------------------------------- objective runs


def build_run(objective: str, config: PretrainConfig, corpus: PackedCorpus, tokenizer: Tokenizer) -> PretrainRun:
    """The objective module, its train / held-out packers and its saver, for every objective but bilm."""
    from ctxrep.objectives.masked_lm import MaskedLMConfig, word_start_table

    enc, o = config.encoder, config.objective
    vocab_size = config.tokenizer.vocab_size
    special_ids = tuple(sorted(i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special))
    word_start = word_start_table(tokenizer) if o.whole_word else None
    mlm = None
    if objective in ("mlm", "mlm+nsp", "electra"):
        mlm = MaskedLMConfig.from_tokenizer(
            tokenizer, mask_prob=o.mask_prob, replace_prob=o.replace_prob, random_prob=o.random_prob,
            whole_word=o.whole_word, static_copies=o.static_copies or None, seed=config.trainer.seed,
        )  # fmt: skip

    if objective in ("mlm", "mlm+nsp"):
        from ctxrep.objectives.masked_lm import MaskedLMObjective

        if enc.model_type not in ("bert", "roberta"):
            raise PretrainError(
                f"[encoder] model_type={enc.model_type!r} cannot be trained with {objective}: use 'bert' or "
                "'roberta' (or --objective electra for ELECTRA)"
            )
        bert = _bert_config(config, enc.model_type, tokenizer)
        module = MaskedLMObjective(bert, mlm, nsp=objective == "mlm+nsp", word_start=word_start)
        positions = module.config.max_tokens
    elif objective == "electra":
        from ctxrep.objectives.electra import ElectraObjective, ElectraObjectiveConfig

        electra = ElectraObjectiveConfig(o.generator_size_fraction, o.disc_weight, mlm)
        module = ElectraObjective(_bert_config(config, "electra", tokenizer), electra, word_start)
        positions = module.encoder_config.max_tokens
    elif objective == "clm":
        from ctxrep.models.gpt2 import GPT2Config
        from ctxrep.objectives.causal_lm import CausalLMObjective

        eos = tokenizer.backend.token_to_id("</s>")
        gpt2 = GPT2Config(
            vocab_size=vocab_size, n_positions=enc.max_position_embeddings, n_embd=enc.hidden_size,
            n_layer=enc.num_hidden_layers, n_head=enc.num_attention_heads, n_inner=enc.intermediate_size,
            resid_pdrop=enc.hidden_dropout_prob, embd_pdrop=enc.hidden_dropout_prob,
            attn_pdrop=enc.attention_probs_dropout_prob, initializer_range=enc.initializer_range,
            bos_token_id=tokenizer.backend.token_to_id("<s>"), eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        module = CausalLMObjective(gpt2)
        positions = gpt2.n_positions
    elif objective == "plm":
        from ctxrep.models.xlnet import XLNetConfig
        from ctxrep.objectives.permutation_lm import PermutationLMConfig
        from ctxrep.objectives.permutation_lm_objective import PermutationLMObjective

        xlnet = XLNetConfig(
            vocab_size=vocab_size, d_model=enc.hidden_size, n_layer=enc.num_hidden_layers,
            n_head=enc.num_attention_heads, d_inner=enc.intermediate_size, dropout=enc.hidden_dropout_prob,
            initializer_range=enc.initializer_range, layer_norm_eps=enc.layer_norm_eps,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.backend.token_to_id("<s>"),
            eos_token_id=tokenizer.backend.token_to_id("</s>"),
        )  # fmt: skip
        plm = PermutationLMConfig(o.k, o.span_prediction, o.max_span, o.bidirectional_context)
        module = PermutationLMObjective(xlnet, plm, special_ids)
        positions = None  # relative positions: any length
    else:
        raise PretrainError(f"objective {objective!r} has no pretraining run here; use one of {', '.join(OBJECTIVES)}")

    data = config.data
    for name in ("max_length", "short_seq_warmup_length"):
        length = getattr(data, name)
        if positions is not None and length > positions:
            raise PretrainError(
                f"[data] {name}={length} is longer than the model's {positions} positions "
                f"([encoder] max_position_embeddings in {config.source}); lower {name} or raise max_position_embeddings"
            )
    pairs = objective == "mlm+nsp"
    train_corpus, eval_corpus = split_held_out(corpus, data, min_documents=2 if pairs else 1)
    train_data = _packer(pairs, train_corpus, config, tokenizer, warmup=True)
    eval_data = _packer(pairs, eval_corpus, config, tokenizer, warmup=False) if eval_corpus is not None else None
    return PretrainRun(module, train_data, eval_data, module.save_pretrained)


def _bert_config(config: PretrainConfig, model_type: str, tokenizer: Tokenizer):
    from ctxrep.models.bert import BertConfig

    enc = config.encoder
    return BertConfig(
        model_type=model_type, vocab_size=config.tokenizer.vocab_size, hidden_size=enc.hidden_size,
        num_hidden_layers=enc.num_hidden_layers, num_attention_heads=enc.num_attention_heads,
        intermediate_size=enc.intermediate_size, hidden_act=enc.hidden_act,
        hidden_dropout_prob=enc.hidden_dropout_prob, attention_probs_dropout_prob=enc.attention_probs_dropout_prob,
        max_position_embeddings=enc.max_position_embeddings, type_vocab_size=enc.type_vocab_size,
        layer_norm_eps=enc.layer_norm_eps, initializer_range=enc.initializer_range,
        pad_token_id=tokenizer.pad_token_id, embedding_size=enc.embedding_size or None,
        add_pooling_layer=model_type != "electra",
    )  # fmt: skip


def _packer(pairs: bool, corpus: PackedCorpus, config: PretrainConfig, tokenizer: Tokenizer, warmup: bool):
    data, trainer = config.data, config.trainer
    schedule = None
    if warmup and data.short_seq_warmup_length and data.short_seq_warmup_steps:
        # The packer counts micro-batches.
        micro_batches = data.short_seq_warmup_steps * trainer.accumulation_steps
        schedule = ShortSequenceWarmup(data.short_seq_warmup_length, micro_batches)
    if pairs:
        pair_config = SegmentPairConfig(data.max_length, data.short_seq_prob, trainer.seed, schedule)
        return SegmentPairPacker(corpus, pair_config, tokenizer)
    return FullSentencesPacker(corpus, FullSentencesConfig(data.max_length, trainer.seed, schedule), tokenizer)


def split_held_out(
    corpus: PackedCorpus, data: DataSection, min_documents: int = 1
) -> tuple[PackedCorpus, PackedCorpus | None]:
    """(train, held-out): the held-out part is the corpus's last sentences, at least eval_fraction of its
    tokens, one sequence (max_length) and `min_documents` documents; a document cut by the split becomes
    one document on each side. eval_fraction = 0: (corpus, None)."""
    if not 0.0 <= data.eval_fraction < 1.0:
        raise PretrainError(f"[data] eval_fraction={data.eval_fraction} must be in [0, 1)")
    if data.eval_fraction == 0:
        return corpus, None
    sent_off = corpus.sentence_offsets
    n = corpus.num_sentences
    doc_starts = corpus.document_offsets[:-1]
    want = max(int(np.ceil(data.eval_fraction * corpus.num_tokens)), data.max_length)
    cuts = np.arange(1, n)  # held-out = sentences [c, n)
    tokens_after = corpus.num_tokens - sent_off[cuts]
    docs_after = 1 + (len(doc_starts) - np.searchsorted(doc_starts, cuts, side="right"))
    docs_before = np.searchsorted(doc_starts, cuts, side="left")
    ok = (tokens_after >= want) & (docs_after >= min_documents) & (docs_before >= min_documents)
    ok &= sent_off[cuts] >= data.max_length
    if not ok.any():
        raise PackingError(
            f"{corpus.path}: the corpus ({corpus.num_tokens} tokens, {corpus.num_documents} documents) is too small to "
            f"hold out {data.eval_fraction:.0%} of it (at least one sequence of max_length={data.max_length} tokens"
            + (f" and {min_documents} documents" if min_documents > 1 else "")
            + ") for evaluation and still train; use more text, or set --data.eval_fraction 0 to train without "
            "evaluation"
        )
    c = int(cuts[ok].max())
    return _sentence_slice(corpus, 0, c), _sentence_slice(corpus, c, n)


def _sentence_slice(corpus: PackedCorpus, first: int, last: int) -> PackedCorpus:
    """Sentences [first, last) as a PackedCorpus (a view: no token is copied)."""
    sent_off = corpus.sentence_offsets
    begin, end = int(sent_off[first]), int(sent_off[last])
    starts = corpus.document_offsets[:-1]
    inner = starts[(starts > first) & (starts < last)] - first
    documents = np.concatenate([[0], inner, [last - first]]).astype(np.int64)
    sentences = sent_off[first : last + 1] - begin
    return PackedCorpus(corpus.path, corpus.tokens[begin:end], sentences, documents, corpus.manifest)
