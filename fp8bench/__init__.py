"""fp8bench: FP8 training benchmarks and roofline analysis for NVIDIA Hopper GPUs."""

__version__ = "0.1.0"
