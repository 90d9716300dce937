"""Tuning a policy and the search's shape with Optuna: what a trial is and how it is scored
(``trials``: the search space, objectives, constraints, common random numbers over seeds) and
the study around it (``study``: samplers, storages from SQLite and journal files to PostgreSQL,
resumable and shared by several workers). It drives the simulator; it must not import the CLI or
live mode, and optuna is imported only by ``study``, ``journal`` (the journal file behind a
study) and ``claims`` (which trials are alive and which may still run); ``rdb`` checks an
SQLite study before Optuna opens it.
"""
