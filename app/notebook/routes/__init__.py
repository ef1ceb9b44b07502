"""The notebook's route modules (each defines its blueprint), their HTTP helpers,
request/response schemas (payloads) and serializers. The top layer."""
