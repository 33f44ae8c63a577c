"""TensorRT-LLM's Router Replay output (MoE layers only)."""
