"""The GPU code generator: Tile IR after the GPU passes -> source over jaxtile/device.h."""
