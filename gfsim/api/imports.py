"""Other tools' runs as gfsim logs (``gfsim import``): one function per source, each writing a
whole log or nothing (``gfsim.importers``), and the Kernel Tuner caches gfsim ships."""

from gfsim.importers.gpu_forecasters import fetch_hf, import_eval_set, import_events
from gfsim.importers.kernel_tuner import import_kernel_tuner
from gfsim.importers.kernelbench import import_kernelbench
from gfsim.importers.openevolve import import_openevolve
from gfsim.importers.plugins import import_with
from gfsim.importers.search import import_search
from gfsim.importers.shinka import import_shinka
from gfsim.worlds.kernel_tuner import find_cache

__all__ = ["import_kernel_tuner", "import_search", "import_openevolve", "import_shinka",
           "import_kernelbench", "import_events", "import_eval_set", "fetch_hf", "import_with",
           "find_cache"]
