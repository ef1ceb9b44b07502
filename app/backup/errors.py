"""The one error the backup command reports: a sentence for the admin, printed as
`error: <sentence>` on one line, exit code 1. Nothing was changed when it is raised."""


class BackupError(Exception):
    pass
