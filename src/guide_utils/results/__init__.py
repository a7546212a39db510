"""The results layer, above the engines: what runs leave behind and what the book shows. The
thesis's log formats (``logs``), the source documents' numbers as data (``sources``),
recorded studies (``recorded/``) and the figures (``plots``). The run-record format itself
is in ``core.records``: the engine writes it."""
