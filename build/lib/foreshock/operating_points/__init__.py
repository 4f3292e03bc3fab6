"""Measured operating points (a model's metrics, a drill's figures), installed as
``foreshock.operating_points``.

A package only so that ``importlib.resources`` finds the files in a wheel as in a checkout; read
them through :mod:`foreshock.shipped`."""
