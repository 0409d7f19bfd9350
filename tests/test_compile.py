"""torch.compile: the model compiled in place (checkpoints unchanged), recompiles bounded across the
multi-scale sizes, compile time reported apart; the training command with --compile under DDP, and compiled
inference (inductor, the default backend) equal to eager."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_tool, run_tool_process
from test_trainer import EXP_FILE, tiny_opts

from yolox_fast.exp import Exp
from yolox_fast.inference import Predictor
from yolox_fast.models import YOLOXHead
from yolox_fast.utils.checkpoint import load_checkpoint
from yolox_fast.utils.compile import compile_module, compile_stats, run_batch_sizes

REPO = Path(__file__).resolve().parents[1]
STATS_LINE = re.compile(r"torch\.compile so far: (\d+) graphs compiled in ([\d.]+) s, (\d+) eager fallbacks")


def tiny_model(num_classes: int = 3) -> torch.nn.Module:
    exp = Exp()
    exp.depth, exp.width, exp.num_classes = 0.33, 0.0625, num_classes
    torch.manual_seed(0)
    return exp.get_model()


def targets(size: int) -> torch.Tensor:
    """(2, 4, 5) [cls, cx, cy, w, h] px: two boxes per image, the rest padding."""
    t = torch.zeros(2, 4, 5)
    t[:, :2] = torch.tensor(
        [[0, size / 2, size / 2, size / 4, size / 4], [1, size / 3, size / 3, size / 5, size / 6]]
    )
    return t


def test_compile_keeps_the_state_dict_and_rejects_unknown_settings():
    model = tiny_model()
    keys = list(model.state_dict())
    with pytest.raises(ValueError, match="compile mode must be one of"):
        compile_module(model, mode="fastest")
    with pytest.raises(ValueError, match="compile backend must be one of"):
        compile_module(model, backend="no-such-backend")
    assert compile_module(model, backend="eager") is model
    assert list(model.state_dict()) == keys  # no "_orig_mod." prefix: checkpoints and the EMA load as before
    exp = Exp()
    with pytest.raises(ValueError, match="compile_mode"):
        exp.merge(["compile_mode", "fastest"])


def test_the_loss_is_kept_eager_only_once_something_compiles():
    """Importing the model and the tools does not import torch._dynamo (most of a second per tool start);
    compile_module excludes the head's loss from compilation, once per class."""
    code = (
        "import sys; sys.path.insert(0, 'tools'); import yolox_fast.models, yolox_fast.core.trainer; "
        "import train, eval, demo; print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split()[-1] == "False", done.stdout + done.stderr[-2000:]
    compile_module(tiny_model(), backend="eager")
    losses = YOLOXHead._losses
    assert losses._yolox_fast_eager and losses._torchdynamo_disable
    compile_module(tiny_model(), backend="eager")
    assert YOLOXHead._losses is losses  # not wrapped twice


def test_warm_up_batch_sizes_are_the_batch_and_a_smaller_last_one():
    assert run_batch_sizes(10, 4) == [2, 4]
    assert run_batch_sizes(8, 4) == [4]
    assert run_batch_sizes(3, 4) == [3]


@pytest.mark.slow
def test_training_at_every_multiscale_size_stays_within_a_few_graphs():
    """Dynamo alone (backend "eager"): the graphs it builds for the training forward across three sizes, and
    losses and gradients equal to the uncompiled model's."""
    eager, compiled = tiny_model(), tiny_model()
    compiled.load_state_dict(eager.state_dict())
    compile_module(compiled, backend="eager")
    before = compile_stats()
    for size in (64, 96, 128, 64):
        x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(size)) * 255
        losses = [m(x, targets(size)) for m in (eager, compiled)]
        for m, loss in zip((eager, compiled), losses):
            m.zero_grad()
            loss["total_loss"].backward()
        assert losses[1]["total_loss"].item() == pytest.approx(losses[0]["total_loss"].item(), rel=1e-5)
        for p, q in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    after = compile_stats()
    # the first size, then one graph with dynamic sizes for all the others (each split where the eager
    # loss runs): not one per size
    assert after.graphs - before.graphs <= 4
    assert after.fallbacks == before.fallbacks


