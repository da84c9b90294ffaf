"""The answer from finished runs: `runner report`'s table, the verdict per model, the plots, the end of a sweep."""
