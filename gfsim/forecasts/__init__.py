"""Forecasts and their quality: the forecaster protocol and its registry (``protocol``,
``registry``: one abstraction for the what-if, learned, logged, live and plug-in forecasters),
the 8 speedup bins and their two conventions (``bins``), what a policy reads from a forecast
(``confidence``), how good a forecaster is (``metrics``, ``scoring``: ECE, accuracy, speedup
recovered), recalibrating one (``calibration``), synthetic what-if forecasters of stated quality
(``whatif``) and the learned surrogate (``learned``). It may read replay logs
(``gfsim.replay_logs``) and the core, but nothing that simulates, tunes or runs live.
"""

from gfsim.forecasts.protocol import (
    Forecast,
    Forecaster,
    ForecasterError,
    ForecastRequest,
    LoggedForecaster,
)
from gfsim.forecasts.registry import FORECASTERS, make_forecaster, register_forecaster

__all__ = ["Forecast", "Forecaster", "ForecasterError", "ForecastRequest", "LoggedForecaster",
           "FORECASTERS", "make_forecaster", "register_forecaster"]
