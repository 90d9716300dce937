"""Integrations: gfsim inside other tools' searches. ``gfsim.integrations.openevolve`` puts a
selective surrogate (a forecaster and a gfsim policy) in front of an OpenEvolve evaluator;
``gfsim.integrations.mutation_server`` is an OpenAI-compatible loopback server whose answers
are the task suite's mutation operator's variants (an LLM stand-in for tests and fixtures);
``gfsim.integrations.cap`` is a run's dollar cap, and ``gfsim.integrations.cap_proxy`` holds an
OpenAI-compatible server's calls to it (ShinkaEvolve's LLM).
Nothing here imports OpenEvolve, torch or triton at import time.
"""
