"""What plays the LLM in a live run: the forecasters that ask a vLLM (or OpenAI-compatible)
server (``forecaster``, with its prompt in ``prompt`` and its HTTP client in ``client``), the
learned forecaster's live form (``learned``), ``gfsim forecast``'s writer (``forecast_log``)
and the mutation operator that stands in for a generating LLM (``mutator``).
"""
