"""Planning past one machine: a calibrated discrete-event simulator of a pdserve cluster and a
P:D planner that sizes its pools (``pdserve plan``; docs/planning.md). Imports no torch: only
``calibrate_engine`` does, and nothing here imports it."""
