"""Models by name, downloaded by the real code (huggingface_hub's snapshot_download, urllib for ELMo) from a small
server on 127.0.0.1 that each test starts: just enough of the Hub's API, and AllenNLP's ELMo file layout."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch
from safetensors.torch import load_file

from ctxrep.models import hub
from ctxrep.models.elmo import ElmoBiLM, ElmoConfig
from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import check_model_type

MAX_REQUESTS = 300  # the server answers 503 after this many requests
MAX_SECONDS = 120  # and shuts itself down after this long


class FakeServer:
    """Serves `repos` {repo_id: {"refs": {name: sha}, "commits": {sha: {path: bytes}}}} the way the Hub does, and
    `static` {url path: bytes} as plain files; records every (method, path) it was asked for."""

    def __init__(self, repos: dict | None = None, static: dict | None = None) -> None:
        self.repos, self.static = repos or {}, static or {}
        self.truncate: set[str] = set()  # static paths whose body stops half-way (the connection drops)
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                server._answer(self, body=False)

            def do_GET(self) -> None:
                server._answer(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.timer = threading.Timer(MAX_SECONDS, self.httpd.shutdown)
        self.timer.daemon = True
        self.thread.start()
        self.timer.start()

    def stop(self) -> None:
        self.timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def fetched(self, suffix: str) -> int:
        return sum(1 for m, p in self.requests if m == "GET" and p.endswith(suffix))

    # ---- the Hub's routes ---------------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path))
        if len(self.requests) > MAX_REQUESTS:
            return self._send(h, 503, b"too many requests", body)
        if path in self.static:
            data = self.static[path]
            if path in self.truncate:
                h.close_connection = True
                return self._send(h, 200, data, body, {"Content-Type": "application/octet-stream"}, cut=len(data) // 2)
            return self._send(h, 200, data, body, {"Content-Type": "application/octet-stream"})
        if path.startswith("/api/models/"):
            return self._api(h, path[len("/api/models/") :], body)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            rev, file = rest.split("/", 1)
            return self._resolve(h, repo_id, rev, file, body)
        return self._send(h, 404, b"not found", body)

    def _commit(self, h, repo_id: str, rev: str, body: bool) -> str | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._send(h, 404, b'{"error": "Repository not found"}', body, {"X-Error-Code": "RepoNotFound"})
            return None
        sha = repo["refs"].get(rev, rev if rev in repo["commits"] else None)
        if sha is None:
            self._send(h, 404, b'{"error": "Invalid rev id"}', body, {"X-Error-Code": "RevisionNotFound"})
        return sha

    def _api(self, h, rest: str, body: bool) -> None:
        if "/revision/" in rest:  # /api/models/{repo}/revision/{rev}
            repo_id, rev = rest.split("/revision/", 1)
        elif "/tree/" in rest:  # /api/models/{repo}/tree/{rev}?recursive=...
            repo_id, rev = rest.split("/tree/", 1)
            sha = self._commit(h, repo_id, rev, body)
            if sha is not None:
                files = self.repos[repo_id]["commits"][sha]
                listing = [
                    {"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in files.items()
                ]
                self._send(h, 200, json.dumps(listing).encode(), body, {"Content-Type": "application/json"})
            return
        else:  # /api/models/{repo}: the default branch
            repo_id, rev = rest, "main"
        sha = self._commit(h, repo_id, rev, body)
        if sha is not None:
            files = self.repos[repo_id]["commits"][sha]
            info = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": False,
                "siblings": [{"rfilename": p} for p in files],
            }
            self._send(h, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})

    def _resolve(self, h, repo_id: str, rev: str, file: str, body: bool) -> None:
        sha = self._commit(h, repo_id, rev, body)
        if sha is None:
            return
        data = self.repos[repo_id]["commits"][sha].get(file)
        if data is None:
            return self._send(h, 404, b"Entry not found", body, {"X-Error-Code": "EntryNotFound"})
        etag = hashlib.sha256(data).hexdigest()
        self._send(
            h, 200, data, body, {"ETag": f'"{etag}"', "X-Repo-Commit": sha, "Content-Type": "application/octet-stream"}
        )

    @staticmethod
    def _send(h, status: int, data: bytes, body: bool, headers: dict | None = None, cut: int | None = None) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data if cut is None else data[:cut])


def _sha(n: int) -> str:
    return hashlib.sha1(str(n).encode()).hexdigest()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def hub_env(tmp_path, monkeypatch):
    """An empty Hugging Face cache and ctxrep cache in tmp_path, no proxy for 127.0.0.1, online."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path / "ctxrep"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    return tmp_path


