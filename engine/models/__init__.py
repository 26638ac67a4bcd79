"""Model implementations over the flat, paged batch (no Hugging Face modeling code)."""
