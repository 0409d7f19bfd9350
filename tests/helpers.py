"""Helpers shared by the test modules (tests/ is on sys.path when pytest runs them)."""

from yolox_fast.exp import Exp


def exp_for(dataset: str, /, **fields) -> Exp:
    """A default Exp on `dataset` for the tiny generated sets: 6 classes, 128 px, no loader workers, seed 0;
    `fields` override any of it."""
    exp = Exp()
    exp.dataset = dataset
    exp.num_classes = 6
    exp.input_size = exp.test_size = (128, 128)
    exp.data_num_workers = 0
    exp.seed = 0
    for key, value in fields.items():
        setattr(exp, key, value)
    return exp
