"""Real fault traces shipped with Foreshock (InfiniteHBD, Titan), installed as ``foreshock.traces``.

A package only so that ``importlib.resources`` finds the files in a wheel as in a checkout; read
them through :mod:`foreshock.shipped`."""
