"""leap: learned throughput prediction and value ranking of accelerator types, before launch.

``import leap`` is cheap: the web stack, Dask and LightGBM load only when used.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
