"""ctypes declarations of the twblas C API (include/twblas/twblas.h) and status handling.

Only what the Python package uses is declared. Every call goes through `check`, which turns a
status other than SUCCESS into ValueError (bad arguments) or RuntimeError, carrying the C
library's own message.
"""

import ctypes
import glob
import os
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_void_p

# twStatus_t
SUCCESS = 0
INVALID_VALUE = 3
NOT_SUPPORTED = 7
STATUS_NAMES = {
    0: "SUCCESS",
    1: "NOT_INITIALIZED",
    2: "ALLOC_FAILED",
    3: "INVALID_VALUE",
    4: "ARCH_MISMATCH",
    5: "EXECUTION_FAILED",
    6: "INTERNAL_ERROR",
    7: "NOT_SUPPORTED",
    8: "INSUFFICIENT_WORKSPACE",
    9: "CAPACITY_EXCEEDED",
    10: "INCOMPLETE_INPUT",
}
# twDataType_t, twOrder_t, twBackend_t, twFfnKind_t, twFfnAttribute_t
R_32F, R_16F, R_16BF = 0, 1, 2
ORDER_ROW, ORDER_COL = 0, 1
BACKEND_DEFAULT, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
FFN_GATED_RELU, FFN_RELU = 0, 1
FFN_ATTR_TILE_WIDTH, FFN_ATTR_COMPRESSION, FFN_ATTR_COMPUTE_MODE, FFN_ATTR_DETERMINISTIC, FFN_ATTR_SAVE_DENSE = 0, 1, 2, 3, 4
FFN_ATTR_L1_OUTPUT, FFN_ATTR_L1_COEFF_POINTER, FFN_ATTR_CALL_GRAPHS = 5, 6, 7
FFN_ATTR_WEIGHT_COPY_BYTES, FFN_ATTR_ALGORITHM = 8, 9
# twFfnAlgorithm_t
(FFN_ALG_DEFAULT, FFN_ALG_SERVE, FFN_ALG_DECODE, FFN_ALG_DENSE, FFN_ALG_FUSED, FFN_ALG_TWO_PASS,
 FFN_ALG_MASKED_TWO_PASS) = range(7)
# twSaveDense_t (FFN_ATTR_SAVE_DENSE)
SAVE_DENSE_NEVER, SAVE_DENSE_ALWAYS, SAVE_DENSE_AUTO = 0, 1, 2


class FfnStats(ctypes.Structure):
    """twFfnStats_t"""

    _fields_ = [
        ("tokens", c_int64),
        ("meanRowNnz", ctypes.c_double),
        ("maxRowNnz", c_int64),
        ("overflowRows", c_int64),
        ("l1", ctypes.c_double),
    ]


def _library_path():
    # TWBLAS_LIBRARY points at another build of libtwblas (development); by default the copy
    # that `pip install` put beside this file, named by its SONAME (libtwblas.so.<major>: the op
    # library of twblas.torch needs that name, and finds it through its RPATH)
    env = os.environ.get("TWBLAS_LIBRARY")
    if env:
        return env
    here = os.path.dirname(__file__)
    found = sorted(glob.glob(os.path.join(here, "libtwblas.so.*")))
    return found[0] if found else os.path.join(here, "libtwblas.so")


def _declare(lib):
    H = c_void_p  # every handle and descriptor is an opaque pointer
    sig = {
        "twGetErrorMessage": (c_char_p, [H]),
        "twGetVersion": (c_int, [POINTER(c_int)]),
        "twCreateWithBackend": (c_int, [POINTER(H), c_int]),
        "twDestroy": (c_int, [H]),
        "twGetBackend": (c_int, [H, POINTER(c_int)]),
        "twSetStream": (c_int, [H, c_void_p]),
        "twCreateDnMat": (c_int, [POINTER(H), c_int64, c_int64, c_int64, c_void_p, c_int, c_int]),
        "twDestroyDnMat": (c_int, [H]),
        "twCreateFfn": (c_int, [H, POINTER(H), c_int, H, H, H]),
        "twFfnUpdateWeights": (c_int, [H, H, H, H, H]),
        "twDestroyFfn": (c_int, [H]),
        "twFfnSetAttribute": (c_int, [H, c_int, c_void_p, c_size_t]),
        "twFfnGetAttribute": (c_int, [H, c_int, c_void_p, c_size_t]),
        "twFfnSetTuning": (c_int, [H, c_char_p, ctypes.c_double]),
        "twFfnGetTuning": (c_int, [H, c_char_p, POINTER(ctypes.c_double)]),
        "twSpGEMMFused_bufferSize": (c_int, [H, H, H, H, POINTER(c_size_t)]),
        "twSpGEMMFused": (c_int, [H, H, H, H, H, c_void_p]),
        "twFfnGetStats": (c_int, [H, H, POINTER(FfnStats)]),
        "twFfnGetNeuronCounts": (c_int, [H, H, c_void_p]),
        "twFfnResetNeuronCounts": (c_int, [H, H]),
        "twSpGEMMFusedSaved_bufferSize": (c_int, [H, H, c_int64, POINTER(c_size_t)]),
        "twSpGEMMFusedForwardTrain": (c_int, [H, H, H, H, c_void_p, c_void_p]),
        "twSpGEMMFusedBackward_bufferSize": (c_int, [H, H, c_int64, POINTER(c_size_t)]),
        "twSpGEMMFusedBackward": (c_int, [H, H, H, c_void_p, H, c_float, H, H, H, H, c_void_p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


_lib = None


def lib():
    """The loaded library (loaded on first use, so that importing twblas never fails)."""
    global _lib
    if _lib is None:
        path = _library_path()
        try:
            _lib = _declare(ctypes.CDLL(path))
        except OSError as e:
            raise RuntimeError(f"twblas: cannot load {path}: {e}") from e
    return _lib


def check(status, handle=None, what=""):
    """Raises for a status other than SUCCESS, with the library's message for the call."""
    if status == SUCCESS:
        return
    msg = lib().twGetErrorMessage(handle)
    detail = msg.decode(errors="replace") if msg else ""
    name = STATUS_NAMES.get(status, str(status))
    text = f"twblas: {what}: TW_STATUS_{name}" + (f": {detail}" if detail else "")
    raise (ValueError if status == INVALID_VALUE else RuntimeError)(text)


def version():
    v = c_int()
    check(lib().twGetVersion(ctypes.byref(v)), None, "twGetVersion")
    return f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"
