"""Live mode: real forecasts and real Triton measurements (docs/concepts/design.md "Live mode").

Forecasters (``forecaster``, with the prompt in ``prompt`` and the HTTP client in ``client``)
and candidate sources (``candidates``, ``sources``, ``mutator``) feed the live PUCT driver
(``driver``), which measures on a GPU through ``measurer`` and its worker processes. It may use
everything below it; only the CLI may import it. Importing this package imports nothing heavy:
torch, triton and vllm are imported only inside the modules and functions that use them.
"""
