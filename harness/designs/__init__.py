"""A/B designs: how the arms' servers are run and which samples each comparison uses. ``registry`` maps
``run.design`` to its design; each design module owns its run loop and its comparison rows."""
