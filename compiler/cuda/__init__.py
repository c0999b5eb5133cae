"""The CUDA target's toolchain: nvcc compilation and the device-code rule."""
