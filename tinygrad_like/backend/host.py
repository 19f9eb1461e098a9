"""The host functions every device provides (backend/<device>/runtime.py, exported by the device
package): the rest of a device besides its kernels (kernels/), called directly on the device's
module and never counted by kernels.launch. Declared once here: a name, a signature and what it
does; tests/kernels/test_contract.py holds every device to them.
"""


def supported_dtypes():
    """The dtype names the device trains in."""


def asarray(data, dtype=None):
    """Host data (NumPy arrays, lists) as an array of this device: a host-to-device copy."""


def to_numpy(a):
    """An array of this device as a NumPy array: a device-to-host copy (waits for it)."""


def empty(shape, dtype):
    """An uninitialized array of this device."""


def synchronize():
    """Wait for every launch so far."""


def start_timer():
    """A timer started now, with .stop() and .seconds()."""


HOST = (supported_dtypes, asarray, to_numpy, empty, synchronize, start_timer)
