"""(a) Every zoo size's model against official YOLOX 0.3.0's: the same state_dict keys, in the same order and
shapes, and the same initial weights under one torch seed (so that a seeded comparison of any size starts
equal).

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/zoo_init.py [NAME ...]
"""

from __future__ import annotations

import common
import torch

NAMES = ("yolox-nano", "yolox-tiny", "yolox-s", "yolox-m", "yolox-l", "yolox-x")  # about 8 s of CPU in all


def compare(name: str) -> dict:
    from yolox.exp import get_exp as official_get_exp

    from yolox_fast.exp import get_exp

    official_exp, ours_exp = official_get_exp(None, name), get_exp(exp_name=name)
    torch.manual_seed(0)
    official = official_exp.get_model().state_dict()
    torch.manual_seed(0)
    ours = ours_exp.get_model().state_dict()
    shapes_equal = [tuple(v.shape) for v in official.values()] == [tuple(v.shape) for v in ours.values()]
    same = list(official) == list(ours) and shapes_equal
    return {
        "tensors": len(official),
        "parameters": sum(v.numel() for v in official.values()),
        "same_keys_in_order_and_shapes": same,
        "init_max_abs_diff": (
            max(
                float((official[k].double() - ours[k].double()).abs().max())
                for k in official
                if ours[k].numel()
            )
            if same
            else None
        ),
    }


def collect(argv: list[str] | None = None) -> dict:
    return {name: compare(name) for name in (argv or NAMES)}


if __name__ == "__main__":
    common.run(collect)
