"""Train a Transformer translation model on parallel text with the shared Trainer.

    config = load_config("multi30k", [("trainer.max_steps", "2000")])
    metrics = train_mt(config, "train.en", "train.de", "val.en", "val.de", "runs/en-de")

What a run does (`ctxrep mt train` runs exactly this):
1. reads the aligned training and validation files (ctxrep.translate.data: UTF-8 checked per line, empty pairs
   skipped and counted, unequal lengths refused);
2. trains a joint BPE / unigram vocabulary on both sides of the training data into OUT/tokenizer.json (kept
   from an earlier run in OUT; under torchrun rank 0 trains it, the others load it);
3. builds a MarianMTModel of the [model] shape with a shared source/target vocabulary, tied embeddings;
4. trains it with the Trainer: Adam (weight_decay 0, betas (0.9, 0.98), eps 1e-9; with no decay AdamW is Adam),
   the paper's inverse-square-root schedule (`inverse_sqrt`, eq. 3), label-smoothed cross-entropy
   (epsilon 0.1, sec. 5.4), dropout, token-budget batches ([trainer] batch_size counts target-side tokens of
   rows x longest side per optimizer step, not rows), the validation loss over every validation pair and BLEU /
   chrF of greedy translations of the first [training] bleu_sentences validation sentences at each evaluation;
5. at every checkpoint saves the weights as OUT/snapshots/step-NNNNNNN.safetensors, keeps the last
   [training] average_last of them, and writes their mean into OUT as the model (Vaswani et al. averaged the
   last 5 checkpoints, written at 10-minute intervals, for the base models): OUT is a Marian-format folder
   (config.json, model.safetensors, tokenizer.json) that ctxrep.load_model and transformers' MarianMTModel load.

Configs are TOML files with the sections [model] (MarianConfig's shape), [tokenizer], [data], [training] and
[trainer] (TrainerConfig's fields; lr is the factor in front of the schedule: 1.0 is the paper's). Shipped
configs live in ctxrep/configs/mt/ (tiny, multi30k-10min, multi30k, base) and are named without ".toml".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from torch import nn

from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train import distributed
from ctxrep.train.config import Schema, check_run_folder
from ctxrep.train.trainer import Trainer, TrainerConfig
from ctxrep.translate import data as mtdata
from ctxrep.util.files import apply_umask

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "mt"
RUN_FILE = "mt_train.json"
SNAPSHOT_DIR = "snapshots"


class MTTrainError(ValueError):
    """A config, data set or output folder that cannot be used for training, with what to change."""


# ------------------------------------------------------------------------------------------- config


@dataclass
class ModelSection:
    """The network's shape, in transformers' MarianConfig names (the paper's base: 512, 6 + 6, 8 heads, 2048)."""

    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float = 0.1  # P_drop: on each sub-layer's output and on the embedding sums (sec. 5.4)
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_function: str = "relu"
    max_position_embeddings: int = 256
    scale_embedding: bool = True  # embeddings x sqrt(d_model) (sec. 3.4)
    normalize_before: bool = False  # pre-LayerNorm; such a model is saved in ctxrep's own format, not Marian's


@dataclass
class TokenizerSection:
    kind: str = "bpe"  # "bpe" or "unigram", one vocabulary for both languages
    vocab_size: int = 8000
    min_frequency: int = 2


@dataclass
class DataSection:
    skip_long: bool = False  # leave out training pairs longer than max_position_embeddings (else: an error)
    eval_batch_tokens: int = 4096  # token budget of the validation-loss batches


@dataclass
class TrainingSection:
    label_smoothing: float = 0.1  # epsilon_ls (sec. 5.4)
    average_last: int = 5  # the model written to OUT is the mean of the last K snapshots; 1 = the current weights
    bleu_sentences: int = 200  # validation sentences translated (greedy) for BLEU/chrF at each evaluation; 0 = none
    bleu_beam: int = 1


SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "tokenizer": TokenizerSection,
    "data": DataSection,
    "training": TrainingSection,
    "trainer": TrainerConfig,
}


