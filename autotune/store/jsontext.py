"""JSON as other tools read it: strict RFC 8259 text for the journal and every ``--json``.

Python writes an infinite or undefined float as ``Infinity`` / ``NaN``, which jq, JavaScript's
``JSON.parse`` and most readers reject. An interval that cannot be computed yet (too few batches
in a probe) is infinite here, so such values are written as ``null``: not known.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def plain(obj):
    """``obj`` as JSON-ready values: records by their ``to_dict``, enums by value, paths and
    unknown objects as text, non-finite floats as None."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return plain(obj.to_dict())
    if hasattr(obj, "value"):
        return plain(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def dumps(obj, **kw) -> str:
    """Strict JSON text of ``obj`` (see `plain`)."""
    return json.dumps(plain(obj), allow_nan=False, **kw)
