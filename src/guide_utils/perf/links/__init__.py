"""Emulated links: hosts on this machine joined by links of a chosen rate, and the step model measured over them."""
