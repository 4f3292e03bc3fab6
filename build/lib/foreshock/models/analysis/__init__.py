"""Loaders and figures behind the notebooks and the demo report.

``failures``: what failed, how it announced itself, which Xids a fleet throws and how often nodes
fail (``notebooks/failure_analysis.ipynb``). ``model_view``: a trained model judged against its
baselines, its lead times, recall by cause and SHAP explanations (``notebooks/model_report.ipynb``).
``ettr``: goodput sweeps drawn against cluster size and recall (``notebooks/goodput.ipynb``).
``lead_bound``: a model's lead beside an oracle that reads each simulated foreshock's true
intensity and catches as many failures (``notebooks/model_report.ipynb``).

Every figure function returns a :class:`matplotlib.figure.Figure` built without pyplot, so a
notebook shows it once (as a cell's value) and a script saves it without global state.
"""
