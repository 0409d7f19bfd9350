"""The command-line tools, one module each: `yolox_fast TOOL ...`, `python -m yolox_fast.tools.TOOL ...` or
`python tools/TOOL.py ...` from a checkout (a shim over the module here). Each module parses its flags and
calls into the package; `main(argv)` is its entry point."""
