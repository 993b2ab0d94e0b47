"""Before a search: what it will cost and detect (plan), and where the headroom is (the probe)."""
