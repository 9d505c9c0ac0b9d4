"""The benchmarks behind `python bench.py NAME`, one file each, sharing common.py (timing, JSON lines,
shapes) and long_tail.py (the long-tailed workload)."""
