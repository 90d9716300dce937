"""The foundation every other part of gfsim stands on: the error types (``errors``: a
``GfsimError`` is a one-line message, never a traceback), keyed randomness (``rng``: every draw
from one seed and a key naming what it is about, never a global generator) and the ``KEY=VALUE``
spec grammar the command line shares (``specs``). It imports nothing else of gfsim.
"""
