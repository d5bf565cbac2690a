"""Demo LightningModules and DataModules on data every machine has, for the examples, the training app and the
benchmarks. Like ``lightning.pytorch.demos``, they are ordinary Lightning code that knows nothing of hybrid
training."""
