"""SYNTHETIC logs (``gfsim synth``): nothing measured, every distribution a stated assumption
recorded in the header; the same arguments give the same bytes."""

from gfsim.worlds.synth import SHAPES, summary_lines, synthesize

__all__ = ["SHAPES", "summary_lines", "synthesize"]
