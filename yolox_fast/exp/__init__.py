from yolox_fast.exp.base_exp import BaseExp
from yolox_fast.exp.build import get_exp, get_exp_by_checkpoint, get_exp_by_file, get_exp_by_name
from yolox_fast.exp.yolox_base import Exp

__all__ = ["BaseExp", "Exp", "get_exp", "get_exp_by_checkpoint", "get_exp_by_file", "get_exp_by_name"]