@dataclass
class MTConfig:
    model: ModelSection = field(default_factory=ModelSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    source: str = ""

    def validate(self) -> None:
        t, tr = self.tokenizer, self.training
        if t.kind not in mtdata.TOKENIZER_KINDS:
            raise MTTrainError(f"{self.source}: [tokenizer] kind={t.kind!r}; use 'bpe' or 'unigram'")
        if not 0.0 <= tr.label_smoothing < 1.0:
            raise MTTrainError(f"{self.source}: [training] label_smoothing={tr.label_smoothing} must be in [0, 1)")
        if tr.average_last < 1:
            raise MTTrainError(f"{self.source}: [training] average_last={tr.average_last} must be 1 or more")
        if tr.bleu_sentences < 0 or tr.bleu_beam < 1:
            raise MTTrainError(f"{self.source}: [training] bleu_sentences must be >= 0 and bleu_beam >= 1")
        if (
            self.model.d_model % self.model.encoder_attention_heads
            or self.model.d_model % self.model.decoder_attention_heads
        ):
            raise MTTrainError(f"{self.source}: [model] d_model={self.model.d_model} must be a multiple of the heads")


SCHEMA = Schema(SECTIONS, CONFIG_DIR, MTTrainError, "MT config")


def config_path(name_or_path: str | Path) -> Path:
    """A shipped config name ("tiny", "multi30k-10min", "multi30k", "base") or the path of a TOML file."""
    return SCHEMA.path(name_or_path)


def load_config(name_or_path: str | Path, overrides: Sequence[tuple[str, str]] = ()) -> MTConfig:
    """Read a TOML config and apply `overrides` ((key, text value): "trainer.lr", or "lr" when unambiguous)."""
    sections, _, source = SCHEMA.load(name_or_path, overrides)
    config = MTConfig(**sections, source=source)
    config.validate()
    return config


# ------------------------------------------------------------------------------ schedule, loss, average


def inverse_sqrt(step: int, d_model: int, warmup_steps: int) -> float:
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)   (Vaswani et al. 2017, eq. 3)

    `step` is the number of optimizer steps already taken (LambdaLR's count), so step_num = step + 1: the
    rate rises linearly for warmup_steps steps, peaks at (d_model * warmup_steps)^-0.5, then falls as 1/sqrt.
    """
    if warmup_steps < 1:
        raise MTTrainError(f"warmup_steps={warmup_steps}: the inverse-square-root schedule needs warmup_steps >= 1")
    t = step + 1
    return d_model**-0.5 * min(t**-0.5, t * warmup_steps**-1.5)


def label_smoothed_loss(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float, ignore_index: int = mtdata.IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(smoothed loss, NLL, tokens), both losses summed over the positions whose label is not ignore_index.

    Label smoothing (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4) trains towards
    q'(k) = (1 - eps) * [k = y] + eps / V, so per token
        loss = (1 - eps) * (-log p_y) + (eps / V) * sum_k (-log p_k)
    (torch's cross_entropy(label_smoothing=eps) is the same). logits: (..., V); labels: (...).
    """
    keep = labels != ignore_index
    logits, labels = logits[keep], labels[keep]  # (tokens, V), (tokens,)
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1).sum()
    if epsilon == 0:
        return nll, nll.detach(), int(labels.numel())
    smooth = -logp.sum()
    loss = (1.0 - epsilon) * nll + (epsilon / logits.size(-1)) * smooth
    return loss, nll.detach(), int(labels.numel())


