"""``check-script``: run a reader's own training script on a few CPU workers and prove it distributed correctly."""
