"""Weights by name (utils/hub.py), against a local HTTP server on 127.0.0.1: fetched once into the cache,
checked against their SHA-256, written atomically; a refused or failed download leaves nothing behind and
says which URL and where to put the file by hand."""

import functools
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest
import torch
from helpers import run_tool_in_process

from yolox_fast.exp import get_exp
from yolox_fast.utils import hub
from yolox_fast.utils.hub import WeightsDownloadError, download, fetch_weights


class CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list = []

    def do_GET(self):
        CountingHandler.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):  # the test's output stays the test's
        pass


@pytest.fixture
def server(tmp_path):
    """(base URL, served folder, the paths requested so far) of an HTTP server on 127.0.0.1."""
    served = tmp_path / "served"
    served.mkdir()
    CountingHandler.requests = []
    handler = functools.partial(CountingHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served, CountingHandler.requests
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch, server) -> Path:
    """$YOLOX_FAST_HOME in the test's folder, weights fetched from the local server."""
    monkeypatch.setenv(hub.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv(hub.MIRROR_ENV, server[0])
    return tmp_path / "home" / "weights"


def leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_download_is_checked_and_atomic(server, tmp_path):
    base, served, _ = server
    payload = b"weights" * 1000
    (served / "w.pth").write_bytes(payload)
    good = hashlib.sha256(payload).hexdigest()
    assert download(f"{base}/w.pth", tmp_path / "out" / "w.pth", good) == good
    assert (tmp_path / "out" / "w.pth").read_bytes() == payload
    assert leftovers(tmp_path / "out") == ["w.pth"]  # no partial file left


def test_a_corrupted_download_is_refused_and_not_kept(server, tmp_path):
    base, served, _ = server
    (served / "w.pth").write_bytes(b"truncated")
    with pytest.raises(WeightsDownloadError, match=r"SHA-256 .* is not the expected .*not kept"):
        download(f"{base}/w.pth", tmp_path / "out" / "w.pth", "0" * 64)
    assert leftovers(tmp_path / "out") == []


def test_offline_the_error_names_the_url_and_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(hub.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv(hub.MIRROR_ENV, "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(WeightsDownloadError) as err:
        fetch_weights("yolox-s")
    message = str(err.value)
    assert "http://127.0.0.1:9/yolox_s.pth" in message
    assert f"put it at {tmp_path / 'home' / 'weights' / 'yolox_s.pth'}" in message
    assert leftovers(tmp_path / "home" / "weights") == []


def test_the_official_url_and_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(hub.MIRROR_ENV, raising=False)
    url = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0/yolox_nano.pth"
    assert hub.weights_url("YOLOX_NANO") == url
    monkeypatch.delenv(hub.HOME_ENV, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert hub.cache_dir() == tmp_path / "torch" / "hub" / "yolox_fast"


def test_weights_are_fetched_once_then_trusted_and_checked(cache, server):
    _, served, requests = server
    (served / "yolox_nano.pth").write_bytes(b"first")
    path = fetch_weights("yolox-nano")
    assert path == cache / "yolox_nano.pth" and path.read_bytes() == b"first"
    assert (cache / "yolox_nano.pth.sha256").read_text().strip() == hashlib.sha256(b"first").hexdigest()
    assert fetch_weights("yolox_nano") == path and requests == ["/yolox_nano.pth"]  # never twice
    path.write_bytes(b"tampered")
    with pytest.raises(WeightsDownloadError, match="does not match its SHA-256"):
        fetch_weights("yolox-nano")


def test_a_file_put_there_by_hand_is_used_and_trusted_from_then_on(cache, server):
    cache.mkdir(parents=True)
    (cache / "yolox_nano.pth").write_bytes(b"copied by hand")
    assert fetch_weights("yolox-nano").read_bytes() == b"copied by hand" and server[2] == []
    recorded = (cache / "yolox_nano.pth.sha256").read_text().strip()
    assert recorded == hashlib.sha256(b"copied by hand").hexdigest()


def test_a_known_checksum_refuses_other_bytes(cache, server):
    (server[1] / "yolox_s.pth").write_bytes(b"not the release file")
    with pytest.raises(WeightsDownloadError, match="f55ded71"):
        fetch_weights("yolox-s")
    assert leftovers(cache) == []


def test_c_with_a_zoo_name_fetches_the_weights_and_picks_the_exp(cache, server, tiny_shapes_coco, tmp_path):
    exp = get_exp(None, "yolox-nano")
    exp.num_classes = 80
    torch.save({"model": exp.get_model().state_dict()}, server[1] / "yolox_nano.pth")  # official layout
    images = Path(tiny_shapes_coco["root"]) / "val2017"
    out = ["--tsize", "64", "--save-json", "output_dir", tmp_path / "out"]
    run_tool_in_process("demo", "image", "-c", "yolox-nano", "--path", images, *out, cwd=tmp_path)
    (saved,) = (tmp_path / "out" / "yolox_nano" / "vis_res").glob("*/detections.json")
    assert len(json.loads(saved.read_text())) == tiny_shapes_coco["num_val"]
    assert (cache / "yolox_nano.pth").is_file() and server[2] == ["/yolox_nano.pth"]
