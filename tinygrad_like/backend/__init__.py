"""Device selection. Three devices, each a package of its runtime (the host functions of host.py,
allocation, timing): cpu/ (NumPy), cuda/ (CuPy) and meta/ (shapes and dtypes without data: it
counts a step without running it). Their kernels live by family in tinygrad_like/kernels/. CuPy
is imported only when CUDA is asked for or auto-detected, so the package never needs it.

TG_DEVICE=cpu|cuda|meta picks the default; without it the default is cuda when CuPy sees a GPU.
"""

import os
from functools import lru_cache

from . import cpu, meta

DEVICES = ("cpu", "cuda", "meta")


@lru_cache(maxsize=None)
def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or no device: all mean "no CUDA here"
        return False


@lru_cache(maxsize=None)
def default_device() -> str:
    """TG_DEVICE's device, else cuda when a GPU is usable, else cpu."""
    return resolve(os.environ.get("TG_DEVICE") or ("cuda" if cuda_available() else "cpu"))


def resolve(device=None) -> str:
    """The device a command line names (None: default_device()), checked: ValueError for an
    unknown name, RuntimeError for cuda where no GPU is usable. Programs call it once, where
    they read their command line; what differs by device is then asked of get(device)."""
    if device is None:
        return default_device()
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: use one of {', '.join(DEVICES)}")
    if device == "cuda" and not cuda_available():
        raise RuntimeError(
            "device 'cuda' asked for but no GPU is usable: install the extra "
            "with pip install -e '.[cuda]' on a machine with an NVIDIA GPU, "
            "or use --device cpu / TG_DEVICE=cpu"
        )
    return device


def get(device: str):
    """The backend module for a device name: its host functions and what the device is
    (host.py; its kernels: kernels.on(name))."""
    if device == "cpu":
        return cpu
    if device == "meta":
        return meta
    resolve(device)
    from . import cuda

    return cuda


def of(array):
    """The backend that owns an array (an array with __cuda_array_interface__ lives on CUDA,
    other NumPy arrays on the CPU, MetaArrays on meta, everything else on CUDA)."""
    if type(array) is cpu.np.ndarray:  # the common case first: a launch asks at every call
        return cpu
    if hasattr(array, "__cuda_array_interface__"):
        return get("cuda")
    if isinstance(array, (cpu.np.ndarray, cpu.np.generic)):
        return cpu
    return meta if isinstance(array, meta.MetaArray) else get("cuda")


def is_array(data) -> bool:
    """Whether data is an array of some device (NumPy's, CuPy's, a MetaArray), not host data
    (a list, a scalar)."""
    return (
        hasattr(data, "__array_interface__")
        or hasattr(data, "__cuda_array_interface__")
        or isinstance(data, meta.MetaArray)
    )


def holds_values(data) -> bool:
    """Whether data has values to read: host data does, an array as its device says
    (HOLDS_VALUES: the meta device's arrays hold a shape only)."""
    return not is_array(data) or of(data).HOLDS_VALUES
