"""Classes from a repository base URL (`--repository-url`), where the directory has none."""
from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from filtersrv_support import CLASSES, numbers, start_filtersrv

from sluice.protocol.codes import ResponseCode


@pytest.fixture
def http_repo(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "web"
    (root / "pkg").mkdir(parents=True)
    (root / "remote_evens.py").write_text(CLASSES["evens"])
    (root / "pkg" / "tags.py").write_text(CLASSES["tagged"])
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_classes_are_fetched_from_the_repository_url(fs_setup, http_repo: str, tmp_path: Path) -> None:
    s = fs_setup
    fs = start_filtersrv(tmp_path, s.broker, "--repository", str(s.repo), "--repository-url", http_repo,
                         name="fs-url")
    try:
        for n in range(4):
            s.rpc.send("FsUrl", n, tags="red" if n == 3 else "blue")
        assert s.rpc.register(fs.addr, "G-url", "FsUrl", "remote_evens:Even").code == ResponseCode.SUCCESS
        assert numbers(s.rpc.drain(fs.addr, "G-url", "FsUrl")) == [0, 2]
        assert s.rpc.register(fs.addr, "G-url2", "FsUrl", "pkg.tags:RedOnly").code == ResponseCode.SUCCESS
        assert numbers(s.rpc.drain(fs.addr, "G-url2", "FsUrl")) == [3]
        assert s.rpc.register(fs.addr, "G-dir", "FsUrl", "nothing:Nothing").code == ResponseCode.SUCCESS  # the dir's
        missing = s.rpc.register(fs.addr, "G-miss", "FsUrl", "absent:Cls")
        assert missing.code == ResponseCode.FILTER_DATA_NOT_EXIST
        assert "absent.py does not exist" in missing.remark and "absent.py answered 404" in missing.remark
    finally:
        fs.stop()
