"""Each queue operation written once, as a plan of named SQL blocks (one module per group).

A plan takes the backend's :class:`~sqlbroker.storage.seam.Settings` first and its
arguments as keywords; the dialects hold the SQL of every block it names, under the same
name, taking the same parameters and returning the same columns.
"""
