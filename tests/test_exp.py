"""Experiment files: zoo names, files, trailing KEY VALUE overrides."""

import importlib.util
import textwrap

import pytest

from yolox_fast.exp import Exp, get_exp, get_exp_by_file


def test_zoo_names_resolve_to_exp_files():
    for name, depth, width in [("yolox-s", 0.33, 0.50), ("yolox_nano", 0.33, 0.25), ("YOLOX-X", 1.33, 1.25)]:
        exp = get_exp(exp_name=name)
        assert (exp.depth, exp.width) == (depth, width)
    nano = get_exp(exp_name="yolox-nano")
    assert nano.depthwise and nano.input_size == (416, 416) and nano.exp_name == "yolox_nano"


def test_unknown_zoo_name_lists_known_ones():
    with pytest.raises(ValueError, match="yolox-s"):
        get_exp(exp_name="yolox-q")


def test_exp_file_overrides_only_what_differs(tmp_path):
    path = tmp_path / "my_exp.py"
    path.write_text(
        textwrap.dedent("""
        from yolox_fast.exp import Exp as BaseExp

        class Exp(BaseExp):
            def __init__(self):
                super().__init__()
                self.num_classes = 3
    """)
    )
    exp = get_exp_by_file(str(path))
    assert exp.num_classes == 3 and exp.exp_name == "my_exp"
    assert exp.depth == Exp().depth


def test_an_exp_declares_its_own_fields_as_annotated_class_attributes(tmp_path):
    """One declaration gives a field its type and default; a class attribute overrides a field as an
    assignment in __init__ does, and the command line's values are checked against the declaration."""
    path = tmp_path / "declared_exp.py"
    path.write_text(
        textwrap.dedent("""
        from yolox_fast.exp import Exp as BaseExp

        class Exp(BaseExp):
            depth = 0.33
            warmup_boxes: int | None = None  # a field of this exp, typed by its annotation
            ratios: tuple[float, float] = (0.5, 2.0)
    """)
    )
    exp = get_exp_by_file(str(path))
    assert (exp.depth, exp.warmup_boxes, exp.ratios) == (0.33, None, (0.5, 2.0))
    fields = list(exp.fields())
    assert fields.index("depth") < fields.index("save_eval_report") < fields.index("warmup_boxes")
    exp.merge(["warmup_boxes", "12", "ratios", "(1, 3)", "depth", "0.67"])
    assert (exp.warmup_boxes, exp.ratios, exp.depth) == (12, (1.0, 3.0), 0.67)
    assert type(exp).depth == 0.33  # the override is the instance's, the class keeps its default
    with pytest.raises(ValueError, match=r"'warmup_boxes' to 'many': expected int \| None"):
        exp.merge(["warmup_boxes", "many"])
    with pytest.raises(ValueError, match=r"'ratios' to '\(1, 2, 3\)': expected tuple\[float, float\]"):
        exp.merge(["ratios", "(1, 2, 3)"])
    exp.merge(["warmup_boxes", "none"])
    assert exp.warmup_boxes is None


def test_missing_exp_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        get_exp(str(tmp_path / "nope.py"))


def test_merge_coerces_to_the_current_type():
    exp = Exp()
    exp.merge(
        [
            "max_epoch",
            "12",
            "basic_lr_per_img",
            "1e-3",
            "ema",
            "false",
            "input_size",
            "(320, 256)",
            "act",
            "relu",
            "data_dir",
            "/data/coco",
            "multiscale_range",
            "0",
        ]
    )
    assert exp.max_epoch == 12 and isinstance(exp.max_epoch, int)
    assert exp.basic_lr_per_img == pytest.approx(1e-3)
    assert exp.ema is False
    assert exp.input_size == (320, 256) and isinstance(exp.input_size, tuple)
    assert exp.act == "relu" and exp.data_dir == "/data/coco" and exp.multiscale_range == 0


@pytest.mark.parametrize(
    "opts, message",
    [
        (["max_epochs", "3"], "unknown exp key 'max_epochs'.*max_epoch"),
        (["max_epoch", "three"], "cannot set exp key 'max_epoch'"),
        (["ema", "maybe"], "cannot set exp key 'ema'"),
        (["max_epoch"], "KEY VALUE pairs"),
        (["get_model", "1"], "unknown exp key 'get_model'"),
    ],
)
def test_merge_rejects_bad_overrides(opts, message):
    with pytest.raises(ValueError, match=message):
        Exp().merge(opts)


def test_printing_shows_a_table_of_fields():
    text = repr(Exp())
    assert "basic_lr_per_img" in text and "nmsthre" in text


def test_merge_keeps_paths_as_strings_and_parses_other_unset_fields():
    exp = Exp()
    exp.merge(["data_dir", "2017", "simota_max_bytes", "1073741824", "class_names", "('a', 'b')"])
    assert exp.data_dir == "2017"
    assert exp.simota_max_bytes == 1 << 30
    assert exp.class_names == ("a", "b")


