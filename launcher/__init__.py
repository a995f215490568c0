"""Launching: the ``speculant`` root command line (:mod:`launcher.cli`), which registers every
package's commands, and the demo. The one package that may import every other one
(tests/test_layers.py)."""
