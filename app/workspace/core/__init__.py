"""The platform's data (models), its schema history (migrations) and request
schemas (payloads)."""
