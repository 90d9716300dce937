"""Live mode: real forecasts and real Triton measurements (docs/concepts/design.md "Live mode").

Two rooms and what joins them: ``llm`` holds what plays the LLM (the vLLM forecasters, their
prompt and HTTP client, the learned forecaster's live form, the mutation operator) and
``measure`` what measures (the Triton measurer, its sandbox and worker processes, the GPU pool);
candidate sources (``candidates``, ``sources``) feed the live PUCT driver (``driver``), which
forecasts through the one and measures through the other, and ``fidelity`` replays its log
against what it recorded. It may use everything below it; only ``gfsim.api`` (and the
integrations) may import it. Importing this package imports nothing heavy:
torch, triton and vllm are imported only inside the modules and functions that use them.
"""
