"""Reaching the box: transports (this machine, SSH), tmux control, server providers."""
