from thunder_fuser.layout.allocation_order import (
    dim_provenance,
    infer_allocation_orders,
    stride_order,
    strides_for_order,
)
from thunder_fuser.layout.attention_operands import attention_reads
from thunder_fuser.layout.matmul_operands import matmul_copies, matmul_order, matmul_reads

__all__ = [
    "attention_reads",
    "dim_provenance",
    "infer_allocation_orders",
    "stride_order",
    "strides_for_order",
    "matmul_copies",
    "matmul_order",
    "matmul_reads",
]
