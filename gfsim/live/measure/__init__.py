"""Real measurements: the Triton measurer (``measurer``) and the confinement its candidates run
in (``sandbox``: namespaces, Landlock, seccomp; ``cgroup``: memory and process limits;
``orphans``: what a candidate left behind), the worker process that loads and times a candidate
(``worker``, ``timing``), the GPU clock shared with it (``gpushare``) and the pool of measurers,
local or on a Ray cluster (``gpus``). torch and triton are imported only where they are used.
"""
