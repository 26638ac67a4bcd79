"""Attention backends: how a layer writes new K/V into the paged pool and attends over it."""