def test_multiscale_preprocess_scales_images_and_boxes():
    import torch

    exp = Exp()
    inputs = torch.zeros(1, 3, 64, 64)
    targets = torch.tensor([[[1, 32, 32, 20, 10], [0, 0, 0, 0, 0]]], dtype=torch.float32)
    out, t = exp.preprocess(inputs, targets, (32, 48))
    assert out.shape == (1, 3, 32, 48)
    torch.testing.assert_close(t[0, 0], torch.tensor([1.0, 24, 16, 15, 5]))
    assert (t[0, 1] == 0).all()


def test_an_exp_whose_source_file_cannot_be_found_still_builds(tmp_path):
    # a module loaded from a spec but not registered in sys.modules: inspect.getfile cannot find its file
    path = tmp_path / "my_recipe.py"
    path.write_text("from yolox_fast.exp import Exp as BaseExp\n\nclass Exp(BaseExp):\n    pass\n")
    spec = importlib.util.spec_from_file_location("unregistered_recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.Exp().exp_name == "unregistered_recipe"
    # a class made in a notebook (module __main__, no file)
    namespace = {"__name__": "__main__"}
    exec("from yolox_fast.exp import Exp\nclass NotebookExp(Exp):\n    pass\n", namespace)
    assert namespace["NotebookExp"]().exp_name == "notebook_exp"


@pytest.mark.parametrize(
    "key, raw, message",
    [
        ("simota_max_bytes", "lots", r"'simota_max_bytes' to 'lots': expected int \| None"),
        ("input_size", "(128,)", r"expected tuple\[int, int\]"),
        ("input_size", "(128, 128, 3)", r"expected tuple\[int, int\]"),
        ("random_size", "(10, 'x')", r"expected tuple\[int, int\] \| None"),
        ("act", "gelu", "expected Literal"),
        ("class_names", "3", r"expected tuple\[str, ...\] \| None"),
        ("warmup_epochs", "soon", "expected float"),
    ],
)
def test_every_field_has_a_declared_type_and_shape_checked_at_merge(key, raw, message):
    with pytest.raises(ValueError, match=message):
        Exp().merge([key, raw])


def test_optional_fields_parse_none_numbers_and_sizes():
    exp = Exp()
    exp.merge(["simota_max_bytes", "1e9", "random_size", "(10, 20)", "input_size", "512", "seed", "7"])
    assert (exp.simota_max_bytes, exp.random_size, exp.input_size, exp.seed) == (
        10**9,
        (10, 20),
        (512, 512),
        7,
    )
    exp.merge(["random_size", "none", "seed", "None", "warmup_lr", "0.001", "clip_grad_norm", "10"])
    assert (
        exp.random_size is None and exp.seed is None and exp.warmup_lr == 0.001 and exp.clip_grad_norm == 10.0
    )


def test_validate_catches_what_an_exp_file_sets(tmp_path):
    path = tmp_path / "bad_exp.py"
    path.write_text(
        "from yolox_fast.exp import Exp as BaseExp\n\n"
        "class Exp(BaseExp):\n    def __init__(self):\n        super().__init__()\n"
        "        self.input_size = (640,)\n        self.mosaic_scale = [0.5, 1.5]\n"
        "        self.my_own_knob = 3\n"
    )
    exp = get_exp_by_file(str(path))
    with pytest.raises(ValueError, match=r"input_size = \(640,\) \(expected tuple\[int, int\]\)"):
        exp.validate()
    exp.input_size = (640, 640)
    exp.validate()  # a list for a pair and the exp's own undeclared fields are fine
    exp.merge(["ema_ramp", "0"])
    with pytest.raises(ValueError, match=r"exp.ema_ramp must be > 0"):
        exp.validate()
    exp.ema_ramp = 400.0
    exp.merge(["my_own_knob", "4"])
    assert exp.my_own_knob == 4


def test_mixed_precision_fields_merge_and_validate():
    exp = Exp()
    assert (exp.cpu_amp_dtype, exp.scaler_init_scale, exp.scaler_growth_interval) == ("bf16", 65536.0, 2000)
    exp.merge(["cpu_amp_dtype", "fp16", "scaler_init_scale", "1024", "scaler_growth_interval", "50"])
    exp.validate()
    assert (exp.cpu_amp_dtype, exp.scaler_init_scale, exp.scaler_growth_interval) == ("fp16", 1024.0, 50)
    with pytest.raises(ValueError, match=r"'cpu_amp_dtype' to 'fp8': expected Literal\['bf16', 'fp16'\]"):
        exp.merge(["cpu_amp_dtype", "fp8"])
    for key, value in (("scaler_init_scale", "0"), ("scaler_growth_interval", "0")):
        bad = Exp()
        bad.merge([key, value])
        with pytest.raises(
            ValueError, match="scaler_init_scale must be > 0 and exp.scaler_growth_interval >= 1"
        ):
            bad.validate()


def test_data_worker_nice_merges_none_or_a_niceness_from_0_to_19():
    exp = Exp()
    assert exp.data_worker_nice is None  # the default: by device (19 on a CPU, 0 on a GPU)
    exp.merge(["data_worker_nice", "0"])
    exp.validate()
    exp.merge(["data_worker_nice", "None"])
    exp.validate()
    for bad in ("20", "-5"):
        exp.merge(["data_worker_nice", bad])
        with pytest.raises(ValueError, match=rf"data_worker_nice .* 0-19 .*got {bad}"):
            exp.validate()
