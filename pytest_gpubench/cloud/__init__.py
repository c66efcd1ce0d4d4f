"""Renting GPUs: the GPU Shopper client and provider, offers, provisioning, SSH wait, session reuse, watch, budget, cleanup."""
