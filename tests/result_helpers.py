"""A complete ``BenchmarkResult`` for tests of what reads results (export, browse, reports)."""

from __future__ import annotations

from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, PerformanceResults, TestConfig
from pytest_gpubench.remote.readings import GPUStats, HardwareInfo


def make_result(tps: float, gpu: str = "NVIDIA GeForce RTX 4090", model: str = "qwen2:7b") -> BenchmarkResult:
    return BenchmarkResult(
        hardware=HardwareInfo(gpu_name=gpu, gpu_memory_mib=24564, gpu_count=1, driver_version="550.54.15",
                              cuda_version="12.4", cpu_model="AMD EPYC 7543", cpu_cores=16, ram_gib=64),
        model=ModelInfo(name=model, family="qwen2", parameter_count="7.6B", quantization="Q4_0", size_gb=4.4,
                        runtime="ollama", runtime_version="0.5.7"),
        test_config=TestConfig(duration_minutes=1, max_tokens=256, prompt_types=["short", "code"],
                               concurrent_reqs=2, warmup_requests=1),
        results=PerformanceResults(total_requests=20, total_tokens=4000, avg_tokens_per_second=tps,
                                   p50_ttft_ms=40.0, error_rate=0.05, total_errors=1, duration_seconds=60.0),
        gpu_stats=GPUStats(avg_utilization_pct=91.5, max_utilization_pct=99.0, avg_memory_used_mib=5420,
                           max_memory_used_mib=5500, avg_temperature_c=70.0, max_temperature_c=74.0,
                           avg_power_draw_w=380.2, max_power_draw_w=401.0),
        provider="vastai", location="US-CA", price_per_hour=0.36,
    )
