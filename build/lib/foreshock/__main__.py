from foreshock.cli import app

app()
