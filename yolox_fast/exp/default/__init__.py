"""The model zoo: official YOLOX recipes, found by `get_exp(exp_name="yolox-s")` (`-n yolox-s`)."""
