"""Structured outputs: a request's grammar (JSON schema, regex, choice, Lark/GBNF grammar) as
plain data (``spec``), and the per-request matchers that turn it into token masks (``masks``)."""
