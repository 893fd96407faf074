"""Integrations of attn with other libraries: attn.integrations.transformers (Hugging Face)."""
