"""One module per DVC stage: run() and summary(); stages import only the library."""
