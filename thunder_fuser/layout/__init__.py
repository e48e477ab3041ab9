from thunder_fuser.layout.allocation_order import (
    dim_provenance,
    infer_allocation_orders,
    stride_order,
    strides_for_order,
)

__all__ = ["dim_provenance", "infer_allocation_orders", "stride_order", "strides_for_order"]
