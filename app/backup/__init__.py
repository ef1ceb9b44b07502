"""Backups of a host's data: online snapshots into a restic repository, and their
restore (`python -m app.backup`, docs/backup.md).

- snapshot.py: what a snapshot holds and how each kind of file is copied live;
- restic.py: the repository (Debian's restic), its errors as sentences;
- restore.py: reading a snapshot back, checking it whole, putting it in place;
- commands.py: the sub-commands; status.py: the outcome for Prometheus;
- settings.py: the BACKUP_* variables.

A service whose files need more than a copy says how in app/<service>/backup.py
(the deck service's event logs). This package imports only the standard library at
its top, so a data host runs it without the services' venv."""
