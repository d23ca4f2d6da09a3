"""Models by name: Hugging Face Hub downloads (through `huggingface_hub`) and AllenNLP's published ELMo files.

Hub names ("bert-base-cased", "google/electra-small-discriminator", "org/name@revision") are fetched with
`huggingface_hub.snapshot_download` into its own cache (HF_HOME, HF_HUB_CACHE), from HF_ENDPOINT, honouring
HF_HUB_OFFLINE; only what ctxrep reads is fetched: config.json, model.safetensors (or the shards that
model.safetensors.index.json lists; pytorch_model.bin only when the repository has no safetensors), tokenizer files
and a sentence-transformers folder's modules (modules.json, prompts, Pooling, Dense configs and weights).

"elmo:small|medium|original|original-5.5b" download the options.json + weights.hdf5 pairs that AllenNLP publishes
under https://allennlp.s3.amazonaws.com/models/elmo/FOLDER/elmo_FOLDER_{options.json,weights.hdf5} (the URLs of
AllenNLP's ELMo page and of its `allennlp.modules.elmo` configs) into $CTXREP_CACHE/elmo/NAME
(~/.cache/ctxrep/elmo/NAME by default); CTXREP_ELMO_BASE_URL replaces the base URL (a mirror, or a test server).
Each weight file is loaded into an ElmoBiLM built from its options, which checks the shape of every layer,
before the download is marked usable.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from ctxrep.models.folders import CheckpointError
from ctxrep.text.tokenizer_files import TOKENIZER_FILES
from ctxrep.util.files import ctxrep_cache
from ctxrep.util.progress import progress as show_progress

# ---- Hugging Face Hub -------------------------------------------------------------------------------------

# In order of preference: read by folders.read_state_dict, and (the index and its shards) by models/shards.py.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")  # the shard names transformers writes beside the index
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json")  # modules, prompts
# The modules ctxrep applies (models/sentence_transformers.py): Pooling's config, each Dense's config and weights.
SENTENCE_TRANSFORMERS_MODULE = re.compile(r"^\d+_(Pooling/config\.json|Dense/(config\.json|model\.safetensors))$")

_REVISION = re.compile(r"^[\w.\-/]+$")  # branch, tag or commit hash


ModelTypeCheck = Callable[[object, str], None]  # (config.json model_type, where) -> None, or raises


def parse_hub_name(name: str) -> tuple[str, str | None]:
    """ "org/name@revision" -> ("org/name", "revision"); a name without "@" has revision None."""
    repo_id, at, revision = str(name).partition("@")
    if not at:
        return repo_id, None
    if not repo_id or not revision or "@" in revision or not _REVISION.match(revision):
        raise CheckpointError(
            f"model name {name!r}: expected NAME or NAME@REVISION with one branch, tag or commit hash after '@' "
            "(e.g. bert-base-cased@main)"
        )
    return repo_id, revision


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise CheckpointError(
            "downloading models from the Hugging Face Hub needs the huggingface_hub package: pip install huggingface_hub"
        ) from None
    return huggingface_hub


def _valid_repo_id(repo_id: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_hub_name(name: str) -> bool:
    """Whether `name` can be a Hub model id ("bert-base-cased", "org/name", "org/name@rev"): no network."""
    try:
        repo_id, _ = parse_hub_name(name)
    except CheckpointError:
        return False
    return not repo_id.startswith((".", "/", "~")) and _valid_repo_id(repo_id)


def _offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it at import."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE") or bool(_hub().constants.HF_HUB_OFFLINE)


def _cache_dir() -> Path:
    """huggingface_hub's cache as the environment says now (it reads HF_HOME once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(_hub().constants.HF_HUB_CACHE)


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or _hub().constants.ENDPOINT


def _has_weights(folder: Path) -> bool:
    return any((folder / f).is_file() for f in WEIGHT_FILES)


