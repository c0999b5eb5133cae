"""Tile IR passes: functions from a kernel to a kernel."""
