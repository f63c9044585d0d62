"""Long experiments kept out of the default pipeline: the DAPT study driver next to its specs."""
