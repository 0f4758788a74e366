"""The emulated node: DeepSeek-V4-Flash served by vLLM on a hardware profile, from a performance model."""
