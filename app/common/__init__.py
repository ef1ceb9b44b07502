"""Mechanisms shared by two or more services. Nothing service-specific lives here."""
