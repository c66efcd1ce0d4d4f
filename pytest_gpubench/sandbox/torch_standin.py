"""The sandbox's ``torch``: just enough of torch for the GPU microbenchmarks, at catalog speed.

On a sandbox instance this file is the package ``torch`` (``python/torch/__init__.py``, or
installed from the sandbox's local wheel into a venv: :mod:`.instances`). It is
self-contained (standard library only) because the venv's Python does not see this
package. It reads the instance file (``GPUBENCH_SANDBOX_INSTANCE``): the GPU's name and
compute capability, and its achievable figures, ``gpu.microbench`` (the catalog's
``microbench:`` line): ``memory_gb_per_s`` and ``tflops`` by precision.

Every CUDA operation advances a per-process device clock by the time the figures say it
takes (a copy of B bytes moves 2B at ``memory_gb_per_s``; an n x n matmul is 2 n^3
operations at the precision's rate), with a small deterministic jitter so that runs
differ as real ones do; CUDA events read that clock. The host really waits that time
multiplied by the instance's time scale, like the other stand-ins' waits. A precision
without a figure raises the way torch does on a GPU that cannot run it.
"""

import json
import os
import random
import time

__version__ = "2.5.1+gpubench.sandbox"

_INSTANCE_ENV = "GPUBENCH_SANDBOX_INSTANCE"
#: Relative spread of one operation's time around the catalog figure.
JITTER = 0.01


class dtype:  # noqa: N801 - torch's own name
    def __init__(self, name, itemsize, precision):
        self.name, self.itemsize, self.precision = name, itemsize, precision

    def __repr__(self):
        return f"torch.{self.name}"


uint8 = dtype("uint8", 1, None)
int8 = dtype("int8", 1, "int8")
int32 = dtype("int32", 4, None)
float32 = dtype("float32", 4, "fp32")
float16 = dtype("float16", 2, "fp16")
bfloat16 = dtype("bfloat16", 2, "bf16")
float8_e4m3fn = dtype("float8_e4m3fn", 1, "fp8")


def _visible(count):
    """The GPUs a CUDA program sees: all ``count`` without ``CUDA_VISIBLE_DEVICES``, else its
    indices up to the first that names none of the machine's (``instance_spec.visible_gpus``, which
    this self-contained file cannot import)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(count))
    seen = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) >= count or int(part) in seen:
            break
        seen.append(int(part))
    return seen


class _Device:
    """The emulated GPU: its facts and the clock its operations advance."""

    def __init__(self):
        path = os.environ.get(_INSTANCE_ENV)
        document = {}
        try:
            with open(path or "", encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError):
            pass  # not on a sandbox instance (or its file is gone): no CUDA device, as torch on a CPU box
        gpu = document.get("gpu") or {}
        self.available = bool(gpu) and bool(_visible(int(gpu.get("count", 1))))
        self.name = gpu.get("name", "")
        major, _, minor = str(gpu.get("compute_capability", "0.0")).partition(".")
        self.capability = (int(major or 0), int(minor or 0))
        self.figures = gpu.get("microbench") or {}
        self.time_scale = float(document.get("time_scale", 1.0))
        self.clock = 0.0  # seconds of device time
        self._random = random.Random(0)

    def run(self, seconds):
        seconds *= 1.0 + self._random.uniform(-JITTER, JITTER)
        self.clock += seconds
        if self.time_scale > 0:
            time.sleep(seconds * self.time_scale)

    def rate(self, precision):
        rate = (self.figures.get("tflops") or {}).get(precision)
        if not rate:
            raise RuntimeError(f"CUDA error: no kernel image is available for {precision} matmul on {self.name}")
        return float(rate) * 1e12


_device = None


def _gpu():
    global _device
    if _device is None:
        _device = _Device()
    return _device


class Tensor:
    def __init__(self, shape, dtype_, device):
        self.shape, self.dtype, self.device = tuple(shape), dtype_, str(device)

    def numel(self):
        count = 1
        for side in self.shape:
            count *= side
        return count

    @property
    def nbytes(self):
        return self.numel() * self.dtype.itemsize

    def to(self, dtype_):
        return Tensor(self.shape, dtype_, self.device)

    def t(self):
        return Tensor(tuple(reversed(self.shape)), self.dtype, self.device)

    def copy_(self, source):
        if self.device.startswith("cuda"):
            rate = float(_gpu().figures.get("memory_gb_per_s") or 0)
            if not rate:
                raise RuntimeError(f"CUDA error: the sandbox catalog gives {_gpu().name} no microbench figures")
            _gpu().run(2.0 * source.nbytes / (rate * 1e9))
        return self

    def __matmul__(self, other):
        return matmul(self, other)


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def empty(*size, dtype=float32, device="cpu"):
    return Tensor(_shape(size), dtype, device)


def randn(*size, device="cpu", dtype=float32):
    return Tensor(_shape(size), dtype, device)


def ones(size, device="cpu", dtype=float32):
    return Tensor(_shape((size,)), dtype, device)


def randint(low, high, size, device="cpu", dtype=int32):
    return Tensor(tuple(size), dtype, device)


def _product(a, b, precision, out_dtype):
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    _gpu().run(2.0 * n * k * m / _gpu().rate(precision))
    return Tensor((n, m), out_dtype, a.device)


def matmul(a, b):
    precision = a.dtype.precision
    if precision == "fp32" and backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    if precision not in ("fp32", "tf32", "fp16", "bf16"):
        raise RuntimeError(f'"addmm_cuda" not implemented for \'{a.dtype.name}\'')
    return _product(a, b, precision, a.dtype)


def _scaled_mm(a, b, scale_a=None, scale_b=None, out_dtype=bfloat16):
    return _product(a, b, "fp8", out_dtype)


def _int_mm(a, b):
    return _product(a, b, "int8", int32)


class _Flags:
    allow_tf32 = False


class backends:  # noqa: N801 - torch.backends
    class cuda:  # noqa: N801
        matmul = _Flags()


class cuda:  # noqa: N801 - torch.cuda
    @staticmethod
    def is_available():
        return _gpu().available

    @staticmethod
    def get_device_name(index=0):
        return _gpu().name

    @staticmethod
    def get_device_capability(index=0):
        return _gpu().capability

    @staticmethod
    def synchronize():
        return None

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = _gpu().clock

        def synchronize(self):
            return None

        def elapsed_time(self, end):
            """Milliseconds from this event to ``end``, as torch reports them."""
            return (end.at - self.at) * 1e3
