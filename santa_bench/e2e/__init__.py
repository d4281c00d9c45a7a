"""End-to-end batched decode: a compact decoder, a static KV cache, decode-attention
backends, a CUDA-graph decode loop and its runner (``santa-bench e2e``)."""
