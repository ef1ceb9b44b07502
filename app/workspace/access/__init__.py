"""Who may do what: accounts, passwords, session tokens, OIDC sign-in, grants,
sign-in limits and app-host tokens."""
