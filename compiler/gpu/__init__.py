"""The GPU-common tier: layouts, gemm planning, copy schedules, shared memory, barriers, bounds."""
