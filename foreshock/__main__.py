from foreshock.cli import app

if __name__ == "__main__":  # the API process (spawned) imports this module again
    app()
