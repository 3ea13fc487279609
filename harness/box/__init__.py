"""Runs on the box: probe, plan and the sweep job (stdlib + torch + triton only)."""