@pytest.fixture()
def server(hub_env, monkeypatch):
    servers = []

    def start(repos=None, static=None) -> FakeServer:
        s = FakeServer(repos, static)
        servers.append(s)
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def bert_files(tiny_models) -> dict[str, bytes]:
    """The tiny BERT's folder (config, safetensors, tokenizer files) plus files ctxrep must not fetch."""
    files = _files(tiny_models["bert"])
    state = load_file(tiny_models["bert"] / "model.safetensors")
    buf = Path(tiny_models["bert"]).parent / "pytorch_model.bin"
    torch.save(state, buf)
    files["pytorch_model.bin"] = buf.read_bytes()
    files["README.md"] = b"# tiny\n"
    files["flax_model.msgpack"] = b"\0" * 100
    files["onnx/model.onnx"] = b"\0" * 100
    return files


# ---- Hugging Face Hub -----------------------------------------------------------------------------------


def test_parse_hub_name():
    assert hub.parse_hub_name("bert-base-cased") == ("bert-base-cased", None)
    assert hub.parse_hub_name("google/electra-small-discriminator@v1.0") == (
        "google/electra-small-discriminator",
        "v1.0",
    )
    for bad in ("org/name@", "@main", "a@b@c", "org/name@bad rev"):
        with pytest.raises(CheckpointError, match="NAME@REVISION"):
            hub.parse_hub_name(bad)


def test_is_hub_name():
    assert hub.is_hub_name("bert-base-cased") and hub.is_hub_name("org/name@v1") and hub.is_hub_name("a/b.c-d_e")
    for not_hub in ("./model", "/abs/model", "~/model", "a/b/c", "org/name@", "has space", "bad--name"):
        assert not hub.is_hub_name(not_hub), not_hub


def test_download_fetches_only_what_ctxrep_reads_and_loads_like_the_local_folder(server, tiny_models, bert_files):
    from ctxrep.models.loading import load_model

    s = server({"org/tiny-bert": {"refs": {"main": _sha(1)}, "commits": {_sha(1): bert_files}}})
    folder = hub.hub_folder("org/tiny-bert", progress=False)
    assert folder.name == _sha(1)
    assert sorted(_files(folder)) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    )
    assert s.fetched("pytorch_model.bin") == 0 and s.fetched("README.md") == 0 and s.fetched(".onnx") == 0
    for name, data in _files(folder).items():
        assert data == bert_files[name], name
    ids = torch.tensor([[101, 7592, 2088, 102]])
    want = load_model(tiny_models["bert"])(ids).last_hidden_state
    got = load_model(folder)(ids).last_hidden_state
    assert torch.equal(got, want)
    assert hub.cached_hub_folder("org/tiny-bert") == folder

    # a second call is answered from the cache with the server gone
    s.stop()
    assert hub.hub_folder("org/tiny-bert", progress=False) == folder
    assert hub.cached_hub_folder("org/tiny-bert") == folder


def test_pytorch_model_bin_only_when_the_repository_has_no_safetensors(server, bert_files):
    from ctxrep.models.folders import read_state_dict

    files = {k: v for k, v in bert_files.items() if k != "model.safetensors"}
    s = server({"org/old-bert": {"refs": {"main": _sha(2)}, "commits": {_sha(2): files}}})
    folder = hub.hub_folder("org/old-bert", progress=False)
    assert s.fetched("pytorch_model.bin") == 1
    assert (folder / "pytorch_model.bin").is_file() and not (folder / "model.safetensors").exists()
    state = read_state_dict(folder)  # weights_only=True
    want = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert state.keys() == want.keys()


