"""`ctxrep demo`: the classic picture of contextual meaning, with the default model.

The same word ("broke", "crane") in different sentences: near-identical vectors at a low layer, vectors that
follow the sense at the top layer (Smith 2019, "Contextual word representations: a contextual introduction").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ctxrep.cli.common import user_errors

if TYPE_CHECKING:
    import numpy as np

BROKE = [
    "The vase broke .",
    "Dawn broke .",
    "The news broke .",
    "Sandy broke the world record .",
    "Sandy broke the law .",
    "The burglar broke into the house .",
    "The newscaster broke into the movie broadcast .",
    "We broke even .",
]
# (sentence, sense): two birds and two machines.
CRANE = [
    ("A crane caught a fish in the shallow lake .", "bird"),
    ("The crane spread its wings and flew away .", "bird"),
    ("A crane lifted the steel beam onto the roof .", "machine"),
    ("The construction crane toppled over in the storm .", "machine"),
]


def target_vectors(fz, sentences: list[str], word: str) -> np.ndarray:
    """(n_sentences, n_layers + 1, hidden): the vectors of `word` in each sentence, every layer."""
    import numpy as np

    split = [s.split() for s in sentences]
    vectors = fz.embed_words(split)
    return np.stack([v[words.index(word)] for v, words in zip(vectors, split)])


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    import numpy as np

    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return x @ x.T


def print_table(labels: list[str], sims: np.ndarray) -> None:
    click.echo("      " + " ".join(f"{i + 1:>5}" for i in range(len(labels))))
    for i, label in enumerate(labels):
        row = " ".join(f"{sims[i, j]:5.2f}" for j in range(len(labels)))
        click.echo(f"  {i + 1:>2}  {row}   {label}")


@click.command()
@click.option("--model", default="minilm", show_default=True, help="Packaged model name or model folder.")
@click.option(
    "--low-layer",
    default=None,
    type=int,
    help="The low layer to contrast with the top layer [default: 1, or 0 for a 1-layer model].",
)
@user_errors
def demo(model: str, low_layer: int | None) -> None:
    """Show that the same word gets different vectors in different contexts."""
    import numpy as np

    from ctxrep.featurize import Featurizer

    fz = Featurizer(model, layers="all", pooling="mean")
    top = fz.num_layers
    if low_layer is None:
        low_layer = min(1, top - 1)
    if not 0 <= low_layer < top:
        raise ValueError(f"--low-layer must be between 0 and {top - 1}, got {low_layer}")
    click.echo(f"ctxrep demo: model {model} ({top} layers, {fz.model.hidden_size} wide); cosine similarity of the")
    click.echo("target word's vectors across sentences, at a low layer and at the top layer.\n")

    broke = target_vectors(fz, BROKE, "broke")
    off_diagonal = ~np.eye(len(BROKE), dtype=bool)
    means = {}
    for layer in (low_layer, top):
        sims = cosine_matrix(broke[:, layer])
        means[layer] = sims[off_diagonal].mean()
        click.echo(f'"broke", layer {layer}: mean similarity between different sentences {means[layer]:.2f}')
        print_table(BROKE, sims)
        click.echo("")
    click.echo(
        f'=> "broke" is almost one vector at layer {low_layer} (mean {means[low_layer]:.2f}) and spreads out by sense '
        f"at layer {top} (mean {means[top]:.2f}): the top-layer vector depends on the context.\n"
    )

    crane = target_vectors(fz, [s for s, _ in CRANE], "crane")
    senses = [sense for _, sense in CRANE]
    same = np.array([[a == b for b in senses] for a in senses]) & ~np.eye(len(senses), dtype=bool)
    different = np.array([[a != b for b in senses] for a in senses])
    gaps = {}
    for layer in (low_layer, top):
        sims = cosine_matrix(crane[:, layer])
        gaps[layer] = (sims[same].mean(), sims[different].mean())
        click.echo(f'"crane", layer {layer}: same sense {gaps[layer][0]:.2f}, different sense {gaps[layer][1]:.2f}')
        print_table([f"{s}  [{sense}]" for s, sense in CRANE], sims)
        click.echo("")
    verdict = "closer" if gaps[top][0] > gaps[top][1] else "NOT closer"
    click.echo(
        f'=> at layer {top}, two "crane"s of the same sense are {verdict} ({gaps[top][0]:.2f}) than a bird and a '
        f"machine ({gaps[top][1]:.2f}); at layer {low_layer} the gap is "
        f"{gaps[low_layer][0] - gaps[low_layer][1]:+.2f} against {gaps[top][0] - gaps[top][1]:+.2f} at the top."
    )
