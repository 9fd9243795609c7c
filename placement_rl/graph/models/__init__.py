"""Model families of the built-in zoo (see ``placement_rl.graph.zoo``).

Every module's ``forward`` takes the example inputs *including the targets* and returns the
scalar training loss, so a captured graph is a whole training step's forward (model + loss).
"""