def test_sentence_transformers_files_are_fetched(server, bert_files):
    files = dict(bert_files)
    files["modules.json"] = b'[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]'
    files["1_Pooling/config.json"] = b'{"pooling_mode_mean_tokens": true}'
    files["2_Dense/config.json"] = b"{}"  # EmbeddingGemma's Dense modules and Qwen3-Embedding's prompts
    files["2_Dense/model.safetensors"] = b"dense weights"
    files["2_Dense/pytorch_model.bin"] = b"not fetched"
    files["config_sentence_transformers.json"] = b'{"prompts": {"query": "Instruct: x\\nQuery:"}}'
    files["3_Normalize/README.md"] = b"not fetched"
    server({"org/st": {"refs": {"main": _sha(3)}, "commits": {_sha(3): files}}})
    folder = hub.hub_folder("org/st", progress=False)
    for name in (
        "modules.json",
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
        "config_sentence_transformers.json",
    ):
        assert (folder / name).read_bytes() == files[name], name
    assert not (folder / "2_Dense" / "pytorch_model.bin").exists() and not (folder / "3_Normalize").exists()


def test_name_at_revision_pins_a_branch_tag_or_commit(server, bert_files):
    old = dict(bert_files)
    config = json.loads(old["config.json"])
    config["num_hidden_layers"] = 1  # a different commit: the config differs
    old["config.json"] = json.dumps(config).encode()
    repos = {"org/m": {"refs": {"main": _sha(5), "v1": _sha(4)}, "commits": {_sha(4): old, _sha(5): bert_files}}}
    server(repos)
    tagged = hub.hub_folder("org/m@v1", progress=False)
    assert tagged.name == _sha(4) and json.loads((tagged / "config.json").read_text())["num_hidden_layers"] == 1
    by_commit = hub.hub_folder(f"org/m@{_sha(4)}", progress=False)
    assert by_commit == tagged
    main = hub.hub_folder("org/m", progress=False)
    assert main.name == _sha(5) and main != tagged
    assert hub.hub_folder("org/m", revision="v1", progress=False) == tagged
    assert hub.cached_hub_folder("org/m@v1") == tagged
    assert hub.cached_hub_folder("org/m") == main
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/m@v2", progress=False)
    assert "has no revision 'v2'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="pins revision 'v1' but revision='main'"):
        hub.hub_folder("org/m@v1", revision="main")


def test_missing_repository_is_one_line(server):
    s = server({})
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/does-not-exist", progress=False)
    message = str(e.value)
    assert "'org/does-not-exist' not found on " + s.url in message and "check the spelling" in message
    assert "\n" not in message


