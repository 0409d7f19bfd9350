"""What the demo reads: globs, folders, image URLs, a video served over HTTP, a live MJPEG stream that drops
and is reopened, and a stream that never opens; all from a local HTTP server on 127.0.0.1."""

import functools
import http.server
import json
import socketserver
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import load_tool

from yolox_fast.core.sources import VideoSource, image_base, image_name, is_url, list_images, read_image
from yolox_fast.exp import get_exp

FRAMES_PER_CONNECTION = 6


def _frame(i: int) -> np.ndarray:
    return np.full((48, 64, 3), (10 * i) % 250, dtype=np.uint8)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files of the served folder, and /live: an MJPEG stream of FRAMES_PER_CONNECTION frames per connection,
    for `server.live_connections` connections, then 404 (the camera is gone)."""

    def do_GET(self):
        if self.path != "/live":
            return super().do_GET()
        if self.server.live_connections <= 0:
            return self.send_error(404)
        self.server.live_connections -= 1
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        for i in range(FRAMES_PER_CONNECTION):
            jpg = cv2.imencode(".jpg", _frame(i))[1].tobytes()
            head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpg)}\r\n\r\n".encode()
            self.wfile.write(head + jpg + b"\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """(base URL, served folder) of an HTTP server on 127.0.0.1 serving a 20-frame clip.mp4 and two images."""
    folder = tmp_path / "served"
    folder.mkdir()
    writer = cv2.VideoWriter(str(folder / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(20):
        writer.write(_frame(i))
    writer.release()
    cv2.imwrite(str(folder / "a.png"), _frame(3))
    cv2.imwrite(str(folder / "b.jpg"), _frame(7))
    httpd = socketserver.ThreadingTCPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(folder))
    )
    httpd.daemon_threads = True
    httpd.live_connections = 2
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", folder
    httpd.shutdown()
    httpd.server_close()


def test_globs_folders_and_names(tmp_path, log_lines):
    for rel in ("a.jpg", "b.png", "sub/c.jpg", "sub/deep/d.jpg", "notes.txt", "photo[1].png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp_path / rel), _frame(1)) if rel.endswith(("jpg", "png")) else (
            tmp_path / rel
        ).touch()

    def names(path: str, recursive: bool = False) -> list[str]:
        return [image_name(p, image_base(path)) for p in list_images(path, recursive)]

    own = ["a.jpg", "b.png", "photo[1].png"]
    assert names(str(tmp_path)) == own  # the folder's own images, and one line says how many are left
    assert sum("2 images in its subfolders not read" in m and "--recursive" in m for m in log_lines) == 1
    assert names(str(tmp_path), recursive=True) == [*own, "sub/c.jpg", "sub/deep/d.jpg"]
    assert names(str(tmp_path / "photo[1].png")) == ["photo[1].png"]  # a file's name, not a pattern
    assert names(str(tmp_path / "*.jpg")) == ["a.jpg"]
    assert names(str(tmp_path / "**" / "*.jpg")) == ["a.jpg", "sub/c.jpg", "sub/deep/d.jpg"]
    assert names(str(tmp_path / "sub" / "c.jpg")) == ["c.jpg"]
    assert is_url("rtsp://cam/1") and is_url("https://x/y.jpg") and not is_url(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        list_images(str(tmp_path / "missing"))


def test_image_urls_are_downloaded_and_named_by_their_file(server):
    url, _ = server
    np.testing.assert_array_equal(read_image(f"{url}/a.png"), _frame(3))
    assert image_name(f"{url}/a.png?size=big", Path()) == "a.png"
    assert read_image(f"{url}/missing.png") is None  # 404: one warning, the image skipped


def test_the_python_api_predicts_on_an_image_url_and_names_a_dead_one(server):
    """`YOLOX.predict(URL)` as a user calls it: the image downloaded and decoded as a file is (the result's
    image and path are the served ones); a URL that serves nothing is a ValueError naming it."""
    from yolox_fast import YOLOX

    url, _ = server
    model = YOLOX("shapes-nano", random_weights=True)  # the reading is under test, not the detections
    (result,) = model.predict(f"{url}/a.png", conf=0.5)
    assert result.path == f"{url}/a.png"
    np.testing.assert_array_equal(result.image, _frame(3))
    with pytest.raises(ValueError, match="missing.png"):
        model.predict(f"{url}/missing.png")


def test_a_live_stream_that_drops_is_reopened_then_given_up(server, log_lines):
    url, _ = server
    video = VideoSource(f"{url}/live", reconnect_tries=2, reconnect_wait_s=0.05)
    assert video.live
    frames = []
    while (frame := video.read()) is not None:
        frames.append(frame)
    video.release()
    # two connections of FRAMES_PER_CONNECTION frames (the second after one reconnect), then 404s
    assert len(frames) == 2 * FRAMES_PER_CONNECTION and video.reconnects == 1
    assert any("dropped: reconnecting (1/2)" in line for line in log_lines)
    assert any("lost: no frame after 2 reconnect attempts" in line for line in log_lines)


def test_a_video_served_over_http_ends_at_its_last_frame_and_a_dead_url_is_one_error(server):
    url, _ = server
    video = VideoSource(f"{url}/clip.mp4", reconnect_wait_s=0.05)
    count = 0
    while video.read() is not None:
        count += 1
    assert not video.live and count == 20 and video.reconnects == 0
    with pytest.raises(ConnectionError, match="cannot open stream"):
        VideoSource("http://127.0.0.1:9/none.mp4")


@pytest.mark.slow
def test_demo_reads_a_video_url_an_image_url_and_a_glob_as_typed(server, tmp_path):
    url, folder = server
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = 2
    ckpt = tmp_path / "nano.pth"
    torch.save({"model": exp.get_model().state_dict()}, ckpt)
    demo = load_tool("demo")
    common = ["-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "--save-json", "num_classes", "2"]
    common += ["output_dir", str(tmp_path / "out")]

    demo.main(["video", "--path", f"{url}/clip.mp4", "-b", "3", *common, "-expn", "video"])
    (per_frame,) = (tmp_path / "out" / "video" / "vis_res").glob("*/clip.json")
    assert len(json.loads(per_frame.read_text())) == 20

    demo.main(["image", "--path", f"{url}/b.jpg", *common, "-expn", "url"])
    (saved,) = (tmp_path / "out" / "url" / "vis_res").glob("*/detections.json")
    assert list(json.loads(saved.read_text())) == ["b.jpg"]

    demo.main(["image", "--path", str(folder / "*.png"), *common, "-expn", "glob"])
    (saved,) = (tmp_path / "out" / "glob" / "vis_res").glob("*/detections.json")
    assert list(json.loads(saved.read_text())) == ["a.png"]
