"""MLIR lowering of ``kernel_call``: an XLA FFI custom call that names the kernel by its key.

A program compiled in this process calls ``jaxtile_cpu_call {key}``; the kernel is already
loaded here. A program lowered by ``jax.export`` must run elsewhere, so it calls
``jaxtile_cpu_exported_call {key, payload}`` instead, whose payload carries the compiled
library (``payload.py``); the handler loads it on the first call in a process that lacks it.
Each platform's rule chooses the target (the host CPU; on a GPU, from the device's compute
capability, the highest known plain architecture at or below it for a GPU newer than every
known one, sm_80 where the lowering has no device, as for an export made on a CPU-only
machine) and compiles the kernel for it there, so one traced call can be lowered for several
platforms; the tiles a library kernel's call left out are chosen again for that target
(``spec.for_target``: the trace chose them for the active backend's). On ``cuda`` the call
is ``jaxtile_cuda_call {key, payload}`` under jit as under export: the payload carries the
cubin and its launch, which the CUDA handler loads on the first call in each device's
context, so neither a persistent-compilation-cache hit nor an exported program needs a
compiler where it runs. On ``rocm`` the call is ``jaxtile_rocm_call {key, payload}`` in the
same way, the payload carrying the code object for the device's gfx architecture (as JAX's
ROCm plugin names it, ``gfx942``) or, for an export or a lowering without a device, one for
each architecture ``JAXTILE_ROCM_ARCHS`` names (by default every supported one), of which
the ROCm handler loads the device's once per device. Any other platform is a clear error at
lowering time. The GPU compiler modules are imported by the GPU rules when they run, so a
CPU process never loads them. A kernel with a sharding rule, lowered for several devices
outside ``shard_map``, is wrapped so that each device runs it on its shard (``sharding.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.interpreters import mlir

from jaxtile import _ffi
from jaxtile.compiler import build, cache
from jaxtile.compiler import jax_internals as ji
from jaxtile.compiler.errors import KernelError, kernel_error, user_line
from jaxtile.compiler.target import Target, for_platform

from . import payload, sharding
from .kernel_call import KernelHandle, kernel_call_p, load

CPU_TARGET_NAME = "jaxtile_cpu_call"
CPU_EXPORTED_TARGET_NAME = "jaxtile_cpu_exported_call"
CUDA_TARGET_NAME = "jaxtile_cuda_call"
ROCM_TARGET_NAME = "jaxtile_rocm_call"
SUPPORTED_PLATFORMS = ("cpu", "cuda", "rocm")


def _sharded(ctx: Any, args: tuple, kernel: KernelHandle) -> Any | None:
    """The lowering of a kernel with a sharding rule, lowered for several devices outside
    ``shard_map``: each device runs it on its shard. None for any other call."""
    rule = getattr(kernel.spec, "shard_rule", None)
    if rule is None or kernel.per_shard or not ji.lowering_is_partitioned(ctx):
        return None
    return mlir.lower_fun(functools.partial(sharding.sharded_call, kernel=kernel, rule=rule),
                          multiple_results=True)(ctx, *args)


def _cpu_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    if (sharded := _sharded(ctx, args, kernel)) is not None:
        return sharded
    target = kernel.spec.cpu_platform_target
    spec = kernel.spec.for_target(target)
    # A CUDA target on the CPU platform is the cuda-emulator backend: the emulator runs it.
    entry = spec.build(target, load, emulated=target.kind != "cpu")
    ctx, args, aliases = _with_output_inits(ctx, args, spec)
    # Should JAX stop flagging export lowerings, exports would hold plain jaxtile_cpu_call
    # ops, which jax.export then rejects (export_checks() does not allow them) rather than
    # writing a program that cannot run elsewhere.
    if ji.lowering_for_export(ctx):
        if target.kind != "cpu":
            # The emulator's library runs only inside this process's emulator runtime; an
            # exported program must run on any CPU (and its payload names a CPU's ISA).
            raise kernel_error(
                kernel.name, f"it was specialised for an emulator backend (target "
                f"{target.name}), a debugging backend whose kernels cannot be exported: call "
                "jt.set_backend('cpu') before jax.export (an export for platforms=['cuda'] "
                "compiles the CUDA code itself)", user_line())
        _require_export_checks(kernel, CPU_EXPORTED_TARGET_NAME)
        with ji.named_op_location(ctx, spec.label):
            return jax.ffi.ffi_lowering(CPU_EXPORTED_TARGET_NAME, **aliases)(
                ctx, *args, key=entry.key,
                payload=payload.encode(kernel.name, entry, target.caps.isa))
    with ji.named_op_location(ctx, spec.label):
        return jax.ffi.ffi_lowering(CPU_TARGET_NAME, **aliases)(ctx, *args, key=entry.key)


def _with_output_inits(ctx: Any, args: tuple, spec: Any) -> tuple[Any, tuple, dict]:
    """Zeros for the ``init`` buffers of the kernel of specialisation ``spec`` (outputs it
    updates atomically), passed in the memory of the outputs they alias."""
    params = spec.tile_ir.params
    inits = [b for b in params if b.role == "init"]
    if not inits:
        return ctx, args, {}
    outputs = [b.name for b in params if b.role == "output"]
    avals = [ctx.avals_out[outputs.index(b.aliases)] for b in inits]
    zeros = [ji.zeros(ctx, aval) for aval in avals]
    aliases = {len(args) + i: outputs.index(b.aliases) for i, b in enumerate(inits)}
    ctx = ctx.replace(avals_in=[*ctx.avals_in, *avals])
    return ctx, (*args, *zeros), {"operand_output_aliases": aliases}


def _check_launch(kind: str) -> Any:
    """A GPU platform's ``load``: its handler loads the artifact from the payload on each
    device; here an entry only has to be of ``kind`` with a readable launch."""
    def check(entry: cache.Entry) -> None:
        from jaxtile.compiler.gpu.launch import Launch

        if entry.kind != kind:
            raise ValueError(f"cache entry {entry.key} is a {entry.kind}, not a {kind}")
        Launch.decode(entry.launch)
    return check


def _cuda_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    from jaxtile.compiler.cuda.compile import arch_of

    if (sharded := _sharded(ctx, args, kernel)) is not None:
        return sharded
    try:
        # A lowering for the devices at hand runs on them: a Hopper gets sm_90a's code.
        target = for_platform("cuda", ji.compute_capability(ctx),
                              present=not ji.lowering_for_export(ctx))
    except KernelError as e:
        # A GPU older than every target the lowering can compile for (sm_75: no cp.async).
        raise kernel_error(kernel.name, f"cannot be compiled for this GPU: {e}",
                           user_line()) from None
    try:
        spec = kernel.spec.for_target(target)
        entry = spec.build(target, _check_launch(cache.CUDA_CUBIN))
    except KernelError as e:
        if build.has_backend(target):
            raise
        raise _no_backend(kernel, "cuda", ctx, e) from None
    ctx, args, aliases = _with_output_inits(ctx, args, spec)
    if ji.lowering_for_export(ctx):
        _require_export_checks(kernel, CUDA_TARGET_NAME)
    text = payload.encode_cuda(kernel.name, entry, arch_of(target))
    with ji.named_op_location(ctx, spec.label):
        return jax.ffi.ffi_lowering(CUDA_TARGET_NAME, **aliases)(
            ctx, *args, key=entry.key, payload=text)


def _no_backend(kernel: KernelHandle, platform: str, ctx: Any, e: Exception) -> KernelError:
    platforms = list(ctx.module_context.platforms)
    return kernel_error(
        kernel.name, f"has no lowering for platform {platform!r} (lowering for platforms "
        f"{platforms}): {e}; until that backend lands jaxtile runs kernels on the CPU only: "
        "lower or export for platforms=['cpu']", user_line())


def _rocm_targets(ctx: Any, kernel: KernelHandle) -> tuple[Target, ...]:
    """The AMD targets a ROCm lowering compiles for: the device's architecture alone when it
    has one and is no export (the program runs here), else ``spec.rocm_export_targets`` (by
    default every supported one), since the program may meet any of them."""
    device = ji.compute_capability(ctx)
    if device is not None and not ji.lowering_for_export(ctx):
        try:
            return (for_platform("rocm", device),)
        except KernelError as e:
            # A GPU of an architecture jaxtile has no target for (it knows gfx90a, gfx942).
            raise kernel_error(kernel.name, f"cannot be compiled for this GPU: {e}",
                               user_line()) from None
    return kernel.spec.rocm_export_targets


def _rocm_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    if (sharded := _sharded(ctx, args, kernel)) is not None:
        return sharded
    built = []
    for target in _rocm_targets(ctx, kernel):
        spec = kernel.spec.for_target(target)
        built.append((spec, target.caps.gfx,
                      spec.build(target, _check_launch(cache.HIP_CODE_OBJECT))))
    # Every code object is called with the same operands: the output inits of each
    # architecture's specialisation (its tiles may differ, its outputs may not) must agree.
    inits = {tuple((b.name, b.aliases) for b in spec.tile_ir.params if b.role == "init")
             for spec, _, _ in built}
    if len(inits) > 1:
        raise kernel_error(kernel.name, "its specialisations for "
                           f"{', '.join(gfx for _, gfx, _ in built)} zero different outputs "
                           "before the call, which one call cannot serve: lower for one "
                           "architecture at a time (JAXTILE_ROCM_ARCHS)", user_line())
    spec = built[0][0]
    ctx, args, aliases = _with_output_inits(ctx, args, spec)
    if ji.lowering_for_export(ctx):
        _require_export_checks(kernel, ROCM_TARGET_NAME)
    key, text = payload.encode_hip(kernel.name,
                                   tuple((gfx, entry) for _, gfx, entry in built))
    with ji.named_op_location(ctx, spec.label):
        return jax.ffi.ffi_lowering(ROCM_TARGET_NAME, **aliases)(
            ctx, *args, key=key, payload=text)


def _require_export_checks(kernel: KernelHandle, target_name: str) -> None:
    # Without this, jax.export's own check rejects the call after lowering, in a message that
    # prints the whole op with its base64 payload (tens of thousands of characters).
    checks = ji.export_disabled_checks()
    if checks is None:  # not found on the stack: JAX's own check will speak
        return
    allowed = {check.is_custom_call() for check in checks}
    if not allowed & {target_name, "ALL"}:
        raise kernel_error(
            kernel.name, "jax.export only accepts custom calls it knows to be stable: pass "
            "disabled_checks=jt.export_checks() to jax.export.export (jaxtile's custom call "
            f"{target_name!r} is stable: its payload format is versioned)",
            user_line())


def _explain_export_check(message: str) -> KernelError | None:
    """jax.export's check rejected a module: say what to pass when jaxtile's calls are among
    the rejected ones (the lowering rules say it too, but a cached lowering skips them)."""
    names = [n for n in (CPU_EXPORTED_TARGET_NAME, CUDA_TARGET_NAME, ROCM_TARGET_NAME)
             if f"@{n}(" in message]
    if not names:
        return None
    line = user_line()
    return KernelError(
        "jax.export only accepts custom calls it knows to be stable: pass "
        "disabled_checks=jt.export_checks() to jax.export.export (the program calls jaxtile "
        f"kernels through {', '.join(map(repr, names))}, which is stable: its payload format "
        "is versioned)" + (f" (at {line})" if line else ""))


def _unsupported_lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    del args
    platforms = tuple(ctx.module_context.platforms)
    others = [p for p in platforms if p not in SUPPORTED_PLATFORMS]
    raise kernel_error(
        kernel.name,
        f"has no lowering for platform {' or '.join(map(repr, others))} (lowering for "
        f"platforms {list(platforms)}): jaxtile compiles kernels for the CPU, CUDA and "
        "ROCm; lower or export for platforms=['cpu'], ['cuda'] or ['rocm']", user_line())


_PLATFORM_RULES = {"cpu": _cpu_lowering, "cuda": _cuda_lowering, "rocm": _rocm_lowering}


def _lowering(ctx: Any, *args: Any, kernel: KernelHandle) -> Any:
    return ji.lower_per_platform(ctx, "jaxtile kernel call", _PLATFORM_RULES,
                                 _unsupported_lowering, *args, kernel=kernel)


# Not cacheable: JAX emits a cached lowering at the call's own location, which would drop the
# name the rules give the custom call for profiler traces (each kernel's build is cached by
# its specialisation anyway). Hence one rule that dispatches on the platform itself.
mlir.register_lowering(kernel_call_p, _lowering, cacheable=False)
ji.require_devices_when_lowering(kernel_call_p)
ji.explain_export_check_failures(_explain_export_check)
jax.ffi.register_ffi_target(CPU_TARGET_NAME, _ffi.cpu_handler(), platform="cpu")
jax.ffi.register_ffi_target(CPU_EXPORTED_TARGET_NAME, _ffi.cpu_exported_handler(),
                            platform="cpu")
# The CPU pool's chunks of blocks as ranges in jax.profiler traces (ffi/cpu/trace.h).
ji.register_profiler_plugin(_ffi.profiler_api())
# Harmless without a CUDA jaxlib plugin: JAX keeps the registration for when one loads. The
# handler opens libcuda only when a kernel first runs; its initialize stage loads the kernel
# before XLA executes (or captures into a CUDA graph) the call.
jax.ffi.register_ffi_target(
    CUDA_TARGET_NAME,
    {"initialize": _ffi.cuda_initialize_handler(), "execute": _ffi.cuda_handler()},
    platform="CUDA", traits=ji.COMMAND_BUFFER_COMPATIBLE)
# The same for ROCm (JAX's platform name "ROCM"), without a ROCm plugin as well: the handler
# opens libamdhip64 only when a kernel first runs.
jax.ffi.register_ffi_target(
    ROCM_TARGET_NAME,
    {"initialize": _ffi.rocm_initialize_handler(), "execute": _ffi.rocm_handler()},
    platform="ROCM", traits=ji.COMMAND_BUFFER_COMPATIBLE)
