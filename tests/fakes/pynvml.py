"""A fake ``pynvml`` (nvidia-ml-py) that behaves as NVML is documented to, for tests without GPUs.

Put ``tests/fakes`` first on ``sys.path`` (or ``PYTHONPATH`` for a subprocess) and ``import
pynvml`` gets this module. The machine it pretends to be is read from the JSON file named by
``FAKE_PYNVML_CONFIG`` at every call, so a test can change it while code runs::

    {"driver": "loaded",                # or "missing" (LibraryNotFound), "not_loaded"
     "driver_version": "550.54.15",
     "devices": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-...",
                  "memory_total": 42949672960, "memory_used": 0, "util_gpu": 0,
                  "util_memory": 0, "power_mw": 60000,      # null: NVMLError_NotSupported
                  "energy_mj": 1000, "energy_since": 1.7e9, # null: NotSupported (pre-Volta);
                                                            # grows by power_mw since then
                  "lost": false,                            # true: NVMLError_GpuIsLost
                  "processes": [{"pid": 123, "used_memory": 1048576}],
                  "mps_processes": []}]}

Without the variable it is a machine with no NVIDIA driver: ``nvmlInit`` raises
``NVMLError_LibraryNotFound``, like the real module when ``libnvidia-ml.so.1`` is absent.
As in the real module: every ``NVML_ERROR_*`` code has an ``NVMLError_*`` subclass, and
``NVMLError(code)`` returns an instance of it; calls before ``nvmlInit`` raise
``NVMLError_Uninitialized``; ``nvmlInit``/``nvmlShutdown`` are reference counted; power is in
milliwatts; strings come back as ``str``.
"""

import json
import os
import string
import threading

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

CONFIG_ENV = "FAKE_PYNVML_CONFIG"
FAKE = True  # lets a test check it got this module and not the real one

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    _valClassMapping = {}

    def __new__(typ, value):
        if typ is NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes():
    namespace = globals()  # works however the module was loaded (sys.modules or spec)
    for name in [n for n in list(namespace) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(
            name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = namespace[name]

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(value)})
        cls.__module__ = __name__
        namespace[class_name] = cls
        NVMLError._valClassMapping[value] = cls


_make_error_classes()


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__})"


class c_nvmlMemory_t(_Struct):
    pass


class c_nvmlUtilization_t(_Struct):
    pass


class _Handle:
    def __init__(self, index):
        self.index = index


_lock = threading.Lock()
_refcount = 0
CALLS = []  # names of the functions called, in order (for tests)


def _config():
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return {"driver": "missing"}
    with open(path) as f:
        return json.load(f)


def _check_init():
    if _refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _device(handle):
    _check_init()
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    devices = _config().get("devices", [])
    if handle.index >= len(devices):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    dev = devices[handle.index]
    if dev.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return dev


def nvmlInitWithFlags(flags):
    global _refcount
    CALLS.append("nvmlInit")
    driver = _config().get("driver", "loaded")
    if driver == "missing":
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if driver == "not_loaded":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    with _lock:
        _refcount += 1


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    global _refcount
    CALLS.append("nvmlShutdown")
    with _lock:
        if _refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1


def nvmlSystemGetDriverVersion():
    _check_init()
    return _config().get("driver_version", "550.54.15")


def nvmlDeviceGetCount():
    _check_init()
    return len(_config().get("devices", []))


def nvmlDeviceGetHandleByIndex(index):
    _check_init()
    if not isinstance(index, int) or not 0 <= index < len(_config().get("devices", [])):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetName(handle):
    return _device(handle).get("name", "NVIDIA Fake GPU")


def nvmlDeviceGetUUID(handle):
    return _device(handle).get("uuid", f"GPU-00000000-0000-0000-0000-{handle.index:012d}")


def nvmlDeviceGetMemoryInfo(handle, version=None):
    dev = _device(handle)
    total = int(dev.get("memory_total", 40 * 2**30))
    used = int(dev.get("memory_used", 0))
    return c_nvmlMemory_t(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    dev = _device(handle)
    return c_nvmlUtilization_t(gpu=int(dev.get("util_gpu", 0)),
                               memory=int(dev.get("util_memory", 0)))


def nvmlDeviceGetPowerUsage(handle):
    dev = _device(handle)
    power = dev.get("power_mw", 50000)
    if power is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(power)


def nvmlDeviceGetTotalEnergyConsumption(handle):
    """Millijoules since the driver was loaded (Volta and newer; NOT_SUPPORTED before): the
    device's ``energy_mj`` at ``energy_since`` (a time.time()), plus its power draw since."""
    import time

    dev = _device(handle)
    base = dev.get("energy_mj", 0)
    if base is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    since = dev.get("energy_since")
    grown = (time.time() - since) * dev.get("power_mw", 50000) if since is not None else 0
    return int(base + grown)


def _procs(entries):
    return [_Struct(pid=int(p["pid"]), usedGpuMemory=p.get("used_memory"),
                    gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for p in entries]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _procs(_device(handle).get("processes", []))


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return _procs(_device(handle).get("graphics_processes", []))


def nvmlDeviceGetMPSComputeRunningProcesses(handle):
    return _procs(_device(handle).get("mps_processes", []))
