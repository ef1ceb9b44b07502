"""Test support: the clients, helpers and sample data that tests, devtools and
benches import, one module per service (plus `shared` for what every suite uses).

Fixtures stay in the conftests, which import what they need from here; nothing in
this package defines a fixture, so importing it never registers one twice."""
