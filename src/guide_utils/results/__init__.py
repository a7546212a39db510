"""What runs leave behind and what the book shows: run records (``records``), the thesis's
log formats (``logs``), the source documents' numbers as data (``sources``), recorded
studies (``recorded/``) and the figures (``plots``)."""