def average_state_dicts(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of safetensors state dicts with the same keys and shapes (checkpoint averaging)."""
    if not paths:
        raise MTTrainError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    first = Path(paths[0])
    for path in paths:
        state = load_file(str(path))
        if not total:
            total = {k: v.double().clone() for k, v in state.items()}
            continue
        if set(state) != set(total):
            diff = sorted(set(state) ^ set(total))[:3]
            raise MTTrainError(
                f"{path} and {first} hold different tensors ({', '.join(diff)}); average checkpoints of one run only"
            )
        for k, v in state.items():
            if v.shape != total[k].shape:
                raise MTTrainError(
                    f"{path}: {k} is {tuple(v.shape)}, {tuple(total[k].shape)} in {first}; average "
                    "checkpoints of one model shape only"
                )
            total[k] += v.double()
    dtypes = {k: v.dtype for k, v in load_file(str(first)).items()}
    return {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}


# -------------------------------------------------------------------------------------- the objective


class TranslationObjective(nn.Module):
    """A MarianMTModel trained with label-smoothed cross-entropy, mean over the batch's target tokens.

    fast_loss (the default): EncoderDecoder.seq2seq_loss, which projects only the decoder states of real target
    tokens onto the vocabulary; False: `label_smoothed_loss` of the full (batch, tgt, vocab) logits, the reference
    it is tested against (tests/test_marian.py) and benchmarked against (benchmarks/mt_train_speed.py)."""

    def __init__(self, model: nn.Module, label_smoothing: float = 0.1, fast_loss: bool = True) -> None:
        super().__init__()
        self.model = model
        self.config = model.config  # the trainer's checkpoint fingerprint reads it
        self.label_smoothing = label_smoothing
        self.fast_loss = fast_loss

    def losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(label-smoothed loss, NLL, tokens) of a batch, summed over its real target tokens."""
        if self.fast_loss:
            return self.model.seq2seq_loss(
                batch["input_ids"],
                batch["attention_mask"],
                batch["decoder_input_ids"],
                batch["labels"],
                self.label_smoothing,
            )
        out = self.model(
            batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"]
        )
        return label_smoothed_loss(out.logits, batch["labels"], self.label_smoothing)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        loss, nll, tokens = self.losses(batch)
        tokens = max(tokens, 1)
        num_tokens = int(batch["attention_mask"].sum()) + tokens  # source + target tokens, for tokens/s
        return ObjectiveOutput(loss / tokens, num_tokens, {"nll": float(nll) / tokens}, nll=float(nll) / tokens)

    @torch.no_grad()
    def evaluate_loss(self, batches) -> dict[str, float]:
        """Token-weighted label-smoothed loss, NLL and perplexity exp(NLL) over every batch of `batches`."""
        loss_sum = nll_sum = 0.0
        count = 0
        for batch in batches:
            batch = {k: torch.from_numpy(v).to(next(self.parameters()).device) for k, v in batch.items()}
            loss, nll, n = self.losses(batch)
            loss_sum, nll_sum, count = loss_sum + float(loss), nll_sum + float(nll), count + n
        nll = nll_sum / max(count, 1)
        return {
            "eval_loss": loss_sum / max(count, 1),
            "eval_nll": nll,
            "eval_perplexity": math.exp(nll) if nll < 700 else float("inf"),
        }


# ------------------------------------------------------------------------------------------ the run


def marian_config(config: MTConfig, vocab_size: int):
    """The MarianConfig of the [model] section, with the vocabulary's special ids (<pad> 0, </s> 1)."""
    from ctxrep.models.marian import MarianConfig

    shape = dataclasses.asdict(config.model)
    try:
        return MarianConfig(
            **shape,
            vocab_size=vocab_size,
            pad_token_id=mtdata.PAD_ID,
            eos_token_id=mtdata.EOS_ID,
            decoder_start_token_id=mtdata.PAD_ID,
        )
    except (TypeError, ValueError) as e:
        raise MTTrainError(f"{config.source}: [model] does not make a MarianConfig ({e})") from None


def train_mt(
    config: MTConfig,
    src: str | Path,
    tgt: str | Path,
    valid_src: str | Path | None,
    valid_tgt: str | Path | None,
    out_dir: str | Path,
    max_steps: int | None = None,
    resume: bool = False,
    progress: bool = True,
) -> dict:
    """Train a translation model from `src` to `tgt` into `out_dir`; returns the trainer's last metrics. `progress`:
    the Trainer's progress (False: none, as `ctxrep mt train --no-progress`).

    Call `distributed.init_distributed()` first under torchrun: rank 0 trains the tokenizer, the others load it.
    """
    from ctxrep.models.marian import MarianMTModel
    from ctxrep.translate.tokenizer import MTTokenizer

    if max_steps is not None:
        config.trainer.max_steps = max_steps
    if (valid_src is None) != (valid_tgt is None):
        raise MTTrainError("give both --valid-src and --valid-tgt, or neither")
    out = Path(out_dir)
    ctx = distributed.current()
    _check_out_dir(out, config, resume)

    train_text = mtdata.read_parallel(src, tgt)
    valid_text = mtdata.read_parallel(valid_src, valid_tgt) if valid_src is not None else None
    ctx.main_first(lambda: _prepare_tokenizer(config, train_text, out), lambda: None)
    tok = MTTokenizer.from_model_dir(out)
    positions = config.model.max_position_embeddings
    train_pairs = mtdata.encode_pairs(train_text, tok, positions, config.data.skip_long)
    valid_pairs = mtdata.encode_pairs(valid_text, tok, positions, skip_long=True) if valid_text else None

    torch.manual_seed(config.trainer.seed)  # the same initial weights on every process and every run
    model = MarianMTModel(marian_config(config, tok.vocab_size))
    objective = TranslationObjective(model, config.training.label_smoothing)
    batches = mtdata.TokenBatches(train_pairs, seed=config.trainer.seed, row_multiple=ctx.world_size)
    holder: dict[str, Trainer] = {}
    save = SnapshotSaver(objective, config.training.average_last, lambda: holder["trainer"].step)
    evaluate = None
    if valid_pairs is not None:
        evaluate = validation(objective, valid_pairs, valid_text, tok, config)
    trainer = Trainer(
        objective,
        config.trainer,
        batches,
        out,
        save_model=save,
        evaluate=evaluate,
        schedule=lambda step: inverse_sqrt(step, config.model.d_model, config.trainer.warmup_steps),
        progress=progress,
    )
    holder["trainer"] = trainer
    return trainer.train(resume=resume)


def _prepare_tokenizer(config: MTConfig, text: mtdata.ParallelCorpus, out: Path) -> None:
    """out/tokenizer.json: an earlier (or resumed) run's, else trained on both sides of the training data."""
    if (out / "tokenizer.json").is_file():
        tok = HFTokenizer.from_file(str(out / "tokenizer.json"))
    else:
        t = config.tokenizer
        tok = mtdata.train_joint_tokenizer([text.src, text.tgt], t.vocab_size, out, t.kind, t.min_frequency)
    if [tok.token_to_id(s) for s in mtdata.SPECIALS] != [mtdata.PAD_ID, mtdata.EOS_ID, mtdata.UNK_ID]:
        raise MTTrainError(
            f"{out}/tokenizer.json does not have <pad>, </s>, <unk> at ids 0, 1, 2; remove it to train a new one"
        )


def _check_out_dir(out: Path, config: MTConfig, resume: bool) -> None:
    settings = {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}
    check_run_folder(out, resume, RUN_FILE, {"config": config.source, "settings": settings}, MTTrainError)


class SnapshotSaver:
    """The Trainer's save_model: OUT/snapshots/step-NNNNNNN.safetensors (the last K kept), and their mean
    written into OUT as the Marian folder (save_pretrained of a model holding the averaged weights)."""

    def __init__(self, objective: TranslationObjective, average_last: int, step: Callable[[], int]) -> None:
        self.objective, self.average_last, self.step = objective, average_last, step

    def __call__(self, out: Path) -> None:
        snapshots = Path(out) / SNAPSHOT_DIR
        snapshots.mkdir(parents=True, exist_ok=True)
        model = self.objective.model
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        snapshot = snapshots / f"step-{self.step():07d}.safetensors"
        save_file(state, str(snapshot))
        apply_umask(snapshot)  # safetensors writes 0600 whatever the umask
        kept = sorted(snapshots.glob("step-*.safetensors"))
        for old in kept[: -self.average_last]:
            old.unlink()
        kept = kept[-self.average_last :]
        if len(kept) == 1:
            model.save_pretrained(out)
            return
        averaged = type(model)(model.config)
        averaged.load_state_dict(average_state_dicts(kept))
        averaged.save_pretrained(out)


def validation(
    objective: TranslationObjective,
    pairs: mtdata.EncodedPairs,
    text: mtdata.ParallelCorpus,
    tokenizer,
    config: MTConfig,
) -> Callable[[], dict[str, float]]:
    """The Trainer's evaluate=: validation loss over every pair of `pairs`, BLEU / chrF of the first
    bleu_sentences of them. Pairs longer than the model's positions were left out of `pairs` (and counted,
    `encode_pairs` with skip_long=True): BLEU translates the same pairs as the loss, so no long sentence
    reaches the search."""
    budget, n = config.data.eval_batch_tokens, config.training.bleu_sentences
    kept = set(pairs.lines.tolist())
    sources = [s for s, line in zip(text.src, text.lines) if line in kept][:n]
    references = [t for t, line in zip(text.tgt, text.lines) if line in kept][:n]

    def evaluate() -> dict[str, float]:
        metrics = objective.evaluate_loss(mtdata.iter_batches(pairs, budget))
        if n:
            from ctxrep.translate.score import score

            hyps = translate_sentences(objective.model, tokenizer, sources, config.training.bleu_beam)
            s = score(hyps, references)
            metrics.update(eval_bleu=s.bleu, eval_chrf=s.chrf)
        return metrics

    return evaluate


def translate_sentences(model: nn.Module, tokenizer, sentences: Sequence[str], beam: int) -> list[str]:
    """Detokenized translations of `sentences` with ctxrep.translate.search (greedy when beam == 1)."""
    from ctxrep.translate.search import translate

    return translate(model, tokenizer, list(sentences), beam=beam)


def load_translator(model_dir: str | Path):
    """(encoder-decoder in eval mode, MTTokenizer) of a model folder or Hub name: Marian (OPUS-MT, `ctxrep mt train`'s), BART /
    mBART or T5 / mT5 / flan-t5 (the folder's own tokenizer and template); one-line errors for a folder without a
    tokenizer or with a model that is no encoder-decoder, before any weight is read."""
    from ctxrep.models.folders import read_config
    from ctxrep.models.hub import is_hub_name
    from ctxrep.models.loading import family_of, load_model, resolve
    from ctxrep.models.seq2seq import EncoderDecoder
    from ctxrep.translate.tokenizer import MTTokenizer

    path = Path(model_dir)
    if not path.is_dir():
        if not is_hub_name(str(model_dir)):
            raise FileNotFoundError(f"{model_dir}: no such model folder; pass the --out folder of `ctxrep mt train`")
        path = resolve(model_dir).folder  # a Hub name (facebook/bart-base): the cache, or a download
    family = family_of(path)
    if not issubclass(family, EncoderDecoder):
        raise MTTrainError(
            f"{path} holds a {read_config(path).get('model_type')!r} model, not an encoder-decoder (a translation "
            "model: model_type marian, bart, mbart, t5 or mt5); pass a folder written by `ctxrep mt train`, an OPUS-MT "
            "folder, or a BART / T5 folder"
        )
    tokenizer = MTTokenizer.from_model_dir(path, template=family.reads_template)
    return load_model(path).eval(), tokenizer
