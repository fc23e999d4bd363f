"""Training that goes on with fewer machines (`launch.nnodes: MIN:MAX`): the workers' entry
point of such runs, which re-forms the run for the workers left before training."""
