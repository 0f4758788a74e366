"""Stand-in processes for faults a real vLLM server cannot show on demand (one per fault)."""
