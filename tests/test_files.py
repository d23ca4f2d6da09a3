"""Files written through a temporary file get the user's umask, not owner-only permissions; the one UTF-8 line
reader (files.utf8_lines) on known inputs."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from ctxrep.util.files import apply_umask, current_umask, default_file_mode, utf8_lines


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_current_umask_reads_without_changing(umask):
    assert current_umask() == umask
    assert current_umask() == umask
    assert default_file_mode() == 0o666 & ~umask


def test_a_mkstemp_file_gets_the_umask_mode(umask, tmp_path):
    fd, name = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    assert mode(name) == 0o600  # what the temporary file starts with
    apply_umask(name)
    assert mode(name) == 0o666 & ~umask
    with open(tmp_path / "plain", "w"):
        pass
    assert mode(name) == mode(tmp_path / "plain")  # the same as any file the user creates


def test_a_safetensors_file_gets_the_umask_mode(umask, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    apply_umask(path)
    assert mode(path) == 0o666 & ~umask


def test_a_checkpoint_is_not_owner_only(umask, tmp_path):
    from ctxrep.train.checkpoint import save_checkpoint
    from ctxrep.train.distributed import Distributed

    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    save_checkpoint(tmp_path / "checkpoint", model, optimizer, scheduler, {"step": 0}, Distributed())
    files = sorted((tmp_path / "checkpoint").iterdir())
    assert "model.safetensors" in [f.name for f in files]
    assert {f.name: mode(f) for f in files} == {f.name: 0o666 & ~umask for f in files}


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        apply_umask(tmp_path / "missing")


def test_utf8_lines_known_answers(tmp_path):
    import gzip
    import io

    data = "\ufeffone\r\ntwo\n\nthr\u00e9e".encode()  # BOM, CRLF, an empty line, no final line end
    expected = [(1, "one"), (2, "two"), (3, ""), (4, "thr\u00e9e")]
    (tmp_path / "a.txt").write_bytes(data)
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(data))
    assert list(utf8_lines(tmp_path / "a.txt")) == expected
    assert list(utf8_lines(tmp_path / "a.txt.gz")) == expected  # gunzipped by its magic bytes, whatever its name
    assert list(utf8_lines(io.BytesIO(data), "<stdin>")) == expected
    assert [t for _, t in utf8_lines(tmp_path / "a.txt", keep_ends=True)] == ["one\r\n", "two\n", "\n", "thr\u00e9e"]
    (tmp_path / "bad.txt").write_bytes(b"ok\ncaf\xe9 au lait\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: invalid UTF-8 byte b'\\xe9' at column 4; convert .*iconv"):
        list(utf8_lines(tmp_path / "bad.txt"))

    class DataError(ValueError):
        pass

    with pytest.raises(DataError, match="^<stdin>:2: invalid UTF-8"):
        list(utf8_lines(io.BytesIO(b"ok\n\xff\n"), "<stdin>", error=DataError))
    with pytest.raises(FileNotFoundError, match="missing.txt: no such file"):
        list(utf8_lines(tmp_path / "missing.txt"))