@pytest.mark.slow
def test_cli_trains_with_compile_under_ddp_resumes_and_the_checkpoint_evaluates(
    tiny_shapes_coco, tmp_path, log_lines
):
    """`tools/train.py --compile -d 2` (backend aot_eager: forward and backward traced without generating
    kernels, minutes quicker on a CPU than inductor), EMA and the L1 switch in the last epoch, then
    `--resume` of it with --compile for one more epoch; then `tools/eval.py --compile` and `tools/demo.py
    --compile` build their graphs before the first image and log the compile time apart (backend eager:
    dynamo alone). Compiled outputs against eager's: the inductor test below."""
    ckpt_path = tmp_path / "run" / "best_ckpt.pth"
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, compile_backend="aot_eager", width=0.0625)
    train = ["train", "-f", EXP_FILE, "-expn", "run", "-b", "4", "--logger", "none", "--compile"]
    out = run_tool_process(*train, "-d", "2", *opts, cwd=tmp_path, timeout=600)
    log = (tmp_path / "run" / "train_log.txt").read_text()
    assert "torch.compile (aot_eager, mode default)" in log
    stats = [tuple(map(float, m)) for m in STATS_LINE.findall(log)]
    assert len(stats) == 2, out[-3000:]  # one line per epoch
    (graphs, seconds, fallbacks), budget = stats[-1], int(re.search(r"at most (\d+)", log)[1])
    assert 1 <= graphs <= budget and seconds > 0 and fallbacks == 0
    assert "total_loss: nan" not in log
    assert not any(k.startswith("_orig_mod") for k in load_checkpoint(ckpt_path)["model"])

    eager_opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, width=0.0625, compile_backend="eager")
    resumed_opts = tiny_opts(
        tiny_shapes_coco["config"], tmp_path, width=0.0625, compile_backend="eager", max_epoch=3
    )
    run_tool_process(*train, "--resume", *resumed_opts, cwd=tmp_path, timeout=600)
    log = (tmp_path / "run" / "train_log.txt").read_text()
    assert "epoch 3/3 finished" in log and len(STATS_LINE.findall(log)) == 3
    assert load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")["start_epoch"] == 3

    common = ["-f", EXP_FILE, "-expn", "run", "-c", str(ckpt_path), "-b", "4", *eager_opts]
    text = run_tool_process("eval", *common, "--compile", cwd=tmp_path)
    assert re.search(r"AP50:95 [\d.]+  AP50 [\d.]+", text)
    compiled = (
        r"for batch sizes \[4\]: \d+ graphs compiled in [\d.]+ s, 0 eager fallbacks; not in the timings"
    )
    assert re.search(compiled, text)

    load_tool("demo").main(["image", *common, "--compile", "--path", tiny_shapes_coco["root"], "--recursive"])
    assert any(re.search(compiled, line) for line in log_lines)
    assert any("images/s" in line for line in log_lines)


@pytest.mark.slow
def test_inductor_compiled_inference_gives_the_eager_outputs():
    """The default backend generates C++ kernels for the CPU (a static graph per batch size, about 40 s on
    a 2-core CPU): the raw outputs equal eager's within fp32 reordering, and the warm-up built every graph
    the images needed. (Detections are not compared: a random model's near-tied scores order NMS
    differently under any reordering.)"""
    model = tiny_model().eval()
    compiled_model = tiny_model().eval()
    compiled_model.load_state_dict(model.state_dict())
    compiled = Predictor(compiled_model, 3, (64, 64), conf=0.001, nms=0.65)
    stats = compiled.compile("default", [2])
    assert stats.graphs >= 1 and stats.seconds > 0 and compiled.num_images == 0  # warm-up not counted
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8) for i in range(4)]
    for pair in (images[:2], images[2:]):
        batch = compiled.letterbox_batch(pair)
        with torch.inference_mode():
            torch.testing.assert_close(compiled_model(batch), model(batch), rtol=1e-4, atol=1e-3)
        compiled.predict(pair)
    assert compile_stats().graphs == stats.graphs
