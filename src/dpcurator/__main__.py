"""``python -m dpcurator`` is the ``dpcurator`` command."""

from dpcurator.cli import app

app(prog_name="dpcurator")
