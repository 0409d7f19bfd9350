"""Batched demo inference: B images per forward give the detections of one at a time; bad files are
skipped and reported; results, JSON and checkpoints behave as the tools promise."""

import copy
import json

import cv2
import numpy as np
import pytest
import torch
from helpers import load_tool, run_tool_process

from yolox_fast.core.demo import run_on_images
from yolox_fast.exp import get_exp
from yolox_fast.inference import Predictor, load_inference_model
from yolox_fast.utils.checkpoint import save_checkpoint

NUM_CLASSES = 3
TEST_SIZE = (96, 128)


def _nano_exp(num_classes=NUM_CLASSES):
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = num_classes
    exp.test_size = TEST_SIZE
    return exp


@pytest.fixture(scope="module")
def model():
    """A nano model whose BatchNorm statistics were measured on random images, so that (unlike a
    fresh init, which scores every box 1e-4) it produces many boxes with varied scores; its box
    regression is damped so that boxes stay image-sized."""
    torch.manual_seed(0)
    m = _nano_exp().get_model()
    for bn in (mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)):
        bn.momentum = None  # cumulative average over the calibration batches
    x = torch.rand(4, 3, *TEST_SIZE) * 255
    with torch.no_grad():
        m.train()
        for k, feat in enumerate(m.backbone(x)):
            stem = m.head.stems[k](feat)
            m.head.cls_convs[k](stem)
            m.head.reg_convs[k](stem)
        for conv in list(m.head.obj_preds) + list(m.head.cls_preds):
            conv.bias.zero_()
        for conv in m.head.reg_preds:
            conv.weight.mul_(0.05)
    return m.eval()


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    """Six images of different sizes (two in a sub-folder) and one file that is not an image."""
    root = tmp_path_factory.mktemp("demo_images")
    rng = np.random.default_rng(0)
    (root / "sub").mkdir()
    for i, (h, w) in enumerate([(100, 160), (64, 64), (130, 90), (96, 128), (50, 200), (120, 120)]):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        cv2.rectangle(img, (w // 4, h // 4), (w // 2, h // 2), (255, 255, 255), -1)
        cv2.imwrite(str(root / ("sub" if i >= 4 else "") / f"img{i}.png"), img)
    (root / "broken.jpg").write_bytes(b"not a jpeg at all")
    return root


def _predictor(model, conf=0.3):
    return Predictor(model, NUM_CLASSES, TEST_SIZE, conf=conf, nms=0.45)


def test_batched_detections_equal_one_at_a_time(model, image_dir, log_lines):
    names = [str(i) for i in range(NUM_CLASSES)]
    one = run_on_images(_predictor(model), str(image_dir), 1, names, recursive=True)
    four = run_on_images(_predictor(model), str(image_dir), 4, names, recursive=True)
    assert (
        sorted(one)
        == sorted(four)
        == sorted(["img0.png", "img1.png", "img2.png", "img3.png", "sub/img4.png", "sub/img5.png"])
    )
    assert sum(len(d) for d in one.values()) > 20  # the comparison is not between empty lists
    for name in one:
        a, b = one[name], four[name]
        assert a.shape == b.shape, name
        # Batch size changes the convolutions' summation order, so boxes agree to float rounding only:
        # within 1e-4 of the image size (0.01 px on these images; a wrong letterbox is off by pixels).
        side = max(cv2.imread(str(image_dir / name)).shape[:2])
        a, b = a[np.lexsort((a[:, 0], a[:, 5]))], b[np.lexsort((b[:, 0], b[:, 5]))]
        np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=0, atol=1e-4 * side)
        np.testing.assert_allclose(a[:, 4], b[:, 4], rtol=0, atol=1e-4)
        assert (a[:, 5] == b[:, 5]).all()
    assert any("broken.jpg" in line and "skipped" in line for line in log_lines)


def test_images_the_caller_listed_are_not_listed_again(model, image_dir, log_lines):
    """The demo lists a folder once (it counts the images before compiling and hands the list on): given
    the list, run_on_images reads those images and does not walk the folder again (one subfolder hint)."""
    from yolox_fast.core.sources import list_images

    paths = list_images(str(image_dir))
    dets = run_on_images(_predictor(model), str(image_dir), 2, ["a", "b", "c"], paths=paths)
    assert sorted(dets) == ["img0.png", "img1.png", "img2.png", "img3.png"]
    assert sum("subfolders not read" in line for line in log_lines) == 1


def test_boxes_are_in_original_image_pixels(model, image_dir):
    dets = run_on_images(_predictor(model), str(image_dir / "sub" / "img4.png"), 1, ["a", "b", "c"])
    boxes = dets["img4.png"][:, :4]
    # 50x200 image letterboxed into 96x128: r = 0.64, so input-space boxes reach at most 128 / 0.64
    assert boxes.size and boxes[:, 2].max() > 128 and boxes.max() <= 128 / 0.64 + 50


def test_save_result_and_json(model, image_dir, tmp_path):
    out = tmp_path / "vis"
    names = ["a", "b", "c"]
    dets = run_on_images(_predictor(model), str(image_dir), 2, names, out, True, True, recursive=True)
    assert (out / "sub" / "img4.png").is_file() and (out / "img0.png").is_file()
    saved = json.loads((out / "detections.json").read_text())
    assert set(saved) == set(dets)
    first = saved["img0.png"][0]
    assert set(first) == {"bbox", "score", "class_id", "class_name"}
    assert first["class_name"] == "abc"[first["class_id"]]
    np.testing.assert_allclose(first["bbox"], dets["img0.png"][0, :4], atol=0.01)


def test_checkpoint_class_names_and_mismatch_message(model, tmp_path):
    ckpt = tmp_path / "ckpt.pth"
    save_checkpoint({"model": model.state_dict(), "class_names": ["cat", "dog", "eel"]}, ckpt)
    loaded, names = load_inference_model(_nano_exp(), str(ckpt))
    assert names == ("cat", "dog", "eel")
    x = torch.rand(1, 3, *TEST_SIZE) * 255
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    with pytest.raises(RuntimeError, match=r"head\.cls_preds\.0\.weight") as err:
        load_inference_model(_nano_exp(num_classes=80), str(ckpt))
    assert "num_classes" in str(err.value)


def test_demo_tool_runs_random_weights_only_when_asked_and_says_so(image_dir, tmp_path, log_lines):
    load_tool("demo").main(
        [
            "image",
            "-n",
            "yolox-nano",
            "--random-weights",
            "--path",
            str(image_dir),
            "--tsize",
            "64",
            "-b",
            "4",
            "--save-json",
            "--recursive",
            "num_classes",
            "3",
            "output_dir",
            str(tmp_path),
        ]
    )
    assert any("RANDOM weights" in line for line in log_lines)
    assert any("images/s" in line for line in log_lines)
    (saved,) = tmp_path.glob("yolox_nano/vis_res/*/detections.json")
    assert len(json.loads(saved.read_text())) == 6


@pytest.mark.slow
def test_demo_reads_a_folders_subfolders_only_with_recursive_as_typed(image_dir, tmp_path):
    """`python tools/demo.py image --path DIR` in a fresh process: DIR's own images, and one line that says
    how many its subfolders hold and names the flag; with --recursive, those too."""
    runs = {}
    for name, flags in (("own", []), ("all", ["--recursive"])):
        said = run_tool_process(
            "demo", "image", "-n", "yolox-nano", "--random-weights", "--path", str(image_dir),
            "--tsize", "64", "-b", "4", "--save-json", *flags,
            "num_classes", "3", "output_dir", str(tmp_path / name), cwd=tmp_path,
        )  # fmt: skip
        (saved,) = (tmp_path / name).glob("yolox_nano/vis_res/*/detections.json")
        runs[name] = sorted(json.loads(saved.read_text())), said
    own = ["img0.png", "img1.png", "img2.png", "img3.png"]  # and broken.jpg, reported and skipped
    assert runs["own"][0] == own and runs["all"][0] == [*own, "sub/img4.png", "sub/img5.png"]
    (hint,) = [line for line in runs["own"][1].splitlines() if "subfolders" in line]
    assert "2 images in its subfolders not read" in hint and "--recursive" in hint
    assert "subfolders not read" not in runs["all"][1]


@pytest.mark.parametrize("tool", ["demo", "export"])
def test_a_forgotten_checkpoint_is_one_error_line_naming_the_flag(tool, image_dir, tmp_path):
    from helpers import run_tool_here

    out = tmp_path / "m.onnx"
    head = ["image", "--path", str(image_dir)] if tool == "demo" else ["--output-name", str(out)]
    done = run_tool_here(tool, *head, "-n", "yolox-nano", "test_size", "(64,64)", "output_dir", tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    assert "--random-weights" in errors[0] and "-c" in errors[0]
    assert not out.exists()


def test_load_inference_model_refuses_no_checkpoint_unless_asked():
    with pytest.raises(ValueError, match="random_weights=True"):
        load_inference_model(_nano_exp(), None)
    model, names = load_inference_model(_nano_exp(), None, random_weights=True)
    assert not model.training and len(names) == NUM_CLASSES


def test_demo_tool_defaults_to_the_trained_best_checkpoint(image_dir, tmp_path, log_lines):
    exp = _nano_exp()
    save_checkpoint(
        {"model": exp.get_model().state_dict(), "class_names": ["a", "b", "c"]},
        tmp_path / "yolox_nano" / "best_ckpt.pth",
    )
    load_tool("demo").main(
        [
            "image",
            "-n",
            "yolox-nano",
            "--path",
            str(image_dir),
            "--tsize",
            "64",
            "num_classes",
            "3",
            "output_dir",
            str(tmp_path),
        ]
    )
    assert any("best_ckpt.pth" in line and "loaded" in line for line in log_lines)
    assert not any("RANDOM weights" in line for line in log_lines)


def test_video_frames_in_batches(model, tmp_path):
    from yolox_fast.core.demo import run_on_stream

    src = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(src), cv2.VideoWriter_fourcc(*"mp4v"), 10, (160, 120))
    rng = np.random.default_rng(0)
    for _ in range(5):
        writer.write(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8))
    writer.release()
    out = tmp_path / "out" / "clip.mp4"
    done = run_on_stream(
        _predictor(model), str(src), 2, ["a", "b", "c"], out, save_video=True, save_json=True
    )
    assert done == 5  # 2 + 2 + a last partial batch of 1
    assert len(json.loads(out.with_suffix(".json").read_text())) == 5
    cap = cv2.VideoCapture(str(out))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 5
    cap.release()


