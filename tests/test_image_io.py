"""data/image_io.py: what counts as a damaged image (empty, truncated, undecodable, too large) is refused by
name before any decoder prints a bare line; alpha is composited on the letterbox grey; headers give sizes."""

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import bomb_png

from yolox_fast.data.image_io import (
    ALPHA_BACKGROUND,
    MAX_IMAGE_PIXELS,
    CorruptImageError,
    has_alpha,
    header_sizes,
    native_stderr_lines,
    read_image,
)


def _photo(h: int = 96, w: int = 128) -> np.ndarray:
    """(h, w, 3) uint8 with smooth gradients, so that a JPEG of it has a long scan."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 2 % 256, y * 2 % 256, (x + y) % 256], -1).astype(np.uint8)


def _jpeg(path: Path, img: np.ndarray | None = None) -> Path:
    cv2.imwrite(str(path), _photo() if img is None else img)
    return path


def test_a_whole_jpeg_reads_as_opencv_decodes_it(tmp_path):
    path = _jpeg(tmp_path / "a.jpg")
    assert np.array_equal(read_image(str(path)), cv2.imread(str(path)))


def test_a_jpeg_with_bytes_after_its_end_marker_is_whole(tmp_path):
    path = _jpeg(tmp_path / "a.jpg")
    path.write_bytes(path.read_bytes() + b"camera maker's trailer")
    assert read_image(str(path)).shape == (96, 128, 3)


def test_a_truncated_jpeg_is_refused_by_name_and_libjpeg_prints_nothing(tmp_path, capfd):
    path = _jpeg(tmp_path / "cut.jpg")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptImageError, match="cut.jpg: truncated .*no JPEG end-of-image marker") as err:
        read_image(str(path))
    assert err.value.reason == "truncated"
    assert "Premature end" not in capfd.readouterr().err


def test_a_jpeg_cut_after_an_earlier_end_marker_is_still_truncated(tmp_path):
    """An FF D9 before the last scan (an EXIF thumbnail's) does not make the main image whole."""
    whole = _jpeg(tmp_path / "a.jpg").read_bytes()
    scan = whole.index(b"\xff\xda")
    cut = whole[:scan] + b"\xff\xd9" + whole[scan : (scan + len(whole)) // 2]  # a marker, then a cut scan
    path = tmp_path / "cut.jpg"
    path.write_bytes(cut)
    with pytest.raises(CorruptImageError, match="truncated"):
        read_image(str(path))


def test_a_truncated_png_is_refused(tmp_path):
    path = tmp_path / "cut.png"
    cv2.imwrite(str(path), _photo())
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(CorruptImageError, match="cut.png: truncated .*no PNG IEND chunk"):
        read_image(str(path))


@pytest.mark.parametrize(
    "content, reason, said",
    [(b"", "empty", "the file is empty"), (b"not a jpeg", "undecodable", "not an image any decoder reads")],
)
def test_empty_and_garbage_files_are_refused_with_their_reason(tmp_path, content, reason, said):
    path = tmp_path / "x.jpg"
    path.write_bytes(content)
    with pytest.raises(CorruptImageError, match=said) as err:
        read_image(str(path))
    assert err.value.reason == reason and str(path) in str(err.value)


def test_a_decompression_bomb_is_refused_with_its_size_before_decoding(tmp_path):
    path = bomb_png(tmp_path / "bomb.png", 40000, 40000)
    assert 40000 * 40000 > MAX_IMAGE_PIXELS
    with pytest.raises(CorruptImageError, match="bomb.png: 40000x40000 pixels") as err:
        read_image(str(path))
    assert err.value.reason == "too large"
    assert header_sizes(str(path)) == ((40000, 40000), (40000, 40000))  # Pillow refuses it; the size is read


def test_rgba_is_composited_on_the_letterbox_grey(tmp_path):
    rgba = np.zeros((4, 6, 4), dtype=np.uint8)
    rgba[..., 2] = 255  # red everywhere underneath
    rgba[:2, :, 3] = 0  # top half transparent
    rgba[2:, :, 3] = 255  # bottom half opaque
    rgba[2:, :3, 3] = 128  # half transparent
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), rgba)
    img = read_image(str(path))
    assert img.shape == (4, 6, 3) and has_alpha(str(path))
    assert (img[:2] == ALPHA_BACKGROUND).all()  # transparent: grey, not the hidden red
    assert (img[3, 5] == [0, 0, 255]).all()
    half = np.round(np.array(ALPHA_BACKGROUND) * (1 - 128 / 255) + np.array([0, 0, 255]) * 128 / 255)
    assert np.abs(img[3, 0].astype(int) - half).max() <= 1


def test_an_opaque_png_is_read_as_before(tmp_path):
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), _photo())
    assert not has_alpha(str(path)) and np.array_equal(read_image(str(path)), _photo())


def test_library_lines_on_descriptor_2_are_handed_back_not_printed(capfd):
    with native_stderr_lines() as printed:
        os.write(2, b"Premature end of JPEG file\n")
    assert printed == ["Premature end of JPEG file"]
    assert "Premature" not in capfd.readouterr().err
