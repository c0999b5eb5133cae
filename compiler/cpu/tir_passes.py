"""The TIR lowering pipeline the CPU backend compiles with.

It is TVM's ``"tirx"`` pipeline without ``StmtSimplify`` and without the CUDA-only pass.
TVM's simplifier rewrites floating-point expressions with identities of real numbers that
IEEE arithmetic does not have: ``x - x -> 0`` and ``x * 0 -> 0`` (NaN for an infinite or
NaN ``x``), and, after distributing an addition over a select, ``-0.0 + 0.0 -> -0.0``. XLA
keeps those expressions exact, so jaxtile must too. Leaving the simplifier out changed
neither the vectorisation nor the speed of the library kernels (LLVM simplifies the index
arithmetic it left behind; measured in the notes of the change that made this pipeline).

The pipeline is registered with TVM under :data:`NAME` when this module is imported.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import compilation_pipeline

NAME = "jaxtile_cpu"


def _passes(config: dict) -> list[tvm.transform.Pass]:
    return [
        tirx.transform.LowerTIRx(),
        # By name: jaxtile's import of TVM leaves the tvm.s_tir package out (compiler/
        # tvm_import.py), and this is the one pass of it the pipeline runs.
        tvm.get_global_func("s_tir.transform.UnifyThreadBinding")(),
        tirx.transform.LowerTIRxOpaque(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.VectorizeLoop(not bool(config.get("tir.disable_vectorize", False))),
        tirx.transform.UnrollLoop(),
        tirx.transform.CommonSubexprElim(),
        tirx.transform.FP8ComputeLegalize(),
        tirx.transform.VerifyMemory(),
        tirx.transform.AnnotateEntryFunc(),
        tirx.transform.SplitHostDevice(),
        tirx.transform.MakePackedAPI(),
        tirx.transform.FP8StorageLegalize(),
        tirx.transform.BF16StorageLegalize(),
    ]


def _pipeline() -> tuple:
    @tvm.transform.module_pass(opt_level=0)
    def lower(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        config = tvm.transform.PassContext.current().config
        return tvm.ir.transform.Sequential(_passes(config))(mod)

    return (lower, compilation_pipeline.finalize_host_passes,
            compilation_pipeline.finalize_device_passes)


compilation_pipeline.register_tir_pipeline(NAME, _pipeline)
