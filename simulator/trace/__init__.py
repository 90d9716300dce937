"""The trace driver: a log's searches replayed in their logged order. ``engine`` is the SimPy
reference (every candidate a process, every stage an event); ``fast`` gives its answers without
SimPy (a closed form where no capacity binds, a lean event loop elsewhere), and
``tests/test_fastpath.py`` holds the two to the same decisions, bests and totals.
"""