def test_offline_with_an_empty_cache_is_one_line_and_with_a_cache_works(server, monkeypatch, bert_files):
    s = server({"org/tiny-bert": {"refs": {"main": _sha(1)}, "commits": {_sha(1): bert_files}}})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/tiny-bert", progress=False)
    message = str(e.value)
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE" in message and "\n" not in message
    assert s.requests == [], "offline means no request at all"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    folder = hub.hub_folder("org/tiny-bert", progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(s.requests)
    assert hub.hub_folder("org/tiny-bert", progress=False) == folder
    assert len(s.requests) == n


def test_unreachable_hub_with_an_empty_cache_is_one_line(server):
    s = server({})
    s.stop()
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/tiny-bert", progress=False)
    assert "cannot reach " + s.url in str(e.value) and "\n" not in str(e.value)


def test_repository_without_weights_or_config_is_refused(server, bert_files):
    no_weights = {k: v for k, v in bert_files.items() if k not in ("model.safetensors", "pytorch_model.bin")}
    no_weights["pytorch_model-00001-of-00002.bin"] = b"x"  # sharded PyTorch pickles: not read
    no_config = {k: v for k, v in bert_files.items() if k != "config.json"}
    server(
        {
            "org/sharded": {"refs": {"main": _sha(6)}, "commits": {_sha(6): no_weights}},
            "org/noconfig": {"refs": {"main": _sha(7)}, "commits": {_sha(7): no_config}},
        }
    )
    with pytest.raises(CheckpointError, match="sharded PyTorch weights .*pytorch_model-00001-of-00002.bin"):
        hub.hub_folder("org/sharded", progress=False)
    with pytest.raises(CheckpointError, match="has no config.json"):
        hub.hub_folder("org/noconfig", progress=False)


def test_cached_hub_folder_without_a_download_is_none(hub_env):
    assert hub.cached_hub_folder("org/never-fetched") is None
    assert hub.cached_hub_folder("not a hub name!") is None
    with pytest.raises(CheckpointError, match="neither a local folder nor a valid Hugging Face Hub name"):
        hub.hub_folder("not a hub name!")


def test_a_typo_of_a_packaged_name_gets_a_did_you_mean_before_any_hub_call(hub_env, monkeypatch):
    from click.testing import CliRunner

    from ctxrep.cli import main
    from ctxrep.models.loading import resolve

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was asked for a typo of a packaged name")

    monkeypatch.setattr(hub, "hub_folder", no_hub)
    for typo in ("minilmm", "MiniLM-", "minlm"):
        with pytest.raises(CheckpointError, match=f"unknown model '{typo}': .* did you mean 'minilm'\\?"):
            resolve(typo)
    with pytest.raises(CheckpointError, match="did you mean 'elmo:small'\\?"):
        resolve("elmo:smal")
    result = CliRunner().invoke(main, ["info", "minilmm"])
    assert result.exit_code == 1 and result.output.strip().endswith("did you mean 'minilm'?")
    with pytest.raises(AssertionError, match="the Hub was asked"):  # a name no packaged name is close to: the Hub
        resolve("bert-base-cased")


# ---- AllenNLP's ELMo files ------------------------------------------------------------------------------


def _tiny_elmo(path: Path, seed: int = 0, projection_dim: int = 8) -> Path:
    torch.manual_seed(seed)
    config = ElmoConfig(
        filters=[(1, 4), (2, 8)], n_highway=1, lstm_dim=16, projection_dim=projection_dim, cell_clip=3.0, proj_clip=3.0
    )
    model = ElmoBiLM(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    model.save_pretrained(path)
    return path


def _published(folder: Path, short: str) -> dict[str, bytes]:
    """AllenNLP's layout: /FOLDER/elmo_FOLDER_options.json and _weights.hdf5."""
    name = hub.ELMO_DOWNLOADS[short]
    return {
        f"/elmo/{name}/elmo_{name}_options.json": (folder / "options.json").read_bytes(),
        f"/elmo/{name}/elmo_{name}_weights.hdf5": (folder / "weights.hdf5").read_bytes(),
    }


def test_published_elmo_urls_are_allennlps(monkeypatch):
    monkeypatch.delenv("CTXREP_ELMO_BASE_URL", raising=False)
    assert hub.elmo_urls("original") == {
        "options.json": "https://allennlp.s3.amazonaws.com/models/elmo/2x4096_512_2048cnn_2xhighway/"
        "elmo_2x4096_512_2048cnn_2xhighway_options.json",
        "weights.hdf5": "https://allennlp.s3.amazonaws.com/models/elmo/2x4096_512_2048cnn_2xhighway/"
        "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5",
    }
    assert hub.elmo_urls("original-5.5b")["weights.hdf5"].endswith(
        "/2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_weights.hdf5"
    )
    assert hub.elmo_download_name("elmo:small") == "small"
    assert hub.elmo_download_name("elmo:/some/folder") is None and hub.elmo_download_name("minilm") is None


def test_elmo_download_checks_caches_and_loads(server, tmp_path, monkeypatch):
    from ctxrep.text.char_ids import batch_to_ids

    src = _tiny_elmo(tmp_path / "src")
    s = server(static=_published(src, "small"))
    monkeypatch.setenv("CTXREP_ELMO_BASE_URL", s.url + "/elmo/")
    folder = hub.elmo_download("elmo:small", progress=False)
    assert folder == tmp_path / "ctxrep" / "elmo" / "small"
    assert not list(folder.glob("*.part-*")), "no temporary file left behind"
    ids = batch_to_ids([["a", "crane", "lifted"]])
    want = ElmoBiLM.from_pretrained(src)(ids).hidden_states
    got = ElmoBiLM.from_pretrained(folder)(ids).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    n = len(s.requests)
    s.stop()
    assert hub.elmo_download("small", progress=False) == folder  # from the cache, no request
    assert len(s.requests) == n


def test_elmo_weights_that_do_not_match_their_options_name_the_layer(server, tmp_path, monkeypatch):
    good, other = _tiny_elmo(tmp_path / "good"), _tiny_elmo(tmp_path / "other", projection_dim=6)
    files = _published(good, "medium")
    name = hub.ELMO_DOWNLOADS["medium"]
    files[f"/elmo/{name}/elmo_{name}_weights.hdf5"] = (other / "weights.hdf5").read_bytes()
    s = server(static=files)
    monkeypatch.setenv("CTXREP_ELMO_BASE_URL", s.url + "/elmo")
    with pytest.raises(CheckpointError) as e:
        hub.elmo_download("elmo:medium", progress=False)
    message = str(e.value)
    assert message.startswith("elmo:medium: the downloaded weights do not fit the downloaded options")
    assert "CNN_proj/W_proj (12, 6) (expected (12, 8))" in message and "\n" not in message
    folder = tmp_path / "ctxrep" / "elmo" / "medium"
    assert not list(folder.glob("elmo_*")), "the files are removed, so that a rerun downloads them again"
    assert not (folder / "checked.json").exists()
    # the mirror is fixed: the next call downloads both again and succeeds
    s.static.update(_published(good, "medium"))
    assert ElmoBiLM.from_pretrained(hub.elmo_download("elmo:medium", progress=False)).config.projection_dim == 8


def test_elmo_download_errors_are_one_line(server, monkeypatch):
    s = server(static={})
    monkeypatch.setenv("CTXREP_ELMO_BASE_URL", s.url)
    with pytest.raises(CheckpointError) as e:
        hub.elmo_download("elmo:original", progress=False)
    assert "HTTP 404" in str(e.value) and "elmo_2x4096_512_2048cnn_2xhighway_options.json" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="not a published ELMo: use one of elmo:small, elmo:medium"):
        hub.elmo_download("elmo:large")
    s.stop()
    with pytest.raises(CheckpointError, match="cannot download"):
        hub.elmo_download("elmo:small", progress=False)


def test_interrupted_elmo_download_leaves_no_file_and_a_rerun_completes_it(server, tmp_path, monkeypatch):
    src = _tiny_elmo(tmp_path / "src")
    files = _published(src, "small")
    s = server(static=files)
    weights_path = next(p for p in files if p.endswith("weights.hdf5"))
    s.truncate.add(weights_path)
    monkeypatch.setenv("CTXREP_ELMO_BASE_URL", s.url + "/elmo")
    with pytest.raises(CheckpointError) as e:
        hub.elmo_download("elmo:small", progress=False)
    assert "weights.hdf5: download stopped at" in str(e.value) and "run again" in str(e.value)
    assert "\n" not in str(e.value)
    folder = tmp_path / "ctxrep" / "elmo" / "small"
    assert not list(folder.glob("*weights*")), "neither a partial file nor a temporary one is left"
    s.truncate.clear()
    assert hub.elmo_download("elmo:small", progress=False) == folder
    assert s.fetched("_options.json") == 1, "the complete options file was kept"


# ---- errors before downloads; each family added in issue 25 from a repository laid out as on the Hub ---------------


def test_unsupported_model_type_fails_after_config_json_alone(server, bert_files):
    files = dict(bert_files)
    files["config.json"] = json.dumps(json.loads(files["config.json"]) | {"model_type": "mamba"}).encode()
    s = server({"org/mamba": {"refs": {"main": _sha(8)}, "commits": {_sha(8): files}}})
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/mamba", progress=False, check_model_type=check_model_type)
    message = str(e.value)
    assert "model_type 'mamba', which ctxrep cannot load; it loads bert, roberta" in message
    for family in ("xlm-roberta", "camembert", "distilbert", "mpnet", "t5", "ELMo"):
        assert family in message, family
    assert "ctxrep-albert" not in message and "ctxrep_mt" not in message and "\n" not in message
    assert s.fetched("config.json") == 1
    assert s.fetched("model.safetensors") == 0 and s.fetched("tokenizer.json") == 0 and s.fetched("vocab.txt") == 0


def test_a_404_from_the_server_says_there_is_no_such_model(server):
    s = server({})

    def plain_404(h, repo_id, rev, body):  # a server (a mirror) that answers 404 without the Hub's error code
        s._send(h, 404, b"Not Found", body)

    s._commit = plain_404
    with pytest.raises(CheckpointError) as e:
        hub.hub_folder("org/no-such-model", progress=False)
    message = str(e.value)
    assert "'org/no-such-model': no such model on " + s.url in message and "404" in message
    assert "cannot reach" not in message and "network" not in message and "\n" not in message


def _repo(folder: Path, drop: tuple[str, ...] = (), **extra: bytes) -> dict[str, bytes]:
    files = {k: v for k, v in _files(folder).items() if k not in drop}
    files.update({"README.md": b"# tiny\n", ".gitattributes": b"*.bin filter=lfs\n", **extra})
    return files


def _whole_t5(t5_dir: Path, dst: Path) -> Path:
    """flan-t5's layout: T5ForConditionalGeneration (encoder, decoder, LM head) and spiece.model, no tokenizer.json."""
    import transformers

    config = transformers.T5Config.from_pretrained(t5_dir)
    torch.manual_seed(3)
    transformers.T5ForConditionalGeneration(config).save_pretrained(dst)
    (dst / "spiece.model").write_bytes((t5_dir / "spiece.model").read_bytes())
    (dst / "generation_config.json").write_text("{}")
    return dst


def _camembert_mlm(camembert_dir: Path, dst: Path) -> Path:
    """camembert-base's layout: CamembertForMaskedLM weights (encoder under 'roberta.', lm_head.*) in both formats
    and only sentencepiece.bpe.model for the tokenizer."""
    import transformers

    config = transformers.CamembertConfig.from_pretrained(camembert_dir)
    torch.manual_seed(4)
    transformers.CamembertForMaskedLM(config).save_pretrained(dst)
    (dst / "sentencepiece.bpe.model").write_bytes((camembert_dir / "sentencepiece.bpe.model").read_bytes())
    torch.save(load_file(dst / "model.safetensors"), dst / "pytorch_model.bin")
    return dst


@pytest.mark.parametrize("family", ["xlm-roberta", "camembert", "distilbert", "mpnet", "t5"])
def test_new_family_downloads_and_loads_like_its_source(request, server, tmp_path, family):
    """multilingual-e5 (XLM-R, sentence-transformers), camembert-base (SentencePiece only, MLM weights),
    distilbert-base-uncased (every framework's weights), all-mpnet-base-v2 (sentence-transformers with ONNX and
    OpenVINO copies), flan-t5 (a whole T5, SentencePiece only): ctxrep fetches what it reads and nothing else, and
    the download loads and tokenizes like the source folder."""
    import ctxrep

    if family == "xlm-roberta":
        source = request.getfixturevalue("xlmr_dir")
        modules = b'[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]'
        files = _repo(
            source,
            **{
                "modules.json": modules,
                "1_Pooling/config.json": b'{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}',
                "onnx/model.onnx": b"\0" * 64,
            },
        )
    elif family == "camembert":
        source = _camembert_mlm(request.getfixturevalue("camembert_dir"), tmp_path / "camembert")
        files = _repo(source)
    elif family == "distilbert":
        source = request.getfixturevalue("distilbert_dir")
        files = _repo(
            source, **{"tf_model.h5": b"\0" * 64, "rust_model.ot": b"\0" * 64, "flax_model.msgpack": b"\0" * 64}
        )
    elif family == "mpnet":
        source = request.getfixturevalue("mpnet_dir")
        files = _repo(
            source,
            **{
                "sentence_bert_config.json": b'{"max_seq_length": 384}',
                "onnx/model.onnx": b"\0" * 64,
                "openvino/openvino_model.bin": b"\0" * 64,
                "train_script.py": b"print()\n",
            },
        )
    else:
        source = _whole_t5(request.getfixturevalue("t5_dir"), tmp_path / "flan-t5")
        files = _repo(source)
    s = server({f"org/tiny-{family}": {"refs": {"main": _sha(9)}, "commits": {_sha(9): files}}})
    loaded = ctxrep.load_encoder(f"org/tiny-{family}")
    assert loaded.model.family == family and loaded.folder.name == _sha(9)
    fetched = sorted(_files(loaded.folder))
    assert "README.md" not in fetched and not any(f.startswith(("onnx/", "openvino/")) for f in fetched)
    assert not any(f.endswith((".h5", ".ot", ".msgpack", ".py")) for f in fetched), fetched
    assert ("pytorch_model.bin" in fetched) == ("model.safetensors" not in files)
    assert s.fetched("pytorch_model.bin") == 0 or "model.safetensors" not in files
    local = ctxrep.load_encoder(source)
    words = [["the", "quick", "brown", "fox"], ["a", "crane", "lifted", "the", "steel", "beam"]]
    got, want = loaded.tokenizer.encode_words(words), local.tokenizer.encode_words(words)
    assert [p.ids for p in got] == [p.ids for p in want] and [p.word_ids for p in got] == [p.word_ids for p in want]
    ids = torch.tensor([loaded.tokenizer.build_inputs(got[1].ids)[0]])
    with torch.no_grad():  # through the encoder interface: a whole T5 runs its decoder too (teacher-forced)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        assert torch.equal(loaded.model.encode(batch).last_hidden_state, local.model.encode(batch).last_hidden_state)


def test_sharded_safetensors_download_every_shard_and_load_lazily(server, tmp_path):
    """A decoder LLM as the Hub ships it: model.safetensors.index.json and its shards (issue 35)."""
    from _decoders import tiny_folder

    from ctxrep.models.loading import load_model

    source = tiny_folder(tmp_path / "src", "qwen3")
    load_model(source).save_pretrained(tmp_path / "sharded", max_shard_bytes=20_000)
    files = _repo(tmp_path / "sharded", **{"tokenizer.json": (source / "tokenizer.json").read_bytes()})
    files["pytorch_model-00001-of-00002.bin"] = b"never fetched"
    shard_names = sorted(f for f in files if f.startswith("model-"))
    assert len(shard_names) > 2
    s = server({"org/tiny-qwen3": {"refs": {"main": _sha(8)}, "commits": {_sha(8): files}}})
    folder = hub.hub_folder("org/tiny-qwen3", progress=False)
    assert sorted(_files(folder)) == sorted(
        ["config.json", "model.safetensors.index.json", "tokenizer.json", *shard_names]
    )
    assert s.fetched(".bin") == 0 and s.fetched("README.md") == 0
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        assert torch.equal(load_model(folder)(ids).last_hidden_state, load_model(source)(ids).last_hidden_state)
    assert hub.cached_hub_folder("org/tiny-qwen3") == folder
