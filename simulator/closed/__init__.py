"""The closed loop: each step's parents chosen from the search's archive (``puct``: PUCT, the
reference search; ``evolution``: an OpenEvolve or ShinkaEvolve run's own rules), their children
drawn, decided by the policy and measured. ``engine`` is the SimPy reference; ``fast`` runs
the same search without SimPy, many searches in lockstep, with ``bank`` keeping their archives;
``tests/test_puct_fast.py`` holds the two to the same answers.
"""
