"""Side-by-side benchmarks; `make bench` (python -m bench) prints a table of ratios."""
