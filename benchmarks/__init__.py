"""The benchmarks of yolox_fast, a package of the repository only (the wheel does not ship it): run them as
`python -m benchmarks SUITE` (`__main__.py`); `suites/` holds one module per suite, `kit/` what they share."""
