"""The built-in system layer (`plugin: native`): ASTRA-sim's collectives, chunking and scheduling."""

from chakra_core.system.native.config import NativeSystemConfig
from chakra_core.system.native.layer import NativeSystem

__all__ = ["NativeSystem", "NativeSystemConfig"]
