"""Reading the (optionally gzip-compressed) JSON files PyTorch's profilers write."""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from chakra_core.et.io import GZIP_MAGIC
from chakra_core.errors import InputFileError
from chakra_core.input_files import GuardedGunzip, read_input_bytes
from chakra_core.limits import JSON_TRACE_BYTES
from chakra_core.tools.pytorch.errors import ConversionError


def load_json(path: str | os.PathLike[str], what: str) -> Any:
    """The decoded document; `what` names the kind of file in error messages."""
    try:
        data = read_input_bytes(path, JSON_TRACE_BYTES, what)
        if data[:2] == GZIP_MAGIC:
            with GuardedGunzip(path, JSON_TRACE_BYTES) as stream:   # a gzip bomb stops early, with a message
                data = stream.read()
    except InputFileError as exc:
        raise ConversionError(f"{exc.path}: cannot read the {what}: {exc.reason}") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise ConversionError(f"{path}: corrupt or truncated gzip stream ({exc})") from exc
    try:
        return json.loads(data)
    except RecursionError:
        raise ConversionError(f"{path}: the {what} is nested too deeply to read") from None
    except UnicodeDecodeError as exc:
        raise ConversionError(f"{path}: the {what} is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path}: the {what} is not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno} (truncated or corrupt file?)") from exc
