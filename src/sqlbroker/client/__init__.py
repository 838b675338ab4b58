"""Layer 3: the private base of the two faces (``sqlbroker.Broker`` and
``sqlbroker.AsyncBroker``, composed with the runtime in :mod:`sqlbroker.app`)."""
