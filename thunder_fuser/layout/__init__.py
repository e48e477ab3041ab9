from thunder_fuser.layout.allocation_order import (
    dim_provenance,
    infer_allocation_orders,
    stride_order,
    strides_for_order,
)
from thunder_fuser.layout.attention_operands import attention_reads, contiguous_for_attention_as_views
from thunder_fuser.layout.matmul_operands import matmul_copies, matmul_order, matmul_reads

__all__ = [
    "attention_reads",
    "contiguous_for_attention_as_views",
    "dim_provenance",
    "infer_allocation_orders",
    "stride_order",
    "strides_for_order",
    "matmul_copies",
    "matmul_order",
    "matmul_reads",
]
