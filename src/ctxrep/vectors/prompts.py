"""The prompt a query or a document gets from a folder's prompts (sentence-transformers' encode_query /
encode_document), on top of `Prompts.resolve` (the prompt / prompt_name rules every ctxrep call shares)."""

from __future__ import annotations

from ctxrep.models.sentence_transformers import Prompts

__all__ = ["task_prompt"]


def task_prompt(prompts: Prompts, task: str | None, prompt: str | None = None, prompt_name: str | None = None) -> str:
    """The text to put before each input of `task` ("query", "document" or None: a plain call).

    A given prompt or prompt_name wins (`Prompts.resolve`: same rules and errors as Featurizer.embed_sentences).
    Otherwise a query gets the folder's "query" prompt and a document its "document" prompt, "" where the folder
    declares none, never the default prompt: sentence-transformers' models always hold "query" and "document"
    (empty unless the folder sets them), so encode_query / encode_document never fall back to
    default_prompt_name. A plain call (task None) gets the default prompt, as encode does.
    """
    if task is None or prompt is not None or prompt_name is not None:
        return prompts.resolve(prompt, prompt_name)
    if task not in ("query", "document"):
        raise ValueError(f"task must be 'query', 'document' or None, got {task!r}")
    return prompts.prompts.get(task, "")
