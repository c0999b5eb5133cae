"""MLIR lowering of ``kernel_call``: an XLA FFI custom call that names the kernel by its key.

A program compiled in this process calls ``jaxtile_cpu_call {key}``; the kernel is already
loaded here. A program lowered by ``jax.export`` must run elsewhere, so it calls
``jaxtile_cpu_exported_call {key, payload}`` instead, whose payload carries the compiled
library (``payload.py``); the handler loads it on the first call in a process that lacks it.
Each platform's rule chooses the target (the host CPU; on a GPU, from the device's compute
capability) and compiles the kernel for it there, so one traced call can be lowered for
several platforms. Only the CPU has a backend; the ``cuda`` and ``rocm`` slots and any
other platform are a clear error at lowering time. A kernel
with a sharding rule, lowered for several devices outside ``shard_map``, is wrapped so that
each device runs it on its shard (``sharding.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.interpreters import mlir

from jaxtile import _ffi
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error, user_line
from jaxtile.compiler.target import for_platform

from . import payload, sharding
from .kernel_call import KernelHandle, kernel_call_p, load

CPU_TARGET_NAME = "jaxtile_cpu_call"
CPU_EXPORTED_TARGET_NAME = "jaxtile_cpu_exported_call"
SUPPORTED_PLATFORMS = ("cpu",)


def _cpu_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    rule = getattr(kernel.spec, "shard_rule", None)
    if rule is not None and not kernel.per_shard and ji.lowering_is_partitioned(ctx):
        return mlir.lower_fun(
            functools.partial(sharding.sharded_call, kernel=kernel, rule=rule),
            multiple_results=True)(ctx, *args)
    target = kernel.spec.cpu_platform_target
    # A CUDA target on the CPU platform is the cuda-emulator backend: the emulator runs it.
    entry = kernel.spec.build(target, load, emulated=target.kind != "cpu")
    ctx, args, aliases = _with_output_inits(ctx, args, kernel)
    # Should JAX stop flagging export lowerings, exports would hold plain jaxtile_cpu_call
    # ops, which jax.export then rejects (export_checks() does not allow them) rather than
    # writing a program that cannot run elsewhere.
    if ji.lowering_for_export(ctx):
        _require_export_checks(kernel)
        return jax.ffi.ffi_lowering(CPU_EXPORTED_TARGET_NAME, **aliases)(
            ctx, *args, key=entry.key, payload=payload.encode(kernel.name, entry))
    return jax.ffi.ffi_lowering(CPU_TARGET_NAME, **aliases)(ctx, *args, key=entry.key)


def _with_output_inits(ctx: Any, args: tuple, kernel: KernelHandle) -> tuple[Any, tuple, dict]:
    """Zeros for the kernel's ``init`` buffers (outputs it updates atomically), passed in the
    memory of the outputs they alias."""
    params = kernel.spec.tile_ir.params
    inits = [b for b in params if b.role == "init"]
    if not inits:
        return ctx, args, {}
    outputs = [b.name for b in params if b.role == "output"]
    avals = [ctx.avals_out[outputs.index(b.aliases)] for b in inits]
    zeros = [ji.zeros(ctx, aval) for aval in avals]
    aliases = {len(args) + i: outputs.index(b.aliases) for i, b in enumerate(inits)}
    ctx = ctx.replace(avals_in=[*ctx.avals_in, *avals])
    return ctx, (*args, *zeros), {"operand_output_aliases": aliases}


def _gpu_lowering(platform: str) -> Any:
    """The lowering slot of a GPU platform: it chooses the target from the device and
    builds for it, which fails with a clear error while that platform has no backend."""
    def lower(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
        del args
        platforms = list(ctx.module_context.platforms)
        try:
            kernel.spec.build(for_platform(platform, ji.compute_capability(ctx)), load)
        except KernelError as e:
            raise kernel_error(
                kernel.name, f"has no lowering for platform {platform!r} (lowering for "
                f"platforms {platforms}): {e}; jaxtile runs kernels on the CPU only for now: "
                "lower or export for platforms=['cpu']", user_line()) from None
        raise AssertionError(f"a {platform} backend exists but has no lowering rule")
    return lower


def _require_export_checks(kernel: KernelHandle) -> None:
    # Without this, jax.export's own check rejects the call after lowering, in a message that
    # prints the whole op with its base64 payload (tens of thousands of characters).
    checks = ji.export_disabled_checks()
    if checks is None:  # not found on the stack: JAX's own check will speak
        return
    allowed = {check.is_custom_call() for check in checks}
    if not allowed & {CPU_EXPORTED_TARGET_NAME, "ALL"}:
        raise kernel_error(
            kernel.name, "jax.export only accepts custom calls it knows to be stable: pass "
            "disabled_checks=jt.export_checks() to jax.export.export (jaxtile's custom call "
            f"{CPU_EXPORTED_TARGET_NAME!r} is stable: its payload format is versioned)",
            user_line())


def _unsupported_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    del args
    platforms = tuple(ctx.module_context.platforms)
    others = [p for p in platforms if p not in SUPPORTED_PLATFORMS]
    raise kernel_error(
        kernel.name,
        f"has no lowering for platform {' or '.join(map(repr, others))} (lowering for "
        f"platforms {list(platforms)}): jaxtile compiles kernels for the CPU only for now; "
        "lower or export for platforms=['cpu']", user_line())


# A rule for every platform, which the CPU-specific rule overrides.
mlir.register_lowering(kernel_call_p, _unsupported_lowering)
mlir.register_lowering(kernel_call_p, _cpu_lowering, platform="cpu")
for _gpu in ("cuda", "rocm"):
    mlir.register_lowering(kernel_call_p, _gpu_lowering(_gpu), platform=_gpu)
ji.require_devices_when_lowering(kernel_call_p)
jax.ffi.register_ffi_target(CPU_TARGET_NAME, _ffi.cpu_handler(), platform="cpu")
jax.ffi.register_ffi_target(CPU_EXPORTED_TARGET_NAME, _ffi.cpu_exported_handler(),
                            platform="cpu")
