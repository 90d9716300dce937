"""Importers: other tools' logs and data sets (the paper's event logs and evaluation set,
Kernel Tuner caches) as gfsim replay logs, all or nothing. They write through
``gfsim.replay_logs`` and read the bins of ``gfsim.forecasts``; they must not import the
simulator or anything above it.
"""
