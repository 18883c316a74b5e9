"""The embedded default target: llama-server built from source and generated models."""
