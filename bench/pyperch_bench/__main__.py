"""`python3 -m pyperch_bench` (with bench/ on the path), the same as bench/driver.py."""
from .cli import main

main()
