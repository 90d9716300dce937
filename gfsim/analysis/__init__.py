"""Reading replay results: paired bootstrap intervals over tasks then seeds (``stats``), the
dollars a policy saves against its baseline, censoring-aware (``savings``), and anytime and
score plots (``plots``, matplotlib imported only when one is drawn). It reads the simulator's
results; it must not import tuning, worlds, the CLI or live mode.
"""
