"""Front doors: each captures a graph and hands it to the shared pipeline."""
