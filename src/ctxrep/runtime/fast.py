"""Inference fast paths for any `Encoder`: compiled float32, and int8 linear layers.

Each returns an object with the encoder's `encode(batch, output_attentions, num_layers)`; the encoder's own
forward stays the reference they are tested against (tests/test_fast.py).

  compile_encoder(encoder)   `encoder.encode` under torch.compile (Inductor, frozen weights, dynamic shapes): the
                             same float32 results (to ~1e-5), about 1.5-2x eager on CPU once compiled; compiling
                             costs 10-90 s per process (less when Inductor's on-disk cache already holds the
                             graphs), so `worth_compiling` says when a call's work (tokens x FLOPs) repays it.
  quantize_int8(encoder, batches)  a copy whose nn.Linear layers run in int8 (`Int8Linear`): per-output-channel
                             weights (7-bit where the CPU's int8 kernels would saturate: `full_range_is_exact`),
                             per-tensor activations quantised on the fly over the full 8-bit range, and
                             SmoothQuant scales (Xiao et al. 2023) calibrated on `batches` so that the few outlier
                             input channels of a Transformer do not eat the activation range.
  calibration_batches(tokenizer, max_length)  collated batches of CALIBRATION_TEXTS for `quantize_int8`.

Nothing here hard-codes CPU or float32: the compiled encoder runs on the encoder's device and dtype; int8
quantised linear layers exist on CPU only, so `quantize_int8` refuses a model on another device.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from ctxrep.models.encoder import Encoder
from ctxrep.models.outputs import EncoderOutput
from ctxrep.text.inputs import WindowPlan, collate

# compile="auto" compiles only a call whose work repays the compilation on any machine of the device's kind, by a
# rule from the work (never a timing, so the same call takes the same path everywhere): compiling costs up to
# COMPILE_SECONDS (Inductor, cold cache: 10-90 s measured per process) and saves at most 1 - 1 / COMPILE_SPEEDUP of
# the eager time (1.3-2x measured once compiled); the eager time is at least the call's FLOPs / EAGER_FLOPS[device
# type], the fastest eager rate of that kind (a many-core AVX-512 CPU; a data-centre GPU). The issue that set it
# (32): the old 400k-token rule made one 17,088-sentence call 1.17x slower with MiniLM and 4.3x with a tiny encoder.
COMPILE_SECONDS = 90.0
COMPILE_SPEEDUP = 1.3
EAGER_FLOPS = {"cpu": 2e12, "cuda": 4e14}
MEAN_LENGTH = 128  # tokens per row assumed for attention's share of the FLOPs


def flops_per_token(encoder: Encoder, mean_length: float = MEAN_LENGTH) -> float:
    """2 x the weights of every linear layer (multiply + add) + attention's QK^T and PV (4 x hidden x length per
    layer); a pooler is counted too (an upper bound by one layer's width)."""
    linear = sum(m.weight.numel() for m in encoder.modules() if isinstance(m, nn.Linear))
    return 2.0 * linear + 4.0 * encoder.hidden_size * mean_length * encoder.num_layers


def compile_min_flops(device_type: str) -> float:
    """The work (FLOPs) from which compiling repays itself on the fastest eager machine of `device_type`."""
    rate = EAGER_FLOPS.get(device_type, EAGER_FLOPS["cuda"])
    return COMPILE_SECONDS * rate / (1.0 - 1.0 / COMPILE_SPEEDUP)


def worth_compiling(num_tokens: int, encoder: Encoder) -> bool:
    """Whether compiling `encoder` repays itself within a call of `num_tokens` tokens: tokens x `flops_per_token`
    >= `compile_min_flops` of its device (MiniLM on a CPU: about 34M tokens; a BERT-base size model about 4.5M);
    ELMo's biLSTM never compiles, nor does any encoder on a CPU that `compile_encoder` refuses."""
    if encoder.word_level or num_tokens <= 0:
        return False
    device = next(encoder.parameters()).device.type
    if num_tokens * flops_per_token(encoder) < compile_min_flops(device):
        return False  # asked first: cpu_vector_isa imports Inductor (~3 s on a 2-core CPU), a first call's cost
    return device != "cpu" or bool(cpu_vector_isa())


class CompiledEncoder(nn.Module):
    """`encoder.encode` compiled by torch.compile (Inductor) with frozen weights and dynamic batch / sequence sizes.

    Inference only: the weights are folded into the compiled code as they are when it first runs, so a compiled
    encoder does not see later changes to them. Attention probabilities are not compiled (`output_attentions=True`
    calls the encoder itself). The first call of each new `num_layers` compiles; later calls reuse the code.
    If compiling fails (Inductor needs a C++ compiler on CPU): with `fallback` a one-line warning and the encoder
    runs eagerly from then on; without, a one-line error.
    """

    def __init__(self, encoder: Encoder, fallback: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.family = encoder.family
        self.word_level = encoder.word_level
        self.fallback = fallback
        self.failed: str | None = None  # why compiling failed, once it has
        device = next(encoder.parameters()).device.type
        self._compiled = torch.compile(self._hidden_states, dynamic=True, options=inductor_options(device))

    def _hidden_states(self, batch: Mapping[str, torch.Tensor], num_layers: int | None) -> tuple[torch.Tensor, ...]:
        return self.encoder.encode(batch, num_layers=num_layers).hidden_states

    def encode(
        self,
        batch: Mapping[str, torch.Tensor],
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """The encoder's `encode`, compiled; the compiled graph runs every batch padded (so `padded` holds)."""
        if output_attentions or torch.is_grad_enabled() or self.failed:  # frozen weights are for inference only
            return self.encoder.encode(batch, output_attentions=output_attentions, num_layers=num_layers, padded=padded)
        try:
            with _quiet_graph_break():
                hidden_states = self._compiled(dict(batch), num_layers)
        except torch._dynamo.exc.TorchDynamoException as e:  # compiler failures, not the model's own errors
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.failed = f"{type(e).__name__}: {first}"
            if not self.fallback:
                raise RuntimeError(
                    f"torch.compile failed ({self.failed}): pass compile=False, or install a C++ compiler for Inductor"
                ) from e
            warnings.warn(
                f"torch.compile failed ({self.failed}); running the encoder uncompiled", RuntimeWarning, stacklevel=2
            )
            return self.encoder.encode(batch, num_layers=num_layers, padded=padded)
        return EncoderOutput(last_hidden_state=hidden_states[-1], hidden_states=tuple(hidden_states))

    def forward(self, *args, **kwargs):
        return self.encoder(*args, **kwargs)


@contextlib.contextmanager
def _quiet_graph_break():
    """Dynamo warns once, at length, of the graph break at the encoders' `bool(attention_mask.all())` (the branch that
    skips masking for unpadded batches). It is expected: the code before it is tiny and the rest compiles whole."""
    logger = logging.getLogger("torch._dynamo.variables.tensor")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.cache
def cpu_vector_isa() -> str:
    """The vector instruction set Inductor writes CPU code for ("avx512", "avx2", ... or "" for none): this CPU's,
    capped by ATEN_CPU_CAPABILITY (read once per process; compile="auto" asks on every call)."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    return str(isa).split()[0] if isa else ""


def inductor_options(device_type: str) -> dict[str, bool]:
    """Inductor's options for inference: frozen weights (constants folded, linear weights prepacked), except in AVX2
    CPU code, where torch 2.13 computes NaN from dynamic shapes + freezing (DeBERTa-v3 and ModernBERT; AVX-512 code
    and AVX2 code without freezing agree with eager within 1e-6; tests/test_families2_runtime.py under
    `make test-isa`)."""
    return {"freezing": device_type != "cpu" or cpu_vector_isa() != "avx2"}


def compile_encoder(encoder: Encoder, fallback: bool = False) -> CompiledEncoder:
    """`encoder` under torch.compile for inference (see CompiledEncoder); ELMo, and a CPU without AVX2 or AVX-512
    (Inductor's scalar C++ code does not build in torch 2.13), are refused in one line."""
    if encoder.word_level:
        raise ValueError(f"{encoder.family} is a biLSTM over characters: compile is for Transformer encoders")
    if next(encoder.parameters()).device.type == "cpu" and not cpu_vector_isa():
        raise ValueError(
            "this CPU has neither AVX2 nor AVX-512 (or ATEN_CPU_CAPABILITY=default holds it below them), and torch "
            "2.13's compiled CPU code needs one: pass compile=False (the eager encoder gives the same vectors)"
        )
    return CompiledEncoder(encoder.eval(), fallback=fallback)


# ---- int8 -------------------------------------------------------------------------------------------

# Varied English for calibrating activation ranges (news, dialogue, technical, numbers, names, punctuation).
CALIBRATION_TEXTS = [
    "The quick brown fox jumps over the lazy dog .",
    "A crane lifted the steel beam onto the roof of the new library on Tuesday morning .",
    "Contextual word vectors depend on the sentence around the word .",
    "She said , `` I 'm not sure that 's what we agreed on , '' and left the room .",
    "Shares of the company fell 4.5 % to $ 23.10 after the quarterly report missed analysts ' estimates .",
    "In 1969 , Apollo 11 landed on the Moon and Neil Armstrong stepped onto its surface .",
    "The film is a charming , funny and ultimately moving portrait of a family in crisis .",
    "It 's a dull , overlong mess with no characters worth caring about .",
    "Please restart the server after installing the update ; otherwise the old configuration stays in memory .",
    "Mix two cups of flour with a pinch of salt , then add the eggs one at a time .",
    "The committee rejected the proposal by a vote of 7 to 3 , citing concerns about its cost .",
    "Why did the river flood the village again this spring ?",
    "Researchers at the University of Tokyo reported a new catalyst for splitting water with sunlight .",
    "He plays the violin , speaks four languages and still finds time to coach the under-12 football team .",
    "Turn left at the second traffic light and the museum will be on your right .",
    "The patient was given 500 mg of amoxicillin twice daily for ten days .",
    "Despite the rain , thousands of fans waited outside the stadium for hours .",
    "The novel 's final chapter reveals that the narrator had been lying all along .",
    "Berlin , Paris and Madrid announced a joint plan to cut emissions by 2030 .",
    "I would n't call it a masterpiece , but it 's better than most sequels .",
    "Each node stores a key , a value and pointers to its left and right children .",
    "The bank raised interest rates for the third time this year , to 5.25 percent .",
    "My grandmother grew tomatoes , beans and sunflowers in the small garden behind her house .",
    "Click Save , choose a folder and type a name for the file .",
    "After the match , the coach praised the defence but criticised the team 's finishing .",
    "Photosynthesis converts light energy into chemical energy stored in glucose .",
    "The museum 's collection includes paintings by Rembrandt , Vermeer and van Gogh .",
    "They missed the last train and had to walk home through the snow .",
    "@user lol that was the best game ever !!! can't wait for next week #finals",
    "Section 3.2 defines the terms ; Appendix B lists the exceptions .",
    "An unexpectedly tender , beautifully acted drama that stays with you long after the credits .",
    "The soldiers crossed the border at dawn , according to officials who spoke on condition of anonymity .",
]


def calibration_batches(
    tokenizer, max_length: int, texts: Sequence[str] = CALIBRATION_TEXTS, batch_size: int = 8
) -> list[dict[str, torch.Tensor]]:
    """`texts` (whitespace-split) tokenized as the featurizer does, in collated batches of `batch_size` windows."""
    plan = WindowPlan(tokenizer, max_length)
    pieces = tokenizer.encode_words([t.split() for t in texts])
    windows = [w for i, p in enumerate(pieces) for w in plan.single(i, p)]
    return [collate(windows[k : k + batch_size], tokenizer) for k in range(0, len(windows), batch_size)]


@contextlib.contextmanager
def _quantized_engine(name: str):
    """Select a quantized backend while weights are packed (the packed weights keep it); restore the old one."""
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def int8_engine() -> str:
    """oneDNN where present: with the full 8-bit activation range it was as fast as fbgemm's 7-bit one here."""
    engines = torch.backends.quantized.supported_engines
    for name in ("onednn", "x86", "fbgemm"):
        if name in engines:
            return name
    raise ValueError(f"this torch build has no int8 CPU backend (it has {engines}); use quantize=None")


@functools.cache
def full_range_is_exact() -> bool:
    """Whether this CPU's int8 kernels take activations over the full 0..255 range without error.

    Without VNNI (most AMD EPYC before Zen 4, Intel before Cascade Lake) the AVX2/AVX-512 kernels add pairs of
    u8 x s8 products in int16 (vpmaddubsw), which saturate at 32767 > 2 * 255 * 127 would need; 7-bit activations
    (reduce_range) cannot. A known answer decides: 64 inputs at the top of the range times weights of 1."""
    with _quantized_engine(int8_engine()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch marks its quantized tensors deprecated
        weight = torch.quantize_per_channel(
            torch.ones(8, 64),
            torch.full((8,), 1 / 127, dtype=torch.double),
            torch.zeros(8, dtype=torch.long),
            0,
            torch.qint8,
        )
        packed = torch.ops.quantized.linear_prepack(weight, None)
        y = torch.ops.quantized.linear_dynamic(torch.ones(4, 64), packed, reduce_range=False)
    return bool(torch.allclose(y, torch.full_like(y, 64.0), rtol=1e-2))


# int8 weight levels where int16 pair sums of u8 x s8 products would saturate: 2 * 255 * 63 = 32130 <= 32767.
WEIGHT_LEVELS_WITHOUT_VNNI = 63


def smoothquant_scales(weight: torch.Tensor, input_absmax: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel scales s_j = max|x_j|^alpha / max|W_:j|^(1 - alpha) (Xiao et al. 2023, eq. 4)
    for a (out, in) weight; all ones without calibration."""
    if input_absmax is None:
        return torch.ones(weight.shape[1])
    smooth = input_absmax.float().clamp(min=1e-5) ** alpha / weight.abs().amax(0).clamp(min=1e-5) ** (1 - alpha)
    return smooth.clamp(min=1e-5)  # (in,)


class SmoothedLinear(nn.Module):
    """y = (x / s) (W s)^T + b in float: the same function as `linear`, with SmoothQuant's scales s moved into the
    weight, so that a quantizer that sees only this graph (ONNX Runtime's quantize_dynamic) quantizes the smoothed
    weight and activations (Xiao et al. 2023, eq. 3)."""

    def __init__(self, linear: nn.Linear, input_absmax: torch.Tensor | None, alpha: float) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        smooth = smoothquant_scales(weight, input_absmax, alpha)
        self.register_buffer("inv_smooth", 1 / smooth)  # (in,)
        self.linear = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.linear.weight = nn.Parameter(weight * smooth, requires_grad=False)  # column j scaled by s_j
        if linear.bias is not None:
            self.linear.bias = nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv_smooth)


def smooth_linears(encoder: Encoder, batches: Iterable[Mapping[str, torch.Tensor]], alpha: float = 0.7) -> Encoder:
    """A float32 copy of `encoder` (eval mode) whose nn.Linear layers are `SmoothedLinear`, calibrated on `batches`:
    the same function, ready for a quantizer that reads the graph (the ONNX Runtime int8 route)."""
    smoothed = copy.deepcopy(encoder).float().eval()
    absmax = _input_absmax(smoothed, batches)
    for name, linear in [(n, m) for n, m in smoothed.named_modules() if isinstance(m, nn.Linear)]:
        parent_name, _, child = name.rpartition(".")
        parent = smoothed.get_submodule(parent_name) if parent_name else smoothed
        setattr(parent, child, SmoothedLinear(linear, absmax.get(name), alpha))
    return smoothed


class Int8Linear(nn.Module):
    """y = (x / s) Q(W s)^T + b: a Linear in int8.

    s: per-input-channel SmoothQuant scales, s_j = max|x_j|^alpha / max|W_:j|^(1 - alpha) (Xiao et al. 2023, eq. 4),
    with max|x_j| calibrated on real inputs; they move the activations' outlier channels into the weights, which
    are quantised per output channel (symmetric, scale = max|row| / 127). x / s is quantised per tensor on each
    call over the full 0..255 range (torch's DynamicQuantizedLinear always uses 7 bits, which cost accuracy).
    Where `full_range_is_exact()` fails (no VNNI: int16 pair sums), the weights take 7 bits instead (-63..63:
    2 * 255 * 63 <= 32767 cannot saturate): per-channel weights lose less to one bit than per-tensor activations
    (MiniLM word cosine to float32 at ONEDNN_MAX_CPU_ISA=AVX2: mean 0.9957, min 0.9927; 7-bit activations gave
    0.9914, 0.9832; benchmarks/isa.py).

    per_row: each row of x gets its own activation scale, as CTranslate2's int8 does: y_i = r_i (x_i / r_i) Q(W)^T + b
    with r_i = max_j |x_ij|, so the kernel's one per-tensor scale spans rows that all reach 1 and one row's outlier
    no longer coarsens every other row (decoding: one call's rows are all the sentences or beams of a batch, and
    finished rows still carried are among them). A row's output then does not depend on the other rows of its call.
    The bias is added after the rescaling (packed without it). Tiny reversal MT model, greedy, 2,000 sentences: int8
    outputs equal to float32's 93.0% -> 95.2% with 8-bit weights, 91.6% -> 93.5% with 7-bit (benchmarks/isa.py).
    """

    def __init__(
        self,
        linear: nn.Linear,
        input_absmax: torch.Tensor | None = None,
        alpha: float = 0.7,
        per_row: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.per_row = per_row
        weight = linear.weight.detach().float()  # (out, in)
        smooth = smoothquant_scales(weight, input_absmax, alpha)
        # (in,); None without calibration (every s_j = 1): no pass over the activations to multiply them by one
        self.register_buffer("inv_smooth", None if input_absmax is None else 1 / smooth)
        weight = weight * smooth  # (out, in), column j scaled by s_j
        levels = 127 if full_range_is_exact() else WEIGHT_LEVELS_WITHOUT_VNNI
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / levels  # (out,)
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated in favour of torchao
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        # per_row: the bias is added after each row's rescaling, so the packed product has none (a zero bias,
        # e.g. a translator's final_logits_bias as trained here, is not added at all)
        row_bias = bias if per_row and bias is not None and bool(bias.any()) else None
        self.register_buffer("row_bias", row_bias, persistent=False)
        with _quantized_engine(int8_engine()):
            self._packed = torch.ops.quantized.linear_prepack(qweight, None if per_row else bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = x.float() if self.inv_smooth is None else x.float() * self.inv_smooth
        if not self.per_row:
            return torch.ops.quantized.linear_dynamic(scaled, self._packed, reduce_range=False).to(x.dtype)
        # (..., 1) each row's max |x|; abs().amax(): vector_norm(ord=inf) took 10-20x longer here
        rows = scaled.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12)
        y = torch.ops.quantized.linear_dynamic(scaled / rows, self._packed, reduce_range=False)  # (..., out)
        y = y.mul_(rows) if self.row_bias is None else torch.addcmul(self.row_bias, y, rows, out=y)  # in place
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, per_row={self.per_row}"


def _input_absmax(encoder: Encoder, batches: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """max |x_j| over every call of each nn.Linear (by module name) while `encoder` runs `batches`.
    A module reused at several depths (ALBERT's shared layers) gathers over all of them."""
    absmax: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(_module, inputs, _output) -> None:
            x = inputs[0].detach()
            seen = x.abs().reshape(-1, x.shape[-1]).amax(0).float()  # (in,)
            absmax[name] = torch.maximum(absmax[name], seen) if name in absmax else seen

        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in encoder.named_modules() if isinstance(m, nn.Linear)]
    try:
        with torch.inference_mode():
            for batch in batches:
                encoder.encode(batch)
    finally:
        for h in hooks:
            h.remove()
    return absmax


def quantize_int8(
    encoder: Encoder,
    batches: Iterable[Mapping[str, torch.Tensor]],
    alpha: float = 0.7,
    keep_float: Iterable[str] = (),
    per_row: bool = False,
) -> Encoder:
    """A copy of `encoder` (eval mode) whose nn.Linear layers are `Int8Linear`, SmoothQuant-calibrated on `batches`
    (e.g. `calibration_batches(tokenizer, encoder.max_tokens)`). `keep_float`: module names left in float32.
    `per_row`: one activation scale per row of each call instead of one per call (`Int8Linear`).

    Every Transformer family works: BERT, RoBERTa, ELECTRA, ALBERT, GPT-2, XLNet (its attention projections are
    einsum parameters, not nn.Linear, and stay float32). ELMo is refused in one line."""
    if encoder.word_level:
        raise ValueError(f"{encoder.family} is a biLSTM over characters: int8 applies to Transformer linear layers")
    if any(p.device.type != "cpu" for p in encoder.parameters()):
        raise ValueError("int8 linear layers run on CPU only: move the model to CPU first, or use bf16 on a GPU")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is the SmoothQuant migration strength, between 0 and 1; got {alpha}")
    quantized = copy.deepcopy(encoder).float().eval()
    absmax = _input_absmax(quantized, batches)
    keep = set(keep_float)
    linears = [(n, m) for n, m in quantized.named_modules() if isinstance(m, nn.Linear) and n not in keep]
    unknown = keep - {n for n, m in quantized.named_modules() if isinstance(m, nn.Linear)}
    if unknown:
        raise ValueError(f"keep_float names no nn.Linear of this model: {sorted(unknown)}")
    fusable = set(quantized.fusable_qkv_modules())  # read once: fusing one module changes no other's name
    for name, module in list(quantized.named_modules()):  # BERT-family attention: q, k and v as one product
        parts = [f"{name}.{p}" for p in ("query", "key", "value")]
        if name in fusable and not keep.intersection(parts):
            fused = nn.Linear(module.query.in_features, 3 * module.query.out_features, device="meta")  # no RNG draw
            fused.weight = nn.Parameter(torch.cat([module.query.weight, module.key.weight, module.value.weight]))
            fused.bias = nn.Parameter(torch.cat([module.query.bias, module.key.bias, module.value.bias]))
            module.query_key_value = Int8Linear(fused, absmax.get(parts[0]), alpha, per_row)  # the three saw the same x
            del module.query, module.key, module.value
            linears = [(n, m) for n, m in linears if n not in parts]
    for name, linear in linears:
        parent_name, _, child = name.rpartition(".")
        parent = quantized.get_submodule(parent_name) if parent_name else quantized
        setattr(parent, child, Int8Linear(linear, absmax.get(name), alpha, per_row))
    return quantized
