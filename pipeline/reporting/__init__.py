"""What a person reads about a run: the headline metrics (``summary``) and the offline run report (``html``)."""
