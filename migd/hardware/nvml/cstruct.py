"""C structures read without pynvml's per-field conversions, for the hot paths.

pynvml's structures convert every field access (bytes to str); a bare ctypes structure with the
same ``_fields_`` has the same layout and reads at ctypes speed.  Used on memory that holds one of
pynvml's structures: the simulated library's view of a caller's struct, migd's read of GPM results.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def plain(ctype: Any) -> Any:
    """``ctype``'s C layout as bare ctypes (nested structures and arrays too): the hot entry points
    read and write the caller's memory without pynvml's per-field str/bytes conversions.  Only for
    structures without string fields (a bare char array takes bytes, not str)."""
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
        body: dict[str, Any] = {"_fields_": [(f[0], plain(f[1]), *f[2:]) for f in ctype._fields_]}
        if hasattr(ctype, "_pack_"):
            body["_pack_"] = ctype._pack_
        mirror = type(f"plain_{ctype.__name__}", (ctypes.Structure,), body)
        if ctypes.sizeof(mirror) != ctypes.sizeof(ctype):
            raise TypeError(f"{ctype.__name__}: the bare layout differs in size")
        return mirror
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
        return plain(ctype._type_) * ctype._length_
    return ctype
