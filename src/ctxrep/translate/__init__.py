"""Machine translation with the Transformer encoder-decoder (models/marian.py).

    tokenizer.py   MTTokenizer: tokenizer.json, or an OPUS-MT folder (source.spm / target.spm / vocab.json)
    search.py      greedy and beam search with the decoder's key/value cache; translate() over many sentences
    data.py        parallel text, the joint subword vocabulary, token-budget batches
    train.py       training on the Trainer; score.py: sacreBLEU's BLEU and chrF

Nothing is imported here, so `import ctxrep.translate` does not load torch.
"""
