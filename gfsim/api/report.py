"""What the commands print with: the words and formats the library defines for its figures
(how a point without spread is named, a dollar figure, a search's shape, a fitted selection
rule) and the hook that counts the search steps replayed, for a progress bar."""

from gfsim.analysis.savings import usd_text
from gfsim.analysis.stats import POINT_WORDS, no_spread
from gfsim.simulator.progress import listening
from gfsim.simulator.selection_fit import describe_fit
from gfsim.simulator.shape import describe as describe_shape

__all__ = ["POINT_WORDS", "no_spread", "usd_text", "listening", "describe_fit", "describe_shape"]