def test_webcam_without_a_window_says_why_in_one_line_and_writes_the_video(
    model, tmp_path, monkeypatch, log_lines
):
    """`tools/demo.py webcam` shows frames; where no window can open (a headless OpenCV, no display) the
    frames still reach a video, and one line says why. A camera is a video source like a file here."""
    from yolox_fast.core.demo import run_on_stream, window_unavailable

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert window_unavailable() is not None
    src = tmp_path / "camera.mp4"
    writer = cv2.VideoWriter(str(src), cv2.VideoWriter_fourcc(*"mp4v"), 10, (160, 120))
    for _ in range(3):
        writer.write(np.full((120, 160, 3), 90, dtype=np.uint8))
    writer.release()
    out = tmp_path / "out" / "camera0.mp4"
    assert run_on_stream(_predictor(model), str(src), 2, ["a", "b", "c"], out, show=True) == 3
    said = [m for m in log_lines if "frames are not shown" in m]
    assert len(said) == 1 and str(out) in said[0]
    cap = cv2.VideoCapture(str(out))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 3
    cap.release()


def test_official_yolox_checkpoint_layout_loads(model, tmp_path):
    # official YOLOX saves {"start_epoch", "model", "optimizer"} with plain torch.save
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.rand(1, 3, *TEST_SIZE)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    path = tmp_path / "yolox_nano.pth"
    torch.save({"start_epoch": 300, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    loaded, names = load_inference_model(_nano_exp(), str(path))
    assert names == ("0", "1", "2")  # no names in the checkpoint, 80 COCO names in the exp: indices
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k


class _TwoBoxesOneObject(torch.nn.Module):
    """Decoded output for one object seen twice: two boxes of IoU ~0.8 whose best classes differ."""

    def forward(self, x):
        pred = torch.zeros(x.shape[0], 2, 5 + NUM_CLASSES)
        pred[:, 0, :5] = torch.tensor([50.0, 40.0, 40.0, 30.0, 0.9])
        pred[:, 1, :5] = torch.tensor([52.0, 41.0, 40.0, 30.0, 0.8])
        pred[:, 0, 5], pred[:, 1, 6] = 0.9, 0.7  # class 0, then class 1
        return pred


def test_demo_nms_is_across_classes_and_evaluation_nms_within_each():
    image = np.zeros((96, 128, 3), dtype=np.uint8)  # the test size: letterbox ratio 1
    across = Predictor(_TwoBoxesOneObject(), NUM_CLASSES, TEST_SIZE, 0.3, 0.3, class_agnostic=True)
    within = Predictor(_TwoBoxesOneObject(), NUM_CLASSES, TEST_SIZE, 0.3, 0.3)
    (one,) = across.predict([image])
    (two,) = within.predict([image])
    assert one[:, 5].tolist() == [0] and sorted(two[:, 5].tolist()) == [0, 1]
    np.testing.assert_allclose(one[0, :4], [30, 25, 70, 55], atol=1e-4)


def _iou_matrix(boxes: np.ndarray) -> np.ndarray:
    tl = np.maximum(boxes[:, None, :2], boxes[None, :, :2])
    br = np.minimum(boxes[:, None, 2:4], boxes[None, :, 2:4])
    inter = np.clip(br - tl, 0, None).prod(2)
    area = (boxes[:, 2:4] - boxes[:, :2]).prod(1)
    return inter / (area[:, None] + area[None, :] - inter)


def test_demo_tool_draws_one_box_per_object_unless_per_class_nms(model, image_dir, tmp_path):
    save_checkpoint({"model": model.state_dict()}, tmp_path / "model.pth")
    found = {}
    for name, flags in (("across", []), ("within", ["--per-class-nms"])):
        out = tmp_path / name
        load_tool("demo").main(
            ["image", "-n", "yolox-nano", "-c", str(tmp_path / "model.pth"), "--path", str(image_dir),
             "--tsize", "96", "--conf", "0.05", "--save-json", *flags,
             "num_classes", "3", "output_dir", str(out)]
        )  # fmt: skip
        (saved,) = out.glob("yolox_nano/vis_res/*/detections.json")
        found[name] = {
            k: np.array([d["bbox"] for d in v]).reshape(-1, 4)
            for k, v in json.loads(saved.read_text()).items()
        }
    overlaps = {
        name: sum(int((np.triu(_iou_matrix(b), 1) > 0.3).sum()) for b in per_image.values())
        for name, per_image in found.items()
    }
    # the default (YOLOX's demo): no two boxes overlap past --nms whatever their classes; per class they do
    assert overlaps["across"] == 0 and overlaps["within"] > 0
    assert sum(map(len, found["within"].values())) > sum(map(len, found["across"].values())) > 0
