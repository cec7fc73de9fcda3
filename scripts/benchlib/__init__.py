"""The pieces of `scripts/bench`: shared helpers (common), the corpora it builds (corpus), the
ways of getting a workspace it compares (methods), what it measures (figures) and the markdown
report (report). Python 3.9+ standard library only."""
