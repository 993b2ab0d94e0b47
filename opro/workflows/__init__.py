"""What each command of the command line does, importable: a script or a notebook calls the same
function ``opro CMD`` calls and gets the same typed result (frozen dataclasses), which the command
line only renders. The floor below the CLI: each workflow composes an :class:`~opro.experiment.Experiment` with the
floors below it (resolve a prompt, guard the held-out split, evaluate, record, write)."""
