from foreshock.cli import main

if __name__ == "__main__":  # the API process (spawned) imports this module again
    main()
