"""``python -m santa_bench`` runs the command line."""

from santa_bench.cli import app

app()
