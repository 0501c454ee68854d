"""The soak: both backends on real servers, a bounded time of mixed traffic, invariants checked as it runs."""
