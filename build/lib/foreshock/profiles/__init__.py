"""The shipped cluster profiles (``llama3``, ``infinitehbd``), installed as ``foreshock.profiles``.

A package only so that ``importlib.resources`` finds the files in a wheel as in a checkout; read
them through :mod:`foreshock.shipped`."""
