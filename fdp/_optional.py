"""Optional dependencies: import them on first use, or say which extra installs them."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["require"]


def require(module: str, extra: str) -> Any:
    """``importlib.import_module(module)``, or an ImportError naming the pip extra.

    Example: ``require("matplotlib.pyplot", "plot")`` fails with
    'matplotlib.pyplot is needed for this; install it with: pip install "fdp[plot]"'.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module} is needed for this; install it with: pip install \"fdp[{extra}]\" "
            f"(or pip install -e \".[{extra}]\" in a checkout)"
        ) from err
