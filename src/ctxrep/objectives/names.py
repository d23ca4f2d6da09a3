"""The pretraining objectives' names, in `ctxrep pretrain --objective`'s order, without importing torch: the CLI
offers them in `--help` from here, and recipes.py checks at import that its table holds exactly these, in this
order (a new objective is one name here and one line there)."""

OBJECTIVES: tuple[str, ...] = (
    "mlm",
    "mlm+nsp",
    "mlm+sop",
    "electra",
    "clm",
    "plm",
    "bilm",
    "distill",
    "denoising",
    "span-corruption",
)
