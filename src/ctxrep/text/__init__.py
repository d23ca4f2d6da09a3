"""Text before the model: tokenizers, tokenizer files and training, ELMo character ids, encoder inputs."""
