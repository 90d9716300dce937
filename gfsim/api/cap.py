"""A hard dollar cap on a run's LLM calls (``gfsim cap-proxy``): the ledger that reserves each
call before it is made and settles what it cost (``DollarCap``), and the OpenAI-compatible proxy
that holds an LLM server's calls to it (``CapProxy``)."""

from gfsim.integrations.cap import DollarCap
from gfsim.integrations.cap_proxy import CapProxy

__all__ = ["DollarCap", "CapProxy"]
