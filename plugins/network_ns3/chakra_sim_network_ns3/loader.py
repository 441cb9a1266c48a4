"""Loading ns-3's Python bindings (cppyy) and compiling fabric.cpp against them, once per process.

`pip install ns3` gives ns-3 as shared libraries with cppyy bindings; `from ns import ns` loads
all of its ~45 modules (about 17 s). The plugin needs six (core, stats, network, bridge,
traffic-control, internet, point-to-point), which load in about 2 s from the wheel's own
folders; any other installation of ns-3's bindings (a source build with its lock file) is loaded
through `from ns import ns`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from chakra_core import SimulationError

MODULES = ("core", "stats", "network", "bridge", "traffic-control", "internet", "point-to-point")
"""The ns-3 modules the fabric needs, in dependency order."""
INSTALL_HINT = "pip install ns3"

_loaded: Any = None


def _wheel_prefix() -> tuple[str, str] | None:
    """(prefix, version) of the `ns3` wheel's libraries and headers, if that is what is installed."""
    spec = importlib.util.find_spec("ns")
    if spec is None or spec.origin is None:
        return None
    prefix = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "ns3")
    for variant in ("lib64", "lib"):
        cores = glob.glob(os.path.join(prefix, variant, "libns3*-core.so"))
        if cores:
            found = re.search(r"libns3(\.\d+(?:\.\d+)?)?-core\.so$", cores[0])
            version = found.group(1) or "" if found else ""
            return os.path.join(prefix, variant), version
    return None


def load() -> Any:
    """The cppyy global namespace with ns-3 loaded and `chakra_ns3` (fabric.cpp) compiled."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if importlib.util.find_spec("cppyy") is None or importlib.util.find_spec("ns") is None:
        raise SimulationError(f"network 'ns3' needs ns-3's Python bindings, which are not installed: "
                              f"{INSTALL_HINT} (ns-3 3.44 or later; see plugins/network_ns3/README.md)")
    import cppyy  # type: ignore[import-untyped, import-not-found, unused-ignore]  # no type information

    wheel = _wheel_prefix()
    try:
        if wheel is not None:
            libdir, version = wheel
            import libcppyy  # type: ignore[import-not-found, unused-ignore]  # cppyy's extension module

            libcppyy.AddSmartPtrType("Ptr")
            cppyy.add_library_path(libdir)
            cppyy.add_include_path(os.path.join(os.path.dirname(libdir), "include"))
            for module in MODULES:      # libraries first: their static initialisers are then found
                cppyy.load_library(f"libns3{version}-{module}.so")
            for module in MODULES:
                cppyy.include(f"ns3/{module}-module.h")
        else:
            from ns import ns  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except Exception as exc:  # cppyy raises several exception types when libraries or headers fail
        raise SimulationError(f"network 'ns3': could not load ns-3's bindings ({exc}); reinstall them: "
                              f"{INSTALL_HINT}") from None
    cppyy.include("ns3/ppp-header.h")
    source = (Path(__file__).with_name("fabric.cpp")).read_text()
    if not cppyy.cppdef(source):
        raise SimulationError("network 'ns3': fabric.cpp did not compile against this ns-3")
    _loaded = cppyy.gbl
    return _loaded
