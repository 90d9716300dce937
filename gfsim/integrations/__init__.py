"""Integrations: gfsim inside other tools' searches. ``gfsim.integrations.openevolve`` puts a
selective surrogate (a forecaster and a gfsim policy) in front of an OpenEvolve evaluator;
``gfsim.integrations.mutation_server`` is an OpenAI-compatible loopback server whose answers
are the task suite's mutation operator's variants (an LLM stand-in for tests and fixtures).
Nothing here imports OpenEvolve, torch or triton at import time.
"""
