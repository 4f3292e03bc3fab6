"""Reliability analysis of real fleet records: survival, hazards, MTBF, repairs, repeat failures.

``records``: the one table every source is read into, and the generic CSV a site exports from
its ticketing system (``docs/fleet-records.md``). ``sources``: readers for the Titan GPU lives
(Ostrouchov et al., SC20) and the InfiniteHBD fault trace. The analyses (Kaplan-Meier, Cox
proportional hazards, Weibull, MTBF by period, repair times, the repeat-failure curve) use
lifelines, the field's survival library; each returns an :class:`Analysis`, a frame and a
matplotlib figure built without pyplot. ``titan``: the Titan figures beside the study's own
tables (``notebooks/fleet_reliability.ipynb``). ``refault``: a simulator profile's ``[refault]``
table fitted to a trace's repeat-failure curve. ``history``: how well a node's own history ranks
the nodes that fail next (``docs/results.md``). ``burnin``: the burn-in thresholds (who is held
out after a repair, and for how long) read from the repeat-failure curve.
"""
