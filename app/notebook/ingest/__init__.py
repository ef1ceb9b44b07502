"""Outside content in: extraction, chunking, uploads and the SSRF guard that every
outbound fetch uses (llm/ too). The bottom layer: imports nothing of the notebook."""
