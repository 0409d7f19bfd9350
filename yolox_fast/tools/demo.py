"""Detect objects in images, a video or a webcam stream, B images/frames per forward.

python tools/demo.py image -n yolox-s -c yolox_s.pth --path assets/ --save_result -b 8
python tools/demo.py image -n yolox-s -c yolox_s.pth --path photos/ --recursive   # and its subfolders' images
python tools/demo.py video -f exps/yolox_nano.py -c best_ckpt.pth --path clip.mp4 --save_result
python tools/demo.py video -f exps/yolox_nano.py -c best_ckpt.pth --path clip.mp4 --track --save_result  # ids
python tools/demo.py webcam -n yolox-nano -c yolox_nano.pth --camid 0
python tools/demo.py image -c shapes_nano.onnx --path photos/ -b 8 --save_result   # an exported file
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from loguru import logger

from yolox_fast.core.cli import (
    add_exp_arguments,
    add_inference_arguments,
    add_random_weights_argument,
    build_exp,
    default_checkpoint,
    parse_with_overrides,
    run_tool,
)
from yolox_fast.core.demo import (
    DEMO_CONF,
    DEMO_NMS,
    list_images,
    run_on_images,
    run_on_stream,
    timestamped_dir,
)
from yolox_fast.core.prediction_outputs import add_output_arguments, output_options
from yolox_fast.data.build import prepare_dataset
from yolox_fast.data.datasets.voc import split_folders
from yolox_fast.data.datasets.yolo import val_image_dir
from yolox_fast.export import exported_format, load_exported_model
from yolox_fast.inference import Predictor, load_inference_model
from yolox_fast.tracking import ByteTracker
from yolox_fast.utils.allocator import keep_freed_memory
from yolox_fast.utils.amp import amp_dtype
from yolox_fast.utils.compile import run_batch_sizes


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("yolox_fast demo")
    p.add_argument("demo", choices=("image", "video", "webcam"), help="input kind")
    add_exp_arguments(
        p,
        "checkpoint (ours, which stores its exp, or official YOLOX's) or a file tools/export.py wrote "
        "(.onnx, .xml, .torchscript); -f/-n is optional but for official weights; default: "
        "<output_dir>/<exp_name>/best_ckpt.pth if it exists",
    )
    p.add_argument(
        "--path",
        type=str,
        default=None,
        help="image: file, folder (its own images; with --recursive its subfolders' too), glob "
        "('photos/*.jpg', 'data/**/*.png') or image URL; video: file or stream URL (rtsp://, http(s)://; "
        "reconnected when it drops); default: the exp's val images, read as the split is (subfolders too)",
    )
    p.add_argument(
        "--recursive", action="store_true", help="image: a folder's subfolders too (default: its own images)"
    )
    p.add_argument("--camid", type=int, default=0, help="webcam id")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="images or frames per forward")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--conf", type=float, default=DEMO_CONF, help="score threshold")
    p.add_argument("--nms", type=float, default=DEMO_NMS, help="NMS IoU threshold")
    p.add_argument(
        "--per-class-nms",
        action="store_true",
        help="NMS within each class, as evaluation does (default: across classes, one box per object, "
        "as YOLOX's demo)",
    )
    p.add_argument("--tsize", type=int, default=None, help="test image size (square)")
    p.add_argument("--fp16", action="store_true", help="half precision: fp16 on GPU, bf16 on CPU")
    add_inference_arguments(p)
    add_random_weights_argument(p)
    p.add_argument("--legacy", action="store_true", help="accepted for YOLOX compatibility; no effect")
    p.add_argument("--save_result", action="store_true", help="write annotated images / video")
    p.add_argument("--save-json", action="store_true", help="write detections per image as JSON")
    add_output_arguments(p)
    p.add_argument(
        "--track",
        action="store_true",
        help="video/webcam: ByteTrack ids across frames, drawn and written as MOT text (<name>.txt); "
        "detections from score 0.1 feed it, --conf is not used",
    )
    return p


def default_image_dir(exp) -> str:
    """The validation images of the exp's dataset (the synthetic shapes set is generated if missing)."""
    cfg = prepare_dataset(exp)
    if cfg["format"] == "yolo":
        return val_image_dir(cfg)
    if cfg["format"] == "voc":
        val = cfg["val"]
        if "sets" in val:
            return str(Path(cfg["root"]) / f"VOC{val['sets'][0][0]}" / "JPEGImages")
        return split_folders(cfg["root"], val)[0]
    return str(Path(cfg["root"]) / cfg["val"]["images"])


def main(argv=None) -> None:
    args = parse_with_overrides(make_parser(), argv)
    keep_freed_memory()  # every batch reuses the last one's memory instead of faulting it in anew
    if args.legacy:
        logger.info("--legacy has no effect: yolox_fast inputs are always BGR 0-255 without normalisation")
    if args.device == "gpu" and not torch.cuda.is_available():
        raise SystemExit("--device gpu but CUDA is not available")
    device = torch.device("cuda" if args.device == "gpu" else "cpu")

    if exported_format(args.ckpt):
        if args.fp16 or args.channels_last or args.compile:
            raise ValueError(
                f"--fp16, --channels-last and --compile are for checkpoints: {args.ckpt}'s precision, "
                "layers and layout are fixed at export"
            )
        model = load_exported_model(args.ckpt, device)
        exp = build_exp(args, model.metadata)
        class_names = model.metadata.class_names
        device, channels_last = model.device, False
    else:
        exp = build_exp(args)
        ckpt = default_checkpoint(exp, args.ckpt)
        model, class_names = load_inference_model(
            exp, ckpt, device, fuse=args.fuse, random_weights=args.random_weights
        )
        channels_last = exp.channels_last
    if args.track and args.demo == "image":
        raise ValueError("--track follows objects across the frames of a video or webcam, not images")
    tracker = ByteTracker() if args.track else None
    predictor = Predictor(
        model,
        exp.num_classes,
        exp.test_size,
        tracker.settings.low if tracker else args.conf,
        args.nms,
        device,
        amp_dtype=amp_dtype(device, fp16=args.fp16),
        channels_last=channels_last,
        class_agnostic=not args.per_class_nms,
    )
    image_dir = (args.path or default_image_dir(exp)) if args.demo == "image" else None
    recursive = args.recursive or args.path is None  # the val split's images are all of its folder's
    paths = list_images(image_dir, recursive) if image_dir else None
    if exp.compile:
        # a folder's last batch may be smaller; a stream's batches are all -b but its last
        sizes = run_batch_sizes(len(paths), args.batch_size) if image_dir else [args.batch_size]
        predictor.compile(exp.compile_mode, sizes, exp.compile_backend)
    out_dir = timestamped_dir(exp.output_dir, exp.exp_name)

    if args.demo == "image":
        run_on_images(
            predictor,
            image_dir,
            args.batch_size,
            class_names,
            out_dir=out_dir,
            save_images=args.save_result,
            save_json=args.save_json,
            outputs=output_options(args),
            paths=paths,
        )
    else:
        if args.demo == "video" and args.path is None:
            raise SystemExit("video: give --path to a video file")
        source = args.camid if args.demo == "webcam" else args.path
        name = f"camera{args.camid}.mp4" if args.demo == "webcam" else Path(args.path).stem + ".mp4"
        run_on_stream(
            predictor,
            source,
            args.batch_size,
            class_names,
            out_path=out_dir / name,
            save_video=args.save_result,
            save_json=args.save_json,
            show=args.demo == "webcam",
            tracker=tracker,
            outputs=output_options(args),
        )


if __name__ == "__main__":
    run_tool(main)
