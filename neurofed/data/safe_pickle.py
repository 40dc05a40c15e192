"""Reading pickled data set files without ever running code from them.

The CIFAR python release (``cifar-10-batches-py/``, ``cifar-100-python/``) is a set of
Python 2 pickles of dicts holding byte strings, lists of ints and one uint8 numpy
array. An ordinary ``pickle.load`` would call whatever global a file names (a crafted
file can run a shell command); :func:`load` resolves only the globals numpy's own array
pickles reference (at any protocol: Python 2's, Python 3's protocol 2 with its
``_codecs.encode`` bytes, protocol 5's ``_frombuffer``), each through a wrapper that
builds arrays only from bytes the file holds, refuses any other global before calling
anything, then checks that what came out holds only plain data.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

# ndarray.__reduce__ names its reconstructor: numpy.core.multiarray._reconstruct
# (numpy 1.x) or numpy._core.multiarray._reconstruct (2.x); files may hold either.
_RECONSTRUCT = np.ndarray((0,)).__reduce__()[0]
_SCALAR = np.float64(0).__reduce__()[0]


class UnsafePickleError(ValueError):
    """A pickle names something other than plain data and numpy arrays."""


def _no_objects(dtype_like, *args):
    dt = np.dtype(dtype_like, *args)
    if dt.hasobject:  # an object array would unpickle arbitrary objects into its cells
        raise UnsafePickleError(f"refused numpy dtype {dt!r}: object arrays are not data")
    return dt


class _NdarrayName:
    """What the name ``numpy.ndarray`` in a pickle resolves to: the argument numpy's own
    array pickles pass to ``_reconstruct``, never a constructor (``ndarray(shape)`` would
    hand back uninitialised memory of any size the file declares)."""

    def __call__(self, *args, **kwargs):
        raise UnsafePickleError(f"refused a call to numpy.ndarray{shown(args)}: it allocates memory the file "
                                f"does not hold; array data must come from the file's bytes")


_NDARRAY = _NdarrayName()


def _reconstruct(subtype, shape, dtype):
    """numpy's array pickles start from an empty array (``ndarray.__reduce__`` writes shape
    (0,)); their ``__setstate__`` then fills it from bytes that numpy checks against the
    shape. Any other shape would be uninitialised memory of the file's choosing."""
    if subtype is not _NDARRAY or tuple(shape) != (0,):
        raise UnsafePickleError(f"refused numpy _reconstruct of shape {shown(shape)}: array data must come from "
                                f"the file's bytes")
    return _RECONSTRUCT(np.ndarray, (0,), dtype)


def _frombuffer(buf, dtype, shape, order):
    """Protocol 5's array pickles (``numpy.core.numeric._frombuffer``): the array is the
    file's bytes; numpy refuses a buffer whose size does not match the shape."""
    return np.frombuffer(buf, dtype=_no_objects(dtype)).reshape(shape, order=order)


def _latin1(text, encoding):
    """How Python 3 writes ``bytes`` at protocol <= 2: ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"refused _codecs.encode({shown(text)}, {shown(encoding)}): only latin1 bytes")
    return text.encode("latin1")


def shown(value) -> str:
    import reprlib

    return reprlib.repr(value)


ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _no_objects,
    ("_codecs", "encode"): _latin1,
}
PLAIN = (dict, list, tuple, bytes, str, int, float, bool, type(None), np.ndarray, np.generic)


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, what: str):
        super().__init__(fh, encoding="bytes")  # Python 2 str -> bytes, as the CIFAR files need
        self.what = what

    def find_class(self, module, name):
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self.what}: refused to unpickle {module}.{name}: a data file may hold only dicts, lists, "
                "bytes, str, numbers and numpy arrays (nothing in it was run)"
            ) from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self.what}: refused a persistent id in the pickle (not plain data)")


def _check_plain(obj, what: str, depth: int = 0) -> None:
    if depth > 20:
        raise UnsafePickleError(f"{what}: data nested deeper than 20 levels")
    if not isinstance(obj, PLAIN) or (isinstance(obj, np.ndarray) and obj.dtype.hasobject):
        raise UnsafePickleError(f"{what}: holds a {type(obj).__name__}, not plain data")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_plain(k, what, depth + 1)
            _check_plain(v, what, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _check_plain(v, what, depth + 1)


def loads(data: bytes, what: str = "pickle"):
    """Unpickle ``data`` allowing only plain data and numpy arrays; ``what`` names it in errors."""
    try:
        obj = _Unpickler(io.BytesIO(data), what).load()
    except UnsafePickleError as exc:
        raise UnsafePickleError(str(exc) if str(exc).startswith(what) else f"{what}: {exc}") from None
    except Exception as exc:  # truncated or not a pickle at all
        raise ValueError(f"{what}: not a readable pickle ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    _check_plain(obj, what)
    return obj


def load(path, what: str | None = None):
    with open(path, "rb") as fh:
        return loads(fh.read(), what or str(path))
