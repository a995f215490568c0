"""Launching: commands that run several packages together (the demo). The one package, with the
root command line, that may import every other one (tests/test_layers.py)."""
