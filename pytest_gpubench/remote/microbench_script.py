"""GPU microbenchmarks, shipped to the instance like the load generator: ``PYTHON - PLAN_JSON``.

Standard library and torch only (this file is sent as the program's stdin and must not
import the package). It prints one JSON object per line:

* ``{"event": "device", "name", "capability": [major, minor], "torch", "visible_devices"}`` first
  (``CUDA_VISIBLE_DEVICES`` as given: the cell's GPU on a shared machine, whose ``cuda:0`` it is);
* ``{"event": "figure", "kind", "precision", "unit", "values": [...]}`` per measured figure,
  one value per timed run (after ``warmup`` untimed runs), timed with CUDA events;
* ``{"event": "skipped", "kind", "precision", "reason"}`` for a precision the GPU cannot run;
* ``{"event": "error", "message"}`` when torch or CUDA cannot be used at all (exit status 3).

Memory bandwidth is a device-to-device copy of ``memory_mib`` MiB: it reads and writes
that many bytes, so GB/s = 2 x bytes / seconds / 1e9. Matmul throughput is one square
``n x n`` product: 2 x n^3 operations, TFLOPS = 2 n^3 / seconds / 1e12 (TOPS for INT8).
"""

import json
import os
import sys

#: precision -> (lowest compute capability with a tensor-core path in torch, why not below it)
REQUIREMENTS = {
    "fp32": ((0, 0), ""),
    "tf32": ((8, 0), "TF32 tensor cores need compute capability 8.0 (Ampere) or newer"),
    "fp16": ((7, 0), "FP16 tensor cores need compute capability 7.0 (Volta) or newer"),
    "bf16": ((8, 0), "BF16 needs compute capability 8.0 (Ampere) or newer"),
    "fp8": ((8, 9), "FP8 matmuls (torch._scaled_mm) need compute capability 8.9 (Ada, Hopper) or newer"),
    "int8": ((7, 5), "INT8 matmuls (torch._int_mm) need compute capability 7.5 (Turing) or newer"),
}


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _refused(exc):
    """The reason of a figure torch could not measure: the first line of what it raised."""
    text = str(exc).strip()
    return "torch could not run it: " + (text.splitlines()[0] if text else type(exc).__name__)[:300]


def bandwidth_gb_per_s(nbytes, milliseconds):
    """A copy of ``nbytes`` read them and wrote them: 2 x nbytes moved in ``milliseconds``."""
    return 2.0 * nbytes / (milliseconds / 1e3) / 1e9


def matmul_tflops(n, milliseconds):
    """An ``n x n`` by ``n x n`` product is n^3 multiply-adds: 2 n^3 operations."""
    return 2.0 * n ** 3 / (milliseconds / 1e3) / 1e12


def timed_runs(torch, work, warmup, runs):
    """Milliseconds of each of ``runs`` calls of ``work`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        work()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def memory_bandwidth(torch, plan):
    nbytes = int(plan["memory_mib"]) * 1024 * 1024
    source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = timed_runs(torch, lambda: target.copy_(source), plan["warmup"], plan["runs"])
    return [bandwidth_gb_per_s(nbytes, ms) for ms in times]


def matmul_work(torch, precision, n):
    """The product to time for ``precision`` (raises when torch or the GPU cannot run it)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    if precision in ("fp32", "tf32", "fp16", "bf16"):
        dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        a = torch.randn(n, n, device="cuda", dtype=dtype[precision])
        b = torch.randn(n, n, device="cuda", dtype=dtype[precision])
        return lambda: torch.matmul(a, b)
    if precision == "fp8":
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device="cuda", dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
    return lambda: torch._int_mm(a, b)


def matmul(torch, plan, capability):
    n = int(plan["matmul_size"])
    for precision in plan["precisions"]:
        needed, why = REQUIREMENTS[precision]
        if tuple(capability) < needed:
            emit(event="skipped", kind="matmul", precision=precision, reason=why)
            continue
        try:
            work = matmul_work(torch, precision, n)
            times = timed_runs(torch, work, plan["warmup"], plan["runs"])
        except Exception as exc:  # noqa: BLE001 - "decide by trying": whatever torch says is the reason
            emit(event="skipped", kind="matmul", precision=precision, reason=_refused(exc))
            continue
        unit = "TOPS" if precision == "int8" else "TFLOPS"
        emit(event="figure", kind="matmul", precision=precision, unit=unit,
             values=[matmul_tflops(n, ms) for ms in times])
    torch.backends.cuda.matmul.allow_tf32 = False


def main(argv):
    plan = json.loads(argv[1])
    try:
        import torch
    except ImportError as exc:
        emit(event="error", message=f"torch is not importable: {exc}")
        return 3
    if not torch.cuda.is_available():
        emit(event="error", message=f"torch {torch.__version__} sees no CUDA device")
        return 3
    capability = list(torch.cuda.get_device_capability(0))
    emit(event="device", name=torch.cuda.get_device_name(0), capability=capability, torch=torch.__version__,
         visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if "memory_bandwidth" in plan["kinds"]:
        try:
            values = memory_bandwidth(torch, plan)
        except Exception as exc:  # noqa: BLE001 - out of memory for memory_mib, say: the figure is skipped, said why
            emit(event="skipped", kind="memory_bandwidth", precision=None, reason=_refused(exc))
        else:
            emit(event="figure", kind="memory_bandwidth", precision=None, unit="GB/s", values=values)
    if "matmul" in plan["kinds"]:
        matmul(torch, plan, capability)
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
