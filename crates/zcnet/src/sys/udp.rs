//! UDP segmentation offload (`UDP_SEGMENT`) and receive coalescing (`UDP_GRO`).
