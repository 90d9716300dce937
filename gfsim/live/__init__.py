"""Live mode: real forecasts and real Triton measurements (DESIGN.md "Live mode").

Importing this package imports nothing heavy: torch, triton and vllm are imported only inside
the modules and functions that use them.
"""
