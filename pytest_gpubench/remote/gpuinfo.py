"""Moved to :mod:`pytest_gpubench.gpuinfo`: parsing nvidia-smi is needed by every layer (the ``local``
provider reads this machine's GPUs), so it lives at the top. This name stays for the remote modules
that still import it; new code imports :mod:`pytest_gpubench.gpuinfo`."""

from ..gpuinfo import gpu_name_matches, gpu_type_of, parse_gpu_query_csv, parse_nvidia_smi_xml

__all__ = ["gpu_name_matches", "gpu_type_of", "parse_gpu_query_csv", "parse_nvidia_smi_xml"]