def cached_hub_folder(name: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of a hub model that an earlier download left in the Hugging Face cache, or None.

    Looks only at the cache (no network): the snapshot of `revision` (a branch, tag or commit; default "main",
    or the one in "name@revision"), and only one that has config.json and a weight file.
    """
    repo_id, pinned = parse_hub_name(name)
    revision = _one_revision(name, pinned, revision)
    hub = _hub()
    if not _valid_repo_id(repo_id):
        return None
    config = hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=str(_cache_dir()), revision=revision)
    if not isinstance(config, str):  # None (never fetched) or a marker that the file does not exist upstream
        return None
    folder = Path(config).parent
    return folder if _has_weights(folder) else None


def _one_revision(name: str, pinned: str | None, revision: str | None) -> str | None:
    if pinned is not None and revision is not None and pinned != revision:
        raise CheckpointError(
            f"model {name!r} pins revision {pinned!r} but revision={revision!r} was also given; give one"
        )
    return pinned or revision


def _files_to_fetch(name: str, files: list[str]) -> list[str]:
    """What ctxrep needs of a repository's file list, or a one-line error saying what the repository lacks."""
    if "config.json" not in files:
        raise CheckpointError(
            f"hub model {name!r} has no config.json, so it is not a transformers model folder; "
            "pick a model repository with config.json (for ELMo use elmo:small|medium|original|original-5.5b)"
        )
    weights = next((f for f in WEIGHT_FILES if f in files), None)
    if weights is None:
        sharded = [f for f in files if f.endswith(".bin") and ("-of-" in f)]
        detail = f"it has sharded PyTorch weights ({sharded[0]}, ...)" if sharded else "it has none of them"
        raise CheckpointError(
            f"hub model {name!r}: ctxrep reads model.safetensors, safetensors shards with "
            f"model.safetensors.index.json, or pytorch_model.bin, and {detail}; convert the weights to safetensors "
            "(transformers: save_pretrained(DIR)) and pass DIR"
        )
    wanted = {"config.json", weights, *TOKENIZER_FILES, *SENTENCE_TRANSFORMERS_FILES}
    shards = [f for f in files if SHARD.match(f)] if weights == "model.safetensors.index.json" else []
    return [f for f in files if f in wanted or SENTENCE_TRANSFORMERS_MODULE.match(f)] + shards


_HTTP_MODULES = ("httpx", "httpx2", "httpcore", "requests", "urllib3")


def _check_config_first(
    hub, name: str, repo_id: str, revision: str | None, cache: Path, endpoint: str, check_model_type: ModelTypeCheck
) -> None:
    """Fetch config.json alone and refuse a model_type no family loads before any weight is downloaded."""
    try:
        file = hub.hf_hub_download(
            repo_id, "config.json", revision=revision, cache_dir=str(cache), endpoint=endpoint, library_name="ctxrep"
        )
        config = json.loads(Path(file).read_text())
    except OSError as e:  # HfHubHTTPError and httpx's errors included
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"hub model {name!r}: fetching config.json from {endpoint} failed ({type(e).__name__}: {reason}); run the "
            "same command again"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"hub model {name!r}: config.json is not valid JSON (line {e.lineno}): {e.msg}") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    check_model_type(model_type, f"hub model {name!r} (config.json; nothing else downloaded)")


