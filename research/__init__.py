"""Tools for the questions the paper asks of its runs, each runnable as `python -m research.NAME`: diversity
measures and paired comparisons of evaluated runs (`analysis`), the ablation runner over sweep files
(`experiments`), training curves as PNGs (`plot`)."""
