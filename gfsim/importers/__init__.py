"""Importers: logs and data sets of other tools as gfsim replay logs."""
