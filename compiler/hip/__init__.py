"""The AMD GPU (HIP) dialect: toolchain, resource figures, MFMA layouts and the LDS bank
model. Imports only the neutral core of the compiler, never :mod:`..cuda`."""
