"""The AMD GPU (HIP) dialect: toolchain, resource figures, MFMA layouts and the LDS bank
model. Imports only the neutral core of the compiler and, of :mod:`..cuda`, only the launch
format (``cuda/launch.py``), which the ROCm handler reads as the CUDA one does."""
