"""The XLA tier: real torch_xla on PJRT CPU, run by tests/xla/run.sh in its own environment."""
