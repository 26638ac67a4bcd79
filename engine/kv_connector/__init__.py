"""The seam between the engine and KV transfer: ``base`` (the interface and the null
connector) and ``params`` (what a request carries).
"""
