"""NVIDIA's part of the CUDA backend: NVRTC and nvcc, ptxas and SASS figures, the toolchain's
fingerprint, the launch configuration and the emulator runner (the GPU-common code is in
``compiler/gpu/``)."""