class _SilentTqdm(tqdm):
    """A progress bar that never shows (progress=False); huggingface_hub builds bars from the class it is given."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.pop("name", None)
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _model_info(hub, name: str, repo_id: str, revision: str | None, cache: Path, endpoint: str, at: str):
    """Ask the Hub for the model's metadata; each Hub error becomes one CheckpointError line.

    When the Hub is out of reach and a cached snapshot exists, that snapshot's folder (a Path) is returned instead.
    """
    from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = hub.HfApi(endpoint=endpoint, library_name="ctxrep")
    try:
        return api.model_info(repo_id, revision=revision)
    except GatedRepoError:
        raise CheckpointError(
            f"hub model {name!r} is gated: accept its conditions on {endpoint}/{repo_id} and log in "
            "(`hf auth login`, or set HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"hub model {name!r} not found on {endpoint}: check the spelling (ORG/NAME as on the model's page); "
            "a private model needs a login (`hf auth login`, or set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(
            f"hub model {repo_id!r} has no revision {revision!r}: pass a branch, tag or commit hash that exists "
            f"(see {endpoint}/{repo_id}/tree/main)"
        ) from None
    except Exception as e:  # connection refused, timeouts, 5xx (httpx's own errors need not derive from OSError)
        if not isinstance(e, (HfHubHTTPError, OSError)) and type(e).__module__.split(".")[0] not in _HTTP_MODULES:
            raise
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 404:  # the server answered: it has no such model (a mirror may send no Hub error code)
            raise CheckpointError(
                f"hub model {name!r}: no such model on {endpoint} (the server answered 404 Not Found); check the "
                "spelling (ORG/NAME as on the model's page)"
            ) from None
        cached = cached_hub_folder(repo_id, revision)  # the Hub is out of reach: a cached snapshot will do
        if cached is not None:
            return cached
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"hub model {name!r}{at}: cannot reach {endpoint} ({type(e).__name__}: {reason}) and it is not in the "
            f"Hugging Face cache ({cache}); check the network (or HF_ENDPOINT), or pass a local model folder"
        ) from None


def _fetch_snapshot(
    hub,
    name: str,
    repo_id: str,
    revision: str | None,
    files: list[str],
    progress: bool,
    cache: Path,
    endpoint: str,
    at: str,
) -> Path:
    """Download `files` of the model into the Hugging Face cache; return the snapshot folder, checked complete."""
    if progress and not sys.stderr.isatty():  # a log gets one plain line, not byte bars
        print(
            f"hub model {name!r}{at}: fetching {len(files)} files into {cache} (kept ones are not downloaded again)",
            file=sys.stderr,
            flush=True,
        )
    try:
        folder = hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache),
            endpoint=endpoint,
            allow_patterns=files,
            library_name="ctxrep",
            tqdm_class=None if progress and sys.stderr.isatty() else _SilentTqdm,  # bars on a terminal only
        )
    except OSError as e:  # HfHubHTTPError and httpx's errors included: the connection broke during the download
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"hub model {name!r}{at}: the download from {endpoint} failed ({type(e).__name__}: {reason}); run the same "
            "command again to finish it (complete files are kept in the cache)"
        ) from None
    folder = Path(folder)
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(
            f"hub model {name!r}: the download into {folder} lacks {', '.join(missing)}; run again to complete it"
        )
    return folder


def hub_folder(
    name: str, revision: str | None = None, progress: bool = True, check_model_type: ModelTypeCheck | None = None
) -> Path:
    """Download (or find in the cache) the files ctxrep needs of a Hugging Face Hub model; return their folder.

    `check_model_type(model_type, where)` raises for a config.json model_type that no family loads; it runs on
    config.json alone, before any weight is fetched (models/loading.py passes its check; hub knows no family).

    `name` is a repository id, optionally pinned as "name@revision" (branch, tag or commit hash). Offline
    (HF_HUB_OFFLINE=1), or when the Hub cannot be reached, the cached snapshot is used if there is one.
    """
    repo_id, pinned = parse_hub_name(name)
    revision = _one_revision(name, pinned, revision)
    hub = _hub()
    if not _valid_repo_id(repo_id):
        raise CheckpointError(
            f"{name!r} is neither a local folder nor a valid Hugging Face Hub name (NAME or ORG/NAME, letters, digits, "
            "'-', '_', '.'); check the path or the name"
        )
    cache, endpoint = _cache_dir(), _endpoint()
    at = f" at revision {revision!r}" if revision else ""
    if _offline():
        cached = cached_hub_folder(repo_id, revision)
        if cached is not None:
            return cached
        raise CheckpointError(
            f"hub model {name!r}{at} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set, so it "
            "cannot be downloaded: unset HF_HUB_OFFLINE on a machine with internet to fetch it once, or pass a local "
            "model folder"
        )
    info = _model_info(hub, name, repo_id, revision, cache, endpoint, at)
    if isinstance(info, Path):  # the Hub is out of reach and the cache has the model
        return info
    files = _files_to_fetch(name, [s.rfilename for s in info.siblings or []])
    if check_model_type is not None:
        _check_config_first(hub, name, repo_id, info.sha or revision, cache, endpoint, check_model_type)
    return _fetch_snapshot(hub, name, repo_id, revision, files, progress, cache, endpoint, at)


# ---- AllenNLP's published ELMo models ---------------------------------------------------------------------

ELMO_BASE_URL = "https://allennlp.s3.amazonaws.com/models/elmo"
# elmo:NAME -> AllenNLP's folder; its files are elmo_FOLDER_options.json and elmo_FOLDER_weights.hdf5.
ELMO_DOWNLOADS = {
    "small": "2x1024_128_2048cnn_1xhighway",
    "medium": "2x2048_256_2048cnn_1xhighway",
    "original": "2x4096_512_2048cnn_2xhighway",
    "original-5.5b": "2x4096_512_2048cnn_2xhighway_5.5B",
}
_CHECKED = "checked.json"  # written after the weights were loaded into a biLM built from the options


def elmo_download_name(name: str) -> str | None:
    """The short name of an "elmo:small"-style download ("small"), or None for anything else (a folder)."""
    name = str(name)
    if not name.startswith("elmo:"):
        return None
    short = name[len("elmo:") :]
    return short if short in ELMO_DOWNLOADS else None


def elmo_urls(short: str) -> dict[str, str]:
    """The options and weights URLs of one published ELMo ("small", ...), under CTXREP_ELMO_BASE_URL if set."""
    folder = ELMO_DOWNLOADS[short]
    base = (os.environ.get("CTXREP_ELMO_BASE_URL") or ELMO_BASE_URL).rstrip("/")
    return {kind: f"{base}/{folder}/elmo_{folder}_{kind}" for kind in ("options.json", "weights.hdf5")}


def elmo_download(name: str, progress: bool = True) -> Path:
    """Download elmo:small|medium|original|original-5.5b into ctxrep's cache (once) and return the folder, which
    ElmoBiLM.from_pretrained reads. Every weight file is checked against its options file before it is used."""
    short = elmo_download_name(name if str(name).startswith("elmo:") else f"elmo:{name}")
    if short is None:
        raise CheckpointError(
            f"{name!r} is not a published ELMo: use one of {', '.join('elmo:' + k for k in ELMO_DOWNLOADS)}, "
            "or elmo:DIR for a folder with options.json and weights.hdf5"
        )
    dest = ctxrep_cache() / "elmo" / short
    urls = elmo_urls(short)
    files = {kind: dest / url.rsplit("/", 1)[1] for kind, url in urls.items()}
    if (dest / _CHECKED).is_file() and all(f.is_file() for f in files.values()):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for kind in ("options.json", "weights.hdf5"):  # the small options first: a wrong URL fails fast
        if not files[kind].is_file():
            _fetch(urls[kind], files[kind], progress)
    _check_elmo_files(f"elmo:{short}", files["options.json"], files["weights.hdf5"])
    _write_json_atomic(
        dest / _CHECKED,
        {
            "options": urls["options.json"],
            "weights": urls["weights.hdf5"],
            "weights_bytes": files["weights.hdf5"].stat().st_size,
        },
    )
    return dest


def _check_elmo_files(name: str, options: Path, weights: Path) -> None:
    """Load the weights into a biLM built from the options (which names every mis-shaped layer); on failure
    remove both files (either may be the wrong one), so that the next call downloads them again."""
    from ctxrep.models.elmo import ElmoBiLM

    try:
        ElmoBiLM.from_files(options, weights)
    except ValueError as e:  # CheckpointError, wherever elmo.py imports it from
        weights.unlink(missing_ok=True)
        options.unlink(missing_ok=True)
        reason = str(e).strip().splitlines()[0]
        raise CheckpointError(
            f"{name}: the downloaded weights do not fit the downloaded options ({reason}); removed both files: "
            "check CTXREP_ELMO_BASE_URL, or download both files by hand into DIR and use elmo:DIR"
        ) from None


def _fetch(url: str, file: Path, progress: bool) -> None:
    """GET url into file: written under a temporary name and renamed when complete, so that an interrupted
    download never looks like a finished one."""
    tmp = file.with_name(f"{file.name}.part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            total = response.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            with (
                open(tmp, "wb") as out,
                show_progress(total=total, unit="B", unit_scale=True, desc=file.name, enabled=progress) as bar,
            ):
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
        size = tmp.stat().st_size
        if total is not None and size != total:
            raise CheckpointError(f"{url}: download stopped at {size} of {total} bytes; run again to retry")
        os.replace(tmp, file)
    except urllib.error.HTTPError as e:
        raise CheckpointError(
            f"{url}: HTTP {e.code} {e.reason}; check the address (CTXREP_ELMO_BASE_URL, if set) or download the "
            "options and weights files by hand into DIR and use elmo:DIR"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or f"{type(e).__name__}: {e}"
        raise CheckpointError(
            f"{url}: cannot download ({reason}); check the network, or download the options and weights files by "
            "hand into DIR and use elmo:DIR"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _write_json_atomic(file: Path, obj: dict) -> None:
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, file)
