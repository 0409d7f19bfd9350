"""One module per benchmark suite, each with a `main(argv)`; a suite imports the kit, yolox_fast and
third-party packages, never another suite (tests/test_benchmarks.py checks it)."""
