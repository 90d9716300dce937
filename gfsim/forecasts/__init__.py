"""Forecasts and their quality: the 8 speedup bins and their two conventions (``bins``), what
a policy reads from a forecast (``confidence``), how good a forecaster is (``metrics``,
``scoring``: ECE, accuracy, speedup recovered), recalibrating one (``calibration``) and
synthetic what-if forecasters of stated quality (``whatif``). It may read replay logs
(``gfsim.replay_logs``) and the core, but nothing that simulates, tunes or runs live.
"""
